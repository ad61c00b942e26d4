set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
S=sweep_prefill
timeout 235 python3 -m compare run --config sweep --only ${S}_llama-3.1-8b_n512 --only ${S}_llama-3.1-8b_n4096 --only ${S}_llama-3.1-8b_n16384 --only ${S}_gpt-2_n512 --only ${S}_gpt-2_n2048 --only ${S}_gpt-2_n8192 --only ${S}_qwen2.5-7b_n1024 --only ${S}_mistral-7b-v0.1_n8192 --only ${S}_gpt-oss-20b_n4096 --impl pallas:auto --impl pallas:fa_prefill:default --impl pallas:fa_prefill:tiles4 --impl pallas:fa_prefill:c3 --impl fa3:mha --impl jax:cudnn --e2e-reps 3 --max-run-s 225 --out $OUT/prefill > $OUT/prefill.log 2>&1; echo "prefill rc $? at $(( $(date +%s) - t0 )) s"
timeout 80 python3 -m compare run --config sweep --only sweep_train_gpt-2_n4096 --only sweep_train_llama-3.1-8b_n4096 --impl pallas:auto --impl fa3:mha --impl jax:cudnn --e2e-reps 3 --max-run-s 72 --out $OUT/train > $OUT/train.log 2>&1; echo "train rc $? at $(( $(date +%s) - t0 )) s"
timeout 110 python3 -m compare run --config sweep --only sweep_decode_llama-3.1-8b_b8_s8192 --only sweep_decode_llama-3.1-70b_b32_s8192 --only sweep_decode_qwen2.5-7b_b1_s32768 --only sweep_spec_llama-3.1-8b_tq4 --only sweep_spec_llama-3.1-70b_tq8 --only sweep_paged_llama-3.1-8b_p16_b32_s8192 --only sweep_paged_llama-3.1-8b_p64_b8_s32768 --only sweep_chunked_llama-3.1-8b_p64_c512_s8192 --only sweep_chunked_llama-3.1-8b_p16_c2048_s8192 --only sweep_quant_llama-3.1-8b_fp8_e4m3_b32_s8192 --only sweep_quant_llama-3.1-8b_nvfp4_b32_s8192 --only sweep_quant_llama-3.1-8b_bfloat16_b32_s8192 --impl pallas:auto --impl pallas:fa_decode:default --impl fa3:mha --impl fa3:kvcache --impl jax:cudnn --e2e-reps 3 --max-run-s 102 --out $OUT/decode > $OUT/decode.log 2>&1; echo "decode rc $? at $(( $(date +%s) - t0 )) s"
S=sweep_mla_deepseek
timeout 75 python3 -m compare run --config sweep --only ${S}-v3_b64_s8192 --only ${S}-v3_ragged_b64_s8192 --only ${S}-v2-lite_b32_s8192 --only ${S}-v3_b1_s32768 --impl pallas:auto --impl pallas:fa_mla:kv64_mc --e2e-reps 3 --max-run-s 68 --out $OUT/mla > $OUT/mla.log 2>&1; echo "mla rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os
for f in ('prefill', 'train', 'decode', 'mla'):
    p = os.environ['OUT'] + f'/{f}/records.jsonl'
    if not os.path.exists(p): continue
    for line in open(p):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        m = r.get('metrics') or {}
        w = r['workload']['name'].replace('sweep_', '')
        i = r['impl']['name']
        if r['status'] != 'ok': continue
        pr = (r.get('prediction') or {}).get('layer2') or {}
        t = m.get('time_us_p50') or 0
        e = f"{pr['time_us'] / t - 1:+.2f}" if t and pr.get('time_us') else ''
        print(f"{w:34s} {i:26s} {t:9.1f} {e}")
PY
