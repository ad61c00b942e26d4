set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
cp $OLDPWD/.run/ptxas_fused.py /tmp/ptxas_fused.py
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
for c in wide fused fused_c64; do
  MOSAIC_GPU_DUMP_PTXAS=1 timeout 60 python3 /tmp/ptxas_fused.py 128 $c > $OUT/ptxas_$c.log 2>&1
  echo "$c: $(grep -a -E 'spill|Used [0-9]+ registers' $OUT/ptxas_$c.log | sort | uniq -c | tr '\n' ';' | head -c 600)"
done
timeout 150 python3 -m pytest -v tests/gpu/test_fa_prefill_bwd_gpu.py -k "fused_c64" > $OUT/tests.log 2>&1; echo "tests rc $?"; grep -E 'FAIL|passed|failed' $OUT/tests.log | tail -6
timeout 300 python3 -m compare run --config sweep --only sweep_train_qwen2.5-7b_n4096 --only sweep_train_llama-3.1-8b_n4096 --only sweep_train_qwen2.5-7b_n16384 --only sweep_train_llama-3.1-70b_n8192 --only sweep_train_llama-3.1-8b_n16384 --impl pallas:dropin:wide --impl pallas:dropin:fused --impl pallas:dropin:fused_c64 --e2e-reps 3 --max-run-s 290 --out $OUT/train > $OUT/compare.log 2>&1; echo "compare rc $?"
python3 - <<'PY'
import json, os
p = os.environ['OUT'] + '/train/records.jsonl'
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    m = r.get('metrics') or {}
    w = r['workload']['name']
    i = r['impl'] if isinstance(r['impl'], str) else r['impl'].get('name')
    pr = (r.get('prediction') or {}).get('layer2') or {}
    print(f"{w:34s} {i:24s} {r['status']:6s} {m.get('time_us_p50') or 0:9.1f} l2={pr.get('time_us')} {(r.get('reason') or '')[:50]}")
PY
