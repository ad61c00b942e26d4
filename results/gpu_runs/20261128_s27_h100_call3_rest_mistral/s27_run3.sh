# Session 27, H100 call 3: (1) the 27 sweep workloads call 2's budget left undone (too large for a 6-lane share, its pass
# alone cut at 515 s), here over 2 lanes (36 GiB each; the estimate still sends larger ones to a pass alone): the rest of
# the whole-sweep record, and the time of a 2-lane second stage; (2) Mistral-7B N 8192 / 16384 prefill in one process
# (call 2's lanes had auto 1.11 / 1.08x FA3 where session 26's had 0.97 / 1.01x, same program).
# bash .run/s27_run3.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 100 python3 -m compare run --config sweep --only 'sweep_prefill_mistral-7b-v0.1_n8192' --only 'sweep_prefill_mistral-7b-v0.1_n16384' \
  --impl pallas:auto --impl 'pallas:fa_prefill:default' --impl 'pallas:fa_prefill:tiles4' --impl 'jax:cudnn' --impl 'fa3:mha' --rounds 4 \
  --max-run-s 90 --out /tmp/mistral > $OUT/mistral.log 2>&1
echo "mistral rc $? in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 420 python3 -m compare run --config sweep --only 'sweep_decode_llama-3.1-8b_b32_s32768' --only 'sweep_decode_llama-3.1-8b_b128_s8192' --only 'sweep_decode_llama-3.1-70b_b8_s131072' --only 'sweep_decode_llama-3.1-70b_b32_s32768' --only 'sweep_decode_llama-3.1-70b_b128_s8192' --only 'sweep_decode_mistral-7b-v0.1_b32_s32768' --only 'sweep_decode_gemma-2-9b_b32_s32768' --only 'sweep_decode_phi-3-mini_b32_s32768' --only 'sweep_paged_llama-3.1-8b_p16_b8_s131072' --only 'sweep_paged_llama-3.1-8b_p16_b32_s32768' --only 'sweep_paged_llama-3.1-8b_p16_b128_s8192' --only 'sweep_paged_llama-3.1-8b_p64_b8_s131072' --only 'sweep_paged_llama-3.1-8b_p64_b32_s32768' --only 'sweep_paged_llama-3.1-8b_p64_b128_s8192' --only 'sweep_paged_llama-3.1-70b_p64_b64_s8192' --only 'sweep_paged_llama-3.1-70b_p64_b64_s16384' --only 'sweep_paged_qwen2.5-7b_p64_b64_s16384' --only 'sweep_mla_deepseek-v3_b64_s32768' --only 'sweep_mla_deepseek-v3_b128_s32768' --only 'sweep_mla_deepseek-v2-lite_b64_s32768' --only 'sweep_mla_deepseek-v2-lite_b128_s32768' --only 'sweep_quant_llama-3.1-8b_bfloat16_b32_s32768' --only 'sweep_quant_llama-3.1-8b_fp8_e4m3_b32_s32768' --only 'sweep_quant_llama-3.1-8b_nvfp4_b32_s32768' --only 'sweep_quant_llama-3.1-70b_bfloat16_b32_s32768' --only 'sweep_quant_llama-3.1-70b_fp8_e4m3_b32_s32768' --only 'sweep_quant_llama-3.1-70b_nvfp4_b32_s32768' \
  --impl pallas:auto --impl 'jax:*' --impl 'jax-pallas:*' --impl 'torch:cudnn' --impl 'torch:flash' --impl 'fa3:*' --impl 'flashinfer:*' \
  --jobs 2 --compile-workers 12 --max-run-s 400 --out /tmp/rest > $OUT/rest.log 2>&1
echo "rest rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/rest/records.jsonl > $OUT/rest_records.jsonl.gz
gzip -c /tmp/mistral/records.jsonl > $OUT/mistral_records.jsonl.gz
tail -3 $OUT/rest.log
python3 - <<'PY2' | tee $OUT/summary.txt
import json, collections
st = collections.Counter()
for line in open('/tmp/rest/records.jsonl'):
    r = json.loads(line)
    if r.get('type') == 'result': st[r['status']] += 1
print('rest:', dict(st))
d = collections.defaultdict(dict)
for line in open('/tmp/mistral/records.jsonl'):
    r = json.loads(line)
    if r.get('type') == 'result' and r['status'] == 'ok':
        m = r['metrics']; d[r['workload']['name']][r['impl']['name']] = (round(m['time_us_p10']), round(m['time_us_p50']), round(m['time_us_p90']))
for w, v in d.items(): print(w, v)
PY2
