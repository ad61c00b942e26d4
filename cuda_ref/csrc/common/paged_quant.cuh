// Quantized paged KV (docs/reference.md §1.4, §2.14, §2.15): what v9_fp8 and v10_nvfp4 share. Both are
// v8_gqa_ss (§2.13) with ONE change: the paged gather reads quantized pool bytes and dequantizes them into the
// staged fp16 tile; the score-stationary math after the barrier is v8_gqa_ss's, line for line.
//
// Formats (byte-identical to attn_core.formats / cuda_ref.quant, which produce the pools):
//   fp8 E4M3  pool uint8 [num_blocks, page_size, H_kv, D]; value = e4m3(byte) * k_scale (resp. v_scale), in fp32
//   NVFP4     packed uint8 [num_blocks, page_size, H_kv, D/2] (element 2i in the low nibble of byte i, 2i+1 in
//             the high one; nibble = sign << 3 | E2M1 magnitude code) and micro uint8 [..., D/16] (one E4M3
//             scale per 16 consecutive elements of the head dim); value = (±level * e4m3(micro)) * scale, in
//             fp32, left to right as the judge. E2M1 levels: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
// The fp32 value is rounded to fp16 (round to nearest even) when it is stored in the tile, as the fp16 pool of
// v8_gqa_ss would have been by the host cast; a value beyond fp16's range becomes ±inf there (only possible
// for a pool whose original |x| exceeded 65504).
//
// Shared memory and geometry are v8_gqa_ss's: sQ [8][D], sKt [D][TN + 1], sV [TN][D] in fp16, 17,536 B at
// D = 64 (TN 64) and 18,688 B at D = 128 (TN 32); 256 threads, warp per packed row, grid
// (ceil(G * n_q / 8), S, B * H_kv). Bounds: as every paged kernel (common/paged.cuh), a bad block-table entry or
// kv_len loads NaN, never a read outside the pools.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "online_softmax.cuh"
#include "paged.cuh"
#include "ss_tile.cuh"
#include "params.cuh"
#include "warp.cuh"

namespace cuda_ref {

// v8_gqa_ss's geometry and shared memory, unchanged (common/ss_tile.cuh): the tile stays fp16, dequantization
// happens before the store.
constexpr int kQuantThreads = kSsThreads;
constexpr int kQuantRows = kSsRows;             // 8 packed rows per CTA, one per warp
constexpr int kNvfp4Block = 16;                 // elements per micro-scale
template <int D>
using QuantTile = SsTile<D>;
template <int D>
using QuantSmem = SsSmem<D>;

// What the quantized partial kernels read. `base` is the paged block of every v8 kernel (q, table, lens,
// offsets, partials, split plan); its k/v are null and its ks/vs are the element (= byte) strides of the K/V
// data pools (fp8: [.., D]; NVFP4: the packed [.., D/2]).
struct QuantPagedArgs {
  PagedArgs base;
  const uint8_t* k;        // fp8 bytes / NVFP4 packed nibbles
  const uint8_t* v;
  const uint8_t* k_micro;  // NVFP4: contiguous [num_blocks, page_size, H_kv, D/16]; fp8: null
  const uint8_t* v_micro;
  float k_scale, v_scale;  // per-tensor scales (fp32, as the quantizer stored them)
};

// Host: the quantized block from the binding's AttnParams. Throws std::invalid_argument.
inline QuantPagedArgs quant_paged_args(const AttnParams& p, KvDtype want, const char* who) {
  const std::string w = std::string("cuda_ref ") + who + ": ";
  if (p.kv_dtype != want) throw std::invalid_argument(w + "wrong kv_dtype for this generation");
  AttnParams f = p;
  f.kv_dtype = KvDtype::kF16;  // paged_args' checks are about the table, shape and plan, not the KV bytes
  QuantPagedArgs a;
  a.base = paged_args(f, who);
  a.base.k = nullptr;
  a.base.v = nullptr;
  a.k = static_cast<const uint8_t*>(p.k);
  a.v = static_cast<const uint8_t*>(p.v);
  a.k_micro = nullptr;
  a.v_micro = nullptr;
  a.k_scale = p.k_scale;
  a.v_scale = p.v_scale;
  if (want == KvDtype::kNvfp4) {
    if (p.k_micro_scales == nullptr || p.v_micro_scales == nullptr) {
      throw std::invalid_argument(w + "NVFP4 needs k_micro_scales and v_micro_scales");
    }
    if (p.head_dim % (2 * kNvfp4Block) != 0) throw std::invalid_argument(w + "D must be a multiple of 32");
    // The micro offset of a row is its packed offset / 8 (= (D/2) / (D/16)): both pools must be contiguous.
    const int64_t w2 = p.head_dim / 2;
    for (const Strides* s : {&p.k_strides, &p.v_strides}) {
      if (s->head != w2 || s->row != p.h_kv * w2 || s->batch != static_cast<int64_t>(p.page_size) * p.h_kv * w2) {
        throw std::invalid_argument(w + "NVFP4 pools must be contiguous [num_blocks, page_size, H_kv, D/2]");
      }
    }
    a.k_micro = p.k_micro_scales;
    a.v_micro = p.v_micro_scales;
  }
  return a;
}

// --- the decoders (exact; every result is a float32 the judge's table also holds) --------------------------
// __host__ __device__ so tests/test_cuda_quant_cpu.py runs them on the CPU against attn_core.formats.

__host__ __device__ __forceinline__ float quant_bits_to_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// E4M3 byte -> float: s eeee mmm, bias 7; e = 0 subnormal m * 2^-9; 0x7F / 0xFF NaN; no infinities.
__host__ __device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float mag;
  if (e == 0u) {
    mag = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
  } else if (e == 15u && m == 7u) {
    mag = quant_bits_to_float(0x7fc00000u);
  } else {
    mag = quant_bits_to_float(((e + 120u) << 23) | (m << 20));  // 2^(e-7) * (1 + m/8): float exponent e - 7 + 127
  }
  return (b & 0x80u) ? -mag : mag;
}

