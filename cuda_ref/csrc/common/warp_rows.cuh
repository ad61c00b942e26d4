// The v4_fused CTA body (docs/reference.md §2.4), shared with v6_splitkv (§2.6: "warp per row exactly as v4,
// restricted to the split's key range"). Kept here so v6 is v4 plus its delta, not a copy.
//
// 256 threads = 8 warps; warp w owns query row row0 + w. Lane owns elements t = lane + 32 e (e < D / 32)
// of the q row and of the O accumulator. Key tiles of TN rows (64 for d = 64, 32 for d = 128) of K and V
// are staged as fp32 in shared memory (2 * TN * D * 4 B = 32 KB) by the whole CTA; then each warp walks the
// tile key by key: lane partial dot -> XOR-butterfly all-reduce -> * scale -> online-softmax update.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mask.cuh"
#include "online_softmax.cuh"
#include "warp.cuh"

namespace cuda_ref {

constexpr int kWarpRowsThreads = 256;
constexpr int kWarpRowsPerCta = kWarpRowsThreads / 32;  // 8 query rows per CTA
// Minimum resident CTAs per SM for __launch_bounds__. Without it ptxas targets the 6 CTAs that 32 KB of
// shared memory allows on sm_90, caps registers at 40 and spills at d = 128; 5 leaves 48 registers, no
// spills (results/ptxas/ptxas_sm90a.txt).
constexpr int kWarpRowsMinCtas = 5;

template <int D>
struct WarpRowsTile {
  static constexpr int TN = D == 64 ? 64 : 32;
  static constexpr int EPT = D / 32;  // elements per lane
  static_assert(2 * TN * D * 4 <= 48 * 1024, "static shared memory limit");
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

// Result of one warp's row over a key range: unnormalised O slice (per lane), running max and denominator.
template <int D>
struct WarpRowState {
  float o[WarpRowsTile<D>::EPT];
  float m;
  float l;
};

// Runs the CTA over keys [k_begin, k_end) for rows row0 .. row0 + 7 of head bh. Every thread of the CTA
// must call it (it synchronises); warps whose row is past n_q only help with the loads.
template <int D, typename Tin>
__device__ __forceinline__ WarpRowState<D> warp_rows_attend(const Tin* __restrict__ q, const Tin* __restrict__ k,
                                                            const Tin* __restrict__ v, int64_t bh, int row0,
                                                            int n_q, int n_k, int k_begin, int k_end, float scale,
                                                            bool causal, int q_offset, float (*sK)[D],
                                                            float (*sV)[D]) {
  using T = WarpRowsTile<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = row0 + warp;
  const bool active = i < n_q;

  WarpRowState<D> st;
  st.m = kInitMax;
  st.l = 0.f;
  float qr[T::EPT];
#pragma unroll
  for (int e = 0; e < T::EPT; ++e) {
    st.o[e] = 0.f;
    qr[e] = active ? to_f32(q[(bh * n_q + i) * D + lane + 32 * e]) : 0.f;
  }

  const int row_end = active ? min(k_end, last_visible_key(i, n_k, causal, q_offset) + 1) : k_begin;
  const int cta_end = min(k_end, cta_key_end(row0, kWarpRowsPerCta, n_q, n_k, causal, q_offset));
  const Tin* kb = k + bh * n_k * D;
  const Tin* vb = v + bh * n_k * D;

  for (int j0 = k_begin; j0 < cta_end; j0 += T::TN) {
    for (int e = threadIdx.x; e < T::TN * D; e += kWarpRowsThreads) {
      const int c = e / D, t = e % D;
      const bool in = j0 + c < k_end;
      const int64_t off = static_cast<int64_t>(j0 + c) * D + t;
      sK[c][t] = in ? to_f32(kb[off]) : 0.f;
      sV[c][t] = in ? to_f32(vb[off]) : 0.f;
    }
    __syncthreads();
    const int c_end = min(T::TN, row_end - j0);  // keys ascend: the causal cut is a prefix
    for (int c = 0; c < c_end; ++c) {
      float part = 0.f;
#pragma unroll
      for (int e = 0; e < T::EPT; ++e) part += qr[e] * sK[c][lane + 32 * e];
      const float s = scale * warp_allreduce_sum(part);
      const SoftmaxStep step = online_softmax_step(st.m, st.l, s);
#pragma unroll
      for (int e = 0; e < T::EPT; ++e) st.o[e] = step.alpha * st.o[e] + step.p * sV[c][lane + 32 * e];
    }
    __syncthreads();  // the tile is overwritten next round
  }
  return st;
}

}  // namespace cuda_ref
