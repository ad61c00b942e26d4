// The split-KV heuristic (docs/reference.md §2.0): how many key splits a decode launch uses.
//
// Integer math only, no CUDA intrinsics: binding.cpp (a plain C++ translation unit) calls it to size the
// workspace. Mirrored by attn_core.splits.choose_splits (Python, behind cuda_ref.choose_splits); a CPU test
// compiles this header and checks the two agree, so change both together.
#pragma once

#include <cuda_runtime.h>  // __host__ __device__ for non-nvcc compilers

#include <cstdint>

#include "generations.cuh"

namespace cuda_ref {

// The constants of attn_core.splits (a CPU test parses these lines and compares). The SM count is the
// device's unless the caller passes one (40 reproduces the reference's T4 plans, §7.3).
constexpr int kSplitCap = 32;         // S_CAP
constexpr int kMinSplitChunk = 256;   // MIN_CHUNK
constexpr int kSplitRowsPerCta = 8;   // ROWS_PER_PROGRAM: query rows of one partial CTA (v6: one per warp)

struct SplitPlan {
  int num_splits;
  int chunk;
};

__host__ __device__ inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// base = CTAs without splitting; aim for 2 CTAs per SM, but never a chunk under 256 keys and never more
// than 32 splits. Prefill (many row tiles) therefore degenerates to S = 1.
__host__ __device__ inline SplitPlan choose_splits(int64_t bh, int64_t n_q, int64_t n_k, int rows_per_cta,
                                                   int num_sm) {
  const int64_t target_blocks = 2 * static_cast<int64_t>(num_sm);
  const int64_t row_tiles = ceil_div64(n_q, rows_per_cta);
  int64_t base = bh * row_tiles;
  if (base < 1) base = 1;
  const int64_t by_occ = ceil_div64(target_blocks, base);
  const int64_t by_size = ceil_div64(n_k, kMinSplitChunk);
  int64_t s = by_occ < by_size ? by_occ : by_size;
  if (s < 1) s = 1;
  if (s > kSplitCap) s = kSplitCap;
  const int64_t chunk = ceil_div64(n_k, s);
  return {static_cast<int>(s), static_cast<int>(chunk)};
}

// The plan a split-KV row launches with (docs/reference.md §2.0, §2.8, §2.9): the heuristic counts the partial
// kernel's CTAs, B*H_kv (one per KV head) x ceil(G*N_q / rows) packed row tiles, rows = the row's tile_m at this
// head dim (8; 16 for v8_gqa_tc). For the MHA rows (v6, v7; G = 1) that is v6's B*H x ceil(N_q / 8). Mirrored by
// cuda_ref.api.split_plan (a CPU test compiles this and compares).
inline SplitPlan split_plan_for(const GenInfo& g, int64_t batch, int64_t h_q, int64_t h_kv, int64_t n_q, int64_t n_k,
                                int64_t head_dim, int num_sm) {
  const int rows = head_dim <= 64 ? g.tile_m_d64 : g.tile_m_d128;
  return choose_splits(batch * h_kv, (h_q / h_kv) * n_q, n_k, rows, num_sm);
}

}  // namespace cuda_ref
