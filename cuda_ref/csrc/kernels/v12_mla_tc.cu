// v12_mla_tc (docs/reference.md §2.17): MLA latent decode on Hopper tensor cores, heads as the MMA's M dimension.
//
// Engine: warp-level mma.sync.m16n8k16 (fp16 or bf16 operands, fp32 accumulators) fed by ldmatrix, the latent
// tiles staged by cp.async in a 3-stage ring. Not wgmma/TMA: mma.sync runs on sm_90's tensor cores at a
// fraction of wgmma's peak, but its fragment layouts are fixed per warp and simple to get right without a GPU to
// iterate on; MLA decode at h_q = 128 sits near the H100's ridge, so the first target is a correct, HBM-fed MMA
// kernel (docs/mla.md says what the measured numbers mean).
//
// Geometry (common/mla.cuh for the paged machinery: H_kv = 1, G = h_q): grid (ceil(h_q·n_q / 64), S, B), 256
// threads = 8 warps, 64 packed rows (heads at n_q = 1) per CTA, TN = 32 keys per tile. Warp w: row group
// rg = w % 4 (rows 16 rg .. 16 rg + 15, the MMA's M = 16) and half kh = w / 4, which is
//   * in QK: keys 16 kh .. 16 kh + 15 of the tile (two n8 tiles), S = Q · Lᵀ over k = DQK (DQK / 16 MMA k-steps);
//   * in PV: output columns kh·DV/2 .. (kh + 1)·DV/2 (DV/16 n8 tiles), O += P · L[:, :DV] over k = 32 keys.
// So each of the 64 rows is split over 2 warps: the row max and sum of a tile meet in shared memory (sRed), P goes
// through shared memory (sP, the operand type) to the PV warps, and each warp keeps 16 x DV/2 fp32 accumulators
// (128 registers per thread at DV = 512). The two warps of a row group hold identical (m, l) states.
//
// Shared memory (dynamic, rows padded by 16 B so ldmatrix's 8 row addresses hit 8 distinct 16-B bank groups):
//   sQ   [64][DQK + 8]   q rows, operand type T (fp16 or bf16)
//   ring [3][TN][DQK + 8] latent tiles as stored (T), by cp.async; fp8: [3][TN][DQK] raw bytes + one converted
//        T tile [TN][DQK + 8] (dequantized value e4m3 · scale rounded to T: "dequantized to T in smem")
//   sP   [64][TN + 8]    probabilities, T;  sRed [2][2][64] fp32 row max / row sum halves
// Bytes: 576/512 T 193,024, fp8 173,568; 160/128 T 59,904, fp8 53,760; 96/64 T 39,424, fp8 35,328 (docs/mla.md's ptxas table).
//
// Masking: per row the visible keys are a prefix (causal with q_offset, kv_len); masked scores are -inf, so their
// p is exactly 0. Keys past the split's end are zero-filled (cp.async zfill); a bad block-table entry or kv_len
// fills its key with NaN (never a read outside the pool), as every paged kernel. One difference from the
// CUDA-core kernels: a row's PV multiplies p = 0 by the tile's values of keys it cannot see, so a NaN stored in
// a key hidden from a row (causal, n_q > 1) but visible to another row of the CTA reaches that row's output too.
// Partials [B, h_q, n_q, S, DV] fp32 and v7's merge, as v11.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/mla.cuh"
#include "common/online_softmax.cuh"
#include "common/paged.cuh"
#include "common/warp.cuh"

