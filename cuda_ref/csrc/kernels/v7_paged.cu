// v7_paged (docs/reference.md §2.7): v6_splitkv with K/V read from paged pools through the per-sequence block
// table (§1.3), per-sequence kv_lens (ragged batches) and a per-sequence causal q_offset. MHA only.
//
// Everything else is v6: grid (ceil(n_q / 8), S, B * H), 256 threads, warp per query row, fp16 pools (host cast on
// every call) widened into fp32 sK, sV [TN][D] (TN 64 / 32, 32 KB), per-key shuffle-reduced dot + online update,
// unnormalised (O, m, l) partials per split, LSE merge. Each key is gathered on its own through the table, so a
// split or a tile may straddle pages. The CTA body is the G = 1 case of the packed-row body the v8 family shares
// (common/paged_warp_rows.cuh): with one query head per KV head, packed row m is query row i, grid.z is (b, h).
// This file also defines the merge every paged generation launches (common/paged.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/merge.cuh"
#include "common/paged.cuh"
#include "common/paged_warp_rows.cuh"

namespace cuda_ref {
namespace {

static_assert(kPagedRowsPerCta == gen_info(Gen::v7_paged).tile_m_d64 &&
                  kPagedRowsPerCta == gen_info(Gen::v7_paged).tile_m_d128 &&
                  PagedRowsTile<64>::TN == gen_info(Gen::v7_paged).tile_n_d64 &&
                  PagedRowsTile<128>::TN == gen_info(Gen::v7_paged).tile_n_d128,
              "generations.def: v7_paged tile columns");
static_assert(sizeof(PagedRowsSmem<64, KvStage::kF32>) == 32768 && sizeof(PagedRowsSmem<128, KvStage::kF32>) == 32768,
              "v7 stages v6's 32 KB fp32 tile");

template <int D>
__global__ void __launch_bounds__(kPagedRowsThreads, kPagedRowsMinCtas) v7_paged_partial_kernel(const PagedArgs a) {
  __shared__ PagedRowsSmem<D, KvStage::kF32> sm;
  paged_rows_partial<D, KvStage::kF32, false>(a, sm);
}

// Grid (n_q, B * H_q), one thread per output dim (v6's merge, §2.0).
__global__ void paged_merge_kernel(const float* __restrict__ o_part, const float* __restrict__ m_part,
                                   const float* __restrict__ l_part, float* __restrict__ out,
                                   float* __restrict__ lse, int n_q, int d, int num_splits) {
  const int t = threadIdx.x;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * n_q + blockIdx.x;
  const int64_t slot0 = row * num_splits;
  const MergedElement r = lse_merge(m_part + slot0, l_part + slot0, o_part + slot0 * d + t, d, num_splits);
  out[row * d + t] = r.out;
  if (lse != nullptr && t == 0) lse[row] = r.lse;
}

}  // namespace

void launch_paged_merge(const AttnParams& p, cudaStream_t stream) {
  const int64_t slots = p.bh() * p.n_q * p.num_splits;
  const float* o_part = p.ws;
  const float* m_part = o_part + slots * p.head_dim;
  const float* l_part = m_part + slots;
  const dim3 grid(p.n_q, static_cast<unsigned>(p.bh()));
  paged_merge_kernel<<<grid, p.head_dim, 0, stream>>>(o_part, m_part, l_part, p.out, p.lse, p.n_q, p.head_dim,
                                                      p.num_splits);
  check_launch("paged split merge");
}

void launch_v7_paged(const AttnParams& p, cudaStream_t stream) {
  if (p.h_q != p.h_kv) throw std::invalid_argument("cuda_ref v7_paged: MHA only (H_q == H_kv)");
  const PagedArgs a = paged_args(p, "v7_paged");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v7_paged_partial_kernel<D><<<paged_grid(p, kPagedRowsPerCta), kPagedRowsThreads, 0, stream>>>(a);
    check_launch("v7_paged partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
