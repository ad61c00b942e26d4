set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
S=sweep_prefill
timeout 110 python3 -m compare run --config sweep --only ${S}_llama-3.1-8b_n512 --only ${S}_llama-3.1-8b_n2048 --only ${S}_llama-3.1-70b_n1024 --only ${S}_gpt-2_n1024 --only ${S}_gpt-2_n16384 --impl pallas:auto --impl pallas:fa_prefill:default --impl jax:cudnn --e2e-reps 3 --max-run-s 105 --out $OUT/prefill > $OUT/prefill.log 2>&1; echo "prefill rc $?"
S=sweep_mla_deepseek
timeout 90 python3 -m compare run --config sweep --only ${S}-v3_b64_s8192 --only ${S}-v3_b128_s8192 --only ${S}-v3_ragged_b64_s8192 --only ${S}-v3_tq2_b64_s8192 --only ${S}-v2-lite_b64_s8192 --impl pallas:auto --impl pallas:fa_mla:kv64_ws_mc --e2e-reps 3 --max-run-s 85 --out $OUT/mla > $OUT/mla.log 2>&1; echo "mla rc $?"
python3 - <<'PY'
import json, os
for f in ('prefill', 'mla'):
    p = os.environ['OUT'] + f'/{f}/records.jsonl'
    if not os.path.exists(p): continue
    for line in open(p):
        try: r = json.loads(line)
        except Exception: continue
        if r.get('type') != 'result': continue
        m = r.get('metrics') or {}
        pl = (r['impl'].get('plan') or {}) if isinstance(r['impl'], dict) else {}
        t = m.get('time_us_p50') or 0
        pr = (r.get('prediction') or {}).get('layer2') or {}
        e = f"{pr['time_us'] / t - 1:+.2f}" if t and pr.get('time_us') else ''
        print(f"{r['workload']['name'].replace('sweep_', ''):30s} {r['impl']['name']:26s} {r['status'][:5]:5s} {t:9.1f} {e} {str(pl.get('chose', ''))[:30]}")
PY