namespace cuda_ref {
namespace {

constexpr int kV12Threads = 256;
constexpr int kV12Warps = kV12Threads / 32;
constexpr int kV12Rows = 64;  // packed rows per CTA: 4 row groups of 16 (the MMA's M)
constexpr int kV12TN = kMlaTileN;
constexpr int kV12Stages = 3;
constexpr int kPad = 8;  // elements of row padding (16 B)

static_assert(kV12Rows == gen_info(Gen::v12_mla_tc).tile_m_d64 && kV12Rows == gen_info(Gen::v12_mla_tc).tile_m_d128 &&
                  kV12TN == gen_info(Gen::v12_mla_tc).tile_n_d64 && kV12TN == gen_info(Gen::v12_mla_tc).tile_n_d128,
              "generations.def: v12_mla_tc tile columns");
static_assert(kV12Warps == 2 * (kV12Rows / 16) && kV12TN == 32, "v12_mla_tc: 4 row groups x 2 halves, 2 x 16 keys");

// --- PTX wrappers (sm_80+) -----------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes = 0 zero-fills the destination.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// D (16x8 fp32) += A (16x16, row) · B (16x8, col), operands T.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one 32-bit pair of T (the lower column in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <class T>
__device__ __forceinline__ uint16_t nan_bits();
template <>
__device__ __forceinline__ uint16_t nan_bits<__half>() { return 0x7e00u; }
template <>
__device__ __forceinline__ uint16_t nan_bits<__nv_bfloat16>() { return 0x7fc0u; }

// --- shared-memory plan ----------------------------------------------------------------------------------------

template <int DQK, class T, bool kFp8>
struct V12Layout {
  static constexpr int kLd = DQK + kPad;                                  // T elements per staged row
  static constexpr int kLdP = kV12TN + kPad;
  static constexpr int kQBytes = kV12Rows * kLd * 2;
  static constexpr int kTileBytes = kV12TN * kLd * 2;                     // one T tile
  static constexpr int kRawBytes = kFp8 ? kV12TN * DQK : kTileBytes;      // one ring stage
  static constexpr int kRingOff = kQBytes;
  static constexpr int kConvOff = kRingOff + kV12Stages * kRawBytes;      // fp8 only
  static constexpr int kPOff = kConvOff + (kFp8 ? kTileBytes : 0);
  static constexpr int kRedOff = kPOff + kV12Rows * kLdP * 2;
  static constexpr int kBytes = kRedOff + 2 * 2 * kV12Rows * 4;
  static constexpr int kChunksPerKey = (kFp8 ? DQK : DQK * 2) / 16;      // 16-B cp.async chunks of one latent row
  static_assert(DQK % 16 == 0 && kQBytes % 16 == 0 && kRawBytes % 16 == 0 && kTileBytes % 16 == 0, "alignment");
};

static_assert(V12Layout<576, __half, false>::kBytes == 193024 && V12Layout<576, __half, true>::kBytes == 173568 &&
                  V12Layout<160, __half, false>::kBytes == 59904 && V12Layout<96, __half, false>::kBytes == 39424,
              "v12_mla_tc: the shared-memory plan in the file comment");
static_assert(V12Layout<576, __half, false>::kBytes <= 227 * 1024, "v12_mla_tc: sm_90's opt-in shared memory per CTA");

// --- the partial kernel ----------------------------------------------------------------------------------------

// The latent format rides as an int (LatentFormat's value): the kernel's name reads <576, 512, __half, 0>.
template <int DQK, int DV, class T, int kFormat>
__global__ void __launch_bounds__(kV12Threads, 1) v12_mla_tc_partial_kernel(const MlaArgs m) {
  constexpr LatentFormat F = static_cast<LatentFormat>(kFormat);
  constexpr bool kFp8 = F == LatentFormat::kFp8;
  using L = V12Layout<DQK, T, kFp8>;
  constexpr int kKSteps = DQK / 16;      // QK k-steps
  constexpr int kNtO = DV / 2 / 8;       // PV n8 tiles per warp
  static_assert(DV % 32 == 0 && DV <= DQK && kNtO % 2 == 0, "v12_mla_tc template");
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  unsigned char* ring = smem + L::kRingOff;
  T* sP = reinterpret_cast<T*>(smem + L::kPOff);
  float* sRed = reinterpret_cast<float*>(smem + L::kRedOff);  // [2 (max, sum)][2 (kh)][64 rows]

  const PagedArgs& a = m.base;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rg = warp % 4, kh = warp / 4;
  const int g = lane / 4, qd = lane % 4;  // the MMA fragment's row-in-8 and column pair
  const int b = blockIdx.z, split = blockIdx.y;
  const int m0 = blockIdx.x * kV12Rows;
  const int M = a.group * a.n_q;
  const SeqView seq = seq_view(a, b);
  const KeyRange kr = split_keys(a, seq, split);
  const int cta_end = visible_end(a, seq, kr, packed_max_iq(m0, kV12Rows, M, a.n_q));
  const int n_tiles = cta_end > kr.begin ? (cta_end - kr.begin + kV12TN - 1) / kV12TN : 0;
  const unsigned char* lat = static_cast<const unsigned char*>(m.lat);
  constexpr int kElemBytes = kFp8 ? 1 : 2;

  // Issue tile i's cp.asyncs into ring stage i % kStages (every thread; the caller commits).
  auto issue_tile = [&](int i) {
    unsigned char* stage = ring + (i % kV12Stages) * L::kRawBytes;
    const int j0 = kr.begin + i * kV12TN;
    for (int e = tid; e < kV12TN * L::kChunksPerKey; e += kV12Threads) {
      const int c = e / L::kChunksPerKey, ch = e % L::kChunksPerKey;
      unsigned char* dst = stage + (kFp8 ? c * DQK : c * L::kLd * 2) + ch * 16;
      if (j0 + c < kr.end) {
        const int64_t row = paged_kv_row(a, seq, 0, j0 + c).k;
        if (row >= 0) {
          cp_async16(dst, lat + row * kElemBytes + ch * 16, 16);
        } else {  // bad table entry / kv_len: the key is NaN
          uint4 nan4;
          if constexpr (kFp8) {
            nan4 = make_uint4(0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu);  // E4M3 NaN bytes
          } else {
            const uint32_t w = nan_bits<T>() * 0x10001u;
            nan4 = make_uint4(w, w, w, w);
          }
          *reinterpret_cast<uint4*>(dst) = nan4;
        }
      } else {
        cp_async16(dst, lat, 0);  // past the split: zeros
      }
    }
  };

  // Prologue: start the first kStages - 1 tiles, then stage q (plain loads; the rows past M are zero).
#pragma unroll
  for (int i = 0; i < kV12Stages - 1; ++i) {
    if (i < n_tiles) issue_tile(i);
    cp_async_commit();
  }
  {
    const T* q = static_cast<const T*>(m.q);
    constexpr int kQChunks = DQK * 2 / 16;
    for (int e = tid; e < kV12Rows * kQChunks; e += kV12Threads) {
      const int r = e / kQChunks, ch = e % kQChunks;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      const PackedRow pr = packed_row(a, 0, m0 + r);
      if (pr.active) {
        const T* qp = q + b * a.qs.batch + pr.h_q * a.qs.head + pr.i_q * a.qs.row;
        v = *reinterpret_cast<const uint4*>(qp + ch * 8);
      }
      *reinterpret_cast<uint4*>(sQ + r * L::kLd + ch * 8) = v;
    }
  }

  // Per-thread rows: r_lo = 16 rg + g and r_hi = r_lo + 8 of the CTA; their visible-key ends.
  const int r_lo = rg * 16 + g, r_hi = r_lo + 8;
  const PackedRow row_lo = packed_row(a, 0, m0 + r_lo), row_hi = packed_row(a, 0, m0 + r_hi);
  const int end_lo = row_lo.active ? visible_end(a, seq, kr, row_lo.i_q) : kr.begin;
  const int end_hi = row_hi.active ? visible_end(a, seq, kr, row_hi.i_q) : kr.begin;

  float o[kNtO][4];
#pragma unroll
  for (int j = 0; j < kNtO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_lo = kInitMax, m_hi = kInitMax, l_lo = 0.f, l_hi = 0.f;

  for (int i = 0; i < n_tiles; ++i) {
    cp_async_wait<kV12Stages - 2>();  // tile i has landed (this thread's part)
    __syncthreads();                  // ... everyone's part; and every warp is done with tile i - 1
    if (i + kV12Stages - 1 < n_tiles) issue_tile(i + kV12Stages - 1);
    cp_async_commit();
    const int j0 = kr.begin + i * kV12TN;

    const T* sK;
    if constexpr (kFp8) {
      // Dequantize the raw stage into the T tile: 4 bytes per thread-step, value e4m3 · scale, rounded to T.
      const uint8_t* raw = ring + (i % kV12Stages) * L::kRawBytes;
      T* conv = reinterpret_cast<T*>(smem + L::kConvOff);
      for (int e = tid; e < kV12TN * DQK / 4; e += kV12Threads) {
        const int c = (4 * e) / DQK, t = (4 * e) % DQK;
        const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + c * DQK + t);
        const float s = m.lat_scale;
        uint2 out;
        out.x = pack2<T>(e4m3_to_float(w & 0xffu) * s, e4m3_to_float((w >> 8) & 0xffu) * s);
        out.y = pack2<T>(e4m3_to_float((w >> 16) & 0xffu) * s, e4m3_to_float(w >> 24) * s);
        *reinterpret_cast<uint2*>(conv + c * L::kLd + t) = out;
      }
      __syncthreads();
      sK = conv;
    } else {
      sK = reinterpret_cast<const T*>(ring + (i % kV12Stages) * L::kRawBytes);
    }

    // QK: S[16 rows x 16 keys] = Q[rows] · L[keys]ᵀ over DQK.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    {
      const T* qa = sQ + (rg * 16 + lane % 16) * L::kLd + (lane / 16) * 8;
      const int mi = lane / 8;
      const T* kb = sK + (kh * 16 + (mi / 2) * 8 + lane % 8) * L::kLd + (mi % 2) * 8;
#pragma unroll 4
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t af[4], bf[4];
        ldsm_x4(af, qa + kk * 16);
        ldsm_x4(bf, kb + kk * 16);
        mma_16816<T>(s[0], af, bf[0], bf[1]);
        mma_16816<T>(s[1], af, bf[2], bf[3]);
      }
    }

