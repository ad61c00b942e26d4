# Session 38, call 4 (H200): quant_qk16 by the tile rule (on; off on NVFP4 programs of < 8 key tiles). The quant sweep
# entry through auto beside quant_qk16_off / quant_qk16 and jax cuDNN; configs/quant_batches.toml (NVFP4 at dense B 4-16
# and paged B 8 / 32, with the bf16 twins) with auto, default, quant_qk16 and quant_qk16_off. One process each, 4
# rounds. One tar comes back.
# bash .run/s38_run4.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
ls /tmp/site > /dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=/tmp/c4; rm -rf $W; mkdir -p $W
t0=$(date +%s)
timeout 200 python3 -m compare run --config sweep --only 'sweep_quant_*' --impl pallas:auto --impl pallas:fa_decode:quant_qk16_off \
  --impl pallas:fa_decode:quant_qk16 --impl jax:cudnn --rounds 4 --compile-workers 12 --max-run-s 190 --out /tmp/q4 > $W/quant.log 2>&1
echo "quant rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/q4/records.jsonl $W/quant.records.jsonl
t0=$(date +%s)
timeout 200 python3 -m compare run --config quant_batches --impl pallas:auto --impl pallas:fa_decode:default \
  --impl pallas:fa_decode:quant_qk16_off --impl pallas:fa_decode:quant_qk16 --rounds 4 --compile-workers 12 --max-run-s 190 \
  --out /tmp/b4 > $W/batches.log 2>&1
echo "batches rc $? in $(( $(date +%s) - t0 )) s"; cp /tmp/b4/records.jsonl $W/batches.records.jsonl
python3 - <<'PY' | tee $W/summary.txt
import json
for f in ('/tmp/q4/records.jsonl', '/tmp/b4/records.jsonl'):
    by, chose = {}, {}
    for l in open(f):
        r = json.loads(l)
        if r.get('type') != 'result' or r['status'] != 'ok': continue
        n = r['workload']['name']
        by.setdefault(n, {})[r['impl']['name'].replace('pallas:fa_decode:', '')] = r['metrics']['time_us_p50']
        if r['impl']['name'] == 'pallas:auto': chose[n] = (r['impl'].get('plan') or {}).get('chose', '?')
    for w, d in sorted(by.items()):
        on, off = d.get('quant_qk16'), d.get('quant_qk16_off')
        print(w.replace('sweep_quant_', '').replace('quant_batch_', '')[:34].ljust(34), ' '.join(f"{k}={v:.1f}" for k, v in sorted(d.items())),
              f"on/off {on / off:.3f}" if on and off else "", chose.get(w, ''))
PY
cd /tmp && tar czf $OUT/call4.tgz c4
