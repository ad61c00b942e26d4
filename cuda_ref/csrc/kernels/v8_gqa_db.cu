// v8_gqa_db, "v8.5" (docs/reference.md §2.10): Cut 1 (v8_gqa) with the KV tile staged as fp16 in TWO buffers
// sK, sV [2][TN][D] (the same 32 KB as Cut 1's one fp32 buffer, so residency is unchanged). Tile 0 is preloaded;
// for tile t the CTA first issues ordinary global loads of tile t+1 into the other buffer, then computes on
// tile t (fp16 -> fp32 at read), one barrier per iteration. No cp.async. All else as Cut 1
// (common/paged_warp_rows.cuh, KvStage::kF16Double).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/paged.cuh"
#include "common/paged_warp_rows.cuh"

namespace cuda_ref {
namespace {

static_assert(kPagedRowsPerCta == gen_info(Gen::v8_gqa_db).tile_m_d64 && kPagedRowsPerCta == gen_info(Gen::v8_gqa_db).tile_m_d128 &&
                  PagedRowsTile<64>::TN == gen_info(Gen::v8_gqa_db).tile_n_d64 &&
                  PagedRowsTile<128>::TN == gen_info(Gen::v8_gqa_db).tile_n_d128,
              "generations.def: v8_gqa_db tile columns");
static_assert(sizeof(PagedRowsSmem<64, KvStage::kF16Double>) == 32768 && sizeof(PagedRowsSmem<128, KvStage::kF16Double>) == 32768,
              "v8_gqa_db: the specification's shared memory");

template <int D>
__global__ void __launch_bounds__(kPagedRowsThreads, kPagedRowsMinCtas) v8_gqa_db_partial_kernel(const PagedArgs a) {
  __shared__ PagedRowsSmem<D, KvStage::kF16Double> sm;
  paged_rows_partial<D, KvStage::kF16Double, false>(a, sm);
}

}  // namespace

void launch_v8_gqa_db(const AttnParams& p, cudaStream_t stream) {
  const PagedArgs a = paged_args(p, "v8_gqa_db");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v8_gqa_db_partial_kernel<D><<<paged_grid(p, kPagedRowsPerCta), kPagedRowsThreads, 0, stream>>>(a);
    check_launch("v8_gqa_db partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
