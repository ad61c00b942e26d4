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
  __shared__ SsSmem<D> sm;
  ss_partial<D>(a, sm, [&](const KvRow& r, int t, __half& k, __half& v) {
    k = pool_half(a.k, r.k, t);
    v = pool_half(a.v, r.v, t);
  });
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
