# Session 39, call 2 (H200): (a) the GPU tests call 1's limit cut (the serving tests from the paged features on, the
# varlen test with decode_max_q among them; the quantized paged tests) and fa_decode's paged tests again (the check's
# table load moved before the key loop); (b) configs/quant_batches.toml's paged rows: auto (check on) against the named
# default (check off), 4 rounds. One tar comes back.
# bash .run/s39_run2.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee /tmp/env.txt
W=/tmp/c2; rm -rf $W; mkdir -p $W; cp /tmp/env.txt $W/
t0=$(date +%s)
timeout 120 python3 -m compare run --config quant_batches --only 'quant_batch_paged_*' --impl pallas:auto \
  --impl pallas:fa_decode:default --rounds 4 --compile-workers 12 --max-run-s 110 --out /tmp/p2 > $W/paged.log 2>&1
echo "paged rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/p2/records.jsonl $W/paged.records.jsonl
python3 - <<'PY' | tee $W/summary.txt
import json
by = {}
for l in open('/tmp/p2/records.jsonl'):
    r = json.loads(l)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    m = r['metrics']
    by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = (m['time_us_p50'], m['time_us_p10'], m['time_us_p90'])
for w, d in sorted(by.items()):
    a, df = d.get('pallas:auto'), d.get('default')
    print(w.replace('quant_batch_', '')[:34].ljust(34), ' '.join(f"{k}={v[0]:.1f} [{v[1]:.1f}-{v[2]:.1f}]" for k, v in sorted(d.items())),
          f"auto/default {a[0] / df[0]:.3f}" if a and df else "")
PY
t0=$(date +%s)
timeout 330 python3 -m pytest -q -m gpu tests/gpu/test_serving_gpu.py tests/gpu/test_fa_decode_gpu.py \
  "tests/gpu/test_fa_decode_quant_gpu.py::test_paged_ragged" -p no:cacheprovider \
  -k "paged_decode_features or windowed or dense_decode_features or mixed_batch_decode_part or packed_varlen or test_paged or ragged" > $W/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $W/tests.log
cd /tmp && tar czf $OUT/call2.tgz c2
