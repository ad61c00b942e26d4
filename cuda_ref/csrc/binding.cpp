// The one torch-aware file of cuda_ref: turns tensors into an AttnParams, allocates the outputs and the
// generation's workspace, dispatches by generation id and surfaces launch errors as Python exceptions.
//
// Four entries, one per kind of KV operand: forward (dense BHND k/v), forward_paged (KV pools + block
// table), forward_paged_quant (quantized pools: fp8 / NVFP4 bytes, scales, micro-scales) and forward_mla (one
// latent pool serving K and V: fp16 / bf16, fp8 or NVFP4). What a generation accepts (entry, operand cast, head dims, GQA, LSE, split plan, workspace) comes
// from its row in generations.def (common/generations.cuh); nothing here names a generation.
//
// cuda_ref/api.py validates arguments first (with the same messages on a CPU machine); the checks here are
// the C++ line of defence for direct callers of the extension. TORCH_CHECK_VALUE raises ValueError,
// TORCH_CHECK_NOT_IMPLEMENTED raises NotImplementedError, std::runtime_error becomes RuntimeError.
//
// Every message is assembled by msg() (std::to_string, string appends) and handed to TORCH_CHECK as ONE
// std::string, never as numbers for c10::str to stream: on the GPU image (torch 2.11.0+cu130, g++ 13.3,
// libstdc++.so.6.0.33) `std::ostream << int64_t` (or double) inside an extension segfaults the process,
// seen 2026-11-22 on an H100 even in a minimal load_inline extension; strings and std::to_string are fine.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/generations.cuh"
#include "common/launch.cuh"
#include "common/params.cuh"
#include "common/split_plan.cuh"

