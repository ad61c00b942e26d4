// v11_mla (docs/reference.md §2.16): MLA latent-KV decode on CUDA cores, v8_gqa_ss's score-stationary step over
// ONE transposed latent tile that serves as both K and V.
//
// Mapping: v8's GQA machinery with H_kv = 1 and G = h_q (common/mla.cuh): grid (ceil(h_q·n_q / 8), S, B), 256
// threads, one warp per packed row (a query head at n_q = 1), 8 heads per CTA.
// Shared memory, fp16: sQ [8][DQK] (each active warp copies its q row) and sKt [DQK][TN + 1] (the latent tile
// TRANSPOSED, one element of padding); TN = 32. QK reads sKt[t][c] (lane = key c, stride 1: conflict-free); PV reads
// V[c][d] = sKt[d][c] for d < DV (lane = output dim d, stride 33: conflict-free). Bytes: 7,872 (96/64),
// 13,120 (160/128), 47,232 (576/512; < 48 KB static).
// Per tile: the gather walks the block table (consecutive threads take consecutive elements t of one key: coalesced
// pool reads) and converts each element to fp32 at the gather (fp16, bf16, or NVFP4: nibble t & 1 of byte t >> 1,
// micro-scale t >> 4, tensor scale), rounding it into the fp16 tile; then one online-softmax step per 32 keys
// (§2.13): lane c's full DQK dot, warp max and sum, alpha rescale, and PV by broadcast (one shuffle per key, each
// lane adds p_c · sKt[lane + 32 e][c] to its EPT = DV / 32 output dims). Partials [B, h_q, n_q, S, DV] fp32, v7's
// merge with DV threads. q is host-cast to fp16 (as the reference); bf16 latent values are rounded to fp16 in the
// tile (values beyond ±65504 become ±inf there).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/mla.cuh"
#include "common/online_softmax.cuh"
#include "common/paged.cuh"
#include "common/ss_tile.cuh"
#include "common/warp.cuh"