    // Mask and scale; the row max of this warp's 16 keys, then of the tile's 32 (the partner warp's half).
    const int lim_lo = end_lo - j0, lim_hi = end_hi - j0;  // keys c < lim are visible
    float mx_lo = -CUDART_INF_F, mx_hi = -CUDART_INF_F;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int c = kh * 16 + nt * 8 + 2 * qd + x;
        s[nt][x] = c < lim_lo ? a.scale * s[nt][x] : -CUDART_INF_F;
        s[nt][2 + x] = c < lim_hi ? a.scale * s[nt][2 + x] : -CUDART_INF_F;
        mx_lo = fmaxf(mx_lo, s[nt][x]);
        mx_hi = fmaxf(mx_hi, s[nt][2 + x]);
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(kFullMask, mx_lo, off));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(kFullMask, mx_hi, off));
    }
    float* red_max = sRed;
    float* red_sum = sRed + 2 * kV12Rows;
    if (qd == 0) {
      red_max[kh * kV12Rows + r_lo] = mx_lo;
      red_max[kh * kV12Rows + r_hi] = mx_hi;
    }
    __syncthreads();
    const float mn_lo = fmaxf(m_lo, fmaxf(red_max[r_lo], red_max[kV12Rows + r_lo]));
    const float mn_hi = fmaxf(m_hi, fmaxf(red_max[r_hi], red_max[kV12Rows + r_hi]));
    const float alpha_lo = __expf(m_lo - mn_lo), alpha_hi = __expf(m_hi - mn_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;

    // p = exp(s - m_new) (exactly 0 where masked); P -> sP as T; the row sums of the halves -> sRed.
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float p0 = __expf(s[nt][0] - mn_lo), p1 = __expf(s[nt][1] - mn_lo);
      const float p2 = __expf(s[nt][2] - mn_hi), p3 = __expf(s[nt][3] - mn_hi);
      sum_lo += p0 + p1;
      sum_hi += p2 + p3;
      const int c = kh * 16 + nt * 8 + 2 * qd;
      *reinterpret_cast<uint32_t*>(sP + r_lo * L::kLdP + c) = pack2<T>(p0, p1);
      *reinterpret_cast<uint32_t*>(sP + r_hi * L::kLdP + c) = pack2<T>(p2, p3);
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      sum_lo += __shfl_xor_sync(kFullMask, sum_lo, off);
      sum_hi += __shfl_xor_sync(kFullMask, sum_hi, off);
    }
    if (qd == 0) {
      red_sum[kh * kV12Rows + r_lo] = sum_lo;
      red_sum[kh * kV12Rows + r_hi] = sum_hi;
    }
    __syncthreads();
    l_lo = alpha_lo * l_lo + red_sum[r_lo] + red_sum[kV12Rows + r_lo];
    l_hi = alpha_hi * l_hi + red_sum[r_hi] + red_sum[kV12Rows + r_hi];

    // PV: O[16 rows x DV/2] = alpha · O + P[rows, 32 keys] · L[32 keys, kh·DV/2 ...].