namespace cuda_ref {
namespace {

constexpr int64_t kMaxGridY = 65535;  // B*H rides in a grid dimension capped at 65535
constexpr int64_t kInt32Max = std::numeric_limits<int>::max();

// --- error messages without iostreams (see the file comment) ----------------------------------------------
void append(std::string& s, const char* x) { s += x; }
void append(std::string& s, const std::string& x) { s += x; }
void append(std::string& s, int64_t x) { s += std::to_string(x); }
void append(std::string& s, int x) { s += std::to_string(x); }
void append(std::string& s, double x) { s += std::to_string(x); }
void append(std::string& s, c10::ScalarType x) { s += c10::toString(x); }
void append(std::string& s, const c10::Device& x) { s += x.str(); }
void append(std::string& s, at::IntArrayRef x) {
  s += '[';
  for (size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + std::to_string(x[i]);
  s += ']';
}

template <typename... Args>
std::string msg(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

const char* entry_name(Entry e) {
  switch (e) {
    case Entry::kDense: return "dense";
    case Entry::kPaged: return "paged";
    case Entry::kQuantized: return "quantized";
    case Entry::kMla: return "mla";
  }
  return "?";
}

// "v1_naive, v2_tiled, ..." over every row (or the rows of one entry).
std::string built_ids(const Entry* only = nullptr) {
  std::string s;
  for (const GenInfo& g : kGenerations) {
    if (only != nullptr && g.entry != *only) continue;
    if (!s.empty()) s += ", ";
    s += g.name;
  }
  return s.empty() ? "none" : s;
}

// The row for gen_id, which must serve `entry`. An id no row carries is a ValueError, except on an entry
// no row serves yet (paged today), which is a NotImplementedError saying so.
const GenInfo& row_for(int64_t gen_id, Entry entry) {
  const GenInfo* g = find_gen(gen_id);
  TORCH_CHECK_NOT_IMPLEMENTED(any_entry(entry), msg("cuda_ref: generation id ", gen_id, ": no ", entry_name(entry),
                                                    " generation is built in cuda_ref yet; built: ", built_ids()));
  TORCH_CHECK_VALUE(g != nullptr, msg("cuda_ref: unknown generation id ", gen_id, "; built: ", built_ids()));
  TORCH_CHECK_VALUE(g->entry == entry, msg("cuda_ref: ", g->name, " is a ", entry_name(g->entry), " generation, not ",
                                           entry_name(entry), "; ", entry_name(entry),
                                           " generations built: ", built_ids(&entry)));
  return *g;
}

// The launcher of a row: one case per generations.def row.
void dispatch(const GenInfo& g, const AttnParams& p, cudaStream_t stream) {
  switch (g.gen) {
#define CUDA_REF_GEN(id, ...) \
  case Gen::id:               \
    launch_##id(p, stream);   \
    return;
#include "generations.def"
  }
  throw std::logic_error("cuda_ref: no launcher for generation " + std::to_string(g.number()));
}

int device_sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    throw std::runtime_error("cuda_ref: cannot query the device's SM count");
  }
  return sms;
}

void check_float_operand(const torch::Tensor& x, const char* name, const torch::Tensor& q, const char* shape) {
  TORCH_CHECK_VALUE(x.dim() == 4, msg(name, " must be rank 4 ", shape, "; got ", x.sizes()));
  TORCH_CHECK_VALUE(x.is_cuda(), msg(name, " must be a CUDA tensor; got device ", x.device()));
  TORCH_CHECK_VALUE(x.device() == q.device(), msg(name, " must be on q's device ", q.device(), "; got ", x.device()));
  const auto st = x.scalar_type();
  TORCH_CHECK_VALUE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16,
                    msg(name, " must be float32, float16 or bfloat16; got ", st));
}

void check_int32_vector(const torch::Tensor& x, const char* name, const torch::Tensor& q, int64_t b) {
  TORCH_CHECK_VALUE(x.dim() == 1 && x.size(0) == b, msg(name, " must be int32 [B] with B=", b, "; got ", x.sizes()));
  TORCH_CHECK_VALUE(x.scalar_type() == at::kInt, msg(name, " must be int32; got ", x.scalar_type()));
  TORCH_CHECK_VALUE(x.device() == q.device(), msg(name, " must be on q's device ", q.device(), "; got ", x.device()));
}

// What every generation checks, from its row: operand dtype, head dim, GQA, LSE.
void check_row_support(const GenInfo& g, const torch::Tensor& q, const torch::Tensor& k, int64_t h_q, int64_t h_kv,
                       int64_t d, bool return_lse) {
  if (!g.gqa) {
    TORCH_CHECK_NOT_IMPLEMENTED(h_q == h_kv, msg(g.name, " is MHA: H_q must equal H_kv; got ", h_q, " and ", h_kv));
  }
  if (!g.takes_fp16()) {
    TORCH_CHECK_NOT_IMPLEMENTED(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat,
                                msg(g.name, " takes float32 operands only (as the reference)"));
  }
  TORCH_CHECK_NOT_IMPLEMENTED(g.supports_head_dim(d), msg(g.name, " supports head dims 64 and 128; got ", d));
  TORCH_CHECK_NOT_IMPLEMENTED(!return_lse || g.writes_lse,
                              msg(g.name, " does not write the log-sum-exp (generations.def: writes_lse = 0)"));
}

// Operands as the kernels take them: contiguous, and fp16 for fp16-operand rows (the reference casts on the
// host, inside the timed call, and so do we).
torch::Tensor prepare(const torch::Tensor& x, const GenInfo& g) {
  if (g.takes_fp16()) return x.to(at::kHalf).contiguous();
  return x.contiguous();
}

torch::Tensor alloc_f32(at::IntArrayRef sizes, const torch::Tensor& like, bool poison) {
  const auto opts = like.options().dtype(at::kFloat);
  // Poisoning makes any element a kernel forgets to write show up as NaN in the tests.
  return poison ? torch::full(sizes, std::numeric_limits<float>::quiet_NaN(), opts) : torch::empty(sizes, opts);
}

Strides strides_of(const torch::Tensor& x) {  // x contiguous rank 4; dims 0, 1, 2 of BHND
  return {x.stride(0), x.stride(1), x.stride(2)};
}

// Everything after the tensors are in AttnParams: split plan, workspace, LSE, launch, debug sync. Returns
// {out} or {out, lse}.
std::vector<torch::Tensor> run(const GenInfo& g, AttnParams& p, const torch::Tensor& q, int64_t d_out,
                               int64_t num_sm, bool debug, bool return_lse) {
  torch::Tensor out = alloc_f32({p.batch, p.h_q, p.n_q, d_out}, q, debug);
  p.out = out.data_ptr<float>();
  p.o_strides = strides_of(out);
  torch::Tensor lse;
  if (return_lse) {
    lse = alloc_f32({p.batch, p.h_q, p.n_q}, q, debug);
    p.lse = lse.data_ptr<float>();
  }
  if (g.split_kv) {
    // num_sm <= 0: the device's SM count (post-audit behaviour); 40 reproduces the reference's numbers.
    const int sms = num_sm > 0 ? static_cast<int>(num_sm) : device_sm_count();
    const SplitPlan plan = split_plan_for(g, p.batch, p.h_q, p.h_kv, p.n_q, p.n_k, p.head_dim, sms);
    p.num_splits = plan.num_splits;
    p.split_chunk = plan.chunk;
  }
  torch::Tensor ws;
  const int64_t ws_floats = workspace_floats(g, p);
  if (ws_floats > 0) {
    ws = alloc_f32({ws_floats}, q, debug);
    p.ws = ws.data_ptr<float>();
  }

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  dispatch(g, p, stream);
  if (debug) {
    // Asynchronous faults (out-of-bounds, illegal address) only show at a synchronisation point.
    const cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      throw std::runtime_error(std::string("cuda_ref: ") + g.name + " failed during execution: " +
                               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
    }
  }
  if (return_lse) return {out, lse};
  return {out};
}

// Dense entry: q [B, H_q, Nq, D], k/v [B, H_kv, Nk, D] (BHND).
std::vector<torch::Tensor> forward(int64_t gen_id, torch::Tensor q, torch::Tensor k, torch::Tensor v, double scale,
                                   bool causal, int64_t q_offset, int64_t num_sm, bool debug, bool return_lse) {
  const GenInfo& g = row_for(gen_id, Entry::kDense);
  constexpr const char* kShape = "[B, H, N, D]";
  check_float_operand(q, "q", q, kShape);
  check_float_operand(k, "k", q, kShape);
  check_float_operand(v, "v", q, kShape);
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(),
                    msg("k and v must have the same shape; got ", k.sizes(), " and ", v.sizes()));
  TORCH_CHECK_VALUE(q.size(0) == k.size(0), msg("q and k must share B; got ", q.size(0), " and ", k.size(0)));
  TORCH_CHECK_VALUE(q.size(3) == k.size(3), msg("q and k must share D; got ", q.size(3), " and ", k.size(3)));
  TORCH_CHECK_VALUE(q.numel() > 0 && k.numel() > 0, msg("q and k must be non-empty; got ", q.sizes(), ", ", k.sizes()));
  TORCH_CHECK_VALUE(q.size(1) % k.size(1) == 0,
                    msg("H_q must be a multiple of H_kv; got ", q.size(1), " and ", k.size(1)));
  TORCH_CHECK_VALUE(q_offset >= 0, msg("q_offset must be >= 0; got ", q_offset));
  TORCH_CHECK_VALUE(std::isfinite(scale), msg("scale must be finite; got ", scale));
  const int64_t d = q.size(3);
  check_row_support(g, q, k, q.size(1), k.size(1), d, return_lse);
  const int64_t bh = q.size(0) * q.size(1);
  TORCH_CHECK_NOT_IMPLEMENTED(bh <= kMaxGridY, msg(g.name, ": B*H must be <= 65535 (a grid dimension); got ", bh));
  TORCH_CHECK_NOT_IMPLEMENTED(q.size(2) <= kInt32Max && k.size(2) <= kInt32Max && q_offset <= kInt32Max,
                              msg("sequence lengths and q_offset must fit in int32"));

