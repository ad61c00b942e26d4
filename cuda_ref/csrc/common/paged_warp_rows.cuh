// The paged warp-per-packed-row CTA body of v7_paged, v8_gqa ("Cut 1") and its three arms v8_gqa_db,
// v8_gqa_occ, v8_gqa_ilp (docs/reference.md §2.7, §2.8, §2.10-§2.12). One template, three knobs, so each
// generation is its parent plus the one thing it changes:
//
//   KvStage::kF32        Cut 1: the K/V tile staged as fp32 sK, sV [TN][D] (32 KB), one buffer     v7, v8_gqa, _ilp
//   KvStage::kF16        one fp16 tile (16 KB), fp16 -> fp32 at read                                  v8_gqa_occ
//   KvStage::kF16Double  two fp16 tiles (32 KB): tile t+1 is loaded into the other buffer before     v8_gqa_db
//                        computing on tile t, one barrier per iteration (ordinary loads, no cp.async)
//   kIlp = true          keys in groups of KU = 4: four independent dots and shuffle reductions,     v8_gqa_ilp
//                        then the four online-softmax updates in order
//
// 256 threads = 8 warps; warp w owns packed row m = 8 * blockIdx.x + w (common/paged.cuh). Lane owns elements
// t = lane + 32 e (e < D / 32) of its row's q and O. The whole CTA gathers each key tile of TN keys (64 at D = 64,
// 32 at D = 128) of KV head h_kv through the block table, key by key, zero past the split's end; then each warp
// walks its visible prefix of the tile key by key: lane partial dot -> XOR-butterfly all-reduce -> * scale ->
// online-softmax update. Output: the unnormalised (O, m, l) of each active row for this split.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "online_softmax.cuh"
#include "paged.cuh"
#include "warp.cuh"

