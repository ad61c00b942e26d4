set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz && cp $OLDPWD/.run/quick_fused.py . || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 quick_fused.py > $OUT/quick.log 2>&1; echo "quick rc $?"; grep -v '^ ' $OUT/quick.log | tail -12
timeout 290 python3 -m compare run --config sweep --only sweep_train_llama-3.1-8b_n1024 --only sweep_train_llama-3.1-8b_n16384 --only sweep_train_qwen2.5-7b_n4096 --only sweep_train_mistral-7b-v0.1_n8192 --only sweep_train_gpt-2_n1024 --only sweep_train_gpt-2_n8192 --impl pallas:auto --impl pallas:dropin:wide --impl pallas:dropin:fused --impl fa3:mha --impl jax:cudnn --e2e-reps 3 --max-run-s 280 --out $OUT/train > $OUT/compare.log 2>&1; echo "compare rc $?"
timeout 140 python3 -m pytest -q -x tests/gpu/test_fa_prefill_bwd_gpu.py -k "fused and (bfloat16 or repeatable)" > $OUT/tests.log 2>&1; echo "tests rc $?"; tail -5 $OUT/tests.log
python3 - <<'PY'
import json, glob, os
for f in glob.glob(os.environ['OUT'] + '/train/*.records.jsonl'):
    for line in open(f):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        m = r.get('metrics') or {}
        w = r['workload']['name'] if isinstance(r['workload'], dict) else r['workload']
        i = r['impl'] if isinstance(r['impl'], str) else r['impl'].get('name')
        print(f"{w:40s} {i:24s} {r['status']:6s} {m.get('time_us_p50') or 0:10.1f} {(r.get('reason') or '')[:80]}")
PY