  const c10::cuda::CUDAGuard guard(q.device());
  const torch::Tensor qc = prepare(q, g), kc = prepare(k, g), vc = prepare(v, g);

  AttnParams p;
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.v = vc.data_ptr();
  p.q_strides = strides_of(qc);
  p.k_strides = strides_of(kc);
  p.v_strides = strides_of(vc);
  p.kv_dtype = g.takes_fp16() ? KvDtype::kF16 : KvDtype::kF32;
  p.batch = static_cast<int>(q.size(0));
  p.h_q = static_cast<int>(q.size(1));
  p.h_kv = static_cast<int>(k.size(1));
  p.n_q = static_cast<int>(q.size(2));
  p.n_k = static_cast<int>(k.size(2));
  p.head_dim = static_cast<int>(d);
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.q_offset = static_cast<int>(q_offset);
  return run(g, p, q, d, num_sm, debug, return_lse);
}

// Quantized pools (entry kQuantized, §2.14/§2.15): the format, the per-tensor scales and, for NVFP4, the
// micro-scale pools [num_blocks, page_size, H_kv, D/16] (uint8, contiguous). Checked by forward_paged_quant.
struct QuantKv {
  KvDtype dtype;
  float k_scale, v_scale;
  torch::Tensor k_micro, v_micro;  // NVFP4 only (undefined for fp8)
};

// Debug mode: raise ValueError for what a paged kernel reported in AttnParams::paged_error (common/paged.cuh).
void report_paged_error(const GenInfo& g, const torch::Tensor& err, const torch::Tensor& bt, const torch::Tensor& lens,
                        int64_t capacity, int64_t num_blocks) {
  const torch::Tensor e = err.cpu();
  const int32_t bad_entry = e[0].item<int32_t>(), bad_len = e[1].item<int32_t>();
  if (bad_len > 0) {
    const int64_t seq = bad_len - 1;
    TORCH_CHECK_VALUE(false, msg(g.name, ": kv_lens[", seq, "] = ", lens[seq].item<int64_t>(),
                                 " is outside [0, pages_per_seq * page_size = ", capacity, "]"));
  }
  if (bad_entry > 0) {
    const int64_t flat = bad_entry - 1, pages = bt.size(1);
    const int64_t seq = flat / pages, page = flat % pages;
    TORCH_CHECK_VALUE(false, msg(g.name, ": block_table[", seq, "][", page, "] = ", bt[seq][page].item<int64_t>(),
                                 " is outside [0, num_blocks = ", num_blocks, ") and page ", page,
                                 " holds keys of sequence ", seq));
  }
}

