// v5_wmma (docs/reference.md §2.5): v4's single pass moved onto tensor cores through WMMA 16x16x16 with fp16
// operands and fp32 accumulation. The host casts q, k, v to fp16; the output stays fp32.
//
// One warp per 16-row M tile. d = 64: BM = 64 query rows, BN = 32 keys, 4 warps; d = 128: BM = 32, BN = 32,
// 2 warps. Shared memory holds the reference's six buffers (44 KB / 46 KB, under the 48 KB static limit):
// sQ, sK, sV (fp16), sS (fp32 scores), sP (fp16 probabilities) and oRun (fp32 running, unnormalised O).
// Softmax runs in shared memory with lanes 0-15 of each warp owning one row each, so no shuffles; the
// running O is loaded from and stored back to oRun around every PV product.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/online_softmax.cuh"

namespace cuda_ref {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kMma = 16;

template <int D>
struct V5Tile {
  static constexpr int BM = D == 64 ? 64 : 32;
  static constexpr int BN = 32;
  static constexpr int kWarps = BM / kMma;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSmemBytes = (BM * D + 2 * BN * D + BM * BN) * 2 + (BM * BN + BM * D) * 4;
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");
  static_assert(BM == (D == 64 ? gen_info(Gen::v5_wmma).tile_m_d64 : gen_info(Gen::v5_wmma).tile_m_d128) &&
                    BN == (D == 64 ? gen_info(Gen::v5_wmma).tile_n_d64 : gen_info(Gen::v5_wmma).tile_n_d128),
                "generations.def: v5_wmma tile columns");
};

template <int D>
__global__ void __launch_bounds__(V5Tile<D>::kThreads) v5_wmma_kernel(const __half* __restrict__ q,
                                                                      const __half* __restrict__ k,
                                                                      const __half* __restrict__ v,
                                                                      float* __restrict__ out,
                                                                      float* __restrict__ lse, int n_q, int n_k,
                                                                      float scale, bool causal, int q_offset) {
  using T = V5Tile<D>;
  constexpr int BM = T::BM, BN = T::BN;
  // 32-byte alignment: WMMA loads/stores need 256-bit aligned tile pointers.
  __shared__ __align__(32) __half sQ[BM * D];
  __shared__ __align__(32) __half sK[BN * D];
  __shared__ __align__(32) __half sV[BN * D];
  __shared__ __align__(32) float sS[BM * BN];
  __shared__ __align__(32) __half sP[BM * BN];
  __shared__ __align__(32) float oRun[BM * D];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = blockIdx.x * BM;
  const int64_t bh = blockIdx.y;
  const __half* qb = q + bh * n_q * D;
  const __half* kb = k + bh * n_k * D;
  const __half* vb = v + bh * n_k * D;
  const __half zero = __float2half(0.f);

  for (int e = threadIdx.x; e < BM * D; e += T::kThreads) {
    const int r = e / D;
    sQ[e] = i0 + r < n_q ? qb[static_cast<int64_t>(i0) * D + e] : zero;
    oRun[e] = 0.f;
  }
  __syncthreads();

  // Each warp keeps its 16 rows of Q as D/16 A fragments for the whole key loop.
  wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, __half, wmma::row_major> q_frag[D / kMma];
#pragma unroll
  for (int kk = 0; kk < D / kMma; ++kk) wmma::load_matrix_sync(q_frag[kk], sQ + warp * kMma * D + kk * kMma, D);

  // Softmax state of the row this lane owns (lanes 0-15 only).
  const int my_row = warp * kMma + lane;
  const int my_i = i0 + my_row;
  const bool owns_row = lane < kMma && my_i < n_q;
  const int my_last = owns_row ? last_visible_key(my_i, n_k, causal, q_offset) : -1;
  float m = kInitMax, l = 0.f;

  const int key_end = cta_key_end(i0, BM, n_q, n_k, causal, q_offset);
  for (int j0 = 0; j0 < key_end; j0 += BN) {
    // (1) stage K and V, zero past n_k
    for (int e = threadIdx.x; e < BN * D; e += T::kThreads) {
      const int c = e / D;
      const bool in = j0 + c < n_k;
      const int64_t off = static_cast<int64_t>(j0) * D + e;
      sK[e] = in ? kb[off] : zero;
      sV[e] = in ? vb[off] : zero;
    }
    __syncthreads();

    // (2) S = Q K^T: K read as a column-major B fragment, which is K^T without a transpose.
#pragma unroll
    for (int n = 0; n < BN / kMma; ++n) {
      wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float> s_frag;
      wmma::fill_fragment(s_frag, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / kMma; ++kk) {
        wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __half, wmma::col_major> k_frag;
        wmma::load_matrix_sync(k_frag, sK + n * kMma * D + kk * kMma, D);
        wmma::mma_sync(s_frag, q_frag[kk], k_frag, s_frag);
      }
      wmma::store_matrix_sync(sS + warp * kMma * BN + n * kMma, s_frag, BN, wmma::mem_row_major);
    }
    __syncthreads();

    // (3) online softmax over the block, one lane per row; p goes to sP as fp16 for the PV product.
    if (lane < kMma) {
      float* srow = sS + my_row * BN;
      __half* prow = sP + my_row * BN;
      if (owns_row) {
        const int c_vis = min(BN, my_last + 1 - j0);  // visible keys of this block form a prefix
        float block_max = kInitMax;
        for (int c = 0; c < c_vis; ++c) block_max = fmaxf(block_max, scale * srow[c]);
        const float alpha = online_softmax_rescale(m, block_max);
        float sum = 0.f;
        for (int c = 0; c < BN; ++c) {
          const float p = c < c_vis ? __expf(scale * srow[c] - m) : 0.f;
          prow[c] = __float2half(p);
          sum += p;
        }
        l = alpha * l + sum;
        float* orow = oRun + my_row * D;
        for (int t = 0; t < D; ++t) orow[t] *= alpha;
      } else {
        for (int c = 0; c < BN; ++c) prow[c] = zero;  // rows past n_q: keep the MMA inputs defined
      }
    }
    __syncthreads();

    // (4) oRun += P V, the accumulator round-tripping through shared memory.
#pragma unroll
    for (int dt = 0; dt < D / kMma; ++dt) {
      wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float> o_frag;
      float* o_tile = oRun + warp * kMma * D + dt * kMma;
      wmma::load_matrix_sync(o_frag, o_tile, D, wmma::mem_row_major);
#pragma unroll
      for (int kc = 0; kc < BN / kMma; ++kc) {
        wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, __half, wmma::row_major> p_frag;
        wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __half, wmma::row_major> v_frag;
        wmma::load_matrix_sync(p_frag, sP + warp * kMma * BN + kc * kMma, BN);
        wmma::load_matrix_sync(v_frag, sV + kc * kMma * D + dt * kMma, D);
        wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
      }
      wmma::store_matrix_sync(o_tile, o_frag, D, wmma::mem_row_major);
    }
    __syncthreads();
  }

  if (owns_row) {
    const float inv = safe_inv(l);
    const float* orow = oRun + my_row * D;
    float* dst = out + (bh * n_q + my_i) * D;
    for (int t = 0; t < D; ++t) dst[t] = orow[t] * inv;
    if (lse != nullptr) lse[bh * n_q + my_i] = row_lse(m, l);  // the row's owning lane holds (m, l)
  }
}

}  // namespace

void launch_v5_wmma(const AttnParams& p, cudaStream_t stream) {
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    using T = V5Tile<D>;
    const dim3 grid((p.n_q + T::BM - 1) / T::BM, static_cast<unsigned>(p.bh()));
    v5_wmma_kernel<D><<<grid, T::kThreads, 0, stream>>>(
        static_cast<const __half*>(p.q), static_cast<const __half*>(p.k), static_cast<const __half*>(p.v), p.out,
        p.lse, p.n_q, p.n_k, p.scale, p.causal, p.q_offset);
    check_launch("v5_wmma");
  });
}

}  // namespace cuda_ref
