# Session 33, call 4 (H200): (1) fa_mla's own rule with the work list, through pallas:auto: DeepSeek-V3's 21 MLA sweep
# workloads with auto, kv64_mc and kv64_mc_wl in one process (4 rounds); (2) the chunked entry twice (issue 32: page 64
# c512 s8k sat at 0.948 of its dense twin in session 32 call 5, 0.961 in call 4: the noise at that size).
# bash .run/s33_run4.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"])
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 280 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v3_*' --impl pallas:auto \
  --impl pallas:fa_mla:kv64_mc --impl pallas:fa_mla:kv64_mc_wl --rounds 4 --max-run-s 270 --out /tmp/mla > $OUT/mla.log 2>&1
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
print(f"{'workload':34s} {'auto':>8s} {'kv64_mc':>8s} {'mc_wl':>8s} auto/mc auto/wl floor(auto)")
for w, d in sorted(by.items()):
    a, m, p = d.get('pallas:auto', 0), d.get('pallas:fa_mla:kv64_mc', 0), d.get('pallas:fa_mla:kv64_mc_wl', 0)
    print(f"{w[10:]:34s} {a:8.1f} {m:8.1f} {p:8.1f} {a / m if m else 0:7.3f} {a / p if p else 0:7.3f} "
          f"{fr[w].get('pallas:auto', 0):.3f}")
PY
for i in 1 2; do
  t0=$(date +%s)
  timeout 130 python3 -m compare run --config sweep --only 'sweep_chunked_*' --impl pallas:auto --impl pallas:chunked:dense \
    --impl 'fa3:kvcache' --rounds 4 --out /tmp/ch$i > $OUT/chunked$i.log 2>&1
  echo "chunked $i rc $? in $(( $(date +%s) - t0 )) s"
  gzip -c /tmp/ch$i/records.jsonl > $OUT/chunked$i.records.jsonl.gz
  python3 - $i <<'PY' | tee -a $OUT/summary.txt
import json, collections, sys
by = collections.defaultdict(dict)
for line in open(f'/tmp/ch{sys.argv[1]}/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by[r['workload']['name']][r['impl']['name']] = r['metrics']['time_us_p50']
for w, d in sorted(by.items()):
    a, t, f = d.get('pallas:auto'), d.get('pallas:chunked:dense'), d.get('fa3:kvcache')
    print(f"run {sys.argv[1]} {w[14:]:30s} auto {a:8.1f} twin {t:8.1f} speed/twin {t / a:.3f} auto/fa3 {a / f if f else 0:.3f}")
PY
done
