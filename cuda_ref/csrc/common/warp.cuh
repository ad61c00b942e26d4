// Warp-level reductions shared by the warp-per-row kernels (v4, v6).
#pragma once

namespace cuda_ref {

constexpr unsigned kFullMask = 0xffffffffu;

// 5-step XOR butterfly: every lane ends with the full sum (§2.4), so no broadcast is needed afterwards.
__device__ __forceinline__ float warp_allreduce_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

}  // namespace cuda_ref
