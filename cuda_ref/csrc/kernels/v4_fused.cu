// v4_fused (docs/reference.md §2.4): single-pass FlashAttention-1, warp per query row, online softmax; no HBM
// scratch at all. Grid (ceil(n_q / 8), BH) x 256 threads. The CTA body lives in common/warp_rows.cuh
// because v6_splitkv reuses it; this file adds only the normalisation and the store.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/warp_rows.cuh"

namespace cuda_ref {
namespace {

static_assert(kWarpRowsPerCta == gen_info(Gen::v4_fused).tile_m_d64 &&
                  kWarpRowsPerCta == gen_info(Gen::v4_fused).tile_m_d128 &&
                  WarpRowsTile<64>::TN == gen_info(Gen::v4_fused).tile_n_d64 &&
                  WarpRowsTile<128>::TN == gen_info(Gen::v4_fused).tile_n_d128,
              "generations.def: v4_fused tile columns");

// With lse set, lane 0 of each warp stores its row's log-sum-exp from the final (m, l).
template <int D>
__global__ void __launch_bounds__(kWarpRowsThreads, kWarpRowsMinCtas) v4_fused_kernel(const float* __restrict__ q,
                                                                    const float* __restrict__ k,
                                                                    const float* __restrict__ v,
                                                                    float* __restrict__ out,
                                                                    float* __restrict__ lse, int n_q, int n_k,
                                                                    float scale, bool causal, int q_offset) {
  using T = WarpRowsTile<D>;
  __shared__ float sK[T::TN][D];
  __shared__ float sV[T::TN][D];
  const int64_t bh = blockIdx.y;
  const int row0 = blockIdx.x * kWarpRowsPerCta;
  const WarpRowState<D> st =
      warp_rows_attend<D, float>(q, k, v, bh, row0, n_q, n_k, 0, n_k, scale, causal, q_offset, sK, sV);
  const int i = row0 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (i >= n_q) return;
  const float inv = safe_inv(st.l);
#pragma unroll
  for (int e = 0; e < T::EPT; ++e) out[(bh * n_q + i) * D + lane + 32 * e] = st.o[e] * inv;  // coalesced
  if (lse != nullptr && lane == 0) lse[bh * n_q + i] = row_lse(st.m, st.l);
}

}  // namespace

void launch_v4_fused(const AttnParams& p, cudaStream_t stream) {
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    const dim3 grid((p.n_q + kWarpRowsPerCta - 1) / kWarpRowsPerCta, static_cast<unsigned>(p.bh()));
    v4_fused_kernel<D><<<grid, kWarpRowsThreads, 0, stream>>>(
        static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v), p.out,
        p.lse, p.n_q, p.n_k, p.scale, p.causal, p.q_offset);
    check_launch("v4_fused");
  });
}

}  // namespace cuda_ref
