// v8_gqa_tc, "Cut 2a" (docs/reference.md §2.9): the v8_gqa contract on tensor cores through WMMA 16x16x16, fp16
// operands, fp32 accumulation — the reference's dead end, kept faithful so the finding can be re-tested.
//
// ONE warp (32 threads) per CTA; grid (ceil(G * n_q / 16), S, B * H_kv): each CTA is one 16-row packed M tile (rows
// >= M = G * n_q carry a zero query and are never written: "pad M = G up to 16"). BN = 64 keys (D = 64) / 32
// (D = 128). Shared memory (v5's six buffers at M = 16): sQ [16][D] half, sK, sV [BN][D] half (paged gather, zero
// past the split's end), sS [16][BN] float, sP [16][BN] half, oRun [16][D] float: 28,672 B (D = 64) / 31,744 B
// (D = 128). Per key block: Q stays as D/16 A fragments; S = Q K^T with K read as a column-major B fragment -> sS;
// lanes 0-15 own one row each: scale, mask (padded rows, keys past the split / kv_len, causal j > i_q + q_offset),
// block max, p as half into sP, the row of oRun times alpha; then oRun += P V by WMMA, round-tripping oRun through
// shared memory. All-masked-block guard: a row that sees no key of the block keeps alpha = 1 and p = 0, so a
// masked entry never injects exp(0) = 1. The split heuristic counts ceil(G * n_q / 16) row tiles (binding.cpp).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/online_softmax.cuh"
#include "common/paged.cuh"

