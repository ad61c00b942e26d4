# Session 39, call 4 (H200): the row-limited decode part with live rows (padding rows store no partial state, the
# merge reads only real rows): scripts/serving_probe.py mixed (both mixes: padded, packed, packed with decode_max_q
# 1; every kernel printed), then the GPU tests that run the row-limited part (mixed batches, packed varlen). One tar.
# bash .run/s39_run4.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/env.txt
W=/tmp/c4; rm -rf $W; mkdir -p $W; cp /tmp/env.txt $W/
t0=$(date +%s)
timeout 150 python3 scripts/serving_probe.py --parts mixed --kernels --out /tmp/serving > $W/serving.log 2>&1
echo "serving rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/serving/records.jsonl $W/serving.records.jsonl
python3 - <<'PY' | tee $W/summary.txt
import json
for l in open('/tmp/serving/records.jsonl'):
    r = json.loads(l)
    if 'time_us_p50' in r:
        print(r['name'][:52].ljust(52), '%.1f [%.1f-%.1f]' % (r['time_us_p50'], r['time_us_p10'], r['time_us_p90']))
PY
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_serving_gpu.py -k "mixed or packed_varlen" -p no:cacheprovider > $W/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $W/tests.log
cd /tmp && tar czf $OUT/call4.tgz c4
