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
#include "common/ss_tile.cuh"
#include "common/warp.cuh"

namespace cuda_ref {
namespace {

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
    ss_tile_steps<D>(sm, warp, lane, c_lim, a.scale, m_run, l_run, o);
    __syncthreads();  // the tile is overwritten next round
  }

  if (!row.active) return;
  const int64_t slot = partial_slot(a, b, row.h_q, row.i_q, split);
  ss_store_partial<D>(a.o_part, a.m_part, a.l_part, slot, lane, o, m_run, l_run);
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
