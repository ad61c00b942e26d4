// v9_fp8 (docs/reference.md §2.14): v8_gqa_ss (§2.13) reading fp8 E4M3 pools (one byte per element, per-tensor k/v scales).
// The paged gather dequantizes into v8_gqa_ss's staged fp16 tile; everything after it (score-stationary QK,
// one online-softmax step per 32 keys, broadcast PV, partials, v7's merge) is v8_gqa_ss's. Formats, smem and
// geometry: common/paged_quant.cuh. Host: the device's SM count by default (num_sm knob).
#include <cuda_runtime.h>

#include "common/dispatch.cuh"
#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/paged.cuh"
#include "common/paged_quant.cuh"

namespace cuda_ref {
namespace {

static_assert(kQuantRows == gen_info(Gen::v9_fp8).tile_m_d64 && kQuantRows == gen_info(Gen::v9_fp8).tile_m_d128 &&
                  QuantTile<64>::TN == gen_info(Gen::v9_fp8).tile_n_d64 &&
                  QuantTile<128>::TN == gen_info(Gen::v9_fp8).tile_n_d128,
              "generations.def: v9_fp8 tile columns");

template <int D>
__global__ void __launch_bounds__(kQuantThreads) v9_fp8_partial_kernel(const QuantPagedArgs a) {
  __shared__ QuantSmem<D> sm;
  quant_ss_partial<D, Fp8Source>(a, sm);
}

}  // namespace

void launch_v9_fp8(const AttnParams& p, cudaStream_t stream) {
  const QuantPagedArgs a = quant_paged_args(p, Fp8Source::kDtype, "v9_fp8");
  CUDA_REF_SWITCH_HEAD_DIM(p.head_dim, D, [&] {
    v9_fp8_partial_kernel<D><<<paged_grid(p, kQuantRows), kQuantThreads, 0, stream>>>(a);
    check_launch("v9_fp8 partial");
  });
  launch_paged_merge(p, stream);
}

}  // namespace cuda_ref