#pragma unroll
    for (int j = 0; j < kNtO; ++j) {
      o[j][0] *= alpha_lo;
      o[j][1] *= alpha_lo;
      o[j][2] *= alpha_hi;
      o[j][3] *= alpha_hi;
    }
#pragma unroll
    for (int ks = 0; ks < kV12TN / 16; ++ks) {
      uint32_t pf[4];
      ldsm_x4(pf, sP + (rg * 16 + lane % 16) * L::kLdP + ks * 16 + (lane / 16) * 8);
      const int mi = lane / 8;
      const T* vb = sK + (ks * 16 + (mi % 2) * 8 + lane % 8) * L::kLd + kh * (DV / 2) + (mi / 2) * 8;
#pragma unroll
      for (int j = 0; j < kNtO; j += 2) {
        uint32_t vf[4];
        ldsm_x4_trans(vf, vb + j * 8);
        mma_16816<T>(o[j], pf, vf[0], vf[1]);
        mma_16816<T>(o[j + 1], pf, vf[2], vf[3]);
      }
    }
  }
  cp_async_wait<0>();  // no cp.async may be in flight when the CTA exits

  // The unnormalised partial of this warp's rows and columns.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const PackedRow& pr = h ? row_hi : row_lo;
    if (!pr.active) continue;
    const int64_t slot = partial_slot(a, b, pr.h_q, pr.i_q, split);
    float* op = a.o_part + slot * DV + kh * (DV / 2) + 2 * qd;
