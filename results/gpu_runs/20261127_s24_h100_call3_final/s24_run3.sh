# session 24 final GPU check: cuda_ref built from the generated table + its GPU tests, the drop-in (named bwd_config),
# serving (chunked through the resolver), fa_prefill_bwd; then the read-ceiling probe on the GPU
set -u
REPO=$(pwd)
mkdir -p /tmp/src && cd /tmp/src && tar xJf $REPO/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
OUT=$OUT/t timeout 420 bash scripts/gpu_parallel_tests.sh "380:tests/gpu/test_dropin_gpu.py" \
  "380:tests/gpu/test_cuda_ref_gpu.py tests/gpu/test_cuda_paged_gpu.py tests/gpu/test_cuda_quant_gpu.py tests/gpu/test_cuda_mla_gpu.py" \
  "380:tests/gpu/test_serving_gpu.py"
echo "tests at $(( $(date +%s) - t0 )) s"
rm -f $OUT/t/*.summary
timeout 90 python3 scripts/quant_read_ceiling_probe.py --out $OUT/probe > $OUT/probe.log 2>&1; echo "probe rc $? at $(( $(date +%s) - t0 )) s"; tail -8 $OUT/probe.log
