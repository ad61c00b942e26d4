// v8_gqa_ss, "v8.7" (docs/reference.md §2.13): Cut 1's contract (same grid (ceil(G * n_q / 8), S, B * H_kv), 256
// threads, warp per packed row, packed-row math, partials, merge) with a score-stationary inner loop.
//
// Shared memory, all fp16 (fp32 on read): sQ [8][D] (each active warp copies its q row), sKt [D][TN + 1] (K
// TRANSPOSED, one element of padding), sV [TN][D]: 17,536 B at D = 64 (TN 64), 18,688 B at D = 128 (TN 32).
// Per staged tile, for each 32-key group g < TN / 32: lane l owns key c = 32 g + l and, if c < c_lim, computes the
// FULL D-long dot of its warp's query (broadcast reads of sQ) with column c of sKt in its own registers, times
// scale (invalid lanes: -inf); one warp max-reduction gives m_tile; p = exp(s - m_new) (0 if invalid); one warp
// sum-reduction gives l_tile; alpha = exp(m - m_new), l = alpha l + l_tile, O *= alpha; then PV as a broadcast:
// for each key cc of the group one shuffle brings p_cc from lane cc and every lane adds p_cc * V[32 g + cc][t] for
// its output dims t = lane + 32 e. The recurrence steps once per 32 keys, and QK needs no cross-lane reduction.
// Host: the device's SM count by default (num_sm knob), B*H_q <= 65535 (common/paged.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/online_softmax.cuh"
#include "common/paged.cuh"
#include "common/warp.cuh"

namespace cuda_ref {
namespace {

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
static_assert(kSsRows == gen_info(Gen::v8_gqa_ss).tile_m_d64 && kSsRows == gen_info(Gen::v8_gqa_ss).tile_m_d128 &&
                  SsTile<64>::TN == gen_info(Gen::v8_gqa_ss).tile_n_d64 &&
                  SsTile<128>::TN == gen_info(Gen::v8_gqa_ss).tile_n_d128,
              "generations.def: v8_gqa_ss tile columns");

template <int D>
__global__ void __launch_bounds__(kSsThreads) v8_gqa_ss_partial_kernel(const PagedArgs a) {
  using T = SsTile<D>;
  __shared__ SsSmem<D> sm;
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
    // Gather: consecutive threads take consecutive t of one key (coalesced pool reads); K lands transposed.
    for (int e = threadIdx.x; e < T::TN * D; e += kSsThreads) {
      const int c = e / D, t = e % D;
      if (j0 + c < kr.end) {
        const KvRow r = paged_kv_row(a, seq, h_kv, j0 + c);
        sm.kt[t][c] = pool_half(a.k, r.k, t);
        sm.v[c][t] = pool_half(a.v, r.v, t);
      } else {
        sm.kt[t][c] = zero;
        sm.v[c][t] = zero;
      }
    }
    __syncthreads();

    const int c_lim = min(T::TN, row_end - j0);  // warp-uniform; the visible keys are a prefix
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
        s = a.scale * dot;
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
    __syncthreads();  // the tile is overwritten next round
  }

  if (!row.active) return;
  const int64_t slot = partial_slot(a, b, row.h_q, row.i_q, split);
#pragma unroll
  for (int e = 0; e < T::EPT; ++e) a.o_part[slot * D + lane + 32 * e] = o[e];
  if (lane == 0) {
    a.m_part[slot] = m_run;
    a.l_part[slot] = l_run;
  }
}

}  // namespace

void launch_v8_gqa_ss(const AttnParams& p, cudaStream_t stream) {
  const PagedArgs a = paged_args(p, "v8_gqa_ss");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v8_gqa_ss_partial_kernel<D><<<paged_grid(p, kSsRows), kSsThreads, 0, stream>>>(a);
    check_launch("v8_gqa_ss partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
