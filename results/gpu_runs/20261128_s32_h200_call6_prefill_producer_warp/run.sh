# Session 32, call 6 (H200): the one-warp producer for every fa_prefill forward (config field producer_warp, the
# default; `wg_producer` is the session-start program byte for byte): GPU tests of fa_prefill, then the prefill entry
# with auto, `default` and `wg_producer` beside jax cuDNN and FA3 (6 lanes, 4 rounds): a within-run A/B.
# bash .run/s32_run6.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"])
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 120 python3 -m pytest -v -x tests/gpu/test_fa_prefill_gpu.py > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(grep -c PASSED $OUT/tests.log) passed, $(grep -c FAILED $OUT/tests.log) failed"
t0=$(date +%s)
timeout 195 python3 -m compare run --config sweep --only 'sweep_prefill_*' --impl pallas:auto --impl pallas:fa_prefill:default \
  --impl pallas:fa_prefill:wg_producer --impl jax:cudnn --impl 'fa3:*' --jobs 6 --compile-workers 12 --rounds 4 \
  --max-run-s 180 --out /tmp/pf > $OUT/prefill.log 2>&1
echo "prefill rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/pf/records.jsonl > $OUT/prefill.records.jsonl.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections, math
by = collections.defaultdict(dict); st = collections.Counter()
for line in open('/tmp/pf/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    st[r['status']] += 1
    if r['status'] == 'ok': by[r['workload']['name']][r['impl']['name']] = r['metrics']['time_us_p50']
print(dict(st))
def gm(xs): return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float('nan')
ab = [(d['pallas:fa_prefill:default'] / d['pallas:fa_prefill:wg_producer'], w) for w, d in by.items()
      if 'pallas:fa_prefill:default' in d and 'pallas:fa_prefill:wg_producer' in d]
print(f"default (one warp) / wg_producer: geomean {gm([x for x, _ in ab]):.4f} over {len(ab)}, "
      f"min {min(ab)[0]:.3f} {min(ab)[1]}, max {max(ab)[0]:.3f} {max(ab)[1]}, faster in {sum(x < 1 for x, _ in ab)}")
for x, w in sorted(ab): print(f"  {x:.3f} {w}")
pe = [d['pallas:auto'] / min(v for k, v in d.items() if not k.startswith('pallas')) for d in by.values()
      if 'pallas:auto' in d and any(not k.startswith('pallas') for k in d)]
print(f"auto / best peer: geomean {gm(pe):.4f} over {len(pe)}, worst {max(pe):.3f}")
PY
tail -2 $OUT/prefill.log
