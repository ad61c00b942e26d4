// MLA latent-KV decode (docs/reference.md §2.16, §2.17): what v11_mla and v12_mla_tc share.
//
// Absorbed MLA is MQA over one latent head: q [B, h_q, n_q, DQK] (content part q_nope·W_UK, then q_rope), one
// latent pool [num_blocks, page_size, 1, DQK] that is both K (all DQK columns) and V (its first DV = kv_lora_rank
// columns), out [B, h_q, n_q, DV] fp32. The paged machinery is v8's with H_kv = 1 and G = h_q (common/paged.cuh):
// grid (ceil(h_q·n_q / rows), S, B), packed rows head-major, the bounds-checked block-table walk (a bad entry or
// kv_len loads NaN, never a read outside the pool; reported in debug mode), the split plan, the FP32 (O, m, l)
// partials [B, h_q, n_q, S, DV] and v7's LSE merge with DV threads. The binding sets AttnParams::head_dim = DV so
// the workspace and the merge have the output width.
//
// Latent storage (AttnParams::kv_dtype): fp16 or bf16 elements; fp8 E4M3 bytes (value = e4m3 · k_scale); NVFP4
// packed nibbles [.., DQK/2] + E4M3 micro-scales [.., DQK/16] (value = (±level · e4m3(micro)) · k_scale), the
// formats of common/paged_quant.cuh, byte-identical to attn_core.formats.
//
// Templates: (DQK, DV) ∈ {(96, 64), (160, 128), (576, 512)} only (§2.16), TN = 32 keys per tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "paged.cuh"
#include "paged_quant.cuh"
#include "params.cuh"

