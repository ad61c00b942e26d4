set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new /tmp/old && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) && (cd /tmp/old && tar xJf $REPO/.run/tree_old.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
NEW=$1; OLD=73d09f0780fa83134f720d15d025f09a7c24aa5c
t0=$(date +%s)
ONLY=(--only sweep_prefill_llama-3.1-8b_n1024 --only sweep_prefill_llama-3.1-8b_n8192 --only 'sweep_train_llama-3.1-8b_n2048:pallas:auto' --only 'sweep_train_llama-3.1-8b_n2048:pallas:dropin:wide' --only 'sweep_train_llama-3.1-8b_n2048:jax:cudnn' --only 'sweep_train_llama-3.1-8b_n2048:fa3:mha' --only sweep_decode_llama-3.1-8b_b32_s8192 --only sweep_mla_deepseek-v3_b64_s8192 --impl 'pallas:*' --impl jax:cudnn --impl 'fa3:*' --impl torch:cudnn)
(cd /tmp/new && PALLAS_ATTN_GIT_SHA=$NEW PYTHONPATH=/tmp/new:/tmp/site timeout 150 python3 scripts/timing_program_probe.py --out $OUT/probe.json --rounds 2 --only sweep_prefill_llama-3.1-8b_n4096 --only sweep_train_llama-3.1-8b_n2048 --only sweep_mla_deepseek-v3_b64_s8192 --only sweep_decode_llama-3.1-8b_b32_s8192 --impl pallas:auto > $OUT/probe.log 2>&1); echo "probe rc $? at $(( $(date +%s) - t0 )) s"; grep -v Warning $OUT/probe.log | tail -12
(cd /tmp/new && PALLAS_ATTN_GIT_SHA=$NEW PYTHONPATH=/tmp/new:/tmp/site timeout 200 python3 -m compare run --config sweep "${ONLY[@]}" --out $OUT/new > $OUT/new.log 2>&1); echo "new rc $? at $(( $(date +%s) - t0 )) s"
(cd /tmp/old && PALLAS_ATTN_GIT_SHA=$OLD PYTHONPATH=/tmp/old:/tmp/site timeout 300 python3 -m compare run --config sweep "${ONLY[@]}" --out $OUT/old > $OUT/old.log 2>&1); echo "old rc $? at $(( $(date +%s) - t0 )) s"
python3 $REPO/.run/s25_summary.py new old 2>&1 | tail -60