namespace cuda_ref {

constexpr int kPagedRowsThreads = 256;
constexpr int kPagedRowsPerCta = kPagedRowsThreads / 32;  // 8 packed rows per CTA
// Minimum resident CTAs for __launch_bounds__: as v4/v6 (warp_rows.cuh), 5 keeps D = 128 free of spills.
constexpr int kPagedRowsMinCtas = 5;
constexpr int kIlpKeys = 4;  // KU of v8_gqa_ilp

enum class KvStage { kF32, kF16, kF16Double };

template <int D>
struct PagedRowsTile {
  static constexpr int TN = D == 64 ? 64 : 32;
  static constexpr int EPT = D / 32;
};

// Static shared memory of one CTA.
template <int D, KvStage S>
struct PagedRowsSmem;
template <int D>
struct PagedRowsSmem<D, KvStage::kF32> {
  static constexpr int kBuffers = 1;
  float k[1][PagedRowsTile<D>::TN][D];
  float v[1][PagedRowsTile<D>::TN][D];
};
template <int D>
struct PagedRowsSmem<D, KvStage::kF16> {
  static constexpr int kBuffers = 1;
  __half k[1][PagedRowsTile<D>::TN][D];
  __half v[1][PagedRowsTile<D>::TN][D];
};
template <int D>
struct PagedRowsSmem<D, KvStage::kF16Double> {
  static constexpr int kBuffers = 2;
  __half k[2][PagedRowsTile<D>::TN][D];
  __half v[2][PagedRowsTile<D>::TN][D];
};

__device__ __forceinline__ void stage_store(float& dst, float x) { dst = x; }
__device__ __forceinline__ void stage_store(__half& dst, float x) { dst = __float2half(x); }
__device__ __forceinline__ float stage_load(float x) { return x; }
__device__ __forceinline__ float stage_load(__half x) { return __half2float(x); }

// The whole CTA gathers keys [j0, j0 + TN) of KV head h into buffer `buf`; keys at or past `end` are zero, keys
// on a bad page NaN. fp16 pools; fp32 staging widens here, fp16 staging keeps the bits.
template <int D, KvStage S>
__device__ __forceinline__ void paged_rows_stage(const PagedArgs& a, const SeqView& seq, int h, int j0, int end,
                                                 PagedRowsSmem<D, S>& sm, int buf) {
  constexpr int TN = PagedRowsTile<D>::TN;
  for (int e = threadIdx.x; e < TN * D; e += kPagedRowsThreads) {
    const int c = e / D, t = e % D;
    if (j0 + c < end) {
      const KvRow r = paged_kv_row(a, seq, h, j0 + c);
      if constexpr (S == KvStage::kF32) {
        sm.k[buf][c][t] = pool_float(a.k, r.k, t);
        sm.v[buf][c][t] = pool_float(a.v, r.v, t);
      } else {
        sm.k[buf][c][t] = pool_half(a.k, r.k, t);
        sm.v[buf][c][t] = pool_half(a.v, r.v, t);
      }
    } else {
      stage_store(sm.k[buf][c][t], 0.f);
      stage_store(sm.v[buf][c][t], 0.f);
    }
  }
}

template <int D>
struct PagedRowState {
  float o[PagedRowsTile<D>::EPT];
  float m, l;
};

// One warp over keys [0, c_lim) of a staged tile: the per-key loop of Cut 1 / v7 / v4.
template <int D, typename Tk>
__device__ __forceinline__ void paged_rows_keys(PagedRowState<D>& st, const float* qr, Tk (*sk)[D],
                                                Tk (*sv)[D], int c_lim, float scale) {
  constexpr int EPT = PagedRowsTile<D>::EPT;
  const int lane = threadIdx.x % 32;
  for (int c = 0; c < c_lim; ++c) {
    float part = 0.f;
#pragma unroll
    for (int e = 0; e < EPT; ++e) part += qr[e] * stage_load(sk[c][lane + 32 * e]);
    const float s = scale * warp_allreduce_sum(part);
    const SoftmaxStep step = online_softmax_step(st.m, st.l, s);
#pragma unroll
    for (int e = 0; e < EPT; ++e) st.o[e] = step.alpha * st.o[e] + step.p * stage_load(sv[c][lane + 32 * e]);
  }
}

// v8_gqa_ilp's loop: groups of KU = 4 keys, the four dots and butterflies interleaved (independent shuffles in
// flight), then the four updates in key order; the last group holds c_lim % 4 keys (warp-uniform guards).
template <int D, typename Tk>
__device__ __forceinline__ void paged_rows_keys_ilp(PagedRowState<D>& st, const float* qr, Tk (*sk)[D],
                                                    Tk (*sv)[D], int c_lim, float scale) {
  constexpr int EPT = PagedRowsTile<D>::EPT;
  const int lane = threadIdx.x % 32;
  for (int c0 = 0; c0 < c_lim; c0 += kIlpKeys) {
    const int n = min(kIlpKeys, c_lim - c0);
    float part[kIlpKeys];
#pragma unroll
    for (int u = 0; u < kIlpKeys; ++u) {
      part[u] = 0.f;
      if (u < n) {
#pragma unroll
        for (int e = 0; e < EPT; ++e) part[u] += qr[e] * stage_load(sk[c0 + u][lane + 32 * e]);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
      for (int u = 0; u < kIlpKeys; ++u) part[u] += __shfl_xor_sync(kFullMask, part[u], offset);
    }
#pragma unroll
    for (int u = 0; u < kIlpKeys; ++u) {
      if (u < n) {
        const SoftmaxStep step = online_softmax_step(st.m, st.l, scale * part[u]);
#pragma unroll
        for (int e = 0; e < EPT; ++e) {
          st.o[e] = step.alpha * st.o[e] + step.p * stage_load(sv[c0 + u][lane + 32 * e]);
        }
      }
    }
  }
}

// The partial kernel's body: grid (ceil(G * n_q / 8), S, B * H_kv), 256 threads. Every thread must call it.
template <int D, KvStage S, bool kIlp>
__device__ __forceinline__ void paged_rows_partial(const PagedArgs& a, PagedRowsSmem<D, S>& sm) {
  using T = PagedRowsTile<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.z / a.h_kv, h_kv = blockIdx.z % a.h_kv;
  const int split = blockIdx.y;
  const int m0 = blockIdx.x * kPagedRowsPerCta;
  const SeqView seq = seq_view(a, b);
  const KeyRange kr = split_keys(a, seq, split);
  const PackedRow row = packed_row(a, h_kv, m0 + warp);

  PagedRowState<D> st;
  st.m = kInitMax;
  st.l = 0.f;
  float qr[T::EPT];
  const __half* qp = q_row(a, b, row.h_q, row.i_q);
#pragma unroll
  for (int e = 0; e < T::EPT; ++e) {
    st.o[e] = 0.f;
    qr[e] = row.active ? __half2float(qp[lane + 32 * e]) : 0.f;
  }
  const int row_end = row.active ? visible_end(a, seq, kr, row.i_q) : kr.begin;
  const int cta_end = visible_end(a, seq, kr, packed_max_iq(m0, kPagedRowsPerCta, a.group * a.n_q, a.n_q));

  if constexpr (S == KvStage::kF16Double) {
    int buf = 0;
    if (kr.begin < cta_end) paged_rows_stage<D, S>(a, seq, h_kv, kr.begin, kr.end, sm, 0);
    __syncthreads();
    for (int j0 = kr.begin; j0 < cta_end; j0 += T::TN) {
      // Tile t+1 into the other buffer (free since the barrier that ended iteration t-1), then tile t.
      if (j0 + T::TN < cta_end) paged_rows_stage<D, S>(a, seq, h_kv, j0 + T::TN, kr.end, sm, buf ^ 1);
      const int c_lim = min(T::TN, row_end - j0);  // keys ascend: the visible keys are a prefix
      if constexpr (kIlp) {
        paged_rows_keys_ilp<D>(st, qr, sm.k[buf], sm.v[buf], c_lim, a.scale);
      } else {
        paged_rows_keys<D>(st, qr, sm.k[buf], sm.v[buf], c_lim, a.scale);
      }
      __syncthreads();  // the one barrier: tile t+1 visible, tile t free for t+2
      buf ^= 1;
    }
  } else {
    for (int j0 = kr.begin; j0 < cta_end; j0 += T::TN) {
      paged_rows_stage<D, S>(a, seq, h_kv, j0, kr.end, sm, 0);
      __syncthreads();
      const int c_lim = min(T::TN, row_end - j0);
      if constexpr (kIlp) {
        paged_rows_keys_ilp<D>(st, qr, sm.k[0], sm.v[0], c_lim, a.scale);
      } else {
        paged_rows_keys<D>(st, qr, sm.k[0], sm.v[0], c_lim, a.scale);
      }
      __syncthreads();  // the tile is overwritten next round
    }
  }

  if (!row.active) return;
  const int64_t slot = partial_slot(a, b, row.h_q, row.i_q, split);
#pragma unroll
  for (int e = 0; e < T::EPT; ++e) a.o_part[slot * D + lane + 32 * e] = st.o[e];
  if (lane == 0) {
    a.m_part[slot] = st.m;
    a.l_part[slot] = st.l;
  }
}

}  // namespace cuda_ref