// Paged entry: q [B, H_q, Nq, D]; pools [num_blocks, page_size, H_kv, D]; block_table int32 [B, pages_per_seq];
// kv_lens int32 [B]; q_offsets int32 [B] (api.py turns None / an int into it). Key j of sequence b is row
// j % page_size of block block_table[b][j / page_size]; keys at j >= kv_lens[b] are invisible. With `quant`
// the pools are the format's uint8 data ([.., D] fp8, [.., D/2] NVFP4 packed), passed to the kernel uncast.
// The paged entries' (paged, quantized, MLA) shape, dtype and device checks of the table, lengths, offsets, scale.
void check_table_args(const torch::Tensor& block_table, const torch::Tensor& kv_lens, const torch::Tensor& q_offsets,
                      const torch::Tensor& q, int64_t b, double scale) {
  TORCH_CHECK_VALUE(block_table.dim() == 2 && block_table.size(0) == b && block_table.size(1) >= 1,
                    msg("block_table must be int32 [B, pages_per_seq] with B=", b, "; got ", block_table.sizes()));
  TORCH_CHECK_VALUE(block_table.scalar_type() == at::kInt,
                    msg("block_table must be int32; got ", block_table.scalar_type()));
  TORCH_CHECK_VALUE(block_table.device() == q.device(), msg("block_table must be on q's device ", q.device()));
  check_int32_vector(kv_lens, "kv_lens", q, b);
  check_int32_vector(q_offsets, "q_offsets", q, b);
  TORCH_CHECK_VALUE(std::isfinite(scale), msg("scale must be finite; got ", scale));
}

// The paged entries' table fields, then the launch. Debug mode: the kernels report a used block-table entry
// outside [0, num_blocks) or a kv_len outside [0, capacity] (they load such keys as NaN either way, never outside
// the pool; common/paged.cuh), and this raises naming it.
std::vector<torch::Tensor> run_paged(const GenInfo& g, AttnParams& p, const torch::Tensor& q, const torch::Tensor& bt,
                                     const torch::Tensor& lens, const torch::Tensor& offs, int64_t page_size,
                                     int64_t num_blocks, double scale, bool causal, int64_t d_out, int64_t num_sm,
                                     bool debug, bool return_lse) {
  p.block_table = bt.data_ptr<int32_t>();
  p.pages_per_seq = static_cast<int>(bt.size(1));
  p.page_size = static_cast<int>(page_size);
  p.num_blocks = static_cast<int>(num_blocks);
  p.kv_lens = lens.data_ptr<int32_t>();
  p.q_offsets = offs.data_ptr<int32_t>();
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  torch::Tensor err;
  if (debug) {
    err = torch::zeros({2}, q.options().dtype(at::kInt));
    p.paged_error = err.data_ptr<int32_t>();
  }
  std::vector<torch::Tensor> res = run(g, p, q, d_out, num_sm, debug, return_lse);
  if (debug) report_paged_error(g, err, bt, lens, bt.size(1) * page_size, num_blocks);
  return res;
}

std::vector<torch::Tensor> paged_impl(const GenInfo& g, torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                                      torch::Tensor block_table, torch::Tensor kv_lens, torch::Tensor q_offsets,
                                      double scale, bool causal, int64_t num_sm, bool debug, bool return_lse,
                                      const QuantKv* quant) {
  check_float_operand(q, "q", q, "[B, H_q, N_q, D]");
  if (quant == nullptr) {
    check_float_operand(k_pool, "k_pool", q, "[num_blocks, page_size, H_kv, D]");
    check_float_operand(v_pool, "v_pool", q, "[num_blocks, page_size, H_kv, D]");
  }
  TORCH_CHECK_VALUE(k_pool.sizes() == v_pool.sizes(),
                    msg("k_pool and v_pool must have the same shape; got ", k_pool.sizes(), " and ", v_pool.sizes()));
  TORCH_CHECK_VALUE(q.numel() > 0 && k_pool.numel() > 0,
                    msg("q and the pools must be non-empty; got ", q.sizes(), ", ", k_pool.sizes()));
  const int64_t b = q.size(0), h_q = q.size(1), d = q.size(3);
  const int64_t num_blocks = k_pool.size(0), page_size = k_pool.size(1), h_kv = k_pool.size(2);
  const bool packed = quant != nullptr && quant->dtype == KvDtype::kNvfp4;  // NVFP4: two elements per byte
  TORCH_CHECK_VALUE(k_pool.size(3) * (packed ? 2 : 1) == d,
                    msg("q and the pools must share D; got ", d, " and ", k_pool.size(3) * (packed ? 2 : 1)));
  TORCH_CHECK_VALUE((page_size & (page_size - 1)) == 0, msg("page_size must be a power of two; got ", page_size));
  TORCH_CHECK_VALUE(h_q % h_kv == 0, msg("H_q must be a multiple of H_kv; got ", h_q, " and ", h_kv));
  check_table_args(block_table, kv_lens, q_offsets, q, b, scale);
  check_row_support(g, q, k_pool, h_q, h_kv, d, return_lse);
  TORCH_CHECK_NOT_IMPLEMENTED(b * h_q <= kMaxGridY,
                              msg(g.name, ": B*H_q must be <= 65535 (a grid dimension); got ", b * h_q));
  const int64_t capacity = block_table.size(1) * page_size;
  TORCH_CHECK_NOT_IMPLEMENTED(q.size(2) <= kInt32Max && capacity <= kInt32Max && num_blocks <= kInt32Max,
                              msg("sequence lengths, pages and blocks must fit in int32"));

  const c10::cuda::CUDAGuard guard(q.device());
  const torch::Tensor qc = prepare(q, g);
  const torch::Tensor kc = quant ? k_pool.contiguous() : prepare(k_pool, g);
  const torch::Tensor vc = quant ? v_pool.contiguous() : prepare(v_pool, g);
  const torch::Tensor bt = block_table.contiguous(), lens = kv_lens.contiguous(), offs = q_offsets.contiguous();

  AttnParams p;
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.v = vc.data_ptr();
  p.q_strides = strides_of(qc);
  p.k_strides = {kc.stride(0), kc.stride(2), kc.stride(1)};  // pool: block, head, token-in-page
  p.v_strides = {vc.stride(0), vc.stride(2), vc.stride(1)};
  p.kv_dtype = g.takes_fp16() ? KvDtype::kF16 : KvDtype::kF32;
  torch::Tensor kmc, vmc;
  if (quant != nullptr) {
    p.kv_dtype = quant->dtype;
    p.k_scale = quant->k_scale;
    p.v_scale = quant->v_scale;
    if (packed) {
      kmc = quant->k_micro.contiguous();
      vmc = quant->v_micro.contiguous();
      p.k_micro_scales = kmc.data_ptr<uint8_t>();
      p.v_micro_scales = vmc.data_ptr<uint8_t>();
    }
  }
  p.batch = static_cast<int>(b);
  p.h_q = static_cast<int>(h_q);
  p.h_kv = static_cast<int>(h_kv);
  p.n_q = static_cast<int>(q.size(2));
  p.n_k = static_cast<int>(capacity);
  p.head_dim = static_cast<int>(d);
  return run_paged(g, p, q, bt, lens, offs, page_size, num_blocks, scale, causal, d, num_sm, debug, return_lse);
}

