set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m pytest -v tests/gpu/test_fa_prefill_bwd_gpu.py -k "default_runs_fused or deterministic_false" > $OUT/tests.log 2>&1; echo "tests rc $?"; grep -E 'PASS|FAIL|passed|failed' $OUT/tests.log | tail -4
timeout 250 python3 -m compare run --config sweep --only 'sweep_train_gpt-2_n*' --only sweep_train_gpt-oss-20b_n4096 --impl pallas:auto --impl pallas:dropin:fused --impl jax:cudnn --e2e-reps 3 --max-run-s 240 --out $OUT/train > $OUT/compare.log 2>&1; echo "compare rc $?"
timeout 190 python3 -m compare run --config sweep --only sweep_train_qwen2.5-7b_n1024 --only sweep_train_qwen2.5-7b_n16384 --only sweep_train_llama-3.1-70b_n8192 --only sweep_train_mistral-7b-v0.1_n2048 --only sweep_train_phi-3-mini_n4096 --impl pallas:auto --impl fa3:mha --impl jax:cudnn --e2e-reps 3 --max-run-s 180 --out $OUT/train128 > $OUT/compare128.log 2>&1; echo "compare128 rc $?"
python3 - <<'PY'
import json, os
for f in ('train', 'train128'):
    p = os.environ['OUT'] + f'/{f}/records.jsonl'
    if not os.path.exists(p): continue
    for line in open(p):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        m = r.get('metrics') or {}
        w = r['workload']['name'] if isinstance(r['workload'], dict) else r['workload']
        i = r['impl'] if isinstance(r['impl'], str) else r['impl'].get('name')
        pr = (r.get('prediction') or {}).get('layer2') or {}
        pt = pr.get('time_us') if isinstance(pr, dict) else None
        print(f"{w:34s} {i:20s} {r['status']:6s} {m.get('time_us_p50') or 0:9.1f} l2={pt} {(r.get('notes') or r.get('reason') or '')[:50]}")
PY
