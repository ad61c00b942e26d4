# Session 35, call 6 (H200): ragged B 128 DeepSeek-V3 MLA workloads (new in the sweep) and equal B 128 S 8k with auto,
# kv64_mc and kv64_mc_wl: does the work list pay past one wave of units?
# bash .run/s35_run6.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 150 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v3_ragged_b128_*' \
  --only 'sweep_mla_deepseek-v3_b128_s8192' --impl pallas:auto --impl pallas:fa_mla:kv64_mc \
  --impl pallas:fa_mla:kv64_mc_wl --rounds 4 --max-run-s 140 --out /tmp/mla > $OUT/mla.log 2>&1
echo "mla rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/mla/records.jsonl > $OUT/mla.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by, fr = collections.defaultdict(dict), collections.defaultdict(dict)
for line in open('/tmp/mla/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    if r['status'] != 'ok':
        print("NOT OK", r['workload']['name'], r['impl']['name'], r['status'], str(r.get('error'))[:150]); continue
    w, i = r['workload']['name'], r['impl']['name']
    by[w][i] = r['metrics']['time_us_p50']
    fr[w][i] = r['metrics'].get('roofline_fraction') or 0
print(f"{'workload':36s} {'auto':>8s} {'kv64_mc':>8s} {'mc_wl':>8s} wl/mc auto/best floor(auto)")
for w, d in sorted(by.items()):
    a, m, p = (d.get(k, 0) for k in ('pallas:auto', 'pallas:fa_mla:kv64_mc', 'pallas:fa_mla:kv64_mc_wl'))
    print(f"{w[10:]:36s} {a:8.1f} {m:8.1f} {p:8.1f} {p / m if m else 0:5.3f} {a / min(m, p) if m and p else 0:8.3f} "
          f"{fr[w].get('pallas:auto', 0):.3f}")
PY
