set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
S=sweep_prefill
timeout 130 python3 -m compare run --config sweep --only ${S}_llama-3.1-8b_n512 --only ${S}_llama-3.1-8b_n2048 --only ${S}_llama-3.1-8b_n8192 --only ${S}_gpt-2_n1024 --only ${S}_gpt-2_n4096 --only ${S}_gpt-2_n16384 --only ${S}_qwen2.5-7b_n4096 --only ${S}_llama-3.1-70b_n1024 --only ${S}_mistral-7b-v0.1_n4096 --impl pallas:auto --impl fa3:mha --impl jax:cudnn --e2e-reps 3 --max-run-s 125 --out $OUT/prefill > $OUT/prefill.log 2>&1; echo "prefill rc $?"
S=sweep_train
timeout 190 python3 -m compare run --config sweep --only ${S}_gpt-2_n2048 --only ${S}_gpt-2_n8192 --only ${S}_llama-3.1-8b_n2048 --only ${S}_llama-3.1-8b_n8192 --only ${S}_qwen2.5-7b_n1024 --only ${S}_gpt-oss-20b_n4096 --impl pallas:auto --impl fa3:mha --impl jax:cudnn --e2e-reps 3 --max-run-s 185 --out $OUT/train > $OUT/train.log 2>&1; echo "train rc $?"
timeout 80 python3 -m compare run --config sweep --only 'sweep_spec_*' --impl pallas:auto --impl fa3:mha --e2e-reps 3 --max-run-s 75 --out $OUT/spec > $OUT/spec.log 2>&1; echo "spec rc $?"
S=sweep_mla_deepseek
timeout 100 python3 -m compare run --config sweep --only ${S}-v3_b1_s8192 --only ${S}-v3_b8_s8192 --only ${S}-v3_b32_s8192 --only ${S}-v3_b64_s8192 --only ${S}-v3_b128_s8192 --only ${S}-v3_ragged_b64_s8192 --only ${S}-v3_tq2_b64_s8192 --only ${S}-v2-lite_b64_s8192 --only ${S}-v3_b1_s32768 --impl pallas:auto --impl pallas:fa_mla:kv64_mc --impl pallas:fa_mla:kv64_ws_mc --e2e-reps 3 --max-run-s 95 --out $OUT/mla > $OUT/mla.log 2>&1; echo "mla rc $?"
python3 - <<'PY'
import json, os
for f in ('prefill', 'train', 'spec', 'mla'):
    p = os.environ['OUT'] + f'/{f}/records.jsonl'
    if not os.path.exists(p): continue
    for line in open(p):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        m = r.get('metrics') or {}
        w = r['workload']['name'].replace('sweep_', '')
        i = r['impl']['name']
        pr = (r.get('prediction') or {}).get('layer2') or {}
        t = m.get('time_us_p50') or 0
        e = f"{pr['time_us'] / t - 1:+.2f}" if t and pr.get('time_us') else ''
        print(f"{w:30s} {i:24s} {r['status'][:5]:5s} {t:9.1f} {e} {(r.get('reason') or '')[:40]}")
PY
