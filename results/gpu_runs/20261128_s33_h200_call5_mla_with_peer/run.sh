# Session 33, call 5 (H200): DeepSeek-V3's 21 MLA sweep workloads with auto, kv64_mc, kv64_mc_wl and the XLA peer
# bash .run/s33_run5.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 340 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v3_*' --impl pallas:auto \
  --impl pallas:fa_mla:kv64_mc --impl pallas:fa_mla:kv64_mc_wl --impl jax:xla_mla --rounds 4 --max-run-s 330 --out /tmp/mla > $OUT/mla.log 2>&1
echo "mla rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/mla/records.jsonl > $OUT/mla.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by, fr = collections.defaultdict(dict), collections.defaultdict(dict)
for line in open('/tmp/mla/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w, i = r['workload']['name'], r['impl']['name']
    by[w][i] = r['metrics']['time_us_p50']
    fr[w][i] = r['metrics'].get('roofline_fraction') or 0
print(f"{'workload':34s} {'auto':>8s} {'kv64_mc':>8s} {'mc_wl':>8s} auto/mc auto/wl floor(auto) auto/xla")
for w, d in sorted(by.items()):
    a, m, p = d.get('pallas:auto', 0), d.get('pallas:fa_mla:kv64_mc', 0), d.get('pallas:fa_mla:kv64_mc_wl', 0)
    print(f"{w[10:]:34s} {a:8.1f} {m:8.1f} {p:8.1f} {a / m if m else 0:7.3f} {a / p if p else 0:7.3f} "
          f"{fr[w].get('pallas:auto', 0):.3f} {a / d['jax:xla_mla'] if d.get('jax:xla_mla') else 0:.3f}")
PY