namespace cuda_ref {

constexpr int kMlaTileN = 32;  // keys per staged latent tile (both generations)

// The latent formats a kernel instance reads (one template instance per format).
enum class LatentFormat : int { kF16 = 0, kBF16 = 1, kFp8 = 2, kNvfp4 = 3 };

// What both MLA partial kernels read, by value. `base` is the paged block with H_kv = 1 (q is reinterpreted by
// the kernel as its q type; base.k/v are null); its ks are the element (= byte for fp8 / NVFP4 packed) strides of
// the latent data pool: block, head (unused, H_kv = 1), token-in-page.
struct MlaArgs {
  PagedArgs base;
  const void* lat;        // latent data pool: fp16 / bf16 elements, fp8 bytes or NVFP4 packed bytes
  const uint8_t* micro;   // NVFP4: contiguous [num_blocks, page_size, 1, DQK/16]; else null
  float lat_scale;        // fp8 / NVFP4 per-tensor scale (1 for fp16 / bf16)
  const void* q;          // [B, h_q, n_q, DQK] in the kernel's q type (AttnParams::q_dtype)
};

inline LatentFormat latent_format(KvDtype d) {
  switch (d) {
    case KvDtype::kF16: return LatentFormat::kF16;
    case KvDtype::kBF16: return LatentFormat::kBF16;
    case KvDtype::kFp8E4M3: return LatentFormat::kFp8;
    case KvDtype::kNvfp4: return LatentFormat::kNvfp4;
    default: break;
  }
  throw std::invalid_argument("cuda_ref MLA: the latent must be fp16, bf16, fp8 E4M3 or NVFP4");
}

// Host: check what the binding filled and derive the kernels' block. Throws std::invalid_argument.
inline MlaArgs mla_args(const AttnParams& p, const char* who) {
  const std::string w = std::string("cuda_ref ") + who + ": ";
  if (p.h_kv != 1) throw std::invalid_argument(w + "MLA has one latent head (H_kv = 1)");
  if (p.d_qk < 1 || p.d_v < 1 || p.d_v > p.d_qk || p.head_dim != p.d_v || p.kv_lora_rank != p.d_v ||
      p.rope_dim != p.d_qk - p.d_v) {
    throw std::invalid_argument(w + "inconsistent MLA widths (d_qk, d_v = kv_lora_rank = head_dim, rope_dim)");
  }
  if (p.q == nullptr || p.k == nullptr) throw std::invalid_argument(w + "q and the latent pool must be set");
  AttnParams f = p;
  f.kv_dtype = KvDtype::kF16;  // paged_args checks the table, shape, plan and workspace, not the latent bytes
  MlaArgs a;
  a.base = paged_args(f, who);
  a.base.q = nullptr;
  a.base.k = nullptr;
  a.base.v = nullptr;
  a.lat = p.k;
  a.q = p.q;
  a.micro = nullptr;
  a.lat_scale = 1.f;
  const LatentFormat fmt = latent_format(p.kv_dtype);
  if (fmt == LatentFormat::kFp8 || fmt == LatentFormat::kNvfp4) a.lat_scale = p.k_scale;
  if (fmt == LatentFormat::kNvfp4) {
    if (p.k_micro_scales == nullptr) throw std::invalid_argument(w + "NVFP4 needs the micro-scale pool");
    if (p.d_qk % 32 != 0) throw std::invalid_argument(w + "NVFP4 needs DQK a multiple of 32");
    const int64_t w2 = p.d_qk / 2;  // the micro offset of a row is its packed offset / 8: contiguous pools only
    if (p.k_strides.row != w2 || p.k_strides.batch != static_cast<int64_t>(p.page_size) * w2) {
      throw std::invalid_argument(w + "NVFP4 latent pools must be contiguous [num_blocks, page_size, 1, DQK/2]");
    }
    a.micro = p.k_micro_scales;
  }
  return a;
}

// --- device: one latent element as fp32 (row = data-pool offset of the key's row, -1 = bad -> NaN) -----------

template <LatentFormat F>
__device__ __forceinline__ float latent_value(const MlaArgs& a, int64_t row, int t) {
  if (row < 0) return paged_nan();
  if constexpr (F == LatentFormat::kF16) {
    return __half2float(static_cast<const __half*>(a.lat)[row + t]);
  } else if constexpr (F == LatentFormat::kBF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(a.lat)[row + t]);
  } else if constexpr (F == LatentFormat::kFp8) {
    return e4m3_to_float(static_cast<const uint8_t*>(a.lat)[row + t]) * a.lat_scale;
  } else {
    const uint32_t byte = static_cast<const uint8_t*>(a.lat)[row + (t >> 1)];
    const uint32_t nib = (t & 1) ? byte >> 4 : byte & 15u;
    const float ms = e4m3_to_float(a.micro[(row >> 3) + (t / kNvfp4Block)]);  // row / 8: see mla_args
    return (e2m1_to_float(nib) * ms) * a.lat_scale;  // left to right, as the judge
  }
}

}  // namespace cuda_ref

// Runs the body with constexpr DQK_NAME / DV_NAME for the three §2.16 templates; anything else throws (the
// Python layer and the binding reject it first with NotImplementedError).
#define CUDA_REF_SWITCH_MLA_DIMS(d_qk, d_v, DQK_NAME, DV_NAME, ...)                                        \
  [&] {                                                                                                   \
    if ((d_qk) == 96 && (d_v) == 64) {                                                                    \
      constexpr int DQK_NAME = 96, DV_NAME = 64;                                                          \
      return __VA_ARGS__();                                                                               \
    } else if ((d_qk) == 160 && (d_v) == 128) {                                                           \
      constexpr int DQK_NAME = 160, DV_NAME = 128;                                                        \
      return __VA_ARGS__();                                                                               \
    } else if ((d_qk) == 576 && (d_v) == 512) {                                                           \
      constexpr int DQK_NAME = 576, DV_NAME = 512;                                                        \
      return __VA_ARGS__();                                                                               \
    } else {                                                                                              \
      throw std::invalid_argument("cuda_ref MLA: (DQK, DV) = (" + std::to_string(d_qk) + ", " +           \
                                  std::to_string(d_v) + ") is not a template; (96, 64), (160, 128), (576, 512)"); \
    }                                                                                                     \
  }()
