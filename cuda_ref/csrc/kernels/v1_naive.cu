// v1_naive (docs/reference.md §2.1): the fp32 three-pass baseline. S = scale * Q K^T is materialised in HBM,
// normalised in place by a thread-per-row softmax, then multiplied by V. No shared memory, no reuse: every
// thread reads its operand rows straight from global memory. Any head dim.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/mask.cuh"
#include "common/online_softmax.cuh"

namespace cuda_ref {
namespace {

constexpr int kThreads = 256;
static_assert(gen_info(Gen::v1_naive).tile_m_d64 == 1 && gen_info(Gen::v1_naive).tile_n_d64 == 1 &&
                  gen_info(Gen::v1_naive).tile_m_d128 == 1 && gen_info(Gen::v1_naive).tile_n_d128 == 1,
              "generations.def: v1_naive is untiled (1 x 1)");

// Pass 1: one thread per element of S [BH, n_q, n_k], 1-D grid-stride over the flat index.
__global__ void __launch_bounds__(kThreads) v1_qk_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                                         float* __restrict__ s, int64_t total, int n_q, int n_k,
                                                         int d, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t j = idx % n_k;
    const int64_t row = idx / n_k;  // bh * n_q + i
    const int64_t bh = row / n_q;
    const float* qr = q + row * d;
    const float* kr = k + (bh * n_k + j) * d;
    float acc = 0.f;
    for (int t = 0; t < d; ++t) acc += qr[t] * kr[t];
    s[idx] = scale * acc;
  }
}

// Pass 2: one thread per row, three sweeps (max over visible keys; exp and sum; scale by 1/sum). The
// masked tail of a causal row is written as 0 so pass 3 can sum over all n_k keys unconditionally. With
// lse set, the row's max and sum also give its log-sum-exp (one store per row).
__global__ void __launch_bounds__(kThreads) v1_softmax_kernel(float* __restrict__ s, float* __restrict__ lse,
                                                              int64_t rows, int n_q, int n_k, bool causal,
                                                              int q_offset) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int i = static_cast<int>(row % n_q);
  const int j_max = last_visible_key(i, n_k, causal, q_offset);
  float* sr = s + row * n_k;
  float m = kInitMax;
  for (int j = 0; j <= j_max; ++j) m = fmaxf(m, sr[j]);
  float sum = 0.f;
  for (int j = 0; j <= j_max; ++j) {
    const float e = __expf(sr[j] - m);
    sr[j] = e;
    sum += e;
  }
  const float inv = safe_inv(sum);
  for (int j = 0; j <= j_max; ++j) sr[j] *= inv;
  for (int j = j_max + 1; j < n_k; ++j) sr[j] = 0.f;
  if (lse != nullptr) lse[row] = row_lse(m, sum);
}

// Pass 3: one thread per output element (bh, i, t); V is read strided by d, as in the reference.
__global__ void __launch_bounds__(kThreads) v1_pv_kernel(const float* __restrict__ s, const float* __restrict__ v,
                                                         float* __restrict__ out, int64_t total, int n_q, int n_k,
                                                         int d) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t t = idx % d;
  const int64_t row = idx / d;  // bh * n_q + i
  const int64_t bh = row / n_q;
  const float* pr = s + row * n_k;
  const float* vb = v + bh * n_k * d + t;
  float acc = 0.f;
  for (int j = 0; j < n_k; ++j) acc += pr[j] * vb[static_cast<int64_t>(j) * d];
  out[idx] = acc;
}

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < (1ll << 30) ? blocks : (1ll << 30));  // pass 1 grid-strides the rest
}

}  // namespace

void launch_v1_softmax_rows(const AttnParams& p, float* s, cudaStream_t stream) {
  const int64_t rows = p.bh() * p.n_q;
  v1_softmax_kernel<<<grid_for(rows), kThreads, 0, stream>>>(s, p.lse, rows, p.n_q, p.n_k, p.causal, p.q_offset);
  check_launch("v1_naive softmax");
}

void launch_v1_naive(const AttnParams& p, cudaStream_t stream) {
  const auto* q = static_cast<const float*>(p.q);
  const auto* k = static_cast<const float*>(p.k);
  const auto* v = static_cast<const float*>(p.v);
  float* s = p.ws;
  const int64_t s_total = p.bh() * p.n_q * p.n_k;
  v1_qk_kernel<<<grid_for(s_total), kThreads, 0, stream>>>(q, k, s, s_total, p.n_q, p.n_k, p.head_dim, p.scale);
  check_launch("v1_naive qk");
  launch_v1_softmax_rows(p, s, stream);
  const int64_t o_total = p.bh() * p.n_q * p.head_dim;
  v1_pv_kernel<<<grid_for(o_total), kThreads, 0, stream>>>(s, v, p.out, o_total, p.n_q, p.n_k, p.head_dim);
  check_launch("v1_naive pv");
}

}  // namespace cuda_ref
