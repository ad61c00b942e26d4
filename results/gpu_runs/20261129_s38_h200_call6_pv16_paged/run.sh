# Session 38, call 6 (H200): quant_pv16 on paged caches by default. configs/quant_batches.toml's paged rows (page 16,
# ragged, B 8 / 32, S 8k; bf16, NVFP4 and, new, fp8 E4M3): auto, default, quant_pv16_off, quant_pv16. One process, 4
# rounds. One tar comes back.
# bash .run/s38_run6.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=/tmp/c6; rm -rf $W; mkdir -p $W
t0=$(date +%s)
timeout 150 python3 -m compare run --config quant_batches --only 'quant_batch_paged_*' --impl pallas:auto \
  --impl pallas:fa_decode:default --impl pallas:fa_decode:quant_pv16_off --impl pallas:fa_decode:quant_pv16 --rounds 4 \
  --compile-workers 12 --max-run-s 140 --out /tmp/p6 > $W/paged.log 2>&1
echo "paged rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/p6/records.jsonl $W/paged.records.jsonl
python3 - <<'PY' | tee $W/summary.txt
import json
by = {}
for l in open('/tmp/p6/records.jsonl'):
    r = json.loads(l)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    by.setdefault(r['workload']['name'], {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
for w, d in sorted(by.items()):
    a, off = d.get('pallas:auto'), d.get('quant_pv16_off')
    print(w.replace('quant_batch_', '')[:34].ljust(34), ' '.join(f"{k}={v:.1f}" for k, v in sorted(d.items())),
          f"auto/pv16_off {a / off:.3f}" if a and off else "")
PY
cd /tmp && tar czf $OUT/call6.tgz c6
