// The causal convention, once (DESIGN.md decision 5): top-left, key j visible to query i iff
// j <= i + q_offset. Kernels walk keys in ascending order, so "visible" is always a prefix [0, last].
#pragma once

namespace cuda_ref {

// Index of the last key query row i may see (n_k - 1 when not causal). Never below 0 for i, q_offset >= 0.
__host__ __device__ __forceinline__ int last_visible_key(int i, int n_k, bool causal, int q_offset) {
  if (!causal) return n_k - 1;
  const long long last = static_cast<long long>(i) + q_offset;
  return last < n_k - 1 ? static_cast<int>(last) : n_k - 1;
}

// One past the last key any row of [row0, row0 + rows) can see (rows clipped to n_q): the key loop bound
// of a CTA. Blocks past it are fully masked for every row and are skipped.
__host__ __device__ __forceinline__ int cta_key_end(int row0, int rows, int n_q, int n_k, bool causal,
                                                    int q_offset) {
  int last_row = row0 + rows - 1;
  if (last_row > n_q - 1) last_row = n_q - 1;
  return last_visible_key(last_row, n_k, causal, q_offset) + 1;
}

}  // namespace cuda_ref
