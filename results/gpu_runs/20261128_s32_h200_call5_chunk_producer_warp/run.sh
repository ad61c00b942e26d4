# Session 32, call 5 (H200): the paged forward's producer as one warp (WarpMesh) instead of the warpgroup (issue 32):
# GPU tests of the serving path, the eight chunked sweep workloads (auto, the dense twin,
# FA3 kvcache; one process, 4 rounds), ncu of the page-16 kernel again.
# bash .run/s32_run5.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"])
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 190 python3 -m pytest -v -x tests/gpu/test_serving_gpu.py -k "in_kernel_paging or other_head_dims or mixed_batch" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests.log)"
t0=$(date +%s)
timeout 150 python3 -m compare run --config sweep --only 'sweep_chunked_*' --impl pallas:auto --impl pallas:chunked:dense \
  --impl 'fa3:kvcache' --rounds 4 --out /tmp/ch > $OUT/chunked.log 2>&1
echo "chunked rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/ch/records.jsonl > $OUT/chunked.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
by = collections.defaultdict(dict)
for line in open('/tmp/ch/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by[r['workload']['name']][r['impl']['name']] = r['metrics']['time_us_p50']
for w, d in sorted(by.items()):
    a, t, f = d.get('pallas:auto'), d.get('pallas:chunked:dense'), d.get('fa3:kvcache')
    print(f"{w[14:]:34s} auto {a:8.1f} twin {t:8.1f} speed/twin {t / a:.3f}  fa3 {f or 0:8.1f} auto/fa3 {a / f if f else 0:.3f}")
PY
export NCU_LIMIT=100
bash scripts/ncu_profiles.sh chunk_p16 "chunked --page 16 --dtype bfloat16" > /dev/null 2>&1
grep -E "fa_prefill_fwd|Duration  " $OUT/chunk_p16.details.txt | grep -A1 fa_prefill | tail -1