std::vector<torch::Tensor> forward_paged(int64_t gen_id, torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                                         torch::Tensor block_table, torch::Tensor kv_lens, torch::Tensor q_offsets,
                                         double scale, bool causal, int64_t num_sm, bool debug, bool return_lse) {
  const GenInfo& g = row_for(gen_id, Entry::kPaged);
  return paged_impl(g, q, k_pool, v_pool, block_table, kv_lens, q_offsets, scale, causal, num_sm, debug, return_lse,
                    nullptr);
}

void check_uint8_pool(const torch::Tensor& x, const char* name, const torch::Tensor& q, const char* shape) {
  TORCH_CHECK_VALUE(x.dim() == 4, msg(name, " must be rank 4 ", shape, "; got ", x.sizes()));
  TORCH_CHECK_VALUE(x.scalar_type() == at::kByte, msg(name, " must be uint8; got ", x.scalar_type()));
  TORCH_CHECK_VALUE(x.device() == q.device(), msg(name, " must be on q's device ", q.device(), "; got ", x.device()));
}

// Quantized paged entry (v9_fp8: kv_format 0, k/v data [num_blocks, page_size, H_kv, D]; v10_nvfp4: kv_format 1,
// packed [.., D/2] + micro [.., D/16]; pass empty micro tensors for fp8). k_scale / v_scale: the per-tensor
// float32 scales, taken as they are (a NaN or inf scale, from a pool holding NaN or inf, makes NaN out as in the
// judge). The generation's row must match the format (v9 reads fp8, v10 NVFP4).
std::vector<torch::Tensor> forward_paged_quant(int64_t gen_id, int64_t kv_format, torch::Tensor q, torch::Tensor k_data,
                                               torch::Tensor v_data, torch::Tensor k_micro, torch::Tensor v_micro,
                                               double k_scale, double v_scale, torch::Tensor block_table,
                                               torch::Tensor kv_lens, torch::Tensor q_offsets, double scale,
                                               bool causal, int64_t num_sm, bool debug, bool return_lse) {
  const GenInfo& g = row_for(gen_id, Entry::kQuantized);
  TORCH_CHECK_VALUE(kv_format == 0 || kv_format == 1, msg("kv_format must be 0 (fp8) or 1 (nvfp4); got ", kv_format));
  const bool nvfp4 = kv_format == 1;
  const Gen want = nvfp4 ? Gen::v10_nvfp4 : Gen::v9_fp8;
  TORCH_CHECK_VALUE(g.gen == want, msg(g.name, " does not read ", nvfp4 ? "NVFP4" : "fp8", " pools; use ",
                                       gen_info(want).name));
  const char* shape = nvfp4 ? "[num_blocks, page_size, H_kv, D/2]" : "[num_blocks, page_size, H_kv, D]";
  check_uint8_pool(k_data, "k_pool data", q, shape);
  check_uint8_pool(v_data, "v_pool data", q, shape);
  QuantKv quant{nvfp4 ? KvDtype::kNvfp4 : KvDtype::kFp8E4M3, static_cast<float>(k_scale),
                static_cast<float>(v_scale), {}, {}};
  if (nvfp4) {
    TORCH_CHECK_VALUE(k_data.size(3) % 16 == 0, msg("NVFP4 needs D a multiple of 32; got D=", 2 * k_data.size(3)));
    const auto check_micro = [&](const torch::Tensor& m, const char* name) {
      check_uint8_pool(m, name, q, "[num_blocks, page_size, H_kv, D/16]");
      TORCH_CHECK_VALUE(m.size(0) == k_data.size(0) && m.size(1) == k_data.size(1) && m.size(2) == k_data.size(2) &&
                            m.size(3) * 8 == k_data.size(3),
                        msg(name, " must be [num_blocks, page_size, H_kv, D/16] matching the packed pool ",
                            k_data.sizes(), "; got ", m.sizes()));
    };
    check_micro(k_micro, "k_pool micro");
    check_micro(v_micro, "v_pool micro");
    quant.k_micro = k_micro;
    quant.v_micro = v_micro;
  }
  return paged_impl(g, q, k_data, v_data, block_table, kv_lens, q_offsets, scale, causal, num_sm, debug, return_lse,
                    &quant);
}

