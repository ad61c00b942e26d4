// The online-softmax update (docs/reference.md §2.0), written once for every fused generation.
//
// State per query row, fp32: running max m (starts at -FLT_MAX, a large finite negative rather than -inf
// so that m - m_new never forms inf - inf), denominator l (0) and the unnormalised output O (0).
// Exponentials are the fast __expf, as in the reference.
#pragma once

#include <math_constants.h>

#include <cfloat>

namespace cuda_ref {

constexpr float kInitMax = -FLT_MAX;

struct SoftmaxStep {
  float alpha;  // factor for the old O and l
  float p;      // weight of the new key
};

// One key with score s: m_new = max(m, s); O must then become alpha * O + p * v (rescale before adding).
__device__ __forceinline__ SoftmaxStep online_softmax_step(float& m, float& l, float s) {
  const float m_new = fmaxf(m, s);
  const float alpha = __expf(m - m_new);
  const float p = __expf(s - m_new);
  l = alpha * l + p;
  m = m_new;
  return {alpha, p};
}

// Block form (v5): fold a block's row max in first; returns alpha for the old O and l. The caller then
// adds the block's p = exp(s - m) to l (l = alpha * l + sum p).
__device__ __forceinline__ float online_softmax_rescale(float& m, float block_max) {
  const float m_new = fmaxf(m, block_max);
  const float alpha = __expf(m - m_new);
  m = m_new;
  return alpha;
}

// Final normalisation; a row that saw no key (l == 0) yields 0, never NaN (§8).
__device__ __forceinline__ float safe_inv(float l) { return l > 0.f ? 1.f / l : 0.f; }

// The row's natural-log log-sum-exp of the scaled scores from its final statistics: m + log(l), where
// m is the running max and l = sum exp(s - m). -inf for a row that saw no key (l == 0). The accurate logf,
// not __logf: one call per row.
__device__ __forceinline__ float row_lse(float m, float l) { return l > 0.f ? m + logf(l) : -CUDART_INF_F; }

}  // namespace cuda_ref
