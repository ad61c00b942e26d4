// v8_gqa, "Cut 1" (docs/reference.md §2.8): v7_paged plus GQA M-packing. One CTA serves 8 packed rows of one
// KV head: G query heads x n_q positions, head-major (packed row m: g = m / n_q, i_q = m % n_q, h_q = h_kv * G + g),
// so the 8 warps share every staged KV tile instead of each query head re-reading it. Grid
// (ceil(G * n_q / 8), S, B * H_kv), 256 threads, warp per packed row; each warp loads the q row of its own head;
// fp32 sK, sV [TN][D] (TN 64 / 32, 32 KB); inner loop as v4/v7; causal on i_q + q_offset[b]. For G > 8 each of
// the ceil(G * n_q / 8) row tiles of a KV head re-stages the KV. The split heuristic counts B * H_kv * row tiles
// (binding.cpp). Partials and merge are query-head shaped, as v6/v7 (common/paged.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/paged.cuh"
#include "common/paged_warp_rows.cuh"

namespace cuda_ref {
namespace {

static_assert(kPagedRowsPerCta == gen_info(Gen::v8_gqa).tile_m_d64 && kPagedRowsPerCta == gen_info(Gen::v8_gqa).tile_m_d128 &&
                  PagedRowsTile<64>::TN == gen_info(Gen::v8_gqa).tile_n_d64 &&
                  PagedRowsTile<128>::TN == gen_info(Gen::v8_gqa).tile_n_d128,
              "generations.def: v8_gqa tile columns");
static_assert(sizeof(PagedRowsSmem<64, KvStage::kF32>) == 32768 && sizeof(PagedRowsSmem<128, KvStage::kF32>) == 32768,
              "v8_gqa: the specification's shared memory");

template <int D>
__global__ void __launch_bounds__(kPagedRowsThreads, kPagedRowsMinCtas) v8_gqa_partial_kernel(const PagedArgs a) {
  __shared__ PagedRowsSmem<D, KvStage::kF32> sm;
  paged_rows_partial<D, KvStage::kF32, false>(a, sm);
}

}  // namespace

void launch_v8_gqa(const AttnParams& p, cudaStream_t stream) {
  const PagedArgs a = paged_args(p, "v8_gqa");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v8_gqa_partial_kernel<D><<<paged_grid(p, kPagedRowsPerCta), kPagedRowsThreads, 0, stream>>>(a);
    check_launch("v8_gqa partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