// MLA entry (entry kMla, docs/reference.md §2.16-§2.17): q [B, H_q, N_q, DQK] fp16/bf16; ONE latent pool
// [num_blocks, page_size, 1, W] serving K (all DQK columns) and V (the first kv_lora_rank = DV): kv_format 0 float
// (fp16 / bf16 elements, W = DQK), 1 fp8 (uint8, W = DQK, lat_scale), 2 NVFP4 (packed uint8 W = DQK/2 + micro
// [.., DQK/16], lat_scale). Out float32 [B, H_q, N_q, DV]. The row's operand column says how q is read (v11_mla
// kF16: cast to fp16 here; v12_mla_tc kNative: as given). Which latent formats and (DQK, DV) templates a
// generation reads is checked by its launcher too; api.py checks all of it first with the same words.
std::vector<torch::Tensor> forward_mla(int64_t gen_id, int64_t kv_format, torch::Tensor q, torch::Tensor lat,
                                       torch::Tensor lat_micro, double lat_scale, torch::Tensor block_table,
                                       torch::Tensor kv_lens, torch::Tensor q_offsets, int64_t kv_lora_rank,
                                       double scale, bool causal, int64_t num_sm, bool debug, bool return_lse) {
  const GenInfo& g = row_for(gen_id, Entry::kMla);
  TORCH_CHECK_VALUE(kv_format >= 0 && kv_format <= 2,
                    msg("kv_format must be 0 (float), 1 (fp8) or 2 (nvfp4); got ", kv_format));
  TORCH_CHECK_VALUE(q.dim() == 4, msg("q must be rank 4 [B, H_q, N_q, DQK]; got ", q.sizes()));
  TORCH_CHECK_VALUE(q.is_cuda(), msg("q must be a CUDA tensor; got device ", q.device()));
  TORCH_CHECK_VALUE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                    msg("q must be float16 or bfloat16; got ", q.scalar_type()));
  TORCH_CHECK_VALUE(lat.dim() == 4, msg("latent_pool must be rank 4 [num_blocks, page_size, 1, W]; got ", lat.sizes()));
  TORCH_CHECK_VALUE(lat.device() == q.device(), msg("latent_pool must be on q's device ", q.device()));
  TORCH_CHECK_VALUE(q.numel() > 0 && lat.numel() > 0, msg("q and latent_pool must be non-empty"));
  const bool is_float = kv_format == 0, nvfp4 = kv_format == 2;
  if (is_float) {
    TORCH_CHECK_VALUE(lat.scalar_type() == q.scalar_type(),
                      msg("a float latent_pool must have q's dtype ", q.scalar_type(), "; got ", lat.scalar_type()));
  } else {
    TORCH_CHECK_VALUE(lat.scalar_type() == at::kByte, msg("a quantized latent pool must be uint8; got ", lat.scalar_type()));
  }
  const int64_t b = q.size(0), h_q = q.size(1), n_q = q.size(2), d_qk = q.size(3);
  const int64_t num_blocks = lat.size(0), page_size = lat.size(1);
  TORCH_CHECK_VALUE(lat.size(2) == 1, msg("latent_pool has one latent head (dim 2 must be 1); got ", lat.sizes()));
  TORCH_CHECK_VALUE(lat.size(3) * (nvfp4 ? 2 : 1) == d_qk,
                    msg("q and latent_pool must share DQK; got ", d_qk, " and ", lat.size(3) * (nvfp4 ? 2 : 1)));
  TORCH_CHECK_VALUE((page_size & (page_size - 1)) == 0, msg("page_size must be a power of two; got ", page_size));
  TORCH_CHECK_VALUE(kv_lora_rank >= 1 && kv_lora_rank <= d_qk,
                    msg("kv_lora_rank must lie in [1, DQK = ", d_qk, "]; got ", kv_lora_rank));
  torch::Tensor micro;
  if (nvfp4) {
    TORCH_CHECK_VALUE(lat_micro.dim() == 4 && lat_micro.scalar_type() == at::kByte && lat_micro.size(0) == num_blocks &&
                          lat_micro.size(1) == page_size && lat_micro.size(2) == 1 && lat_micro.size(3) * 16 == d_qk &&
                          d_qk % 32 == 0,
                      msg("NVFP4 latent micro-scales must be uint8 [num_blocks, page_size, 1, DQK/16] with DQK a "
                          "multiple of 32; got ", lat_micro.sizes()));
    TORCH_CHECK_VALUE(lat_micro.device() == q.device(), msg("latent micro-scales must be on q's device ", q.device()));
    micro = lat_micro.contiguous();
  }
  check_table_args(block_table, kv_lens, q_offsets, q, b, scale);
  const bool template_ok = (d_qk == 96 && kv_lora_rank == 64) || (d_qk == 160 && kv_lora_rank == 128) ||
                           (d_qk == 576 && kv_lora_rank == 512);
  TORCH_CHECK_NOT_IMPLEMENTED(template_ok, msg(g.name, " instantiates (DQK, kv_lora_rank) = (96, 64), (160, 128) and "
                                               "(576, 512) only; got (", d_qk, ", ", kv_lora_rank, ")"));
  const bool v12 = g.operand == Operand::kNative;
  TORCH_CHECK_NOT_IMPLEMENTED(!(v12 && nvfp4) && !(!v12 && kv_format == 1),
                              msg(g.name, v12 ? " reads fp16, bf16 or fp8 latents (NVFP4: v11_mla)"
                                              : " reads fp16, bf16 or NVFP4 latents (fp8: v12_mla_tc)"));
  TORCH_CHECK_NOT_IMPLEMENTED(b * h_q <= kMaxGridY && b <= kMaxGridY,
                              msg(g.name, ": B*H_q must be <= 65535 (a grid dimension); got ", b * h_q));
  const int64_t capacity = block_table.size(1) * page_size;
  TORCH_CHECK_NOT_IMPLEMENTED(n_q <= kInt32Max && capacity <= kInt32Max && num_blocks <= kInt32Max,
                              msg("sequence lengths, pages and blocks must fit in int32"));

  const c10::cuda::CUDAGuard guard(q.device());
  // cp.async (v12) needs 16-B aligned rows: contiguous tensors whose storage starts 16-B aligned (a copy otherwise).
  const auto aligned = [](torch::Tensor x) {
    x = x.contiguous();
    if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) x = x.clone();
    return x;
  };
  const torch::Tensor qc = aligned(g.takes_fp16() ? q.to(at::kHalf) : q);
  const torch::Tensor lc = aligned(lat);
  const torch::Tensor bt = block_table.contiguous(), lens = kv_lens.contiguous(), offs = q_offsets.contiguous();

  AttnParams p;
  p.q = qc.data_ptr();
  p.k = lc.data_ptr();
  p.v = lc.data_ptr();
  p.q_strides = strides_of(qc);
  p.k_strides = {lc.stride(0), lc.stride(2), lc.stride(1)};  // pool: block, head, token-in-page
  p.v_strides = p.k_strides;
  p.q_dtype = qc.scalar_type() == at::kBFloat16 ? KvDtype::kBF16 : KvDtype::kF16;
  if (is_float) {
    p.kv_dtype = lat.scalar_type() == at::kBFloat16 ? KvDtype::kBF16 : KvDtype::kF16;
  } else {
    p.kv_dtype = nvfp4 ? KvDtype::kNvfp4 : KvDtype::kFp8E4M3;
    p.k_scale = static_cast<float>(lat_scale);
    p.v_scale = p.k_scale;
    if (nvfp4) {
      p.k_micro_scales = micro.data_ptr<uint8_t>();
      p.v_micro_scales = p.k_micro_scales;
    }
  }
  p.batch = static_cast<int>(b);
  p.h_q = static_cast<int>(h_q);
  p.h_kv = 1;
  p.n_q = static_cast<int>(n_q);
  p.n_k = static_cast<int>(capacity);
  p.kv_lora_rank = static_cast<int>(kv_lora_rank);
  p.d_qk = static_cast<int>(d_qk);
  p.d_v = static_cast<int>(kv_lora_rank);
  p.rope_dim = static_cast<int>(d_qk - kv_lora_rank);
  p.head_dim = p.d_v;  // the partials' and the merge's width (params.cuh)
  return run_paged(g, p, q, bt, lens, offs, page_size, num_blocks, scale, causal, kv_lora_rank, num_sm, debug,
                   return_lse);
}

