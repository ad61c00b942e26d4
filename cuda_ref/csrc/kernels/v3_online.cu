// v3_online (docs/reference.md §2.3): two passes with online row statistics; S never reaches HBM. The only
// scratch is the per-row max M and denominator L, fp32 [BH, n_q].
//
// One THREAD per query row (tid < TM of 256 threads active), TM = TN = 64 (d = 64) / 32 (d = 128). Pass 1
// streams key tiles through shared memory to get (M, L); pass 2 recomputes every score against K and V
// read straight from global memory (unstaged, as in the reference) and accumulates exp(s - M) / L * V into
// a shared-memory output row. Its slowness (3-7x slower than v2 on a T4) is what this generation measured.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/online_softmax.cuh"

namespace cuda_ref {
namespace {

constexpr int kThreads = 256;

template <int D>
struct V3Tile {
  static constexpr int TM = D == 64 ? 64 : 32;
  static constexpr int TN = TM;
  static_assert(2 * TM * D * 4 <= 48 * 1024, "static shared memory limit");
  static_assert(TM == (D == 64 ? gen_info(Gen::v3_online).tile_m_d64 : gen_info(Gen::v3_online).tile_m_d128) &&
                    TN == (D == 64 ? gen_info(Gen::v3_online).tile_n_d64 : gen_info(Gen::v3_online).tile_n_d128),
                "generations.def: v3_online tile columns");
};

// Pass 1: row statistics. Branch form of the update (§2.3): on a new max, rescale l first; then add.
// With lse set, the final (M, L) also give the row's log-sum-exp (one store per row).
template <int D>
__global__ void __launch_bounds__(kThreads) v3_stats_kernel(const float* __restrict__ q,
                                                            const float* __restrict__ k, float* __restrict__ m_out,
                                                            float* __restrict__ l_out, float* __restrict__ lse,
                                                            int n_q, int n_k, float scale, bool causal,
                                                            int q_offset) {
  using T = V3Tile<D>;
  __shared__ float sQ[T::TM][D];
  __shared__ float sK[T::TN][D];
  const int i0 = blockIdx.x * T::TM;
  const int64_t bh = blockIdx.y;
  const float* qb = q + bh * n_q * D;
  const float* kb = k + bh * n_k * D;

  for (int e = threadIdx.x; e < T::TM * D; e += kThreads) {
    const int r = e / D, t = e % D;
    sQ[r][t] = i0 + r < n_q ? qb[static_cast<int64_t>(i0 + r) * D + t] : 0.f;
  }
  const int r = threadIdx.x;
  const int i = i0 + r;
  const bool active = r < T::TM && i < n_q;
  const int j_last = active ? last_visible_key(i, n_k, causal, q_offset) : -1;
  const int key_end = cta_key_end(i0, T::TM, n_q, n_k, causal, q_offset);
  float m = kInitMax, l = 0.f;

  for (int j0 = 0; j0 < key_end; j0 += T::TN) {
    __syncthreads();  // previous tile fully consumed (and, first time round, sQ written)
    for (int e = threadIdx.x; e < T::TN * D; e += kThreads) {
      const int c = e / D, t = e % D;
      sK[c][t] = j0 + c < n_k ? kb[static_cast<int64_t>(j0 + c) * D + t] : 0.f;
    }
    __syncthreads();
    if (active) {
      const int c_end = min(T::TN, j_last + 1 - j0);  // keys ascend: stop at the first masked one
      for (int c = 0; c < c_end; ++c) {
        float acc = 0.f;
#pragma unroll 16
        for (int t = 0; t < D; ++t) acc += sQ[r][t] * sK[c][t];
        const float s = scale * acc;
        if (s > m) {
          l *= __expf(m - s);
          m = s;
        }
        l += __expf(s - m);
      }
    }
  }
  if (active) {
    m_out[bh * n_q + i] = m;
    l_out[bh * n_q + i] = l;
    if (lse != nullptr) lse[bh * n_q + i] = row_lse(m, l);
  }
}

// Pass 2: output with the final statistics, so no O rescale is ever needed: p = exp(s - M) / L.
template <int D>
__global__ void __launch_bounds__(kThreads) v3_output_kernel(const float* __restrict__ q,
                                                             const float* __restrict__ k,
                                                             const float* __restrict__ v,
                                                             const float* __restrict__ m_in,
                                                             const float* __restrict__ l_in, float* __restrict__ out,
                                                             int n_q, int n_k, float scale, bool causal, int q_offset) {
  using T = V3Tile<D>;
  __shared__ float sQ[T::TM][D];
  __shared__ float sO[T::TM][D];
  const int i0 = blockIdx.x * T::TM;
  const int64_t bh = blockIdx.y;
  const float* qb = q + bh * n_q * D;
  const float* kb = k + bh * n_k * D;
  const float* vb = v + bh * n_k * D;

  for (int e = threadIdx.x; e < T::TM * D; e += kThreads) {
    const int r = e / D, t = e % D;
    sQ[r][t] = i0 + r < n_q ? qb[static_cast<int64_t>(i0 + r) * D + t] : 0.f;
    sO[r][t] = 0.f;
  }
  __syncthreads();

  const int r = threadIdx.x;
  const int i = i0 + r;
  if (r < T::TM && i < n_q) {
    const float m = m_in[bh * n_q + i];
    const float inv_l = safe_inv(l_in[bh * n_q + i]);
    const int j_last = last_visible_key(i, n_k, causal, q_offset);
    for (int j = 0; j <= j_last; ++j) {
      const float* kr = kb + static_cast<int64_t>(j) * D;
      const float* vr = vb + static_cast<int64_t>(j) * D;
      float acc = 0.f;
#pragma unroll 16
      for (int t = 0; t < D; ++t) acc += sQ[r][t] * kr[t];
      const float p = __expf(scale * acc - m) * inv_l;
#pragma unroll 16
      for (int t = 0; t < D; ++t) sO[r][t] += p * vr[t];
    }
  }
  __syncthreads();

  for (int e = threadIdx.x; e < T::TM * D; e += kThreads) {
    const int rr = e / D, t = e % D;
    if (i0 + rr < n_q) out[(bh * n_q + i0 + rr) * D + t] = sO[rr][t];
  }
}

}  // namespace

void launch_v3_online(const AttnParams& p, cudaStream_t stream) {
  const auto* q = static_cast<const float*>(p.q);
  const auto* k = static_cast<const float*>(p.k);
  const auto* v = static_cast<const float*>(p.v);
  float* m = p.ws;
  float* l = p.ws + p.bh() * p.n_q;
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    using T = V3Tile<D>;
    const dim3 grid((p.n_q + T::TM - 1) / T::TM, static_cast<unsigned>(p.bh()));
    v3_stats_kernel<D><<<grid, kThreads, 0, stream>>>(q, k, m, l, p.lse, p.n_q, p.n_k, p.scale, p.causal,
                                                      p.q_offset);
    check_launch("v3_online stats");
    v3_output_kernel<D><<<grid, kThreads, 0, stream>>>(q, k, v, m, l, p.out, p.n_q, p.n_k, p.scale, p.causal,
                                                       p.q_offset);
    check_launch("v3_online output");
  });
}

}  // namespace cuda_ref
