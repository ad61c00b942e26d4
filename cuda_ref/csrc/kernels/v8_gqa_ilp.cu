// v8_gqa_ilp, "v8.6 Arm 2" (docs/reference.md §2.12): Cut 1 (v8_gqa, fp32 sK, sV, 32 KB) with the key loop
// restructured for instruction-level parallelism: per tile the warp-uniform c_lim = visible keys (tile width,
// split end, kv_len, causal i_q + q_offset - j0 + 1, clamped at 0); keys in groups of KU = 4: up to four
// independent partial dots and their shuffle reductions interleaved, then the four online-softmax updates in
// key order (common/paged_warp_rows.cuh, paged_rows_keys_ilp).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/paged.cuh"
#include "common/paged_warp_rows.cuh"

namespace cuda_ref {
namespace {

static_assert(kPagedRowsPerCta == gen_info(Gen::v8_gqa_ilp).tile_m_d64 && kPagedRowsPerCta == gen_info(Gen::v8_gqa_ilp).tile_m_d128 &&
                  PagedRowsTile<64>::TN == gen_info(Gen::v8_gqa_ilp).tile_n_d64 &&
                  PagedRowsTile<128>::TN == gen_info(Gen::v8_gqa_ilp).tile_n_d128,
              "generations.def: v8_gqa_ilp tile columns");
static_assert(sizeof(PagedRowsSmem<64, KvStage::kF32>) == 32768 && sizeof(PagedRowsSmem<128, KvStage::kF32>) == 32768,
              "v8_gqa_ilp: the specification's shared memory");

template <int D>
__global__ void __launch_bounds__(kPagedRowsThreads, kPagedRowsMinCtas) v8_gqa_ilp_partial_kernel(const PagedArgs a) {
  __shared__ PagedRowsSmem<D, KvStage::kF32> sm;
  paged_rows_partial<D, KvStage::kF32, true>(a, sm);
}

}  // namespace

void launch_v8_gqa_ilp(const AttnParams& p, cudaStream_t stream) {
  const PagedArgs a = paged_args(p, "v8_gqa_ilp");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v8_gqa_ilp_partial_kernel<D><<<paged_grid(p, kPagedRowsPerCta), kPagedRowsThreads, 0, stream>>>(a);
    check_launch("v8_gqa_ilp partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
