# Session 31 call 6 (H200): GPU tests after the session's last changes (git passed as $1): the drop-in's vmap / remat
# (vmap(grad) of the default and of the wide pair, new), its short-route and NaN / Inf tests, and fa_prefill_bwd's
# fused tests (the five-product backward behind the short route).
# bash .run/s31_run6.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_dropin_gpu.py -k "vmap or short_causal or d64_and_nan" > $OUT/dropin_tests.log 2>&1
echo "dropin tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/dropin_tests.log; t0=$(date +%s)
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_fa_prefill_bwd_gpu.py -k "fused_repeatable or dropin_default_runs_fused" > $OUT/bwd_tests.log 2>&1
echo "bwd tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/bwd_tests.log