#pragma unroll
    for (int j = 0; j < kNtO; ++j) {
      *reinterpret_cast<float2*>(op + j * 8) = make_float2(o[j][2 * h], o[j][2 * h + 1]);
    }
    if (kh == 0 && qd == 0) {
      a.m_part[slot] = h ? m_hi : m_lo;
      a.l_part[slot] = h ? l_hi : l_lo;
    }
  }
}

template <int DQK, int DV, class T, LatentFormat F>
void launch_v12(const MlaArgs& m, const AttnParams& p, cudaStream_t stream) {
  constexpr int bytes = V12Layout<DQK, T, F == LatentFormat::kFp8>::kBytes;
  auto kernel = v12_mla_tc_partial_kernel<DQK, DV, T, static_cast<int>(F)>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) {
    check_launch("v12_mla_tc partial (shared-memory attribute)");
  }
  kernel<<<paged_grid(p, kV12Rows), kV12Threads, bytes, stream>>>(m);
  check_launch("v12_mla_tc partial");
}

}  // namespace

void launch_v12_mla_tc(const AttnParams& p, cudaStream_t stream) {
  const MlaArgs m = mla_args(p, "v12_mla_tc");
  const LatentFormat fmt = latent_format(p.kv_dtype);
  if (fmt == LatentFormat::kNvfp4) {
    throw std::invalid_argument("cuda_ref v12_mla_tc: reads fp16, bf16 or fp8 latents (NVFP4: v11_mla)");
  }
  const bool bf16 = p.q_dtype == KvDtype::kBF16;
  if (!bf16 && p.q_dtype != KvDtype::kF16) throw std::invalid_argument("cuda_ref v12_mla_tc: q must be fp16 or bf16");
  if ((fmt == LatentFormat::kF16 && bf16) || (fmt == LatentFormat::kBF16 && !bf16)) {
    throw std::invalid_argument("cuda_ref v12_mla_tc: q and a float latent must share their dtype");
  }
  // cp.async moves 16-B chunks: the pool and q rows must be 16-B aligned (the binding makes them so).
  const int eb = fmt == LatentFormat::kFp8 ? 1 : 2;
  if (reinterpret_cast<uintptr_t>(p.k) % 16 != 0 || (p.k_strides.batch * eb) % 16 != 0 || (p.k_strides.row * eb) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.q) % 16 != 0 || (p.q_strides.batch * 2) % 16 != 0 ||
      (p.q_strides.head * 2) % 16 != 0 || (p.q_strides.row * 2) % 16 != 0) {
    throw std::invalid_argument("cuda_ref v12_mla_tc: q and the latent pool must be 16-byte aligned row by row");
  }
  CUDA_REF_SWITCH_MLA_DIMS(p.d_qk, p.d_v, DQK, DV, [&] {
    if (bf16) {
      if (fmt == LatentFormat::kFp8) return launch_v12<DQK, DV, __nv_bfloat16, LatentFormat::kFp8>(m, p, stream);
      return launch_v12<DQK, DV, __nv_bfloat16, LatentFormat::kBF16>(m, p, stream);
    }
    if (fmt == LatentFormat::kFp8) return launch_v12<DQK, DV, __half, LatentFormat::kFp8>(m, p, stream);
    return launch_v12<DQK, DV, __half, LatentFormat::kF16>(m, p, stream);
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