namespace cuda_ref {
namespace {

constexpr int kV11Threads = kSsThreads;  // 256
constexpr int kV11Rows = kSsRows;        // 8 heads (packed rows) per CTA, one per warp
constexpr int kV11TN = kMlaTileN;        // 32 keys per tile = one 32-key group (NG = 1)

static_assert(kV11Rows == gen_info(Gen::v11_mla).tile_m_d64 && kV11Rows == gen_info(Gen::v11_mla).tile_m_d128 &&
                  kV11TN == gen_info(Gen::v11_mla).tile_n_d64 && kV11TN == gen_info(Gen::v11_mla).tile_n_d128,
              "generations.def: v11_mla tile columns");
static_assert(kV11TN == kSsGroup, "v11_mla: one softmax step per tile");

template <int DQK>
struct V11Smem {
  __half q[kV11Rows][DQK];
  __half kt[DQK][kV11TN + 1];
};

static_assert(sizeof(V11Smem<96>) == 7872 && sizeof(V11Smem<160>) == 13120 && sizeof(V11Smem<576>) == 47232,
              "v11_mla: §2.16's shared memory");

// The latent format rides as an int (LatentFormat's value) so the kernel's name reads v11_mla_partial_kernel<576, 512, 3>.
template <int DQK, int DV, int kFormat>
__global__ void __launch_bounds__(kV11Threads) v11_mla_partial_kernel(const MlaArgs m) {
  constexpr LatentFormat F = static_cast<LatentFormat>(kFormat);
  static_assert(DV % 32 == 0 && DV <= DQK && DQK % 16 == 0, "v11_mla template");
  constexpr int EPT = DV / 32;
  __shared__ V11Smem<DQK> sm;
  const PagedArgs& a = m.base;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.z, split = blockIdx.y;
  const int m0 = blockIdx.x * kV11Rows;
  const SeqView seq = seq_view(a, b);
  const KeyRange kr = split_keys(a, seq, split);
  const PackedRow row = packed_row(a, 0, m0 + warp);
  const __half* q = static_cast<const __half*>(m.q);

  if (row.active) {
    const __half* qp = q + b * a.qs.batch + row.h_q * a.qs.head + row.i_q * a.qs.row;
    for (int t = lane; t < DQK; t += 32) sm.q[warp][t] = qp[t];
  }
  __syncwarp();  // a warp reads only its own sQ row

  float o[EPT];
#pragma unroll
  for (int e = 0; e < EPT; ++e) o[e] = 0.f;
  float m_run = kInitMax, l_run = 0.f;
  const int row_end = row.active ? visible_end(a, seq, kr, row.i_q) : kr.begin;
  const int cta_end = visible_end(a, seq, kr, packed_max_iq(m0, kV11Rows, a.group * a.n_q, a.n_q));
  const __half zero = __float2half(0.f);

  for (int j0 = kr.begin; j0 < cta_end; j0 += kV11TN) {
    // Gather: element t of key c lands at sKt[t][c] (transposed), converted to fp16 here.
    for (int e = threadIdx.x; e < kV11TN * DQK; e += kV11Threads) {
      const int c = e / DQK, t = e % DQK;
      if (j0 + c < kr.end) {
        sm.kt[t][c] = __float2half(latent_value<F>(m, paged_kv_row(a, seq, 0, j0 + c).k, t));
      } else {
        sm.kt[t][c] = zero;
      }
    }
    __syncthreads();

    const int c_lim = min(kV11TN, row_end - j0);  // warp-uniform; the visible keys are a prefix
    if (c_lim > 0) {
      const bool valid = lane < c_lim;
      float s = -CUDART_INF_F;
      if (valid) {
        float dot = 0.f;
#pragma unroll 8
        for (int t = 0; t < DQK; ++t) dot += __half2float(sm.q[warp][t]) * __half2float(sm.kt[t][lane]);
        s = a.scale * dot;
      }
      const float m_tile = warp_allreduce_max(s);
      const float m_new = fmaxf(m_run, m_tile);
      const float p = valid ? __expf(s - m_new) : 0.f;
      const float l_tile = warp_allreduce_sum(p);
      const float alpha = __expf(m_run - m_new);
      l_run = alpha * l_run + l_tile;
      m_run = m_new;
#pragma unroll
      for (int e = 0; e < EPT; ++e) o[e] *= alpha;
      for (int cc = 0; cc < c_lim; ++cc) {
        const float pc = __shfl_sync(kFullMask, p, cc);
#pragma unroll
        for (int e = 0; e < EPT; ++e) o[e] += pc * __half2float(sm.kt[lane + 32 * e][cc]);  // V = the tile's rows < DV
      }
    }
    __syncthreads();  // the tile is overwritten next round
  }

  if (!row.active) return;
  const int64_t slot = partial_slot(a, b, row.h_q, row.i_q, split);
#pragma unroll
  for (int e = 0; e < EPT; ++e) a.o_part[slot * DV + lane + 32 * e] = o[e];
  if (lane == 0) {
    a.m_part[slot] = m_run;
    a.l_part[slot] = l_run;
  }
}

template <int DQK, int DV, LatentFormat F>
void launch_v11(const MlaArgs& m, const AttnParams& p, cudaStream_t stream) {
  v11_mla_partial_kernel<DQK, DV, static_cast<int>(F)><<<paged_grid(p, kV11Rows), kV11Threads, 0, stream>>>(m);
  check_launch("v11_mla partial");
}

}  // namespace

void launch_v11_mla(const AttnParams& p, cudaStream_t stream) {
  if (p.q_dtype != KvDtype::kF16) throw std::invalid_argument("cuda_ref v11_mla: q must be fp16 (the host casts)");
  const MlaArgs m = mla_args(p, "v11_mla");
  const LatentFormat fmt = latent_format(p.kv_dtype);
  CUDA_REF_SWITCH_MLA_DIMS(p.d_qk, p.d_v, DQK, DV, [&] {
    switch (fmt) {
      case LatentFormat::kF16: return launch_v11<DQK, DV, LatentFormat::kF16>(m, p, stream);
      case LatentFormat::kBF16: return launch_v11<DQK, DV, LatentFormat::kBF16>(m, p, stream);
      case LatentFormat::kNvfp4: return launch_v11<DQK, DV, LatentFormat::kNvfp4>(m, p, stream);
      default: throw std::invalid_argument("cuda_ref v11_mla: reads fp16, bf16 or NVFP4 latents (fp8: v12_mla_tc)");
    }
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
