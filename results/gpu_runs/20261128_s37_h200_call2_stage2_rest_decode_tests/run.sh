# Session 37, call 2 (H200): (1) the 13 workloads call 1's budget left without a second stage, over 2 lanes (auto +
# every peer, call 1's timing settings); (2) fa_decode's GPU tests (the stage fit's new test); (3) spec_st4 where
# session 37 gave block_m 16 / 32 their 4 stages back, beside the default.
# bash .run/s37_run2.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=""
for w in sweep_decode_gemma-2-9b_b32_s32768 sweep_decode_phi-3-mini_b32_s32768 sweep_paged_llama-3.1-8b_p16_b8_s131072 \
  sweep_paged_llama-3.1-8b_p16_b32_s32768 sweep_paged_llama-3.1-8b_p16_b128_s8192 sweep_paged_llama-3.1-8b_p64_b8_s131072 \
  sweep_paged_llama-3.1-8b_p64_b32_s32768 sweep_paged_llama-3.1-8b_p64_b128_s8192 sweep_paged_llama-3.1-70b_p64_b64_s16384 \
  sweep_mla_deepseek-v3_b128_s32768 sweep_mla_deepseek-v2-lite_b128_s32768 sweep_quant_llama-3.1-8b_nvfp4_b32_s32768 \
  sweep_quant_llama-3.1-70b_nvfp4_b32_s32768; do W="$W --only $w"; done
t0=$(date +%s)
timeout 200 python3 -m compare run --config sweep $W --impl pallas:auto --impl 'jax:*' --impl 'jax-pallas:*' --impl 'torch:cudnn' \
  --impl 'torch:flash' --impl 'fa3:*' --impl 'flashinfer:*' --jobs 2 --compile-workers 12 --rounds 4 --reps 10 \
  --e2e-budget-s 0.25 --max-run-s 190 --out /tmp/rest > /tmp/rest.log 2>&1
echo "rest rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/rest/records.jsonl > $OUT/rest.records.jsonl.gz; gzip -c /tmp/rest.log > $OUT/rest.log.gz
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fa_decode_gpu.py 2>&1 | tail -4 | tee $OUT/tests.log
timeout 100 python3 -m compare run --config spec_extrapolation --only 'spec_extra_hq32_tq*_b64_s8192' --impl pallas:auto --impl 'pallas:fa_decode:default' \
  --impl 'pallas:fa_decode:spec_st4' --rounds 4 --compile-workers 12 --out /tmp/st4 > /tmp/st4.log 2>&1
echo "st4 rc $?"
gzip -c /tmp/st4/records.jsonl > $OUT/st4.records.jsonl.gz; gzip -c /tmp/st4.log > $OUT/st4.log.gz
python3 - <<'PY' | tee $OUT/summary.txt
import json, math
for f in ('/tmp/rest/records.jsonl', '/tmp/st4/records.jsonl'):
    by = {}
    try: lines = open(f).read().splitlines()
    except OSError: print(f, 'missing'); continue
    for l in lines:
        r = json.loads(l)
        if r.get('type') != 'result': continue
        w = r['workload']['name']
        if r['status'] != 'ok':
            if r['status'] not in ('unsupported', 'unavailable'): print('  ', r['status'], w, r['impl']['name'])
            continue
        pl = r['impl'].get('plan') or {}
        by.setdefault(w, {})[r['impl']['name']] = (r['metrics']['time_us_p50'], pl.get('num_stages'), pl.get('block_m'))
    for w, d in sorted(by.items()):
        peers = [v[0] for k, v in d.items() if not k.startswith('pallas')]
        a = d.get('pallas:auto', (None,))[0]
        rat = f"auto/best peer {a / min(peers):.3f}" if a and peers else ""
        print(w[:44].ljust(44), rat, ' '.join(f"{k.replace('pallas:fa_decode:', '')}={v[0]:.1f}(st{v[1]},bm{v[2]})" if v[1] else f"{k}={v[0]:.1f}" for k, v in sorted(d.items(), key=lambda x: x[1][0])))
PY
