// The one parameter block every cuda_ref launcher takes (DESIGN.md: one params struct, one binding).
//
// Kept free of torch on purpose: the kernels compile with plain nvcc on a machine without torch or a GPU,
// and only binding.cpp knows about tensors. All tensors are contiguous BHND ([B, H, N, D], ORIGINAL.md
// §1.1); the binding makes them so before filling this struct.
#pragma once

#include <cstdint>

namespace cuda_ref {

// Generation ids as the binding and Python pass them (order of ORIGINAL.md §2). Stable: Python mirrors it.
enum class Gen : int {
  kV1Naive = 1,
  kV2Tiled = 2,
  kV3Online = 3,
  kV4Fused = 4,
  kV5Wmma = 5,
  kV6SplitKV = 6,
};

struct AttnParams {
  // Operands. fp32 for v1-v4; fp16 (host-cast, §2.5/§2.6) for v5/v6.
  const void* q = nullptr;  // [B, H, n_q, D]
  const void* k = nullptr;  // [B, H, n_k, D]
  const void* v = nullptr;  // [B, H, n_k, D]
  float* out = nullptr;     // [B, H, n_q, D], always fp32 (§1.1)

  // Generation-owned HBM scratch, sized by workspace_floats(): S for v1/v2, row stats for v3,
  // split partials for v6. Owned by the caller so the binding can poison it in debug mode.
  float* ws = nullptr;

  int batch = 0;
  int heads = 0;  // H_q == H_kv: v1-v6 are MHA
  int n_q = 0;
  int n_k = 0;
  int head_dim = 0;

  float scale = 0.f;  // applied to the fp32 dot, after it (§8)
  bool causal = false;
  // Top-left causal: key j visible to query i iff j <= i + q_offset. The reference's v1-v6 have no
  // q_offset (it is always 0 there); we take it in all six as a deliberate extension.
  int q_offset = 0;

  // v6 only: the split plan (choose_splits, split_plan.cuh), decided by the host so it can size the workspace.
  int num_splits = 1;
  int split_chunk = 0;

  int64_t bh() const { return static_cast<int64_t>(batch) * heads; }
};

}  // namespace cuda_ref