// E2M1 nibble (sign << 3 | code) -> ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}: code = e e m, e = 0 gives m * 0.5.
__host__ __device__ __forceinline__ float e2m1_to_float(uint32_t nib) {
  const uint32_t e = (nib >> 1) & 3u, m = nib & 1u;
  const float mag = e == 0u ? 0.5f * static_cast<float>(m) : quant_bits_to_float(((e + 126u) << 23) | (m << 22));
  return (nib & 8u) ? -mag : mag;
}

// Element t of the key/value row at `row` (data-pool offset; -1 = bad row -> NaN), dequantized, as fp16.
struct Fp8Source {
  static constexpr KvDtype kDtype = KvDtype::kFp8E4M3;
  __host__ __device__ static __forceinline__ __half load(const uint8_t* pool, const uint8_t*, float scale, int64_t row,
                                                int t) {
    if (row < 0) return __float2half(quant_bits_to_float(0x7fc00000u));
    return __float2half(e4m3_to_float(pool[row + t]) * scale);
  }
};

struct Nvfp4Source {
  static constexpr KvDtype kDtype = KvDtype::kNvfp4;
  __host__ __device__ static __forceinline__ __half load(const uint8_t* packed, const uint8_t* micro, float scale,
                                                int64_t row, int t) {
    if (row < 0) return __float2half(quant_bits_to_float(0x7fc00000u));
    const uint32_t byte = packed[row + (t >> 1)];
    const uint32_t nib = (t & 1) ? byte >> 4 : byte & 15u;
    const float ms = e4m3_to_float(micro[(row >> 3) + (t / kNvfp4Block)]);  // row / 8: see quant_paged_args
    return __float2half((e2m1_to_float(nib) * ms) * scale);
  }
};

// The partial kernel's body (every thread calls it): v8_gqa_ss with the gather of `Src`.
template <int D, class Src>
__device__ __forceinline__ void quant_ss_partial(const QuantPagedArgs& qa, QuantSmem<D>& sm) {
  // The one change (§2.14/§2.15): the gather dequantizes; K still lands transposed, V row-major, in fp16.
  ss_partial<D>(qa.base, sm, [&](const KvRow& r, int t, __half& k, __half& v) {
    k = Src::load(qa.k, qa.k_micro, qa.k_scale, r.k, t);
    v = Src::load(qa.v, qa.v_micro, qa.v_scale, r.v, t);
  });
}

}  // namespace cuda_ref
