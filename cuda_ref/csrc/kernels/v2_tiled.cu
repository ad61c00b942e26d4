// v2_tiled (docs/reference.md §2.2): v1 with shared-memory tiles for the two matrix products. S is still
// materialised in HBM and normalised by v1's softmax pass, unchanged.
//
// Tiles TM = TN = 64 for d = 64 and 32 for d = 128, so the Q + K tiles are (TM + TN) * d * 4 B = 32 KB
// under the 48 KB static shared-memory limit. Rows are unpadded, as in the reference (its smem budget
// says so); the resulting bank conflicts are part of what this generation measures.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"

namespace cuda_ref {
namespace {

constexpr int kThreads = 256;

template <int D>
struct V2Tile {
  static constexpr int TM = D == 64 ? 64 : 32;
  static constexpr int TN = TM;
  static constexpr int TK = TN;  // the PV contraction is chunked by TN keys
  static constexpr int kOutPerThread = TM * D / kThreads;  // 16 accumulators in both configs
  static_assert(TM * D % kThreads == 0, "each thread owns a whole number of outputs");
  static_assert((TM + TN) * D * 4 <= 48 * 1024, "static shared memory limit");
  static_assert(TM == (D == 64 ? gen_info(Gen::v2_tiled).tile_m_d64 : gen_info(Gen::v2_tiled).tile_m_d128) &&
                    TN == (D == 64 ? gen_info(Gen::v2_tiled).tile_n_d64 : gen_info(Gen::v2_tiled).tile_n_d128),
                "generations.def: v2_tiled tile columns");
};

// Pass 1: a TM x TN tile of S per CTA; both operand tiles staged once (zero-filled out of range), then
// threads grid-stride over the TM*TN outputs, each doing a full d-long dot from shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads) v2_qk_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                                         float* __restrict__ s, int n_q, int n_k, float scale) {
  using T = V2Tile<D>;
  __shared__ float sQ[T::TM][D];
  __shared__ float sK[T::TN][D];
  const int j0 = blockIdx.x * T::TN;
  const int i0 = blockIdx.y * T::TM;
  const int64_t bh = blockIdx.z;
  const float* qb = q + (bh * n_q) * D;
  const float* kb = k + (bh * n_k) * D;

  for (int e = threadIdx.x; e < T::TM * D; e += kThreads) {
    const int r = e / D, t = e % D;
    sQ[r][t] = i0 + r < n_q ? qb[static_cast<int64_t>(i0 + r) * D + t] : 0.f;
  }
  for (int e = threadIdx.x; e < T::TN * D; e += kThreads) {
    const int c = e / D, t = e % D;
    sK[c][t] = j0 + c < n_k ? kb[static_cast<int64_t>(j0 + c) * D + t] : 0.f;
  }
  __syncthreads();

  for (int e = threadIdx.x; e < T::TM * T::TN; e += kThreads) {
    const int r = e / T::TN, c = e % T::TN;
    if (i0 + r >= n_q || j0 + c >= n_k) continue;
    float acc = 0.f;
#pragma unroll 16
    for (int t = 0; t < D; ++t) acc += sQ[r][t] * sK[c][t];
    s[(bh * n_q + i0 + r) * n_k + j0 + c] = scale * acc;
  }
}

// Pass 3: O tile [TM][D] per CTA. Keys are walked in chunks of TK: stage P[TM][TK] and V[TK][D], then each
// thread adds to its fixed, grid-strided set of TM*D/256 outputs held in registers across chunks.
template <int D>
__global__ void __launch_bounds__(kThreads) v2_pv_kernel(const float* __restrict__ s, const float* __restrict__ v,
                                                         float* __restrict__ out, int n_q, int n_k) {
  using T = V2Tile<D>;
  __shared__ float sP[T::TM][T::TK];
  __shared__ float sV[T::TK][D];
  const int i0 = blockIdx.x * T::TM;
  const int64_t bh = blockIdx.y;
  const float* sb = s + bh * n_q * n_k;
  const float* vb = v + bh * n_k * D;

  float acc[T::kOutPerThread];
#pragma unroll
  for (int r = 0; r < T::kOutPerThread; ++r) acc[r] = 0.f;

  for (int k0 = 0; k0 < n_k; k0 += T::TK) {
    for (int e = threadIdx.x; e < T::TM * T::TK; e += kThreads) {
      const int r = e / T::TK, c = e % T::TK;
      sP[r][c] = (i0 + r < n_q && k0 + c < n_k) ? sb[static_cast<int64_t>(i0 + r) * n_k + k0 + c] : 0.f;
    }
    for (int e = threadIdx.x; e < T::TK * D; e += kThreads) {
      const int c = e / D, t = e % D;
      sV[c][t] = k0 + c < n_k ? vb[static_cast<int64_t>(k0 + c) * D + t] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < T::kOutPerThread; ++r) {
      const int e = threadIdx.x + r * kThreads;
      const int row = e / D, t = e % D;
      float a = acc[r];
#pragma unroll 8
      for (int c = 0; c < T::TK; ++c) a += sP[row][c] * sV[c][t];
      acc[r] = a;
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < T::kOutPerThread; ++r) {
    const int e = threadIdx.x + r * kThreads;
    const int row = e / D, t = e % D;
    if (i0 + row < n_q) out[(bh * n_q + i0 + row) * D + t] = acc[r];
  }
}

}  // namespace

void launch_v2_tiled(const AttnParams& p, cudaStream_t stream) {
  const auto* q = static_cast<const float*>(p.q);
  const auto* k = static_cast<const float*>(p.k);
  const auto* v = static_cast<const float*>(p.v);
  float* s = p.ws;
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    using T = V2Tile<D>;
    const dim3 qk_grid((p.n_k + T::TN - 1) / T::TN, (p.n_q + T::TM - 1) / T::TM, static_cast<unsigned>(p.bh()));
    v2_qk_kernel<D><<<qk_grid, kThreads, 0, stream>>>(q, k, s, p.n_q, p.n_k, p.scale);
    check_launch("v2_tiled qk");
    launch_v1_softmax_rows(p, s, stream);
    const dim3 pv_grid((p.n_q + T::TM - 1) / T::TM, static_cast<unsigned>(p.bh()));
    v2_pv_kernel<D><<<pv_grid, kThreads, 0, stream>>>(s, v, p.out, p.n_q, p.n_k);
    check_launch("v2_tiled pv");
  });
}

}  // namespace cuda_ref
