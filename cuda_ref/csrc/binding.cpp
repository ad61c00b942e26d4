// The one torch-aware file of cuda_ref: turns tensors into an AttnParams, allocates the output and the
// generation's workspace, dispatches by generation id and surfaces launch errors as Python exceptions.
//
// cuda_ref/api.py validates arguments first (with the same messages on a CPU machine); the checks here are
// the C++ line of defence for direct callers of the extension. TORCH_CHECK_VALUE raises ValueError,
// TORCH_CHECK_NOT_IMPLEMENTED raises NotImplementedError, std::runtime_error becomes RuntimeError.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>

#include "common/launch.cuh"
#include "common/params.cuh"
#include "common/split_plan.cuh"

namespace cuda_ref {
namespace {

constexpr int kV6RowsPerCta = 8;  // v6's partial CTA holds 8 query rows (one per warp)

const char* gen_name(Gen gen) {
  switch (gen) {
    case Gen::kV1Naive: return "v1_naive";
    case Gen::kV2Tiled: return "v2_tiled";
    case Gen::kV3Online: return "v3_online";
    case Gen::kV4Fused: return "v4_fused";
    case Gen::kV5Wmma: return "v5_wmma";
    case Gen::kV6SplitKV: return "v6_splitkv";
  }
  return "?";
}

bool takes_fp16(Gen gen) { return gen == Gen::kV5Wmma || gen == Gen::kV6SplitKV; }

int device_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    throw std::runtime_error("cuda_ref: cannot query the device's SM count");
  }
  return sms;
}

void check_operand(const torch::Tensor& x, const char* name, const torch::Tensor& q) {
  TORCH_CHECK_VALUE(x.dim() == 4, name, " must be rank 4 [B, H, N, D]; got ", x.sizes());
  TORCH_CHECK_VALUE(x.is_cuda(), name, " must be a CUDA tensor; got device ", x.device());
  TORCH_CHECK_VALUE(x.device() == q.device(), name, " must be on q's device ", q.device(), "; got ", x.device());
  const auto st = x.scalar_type();
  TORCH_CHECK_VALUE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16, name,
                    " must be float32, float16 or bfloat16; got ", st);
}

// Operands as the kernels take them: contiguous, and fp16 for v5/v6 (the reference casts on the host,
// inside the timed call, and so do we).
torch::Tensor prepare(const torch::Tensor& x, Gen gen) {
  if (takes_fp16(gen)) return x.to(at::kHalf).contiguous();
  return x.contiguous();
}

torch::Tensor alloc_f32(at::IntArrayRef sizes, const torch::Tensor& like, bool poison) {
  const auto opts = like.options().dtype(at::kFloat);
  // Poisoning makes any element a kernel forgets to write show up as NaN in the tests.
  return poison ? torch::full(sizes, std::numeric_limits<float>::quiet_NaN(), opts) : torch::empty(sizes, opts);
}

