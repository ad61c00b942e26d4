# Session 29 call 6 (H200): GPU tests left unrun since session 27 in tests/gpu/test_fa_prefill_bwd_gpu.py: the bf16
# gradient checks at the GQA causal-offset and non-causal shapes, the window / soft-cap / sinks backward, the drop-in's
# fused default (31 tests; the 16 first and call 3's 10 ran before).
# bash .run/s29_run6.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 330 python3 -m pytest -q -rfE --durations=5 tests/gpu/test_fa_prefill_bwd_gpu.py \
  -k "(bfloat16 and (offsets or noncausal)) or window_backward or softcap_and_sinks or dropin_default_runs_fused" \
  > $OUT/bwd_tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -12 $OUT/bwd_tests.log