namespace cuda_ref {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kMma = 16;
constexpr int kTcThreads = 32;  // one warp
constexpr int kTcRows = 16;     // one packed M tile

template <int D>
struct TcTile {
  static constexpr int BN = D == 64 ? 64 : 32;
};

template <int D>
struct TcSmem {
  // 32-byte alignment: WMMA loads/stores need 256-bit aligned tile pointers.
  alignas(32) __half q[kTcRows * D];
  alignas(32) __half k[TcTile<D>::BN * D];
  alignas(32) __half v[TcTile<D>::BN * D];
  alignas(32) float s[kTcRows * TcTile<D>::BN];
  alignas(32) __half p[kTcRows * TcTile<D>::BN];
  alignas(32) float o[kTcRows * D];
};

static_assert(sizeof(TcSmem<64>) == 28672 && sizeof(TcSmem<128>) == 31744, "v8_gqa_tc: §2.9's six buffers");
static_assert(kTcRows == gen_info(Gen::v8_gqa_tc).tile_m_d64 && kTcRows == gen_info(Gen::v8_gqa_tc).tile_m_d128 &&
                  TcTile<64>::BN == gen_info(Gen::v8_gqa_tc).tile_n_d64 &&
                  TcTile<128>::BN == gen_info(Gen::v8_gqa_tc).tile_n_d128,
              "generations.def: v8_gqa_tc tile columns");

template <int D>
__global__ void __launch_bounds__(kTcThreads) v8_gqa_tc_partial_kernel(const PagedArgs a) {
  constexpr int BN = TcTile<D>::BN;
  __shared__ TcSmem<D> sm;
  const int lane = threadIdx.x;
  const int b = blockIdx.z / a.h_kv, h_kv = blockIdx.z % a.h_kv;
  const int split = blockIdx.y;
  const int m0 = blockIdx.x * kTcRows;
  const SeqView seq = seq_view(a, b);
  const KeyRange kr = split_keys(a, seq, split);
  const __half zero = __float2half(0.f);

  // Q tile (zero rows past M) and the running O.
  for (int e = lane; e < kTcRows * D; e += kTcThreads) {
    const int r = e / D, t = e % D;
    const PackedRow pr = packed_row(a, h_kv, m0 + r);
    sm.q[e] = pr.active ? q_row(a, b, pr.h_q, pr.i_q)[t] : zero;
    sm.o[e] = 0.f;
  }
  __syncwarp();
  wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, __half, wmma::row_major> q_frag[D / kMma];
#pragma unroll
  for (int kk = 0; kk < D / kMma; ++kk) wmma::load_matrix_sync(q_frag[kk], sm.q + kk * kMma, D);

  // Lanes 0-15 own packed row m0 + lane.
  const PackedRow row = packed_row(a, h_kv, m0 + (lane & (kTcRows - 1)));
  const bool owns_row = lane < kTcRows && row.active;
  const int row_end = owns_row ? visible_end(a, seq, kr, row.i_q) : kr.begin;
  float m_run = kInitMax, l_run = 0.f;
  const int cta_end = visible_end(a, seq, kr, packed_max_iq(m0, kTcRows, a.group * a.n_q, a.n_q));

  for (int j0 = kr.begin; j0 < cta_end; j0 += BN) {
    // (1) gather K and V of keys [j0, j0 + BN), zero past the split's end
    for (int e = lane; e < BN * D; e += kTcThreads) {
      const int c = e / D, t = e % D;
      if (j0 + c < kr.end) {
        const KvRow r = paged_kv_row(a, seq, h_kv, j0 + c);
        sm.k[e] = pool_half(a.k, r.k, t);
        sm.v[e] = pool_half(a.v, r.v, t);
      } else {
        sm.k[e] = zero;
        sm.v[e] = zero;
      }
    }
    __syncwarp();

    // (2) S = Q K^T: K as a column-major B fragment is K^T without a transpose.
#pragma unroll
    for (int n = 0; n < BN / kMma; ++n) {
      wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float> s_frag;
      wmma::fill_fragment(s_frag, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / kMma; ++kk) {
        wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __half, wmma::col_major> k_frag;
        wmma::load_matrix_sync(k_frag, sm.k + n * kMma * D + kk * kMma, D);
        wmma::mma_sync(s_frag, q_frag[kk], k_frag, s_frag);
      }
      wmma::store_matrix_sync(sm.s + n * kMma, s_frag, BN, wmma::mem_row_major);
    }
    __syncwarp();

    // (3) online softmax of the block, one lane per row; p to sP as half.
    if (lane < kTcRows) {
      const float* srow = sm.s + lane * BN;
      __half* prow = sm.p + lane * BN;
      const int c_vis = owns_row ? max(0, min(BN, row_end - j0)) : 0;  // a prefix of the block
      if (c_vis == 0) {
        // All-masked-block guard: alpha = 1 and p = 0 (nothing of this block reaches the row).
        for (int c = 0; c < BN; ++c) prow[c] = zero;
      } else {
        float block_max = kInitMax;
        for (int c = 0; c < c_vis; ++c) block_max = fmaxf(block_max, a.scale * srow[c]);
        const float alpha = online_softmax_rescale(m_run, block_max);
        float sum = 0.f;
        for (int c = 0; c < BN; ++c) {
          const float p = c < c_vis ? __expf(a.scale * srow[c] - m_run) : 0.f;
          prow[c] = __float2half(p);
          sum += p;
        }
        l_run = alpha * l_run + sum;
        float* orow = sm.o + lane * D;
        for (int t = 0; t < D; ++t) orow[t] *= alpha;
      }
    }
    __syncwarp();

    // (4) oRun += P V, the accumulator round-tripping through shared memory.
#pragma unroll
    for (int dt = 0; dt < D / kMma; ++dt) {
      wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float> o_frag;
      float* o_tile = sm.o + dt * kMma;
      wmma::load_matrix_sync(o_frag, o_tile, D, wmma::mem_row_major);
#pragma unroll
      for (int kc = 0; kc < BN / kMma; ++kc) {
        wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, __half, wmma::row_major> p_frag;
        wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __half, wmma::row_major> v_frag;
        wmma::load_matrix_sync(p_frag, sm.p + kc * kMma, BN);
        wmma::load_matrix_sync(v_frag, sm.v + kc * kMma * D + dt * kMma, D);
        wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
      }
      wmma::store_matrix_sync(o_tile, o_frag, D, wmma::mem_row_major);
    }
    __syncwarp();
  }

  // Unnormalised partials of the active rows only.
  if (!owns_row) return;
  const int64_t slot = partial_slot(a, b, row.h_q, row.i_q, split);
  const float* orow = sm.o + lane * D;
  for (int t = 0; t < D; ++t) a.o_part[slot * D + t] = orow[t];
  a.m_part[slot] = m_run;
  a.l_part[slot] = l_run;
}

}  // namespace

void launch_v8_gqa_tc(const AttnParams& p, cudaStream_t stream) {
  const PagedArgs a = paged_args(p, "v8_gqa_tc");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v8_gqa_tc_partial_kernel<D><<<paged_grid(p, kTcRows), kTcThreads, 0, stream>>>(a);
    check_launch("v8_gqa_tc partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