std::tuple<int64_t, int64_t> choose_splits_py(int64_t bh, int64_t n_q, int64_t n_k, int64_t num_sm) {
  TORCH_CHECK_VALUE(bh >= 1 && n_q >= 1 && n_k >= 1, msg("bh, n_q, n_k must be >= 1"));
  const int sms = num_sm > 0 ? static_cast<int>(num_sm) : device_sm_count();
  const SplitPlan plan = choose_splits(bh, n_q, n_k, kSplitRowsPerCta, sms);
  return {plan.num_splits, plan.chunk};
}

// The split plan a split-KV generation launches with at this shape (split_plan_for; num_sm <= 0: the device's).
std::tuple<int64_t, int64_t> split_plan_py(int64_t gen_id, int64_t batch, int64_t h_q, int64_t h_kv, int64_t n_q,
                                           int64_t n_k, int64_t head_dim, int64_t num_sm) {
  const GenInfo* g = find_gen(gen_id);
  TORCH_CHECK_VALUE(g != nullptr, msg("cuda_ref: unknown generation id ", gen_id, "; built: ", built_ids()));
  TORCH_CHECK_VALUE(g->split_kv, msg("cuda_ref: ", g->name, " takes no split plan (generations.def split_kv = 0)"));
  TORCH_CHECK_VALUE(batch >= 1 && h_q >= 1 && h_kv >= 1 && h_q % h_kv == 0 && n_q >= 1 && n_k >= 1 && head_dim >= 1,
                    msg("batch, h_q, h_kv, n_q, n_k, head_dim must be >= 1 with h_q a multiple of h_kv"));
  const int sms = num_sm > 0 ? static_cast<int>(num_sm) : device_sm_count();
  const SplitPlan plan = split_plan_for(*g, batch, h_q, h_kv, n_q, n_k, head_dim, sms);
  return {plan.num_splits, plan.chunk};
}

