# Session 39, call 4b (H200): call 4 again after the merge's loop-bound fix (call 4's first attempt: the merge did not
# verify in Triton, every mixed test failed; attempt1/). The probe's mixed part, then the mixed / packed GPU tests.
# Files straight to $OUT (no tar: a short budget).
# bash .run/s39_run4b.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
t0=$(date +%s)
timeout 130 python3 scripts/serving_probe.py --parts mixed --kernels --out /tmp/serving4b > $OUT/serving.log 2>&1
echo "serving rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/serving4b/records.jsonl $OUT/serving.records.jsonl
python3 - <<'PY' | tee $OUT/summary.txt
import json
for l in open('/tmp/serving4b/records.jsonl'):
    r = json.loads(l)
    if 'time_us_p50' in r:
        print(r['name'][:52].ljust(52), '%.1f [%.1f-%.1f]' % (r['time_us_p50'], r['time_us_p10'], r['time_us_p90']))
PY
t0=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_serving_gpu.py -k "mixed or packed_varlen" -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
