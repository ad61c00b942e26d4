# Session 38, call 5 (H200): quant_pv16 (P.V in fp16 on the decoded V tile, no V convert) outside the batch regime, now
# that the K tile no longer converts either (quant_qk16): the quant sweep's B1 rows and configs/quant_batches.toml's
# NVFP4 rows (dense B 4-16, paged B 8 / 32), default against quant_pv16 (pv16 everywhere), auto beside. One process
# each, 4 rounds. One tar comes back.
# bash .run/s38_run5.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=/tmp/c5; rm -rf $W; mkdir -p $W
t0=$(date +%s)
timeout 120 python3 -m compare run --config sweep --only 'sweep_quant_*_fp8_e4m3_b1_*' --only 'sweep_quant_*_nvfp4_b1_*' \
  --impl pallas:auto --impl pallas:fa_decode:default --impl pallas:fa_decode:quant_pv16 --rounds 4 --compile-workers 12 \
  --max-run-s 110 --out /tmp/q5 > $W/quant.log 2>&1
echo "quant rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/q5/records.jsonl $W/quant.records.jsonl
t0=$(date +%s)
timeout 150 python3 -m compare run --config quant_batches --only 'quant_batch_nvfp4_*' --only 'quant_batch_paged_nvfp4_*' \
  --impl pallas:auto --impl pallas:fa_decode:default --impl pallas:fa_decode:quant_pv16 --rounds 4 --compile-workers 12 \
  --max-run-s 140 --out /tmp/b5 > $W/batches.log 2>&1
echo "batches rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/b5/records.jsonl $W/batches.records.jsonl
python3 - <<'PY' | tee $W/summary.txt
import json
for f in ('/tmp/q5/records.jsonl', '/tmp/b5/records.jsonl'):
    by = {}
    for l in open(f):
        r = json.loads(l)
        if r.get('type') != 'result' or r['status'] != 'ok': continue
        by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
    for w, d in sorted(by.items()):
        on, off = d.get('quant_pv16'), d.get('default')
        print(w.replace('sweep_quant_', '').replace('quant_batch_', '')[:34].ljust(34), ' '.join(f"{k}={v:.1f}" for k, v in sorted(d.items())),
              f"pv16/default {on / off:.3f}" if on and off else "")
PY
cd /tmp && tar czf $OUT/call5.tgz c5