// The table as the extension was compiled with it: (number, id, entry) per row (a GPU test compares it
// with cuda_ref.table(), i.e. the loaded build is the current generations.def).
std::vector<std::tuple<int64_t, std::string, std::string>> table_py() {
  std::vector<std::tuple<int64_t, std::string, std::string>> rows;
  for (const GenInfo& g : kGenerations) rows.emplace_back(g.number(), g.name, entry_name(g.entry));
  return rows;
}

}  // namespace
}  // namespace cuda_ref

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cuda_ref: CUDA twins of the reference's generations (use cuda_ref.attention / paged_attention)";
  m.def("forward", &cuda_ref::forward, "dense attention on BHND CUDA tensors; returns [out] or [out, lse]",
        py::arg("gen_id"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("causal"),
        py::arg("q_offset"), py::arg("num_sm"), py::arg("debug"), py::arg("return_lse"));
  m.def("forward_paged", &cuda_ref::forward_paged,
        "paged attention (BHND q, [num_blocks, page_size, H_kv, D] pools); returns [out] or [out, lse]",
        py::arg("gen_id"), py::arg("q"), py::arg("k_pool"), py::arg("v_pool"), py::arg("block_table"),
        py::arg("kv_lens"), py::arg("q_offsets"), py::arg("scale"), py::arg("causal"), py::arg("num_sm"),
        py::arg("debug"), py::arg("return_lse"));
  m.def("forward_paged_quant", &cuda_ref::forward_paged_quant,
        "paged attention over quantized pools (v9_fp8: kv_format 0; v10_nvfp4: kv_format 1, with micro pools)",
        py::arg("gen_id"), py::arg("kv_format"), py::arg("q"), py::arg("k_data"), py::arg("v_data"),
        py::arg("k_micro"), py::arg("v_micro"), py::arg("k_scale"), py::arg("v_scale"), py::arg("block_table"),
        py::arg("kv_lens"), py::arg("q_offsets"), py::arg("scale"), py::arg("causal"), py::arg("num_sm"),
        py::arg("debug"), py::arg("return_lse"));
  m.def("forward_mla", &cuda_ref::forward_mla,
        "MLA latent decode (BHND q, one latent pool [num_blocks, page_size, 1, W]); kv_format 0 float, 1 fp8, "
        "2 nvfp4 (with micro); returns [out] or [out, lse]",
        py::arg("gen_id"), py::arg("kv_format"), py::arg("q"), py::arg("lat"), py::arg("lat_micro"),
        py::arg("lat_scale"), py::arg("block_table"), py::arg("kv_lens"), py::arg("q_offsets"),
        py::arg("kv_lora_rank"), py::arg("scale"), py::arg("causal"), py::arg("num_sm"), py::arg("debug"),
        py::arg("return_lse"));
  m.def("choose_splits", &cuda_ref::choose_splits_py, "split plan (num_splits, chunk); num_sm <= 0: device",
        py::arg("bh"), py::arg("n_q"), py::arg("n_k"), py::arg("num_sm"));
  m.def("split_plan", &cuda_ref::split_plan_py,
        "split plan (num_splits, chunk) of a split-KV generation at a shape; num_sm <= 0: device",
        py::arg("gen_id"), py::arg("batch"), py::arg("h_q"), py::arg("h_kv"), py::arg("n_q"), py::arg("n_k"),
        py::arg("head_dim"), py::arg("num_sm"));
  m.def("device_sm_count", &cuda_ref::device_sm_count, "SM count of the current CUDA device");
  m.def("table", &cuda_ref::table_py, "generations.def as compiled: [(number, id, entry)]");
}
