# Session 27, H100 call 4: the drop-in's GPU tests in full (the short-prefill route, D 96's, the first non-causal table
# rows: c3 in a non-causal D 64 step), then fa_prefill_bwd's (the deterministic / default gradients through the route).
# bash .run/s27_run4.sh   (archive HEAD to .run/src.tar.xz first; carry [".run"]; kind nvidia-h100-x1)
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 290 python3 -m pytest -q -rA tests/gpu/test_dropin_gpu.py > $OUT/dropin_gpu_tests.log 2>&1; echo "dropin tests rc $? in $(( $(date +%s) - t0 )) s"
tail -2 $OUT/dropin_gpu_tests.log
t0=$(date +%s)
timeout 200 python3 -m pytest -q -rA tests/gpu/test_fa_prefill_bwd_gpu.py > $OUT/bwd_gpu_tests.log 2>&1; echo "bwd tests rc $? in $(( $(date +%s) - t0 )) s"
tail -2 $OUT/bwd_gpu_tests.log
grep -E "^(FAILED|ERROR)" $OUT/*.log | head -20
