// v6_splitkv (docs/reference.md §2.6): Flash-Decoding. v4's warp-per-row CTA body restricted to one split of the
// keys, writing unnormalised (O, m, l) partials to an fp32 workspace, then an LSE merge (§2.0).
//
// Operands arrive as fp16 (the host casts, as the reference does) and are widened to fp32 in shared memory.
// The split plan (num_splits, split_chunk) comes from choose_splits (common/split_plan.cuh) on the host.
// Workspace layout, query-head shaped: O_partial [BH, n_q, S, D] | m_partial [BH, n_q, S] | l_partial.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/merge.cuh"
#include "common/split_plan.cuh"
#include "common/warp_rows.cuh"

namespace cuda_ref {
namespace {

static_assert(kWarpRowsPerCta == kSplitRowsPerCta, "the split plan counts v6's rows per partial CTA");
static_assert(kWarpRowsPerCta == gen_info(Gen::v6_splitkv).tile_m_d64 &&
                  kWarpRowsPerCta == gen_info(Gen::v6_splitkv).tile_m_d128 &&
                  WarpRowsTile<64>::TN == gen_info(Gen::v6_splitkv).tile_n_d64 &&
                  WarpRowsTile<128>::TN == gen_info(Gen::v6_splitkv).tile_n_d128,
              "generations.def: v6_splitkv tile columns");

// Grid (ceil(n_q / 8), S, BH). A split with no visible key for a row still writes (-FLT_MAX, 0, 0).
template <int D>
__global__ void __launch_bounds__(kWarpRowsThreads, kWarpRowsMinCtas) v6_partial_kernel(const __half* __restrict__ q,
                                                                      const __half* __restrict__ k,
                                                                      const __half* __restrict__ v,
                                                                      float* __restrict__ o_part,
                                                                      float* __restrict__ m_part,
                                                                      float* __restrict__ l_part, int n_q, int n_k,
                                                                      int chunk, float scale, bool causal,
                                                                      int q_offset) {
  using T = WarpRowsTile<D>;
  __shared__ float sK[T::TN][D];
  __shared__ float sV[T::TN][D];
  const int split = blockIdx.y, num_splits = gridDim.y;
  const int64_t bh = blockIdx.z;
  const int row0 = blockIdx.x * kWarpRowsPerCta;
  const int64_t k_begin64 = static_cast<int64_t>(split) * chunk;
  const int k_begin = static_cast<int>(k_begin64 < n_k ? k_begin64 : n_k);
  const int k_end = static_cast<int>(k_begin64 + chunk < n_k ? k_begin64 + chunk : n_k);
  const WarpRowState<D> st =
      warp_rows_attend<D, __half>(q, k, v, bh, row0, n_q, n_k, k_begin, k_end, scale, causal, q_offset, sK, sV);
  const int i = row0 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (i >= n_q) return;
  const int64_t slot = (bh * n_q + i) * num_splits + split;
#pragma unroll
  for (int e = 0; e < T::EPT; ++e) o_part[slot * D + lane + 32 * e] = st.o[e];
  if (lane == 0) {
    m_part[slot] = st.m;
    l_part[slot] = st.l;
  }
}

// Grid (n_q, BH), one thread per output dim; each recomputes the split-wide max and denominator. With lse
// set, thread 0 also stores the row's merged log-sum-exp m* + log(l*).
__global__ void v6_merge_kernel(const float* __restrict__ o_part, const float* __restrict__ m_part,
                                const float* __restrict__ l_part, float* __restrict__ out, float* __restrict__ lse,
                                int n_q, int d, int num_splits) {
  const int t = threadIdx.x;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * n_q + blockIdx.x;
  const int64_t slot0 = row * num_splits;
  const MergedElement r = lse_merge(m_part + slot0, l_part + slot0, o_part + slot0 * d + t, d, num_splits);
  out[row * d + t] = r.out;
  if (lse != nullptr && t == 0) lse[row] = r.lse;
}

}  // namespace

void launch_v6_splitkv(const AttnParams& p, cudaStream_t stream) {
  const int num_splits = p.num_splits;
  if (num_splits < 1 || num_splits > kSplitCap || p.split_chunk < 1 ||
      static_cast<int64_t>(num_splits) * p.split_chunk < p.n_k) {
    throw std::invalid_argument("cuda_ref v6_splitkv: split plan does not cover the keys");
  }
  if (p.bh() > 65535) throw std::invalid_argument("cuda_ref v6_splitkv: B*H must be <= 65535 (grid limit)");
  const int64_t slots = p.bh() * p.n_q * num_splits;
  float* o_part = p.ws;
  float* m_part = o_part + slots * p.head_dim;
  float* l_part = m_part + slots;
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    const dim3 grid((p.n_q + kWarpRowsPerCta - 1) / kWarpRowsPerCta, num_splits, static_cast<unsigned>(p.bh()));
    v6_partial_kernel<D><<<grid, kWarpRowsThreads, 0, stream>>>(
        static_cast<const __half*>(p.q), static_cast<const __half*>(p.k), static_cast<const __half*>(p.v), o_part,
        m_part, l_part, p.n_q, p.n_k, p.split_chunk, p.scale, p.causal, p.q_offset);
    check_launch("v6_splitkv partial");
  });
  const dim3 merge_grid(p.n_q, static_cast<unsigned>(p.bh()));
  v6_merge_kernel<<<merge_grid, p.head_dim, 0, stream>>>(o_part, m_part, l_part, p.out, p.lse, p.n_q,
                                                         p.head_dim, num_splits);
  check_launch("v6_splitkv merge");
}

}  // namespace cuda_ref
