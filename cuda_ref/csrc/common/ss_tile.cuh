// v8_gqa_ss's score-stationary tile (docs/reference.md §2.13), shared by v8_gqa_ss and the quantized twins
// v9_fp8 / v10_nvfp4 (§2.14-§2.15), which change only how the fp16 tile is filled: the geometry, the shared
// memory (sQ, the padded transposed sK^T, sV) and the compute on a staged tile (lane per key, full-D dot from
// shared memory, one online-softmax step per 32 keys) live here once.
#pragma once

#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>

#include "online_softmax.cuh"
#include "warp.cuh"

namespace cuda_ref {

constexpr int kSsThreads = 256;
constexpr int kSsRows = kSsThreads / 32;  // 8 packed rows per CTA, one per warp
constexpr int kSsGroup = 32;              // keys per softmax step (one per lane)

template <int D>
struct SsTile {
  static constexpr int TN = D == 64 ? 64 : 32;
  static constexpr int EPT = D / 32;
  static constexpr int kGroups = TN / kSsGroup;
};

template <int D>
struct SsSmem {
  __half q[kSsRows][D];
  __half kt[D][SsTile<D>::TN + 1];
  __half v[SsTile<D>::TN][D];
};

static_assert(sizeof(SsSmem<64>) == 17536 && sizeof(SsSmem<128>) == 18688, "v8_gqa_ss: §2.13's shared memory");

// The staged tile's keys [0, c_lim) (a warp-uniform prefix) folded into warp `warp`'s running state: per group of
// 32 keys, lane c scores key base + c over the full D, one max / sum reduction and one rescale per group, then
// the 32 probabilities broadcast lane by lane into the EPT output elements this lane owns.
template <int D>
__device__ __forceinline__ void ss_tile_steps(const SsSmem<D>& sm, int warp, int lane, int c_lim, float scale,
                                              float& m_run, float& l_run, float (&o)[SsTile<D>::EPT]) {
  using T = SsTile<D>;
#pragma unroll
  for (int g = 0; g < T::kGroups; ++g) {
    const int base = g * kSsGroup;
    if (base >= c_lim) break;
    const int c = base + lane;
    const bool valid = c < c_lim;
    float s = -CUDART_INF_F;
    if (valid) {
      float dot = 0.f;
#pragma unroll 16
      for (int t = 0; t < D; ++t) dot += __half2float(sm.q[warp][t]) * __half2float(sm.kt[t][c]);
      s = scale * dot;
    }
    const float m_tile = warp_allreduce_max(s);
    const float m_new = fmaxf(m_run, m_tile);
    const float p = valid ? __expf(s - m_new) : 0.f;
    const float l_tile = warp_allreduce_sum(p);
    const float alpha = __expf(m_run - m_new);
    l_run = alpha * l_run + l_tile;
    m_run = m_new;
#pragma unroll
    for (int e = 0; e < T::EPT; ++e) o[e] *= alpha;
    const int n = min(kSsGroup, c_lim - base);
    for (int cc = 0; cc < n; ++cc) {
      const float pc = __shfl_sync(kFullMask, p, cc);
#pragma unroll
      for (int e = 0; e < T::EPT; ++e) o[e] += pc * __half2float(sm.v[base + cc][lane + 32 * e]);
    }
  }
}

// One packed row's unnormalised split partial (O, m, l) at workspace slot `slot`.
template <int D>
__device__ __forceinline__ void ss_store_partial(float* o_part, float* m_part, float* l_part, int64_t slot, int lane,
                                                 const float (&o)[SsTile<D>::EPT], float m_run, float l_run) {
#pragma unroll
  for (int e = 0; e < SsTile<D>::EPT; ++e) o_part[slot * D + lane + 32 * e] = o[e];
  if (lane == 0) {
    m_part[slot] = m_run;
    l_part[slot] = l_run;
  }
}

}  // namespace cuda_ref