torch::Tensor forward(int64_t gen_id, torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale, bool causal,
                      int64_t q_offset, int64_t num_sm, bool debug) {
  TORCH_CHECK_VALUE(gen_id >= 1 && gen_id <= 6, "generation id must be 1..6 (v1_naive..v6_splitkv); got ", gen_id);
  const Gen gen = static_cast<Gen>(gen_id);
  check_operand(q, "q", q);
  check_operand(k, "k", q);
  check_operand(v, "v", q);
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "k and v must have the same shape; got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(q.size(0) == k.size(0), "q and k must share B; got ", q.size(0), " and ", k.size(0));
  TORCH_CHECK_VALUE(q.size(3) == k.size(3), "q and k must share D; got ", q.size(3), " and ", k.size(3));
  TORCH_CHECK_NOT_IMPLEMENTED(q.size(1) == k.size(1), gen_name(gen), " is MHA: H_q must equal H_kv; got ", q.size(1),
                              " and ", k.size(1));
  TORCH_CHECK_VALUE(q.numel() > 0 && k.numel() > 0, "q and k must be non-empty; got ", q.sizes(), ", ", k.sizes());
  TORCH_CHECK_VALUE(q_offset >= 0, "q_offset must be >= 0; got ", q_offset);
  TORCH_CHECK_VALUE(std::isfinite(scale), "scale must be finite; got ", scale);
  if (!takes_fp16(gen)) {
    TORCH_CHECK_NOT_IMPLEMENTED(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                                    v.scalar_type() == at::kFloat,
                                gen_name(gen), " takes float32 operands only (as the reference)");
  }
  const int64_t d = q.size(3);
  TORCH_CHECK_NOT_IMPLEMENTED(gen == Gen::kV1Naive || d == 64 || d == 128, gen_name(gen),
                              " supports head dims 64 and 128; got ", d);
  const int64_t bh = q.size(0) * q.size(1);
  TORCH_CHECK_NOT_IMPLEMENTED(bh <= 65535, gen_name(gen), ": B*H must be <= 65535 (a grid dimension); got ", bh);
  TORCH_CHECK_NOT_IMPLEMENTED(q.size(2) <= std::numeric_limits<int>::max() && k.size(2) <= std::numeric_limits<int>::max() &&
                                  q_offset <= std::numeric_limits<int>::max(),
                              "sequence lengths and q_offset must fit in int32");

  const c10::cuda::CUDAGuard guard(q.device());
  const torch::Tensor qc = prepare(q, gen), kc = prepare(k, gen), vc = prepare(v, gen);
  torch::Tensor out = alloc_f32({q.size(0), q.size(1), q.size(2), d}, q, debug);

  AttnParams p;
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.v = vc.data_ptr();
  p.out = out.data_ptr<float>();
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.n_q = static_cast<int>(q.size(2));
  p.n_k = static_cast<int>(k.size(2));
  p.head_dim = static_cast<int>(d);
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.q_offset = static_cast<int>(q_offset);
  if (gen == Gen::kV6SplitKV) {
    // num_sm <= 0: the device's SM count (post-audit behaviour); 40 reproduces the reference's numbers.
    const int sms = num_sm > 0 ? static_cast<int>(num_sm) : device_sm_count();
    const SplitPlan plan = choose_splits(bh, p.n_q, p.n_k, kV6RowsPerCta, sms);
    p.num_splits = plan.num_splits;
    p.split_chunk = plan.chunk;
  }

  torch::Tensor ws;
  const int64_t ws_floats = workspace_floats(gen, p);
  if (ws_floats > 0) {
    ws = alloc_f32({ws_floats}, q, debug);
    p.ws = ws.data_ptr<float>();
  }

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  switch (gen) {
    case Gen::kV1Naive: launch_v1_naive(p, stream); break;
    case Gen::kV2Tiled: launch_v2_tiled(p, stream); break;
    case Gen::kV3Online: launch_v3_online(p, stream); break;
    case Gen::kV4Fused: launch_v4_fused(p, stream); break;
    case Gen::kV5Wmma: launch_v5_wmma(p, stream); break;
    case Gen::kV6SplitKV: launch_v6_splitkv(p, stream); break;
  }
  if (debug) {
    // Asynchronous faults (out-of-bounds, illegal address) only show at a synchronisation point.
    const cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      throw std::runtime_error(std::string("cuda_ref: ") + gen_name(gen) + " failed during execution: " +
                               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
  }
  return out;
}

std::tuple<int64_t, int64_t> choose_splits_py(int64_t bh, int64_t n_q, int64_t n_k, int64_t num_sm) {
  TORCH_CHECK_VALUE(bh >= 1 && n_q >= 1 && n_k >= 1, "bh, n_q, n_k must be >= 1");
  const int sms = num_sm > 0 ? static_cast<int>(num_sm) : device_sm_count();
  const SplitPlan plan = choose_splits(bh, n_q, n_k, kV6RowsPerCta, sms);
  return {plan.num_splits, plan.chunk};
}

}  // namespace
}  // namespace cuda_ref

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cuda_ref: CUDA twins of the reference's v1_naive..v6_splitkv (use cuda_ref.attention)";
  m.def("forward", &cuda_ref::forward, "attention forward on BHND CUDA tensors; fp32 output", py::arg("gen_id"),
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("causal"), py::arg("q_offset"),
        py::arg("num_sm"), py::arg("debug"));
  m.def("choose_splits", &cuda_ref::choose_splits_py, "v6 split plan (num_splits, chunk); num_sm <= 0: device",
        py::arg("bh"), py::arg("n_q"), py::arg("n_k"), py::arg("num_sm"));
  m.def("device_sm_count", &cuda_ref::device_sm_count, "SM count of the current CUDA device");
}
