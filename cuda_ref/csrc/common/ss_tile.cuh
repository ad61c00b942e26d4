// v8_gqa_ss's score-stationary tile (docs/reference.md §2.13), shared by v8_gqa_ss and the quantized twins
// v9_fp8 / v10_nvfp4 (§2.14-§2.15), which change only how the fp16 tile is filled: the geometry, the shared
// memory (sQ, the padded transposed sK^T, sV) and the compute on a staged tile (lane per key, full-D dot from
// shared memory, one online-softmax step per 32 keys) live here once.
#pragma once

#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>

#include "online_softmax.cuh"
#include "paged.cuh"
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

// The whole partial kernel body (every thread of the CTA calls it): sQ, then per key tile the gather through the
// block table (consecutive threads take consecutive t of one key: coalesced pool reads; K lands transposed) and
// ss_tile_steps, then the partial store. `load(row, t, k, v)` writes element t of key row `row` as fp16: a plain
// fp16 read for v8_gqa_ss, a dequantizing read for v9_fp8 / v10_nvfp4 (the only thing they change).
template <int D, class Load>
__device__ __forceinline__ void ss_partial(const PagedArgs& a, SsSmem<D>& sm, Load load) {
  using T = SsTile<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.z / a.h_kv, h_kv = blockIdx.z % a.h_kv;
  const int split = blockIdx.y;
  const int m0 = blockIdx.x * kSsRows;
  const SeqView seq = seq_view(a, b);
  const KeyRange kr = split_keys(a, seq, split);
  const PackedRow row = packed_row(a, h_kv, m0 + warp);

  if (row.active) {
    const __half* qp = q_row(a, b, row.h_q, row.i_q);
    for (int t = lane; t < D; t += 32) sm.q[warp][t] = qp[t];
  }
  __syncwarp();  // a warp reads only its own sQ row

  float o[T::EPT];
#pragma unroll
  for (int e = 0; e < T::EPT; ++e) o[e] = 0.f;
  float m_run = kInitMax, l_run = 0.f;
  const int row_end = row.active ? visible_end(a, seq, kr, row.i_q) : kr.begin;
  const int cta_end = visible_end(a, seq, kr, packed_max_iq(m0, kSsRows, a.group * a.n_q, a.n_q));
  const __half zero = __float2half(0.f);

  for (int j0 = kr.begin; j0 < cta_end; j0 += T::TN) {
    for (int e = threadIdx.x; e < T::TN * D; e += kSsThreads) {
      const int c = e / D, t = e % D;
      if (j0 + c < kr.end) {
        load(paged_kv_row(a, seq, h_kv, j0 + c), t, sm.kt[t][c], sm.v[c][t]);
      } else {
        sm.kt[t][c] = zero;
        sm.v[c][t] = zero;
      }
    }
    __syncthreads();

    const int c_lim = min(T::TN, row_end - j0);  // warp-uniform; the visible keys are a prefix
    ss_tile_steps<D>(sm, warp, lane, c_lim, a.scale, m_run, l_run, o);
    __syncthreads();  // the tile is overwritten next round
  }

  if (!row.active) return;
  const int64_t slot = partial_slot(a, b, row.h_q, row.i_q, split);
  ss_store_partial<D>(a.o_part, a.m_part, a.l_part, slot, lane, o, m_run, l_run);
}

}  // namespace cuda_ref
