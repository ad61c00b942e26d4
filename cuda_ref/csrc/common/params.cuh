// The one parameter block every cuda_ref launcher takes (DESIGN.md: one params struct, one binding).
//
// Kept free of torch on purpose: the kernels compile with plain nvcc on a machine without torch or a GPU,
// and only binding.cpp knows about tensors. It carries what the dense generations use (v1-v6) and what the
// paged / GQA / low-precision / MLA generations (v7-v12) will need, so a new generation adds a kernel, not
// fields: a field a generation does not read keeps its default.
//
// v1-v6 read operands as contiguous BHND ([B, H, N, D], docs/reference.md §1.1) with index arithmetic of their
// own, as the reference's kernels do; the binding makes them contiguous and still fills the strides.
#pragma once

#include <cstdint>

namespace cuda_ref {

// Storage type of the K/V operands the kernel reads (after the binding's host cast, if any).
enum class KvDtype : int {
  kF32 = 0,      // v1-v4: float32, as the reference
  kF16 = 1,      // v5-v8: float16 (host-cast from fp32/bf16, as the reference)
  kBF16 = 2,     // bfloat16 pools (no reference generation reads them natively yet)
  kFp8E4M3 = 3,  // v9: one byte per element; value = fp8 * k_scale (resp. v_scale)
  kNvfp4 = 4,    // v10/v11: two E2M1 values per byte, one E4M3 micro-scale per 16 elements, then * k/v_scale
};

// Element strides (not bytes) of a rank-4 operand; its last dimension is always unit stride.
//   dense BHND [B, H, N, D]:                     batch = H*N*D, head = N*D, row = D
//   paged pool [num_blocks, page_size, H_kv, W]: batch = page_size*H_kv*W (one block), row = H_kv*W (one
//                                                token of a page), head = W
struct Strides {
  int64_t batch = 0;  // dense: to the next sequence; pool: to the next physical block (page)
  int64_t head = 0;   // to the next head
  int64_t row = 0;    // dense: to the next token; pool: to the next token within the same page
};

struct AttnParams {
  // --- operands and outputs --------------------------------------------------------------------------
  const void* q = nullptr;  // [B, H_q, n_q, d_qk]; fp32 or fp16 per the generation's operand column
  const void* k = nullptr;  // dense [B, H_kv, n_k, D]; paged pool [num_blocks, page_size, H_kv, D]
  const void* v = nullptr;  // as k (MLA: unused, the latent pool is k)
  float* out = nullptr;     // [B, H_q, n_q, d_v], always fp32 (§1.1)
  float* lse = nullptr;     // [B, H_q, n_q] fp32 natural-log LSE of the scaled scores, -inf for a row that
                            // sees no key; null = not requested (generations.def column writes_lse)
  Strides q_strides, k_strides, v_strides, o_strides;  // element strides of q, k, v, out (see Strides)

  // Generation-owned HBM scratch, sized by workspace_floats(): S for v1/v2, row stats for v3, split
  // partials for v6. Owned by the caller so the binding can poison it in debug mode.
  float* ws = nullptr;

  // --- shape -------------------------------------------------------------------------------------------
  int batch = 0;     // B
  int h_q = 0;       // query heads
  int h_kv = 0;      // key/value heads; G = h_q / h_kv query heads share one KV head (h_kv = h_q / G).
                     // v1-v6 are MHA: h_q == h_kv
  int n_q = 0;       // query rows per (batch, head)
  int n_k = 0;       // dense: keys per sequence; paged: pages_per_seq * page_size (capacity; see kv_lens)
  int head_dim = 0;  // D of q, k, v and out (dense, paged); MLA uses d_qk / d_v below

  // --- paged KV (v7+; null / 0 for dense) ---------------------------------------------------------------
  const int32_t* block_table = nullptr;  // int32 [B, pages_per_seq]: logical page p of sequence b lives in
                                         // physical block block_table[b * pages_per_seq + p]
  int pages_per_seq = 0;                 // columns of block_table
  int page_size = 0;                     // tokens per page, a power of two; key j is at row j % page_size
                                         // of block block_table[b][j / page_size]
  int num_blocks = 0;                    // physical blocks in each pool (block_table entries < num_blocks)
  const int32_t* kv_lens = nullptr;      // int32 [B]: sequence b has keys [0, kv_lens[b]); null = n_k each
  const int32_t* q_offsets = nullptr;    // int32 [B]: per-sequence causal offset; null = the scalar q_offset
  // Debug mode only (CUDA_REF_DEBUG=1), else null: int32 [2], zeroed by the binding. A paged kernel that meets
  // a used block-table entry outside [0, num_blocks) stores 1 + its flat index (b * pages_per_seq + page) in
  // [0]; a kv_lens[b] outside [0, n_k] stores 1 + b in [1]. Either way it never reads outside the pool: such
  // keys load as NaN, so every row that needs them comes out NaN (common/paged.cuh).
  int32_t* paged_error = nullptr;

  // --- KV storage precision (v9+) -------------------------------------------------------------------
  KvDtype kv_dtype = KvDtype::kF32;          // what k and v point to
  float k_scale = 1.f;                       // per-tensor dequant scale of K (fp8 / nvfp4), 1 otherwise
  float v_scale = 1.f;                       // per-tensor dequant scale of V
  const uint8_t* k_micro_scales = nullptr;   // nvfp4: E4M3 bytes [num_blocks, page_size, H_kv, D / 16]
  const uint8_t* v_micro_scales = nullptr;   // nvfp4: as k_micro_scales, for V

  // --- MLA (v11/v12; 0 otherwise) -------------------------------------------------------------------
  int kv_lora_rank = 0;  // latent width c (512 in DeepSeek-V3): shared by K's nope part and by V
  int rope_dim = 0;      // decoupled rope width r (64): the remaining part of K
  int d_qk = 0;          // query/key width = kv_lora_rank + rope_dim (576)
  int d_v = 0;           // value/output width = kv_lora_rank (512)
  KvDtype q_dtype = KvDtype::kF16;  // MLA: element type of q as the kernel reads it (v11: kF16 after the host
                                    // cast; v12_mla_tc: kF16 or kBF16, also its MMA operand type). The binding
                                    // sets head_dim = d_v for MLA (the partials' and the merge's width).

  // --- softmax and mask --------------------------------------------------------------------------------
  float scale = 0.f;  // applied to the fp32 dot, after it (§8)
  bool causal = false;
  // Top-left causal: key j visible to query i iff j <= i + q_offset. The reference's v1-v6 have no
  // q_offset (it is always 0 there); we take it in all six as a deliberate extension. Paged: q_offsets.
  int q_offset = 0;

  // --- split-KV (generations with split_kv = 1) ---------------------------------------------------------
  // The split plan (choose_splits, split_plan.cuh), decided by the host so it can size the workspace:
  // split s covers keys [s * split_chunk, min((s + 1) * split_chunk, n_k)).
  int num_splits = 1;
  int split_chunk = 0;

  int64_t bh() const { return static_cast<int64_t>(batch) * h_q; }  // (batch, query head) pairs
  int group() const { return h_kv > 0 ? h_q / h_kv : 0; }             // G
};

}  // namespace cuda_ref
