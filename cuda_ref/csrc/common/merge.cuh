// The log-sum-exp merge of split-KV partials (docs/reference.md §2.0), shared by every split-KV generation.
#pragma once

#include <cstdint>

#include "online_softmax.cuh"

namespace cuda_ref {

struct MergedElement {
  float out;  // the normalised output element
  float lse;  // the row's log-sum-exp m* + log(l*) (-inf when l* == 0)
};

// Merge of one output element over S unnormalised partials (m_s, l_s, O_s):
//   m* = max m_s,  l* = sum exp(m_s - m*) l_s,  out = sum exp(m_s - m*) O_s / l*   (0 when l* == 0).
// An empty split carries (m = -FLT_MAX, l = 0, O = 0) and so contributes nothing.
__device__ __forceinline__ MergedElement lse_merge(const float* m_s, const float* l_s, const float* o_s,
                                                   int o_stride, int num_splits) {
  float m_star = kInitMax;
  for (int s = 0; s < num_splits; ++s) m_star = fmaxf(m_star, m_s[s]);
  float l_star = 0.f, acc = 0.f;
  for (int s = 0; s < num_splits; ++s) {
    const float w = __expf(m_s[s] - m_star);
    l_star += w * l_s[s];
    acc += w * o_s[static_cast<int64_t>(s) * o_stride];
  }
  return {acc * safe_inv(l_star), row_lse(m_star, l_star)};
}

}  // namespace cuda_ref

