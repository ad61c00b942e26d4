// v8_gqa_occ, "v8.6 Arm 1" (docs/reference.md §2.11): Cut 1 (v8_gqa) with a single fp16 tile sK, sV [TN][D]
// (16 KB instead of 32 KB) for residency (4 CTAs/SM instead of 2 on the reference's T4); fp16 -> fp32 at read.
// All else as Cut 1 (common/paged_warp_rows.cuh, KvStage::kF16). On sm_90 (228 KB of shared memory per SM)
// neither tile limits residency: __launch_bounds__(256, 5) and the register file do (docs/cuda_ref.md).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/paged.cuh"
#include "common/paged_warp_rows.cuh"

namespace cuda_ref {
namespace {

static_assert(kPagedRowsPerCta == gen_info(Gen::v8_gqa_occ).tile_m_d64 && kPagedRowsPerCta == gen_info(Gen::v8_gqa_occ).tile_m_d128 &&
                  PagedRowsTile<64>::TN == gen_info(Gen::v8_gqa_occ).tile_n_d64 &&
                  PagedRowsTile<128>::TN == gen_info(Gen::v8_gqa_occ).tile_n_d128,
              "generations.def: v8_gqa_occ tile columns");
static_assert(sizeof(PagedRowsSmem<64, KvStage::kF16>) == 16384 && sizeof(PagedRowsSmem<128, KvStage::kF16>) == 16384,
              "v8_gqa_occ: the specification's shared memory");

template <int D>
__global__ void __launch_bounds__(kPagedRowsThreads, kPagedRowsMinCtas) v8_gqa_occ_partial_kernel(const PagedArgs a) {
  __shared__ PagedRowsSmem<D, KvStage::kF16> sm;
  paged_rows_partial<D, KvStage::kF16, false>(a, sm);
}

}  // namespace

void launch_v8_gqa_occ(const AttnParams& p, cudaStream_t stream) {
  const PagedArgs a = paged_args(p, "v8_gqa_occ");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v8_gqa_occ_partial_kernel<D><<<paged_grid(p, kPagedRowsPerCta), kPagedRowsThreads, 0, stream>>>(a);
    check_launch("v8_gqa_occ partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
