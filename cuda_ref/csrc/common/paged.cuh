// Paged split-KV decode, the parts v7_paged and the whole v8 family share (docs/reference.md §1.3, §2.0,
// §2.7-§2.13): the kernels' argument block, the packed-row index math, the per-sequence view (kv_len, causal
// offset, block-table row), the bounds-checked page gather, the split's key range, the partial slot, and the
// merge launcher (defined once, in kernels/v7_paged.cu: the v8 family keeps v7's merge, which is v6's).
//
// Layout (§1.3): pools [num_blocks, page_size, H_kv, D] (fp16 after the binding's host cast); key j of
// sequence b, KV head h, element t is pool[block_table[b][j / page_size]][j % page_size][h][t].
// Packing (§2.0, §2.8): grid.z enumerates (b, h_kv); the CTA's packed rows m in [0, M = G * n_q) are
// head-major: g = m / n_q, i_q = m % n_q, query head h_q = h_kv * G + g. Causal uses i_q + q_offset[b], never m.
// v7_paged is the G = 1 case (grid.z = (b, h), m = i_q), as in the reference where v8_gqa at G = 1 is v7.
//
// Bounds: every kernel checks each block-table entry it uses against [0, num_blocks) and kv_lens[b] against
// [0, n_k] (one compare per gathered key; the reference has no check). A bad entry's keys load as NaN, so the
// rows that need them come out NaN, never as a read outside the pool; in debug mode the kernel also reports
// it through AttnParams::paged_error and the binding raises ValueError naming the entry.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "online_softmax.cuh"
#include "params.cuh"
#include "split_plan.cuh"

namespace cuda_ref {

// What the partial kernels read, by value (kernel parameter space). Built on the host by paged_args().
struct PagedArgs {
  const __half* q;  // [B, H_q, n_q, D], strides qs
  const __half* k;  // pool [num_blocks, page_size, H_kv, D], strides ks (block, head, token-in-page)
  const __half* v;
  Strides qs, ks, vs;
  const int32_t* block_table;  // [B, pages_per_seq]
  const int32_t* kv_lens;      // [B]
  const int32_t* q_offsets;    // [B]
  int32_t* error;              // AttnParams::paged_error (debug) or null
  float* o_part;               // [B * H_q, n_q, S, D] unnormalised partial O
  float* m_part;               // [B * H_q, n_q, S] running max
  float* l_part;               // [B * H_q, n_q, S] denominator
  int h_q, h_kv, group, n_q, n_k;
  int pages_per_seq, page_shift, num_blocks;
  int num_splits, chunk;
  float scale;
  bool causal;
};

// Host: check what the binding filled and derive the kernels' block. Throws std::invalid_argument (the binding
// validates first; this is the launcher's own line of defence for direct C++ callers).
inline PagedArgs paged_args(const AttnParams& p, const char* who) {
  const std::string w = std::string("cuda_ref ") + who + ": ";
  if (p.kv_dtype != KvDtype::kF16) throw std::invalid_argument(w + "takes fp16 pools (the host casts)");
  if (p.block_table == nullptr || p.kv_lens == nullptr || p.q_offsets == nullptr) {
    throw std::invalid_argument(w + "block_table, kv_lens and q_offsets must be set");
  }
  if (p.page_size < 1 || (p.page_size & (p.page_size - 1)) != 0) {
    throw std::invalid_argument(w + "page_size must be a power of two; got " + std::to_string(p.page_size));
  }
  if (p.h_kv < 1 || p.h_q % p.h_kv != 0) throw std::invalid_argument(w + "H_q must be a multiple of H_kv");
  if (p.pages_per_seq < 1 || static_cast<int64_t>(p.pages_per_seq) * p.page_size != p.n_k) {
    throw std::invalid_argument(w + "n_k must be pages_per_seq * page_size");
  }
  if (p.num_splits < 1 || p.num_splits > kSplitCap || p.split_chunk < 1 ||
      static_cast<int64_t>(p.num_splits) * p.split_chunk < p.n_k) {
    throw std::invalid_argument(w + "split plan does not cover the keys");
  }
  if (p.ws == nullptr) throw std::invalid_argument(w + "needs the split-partials workspace");
  if (p.bh() > 65535) throw std::invalid_argument(w + "B*H_q must be <= 65535 (merge grid limit)");
  PagedArgs a;
  a.q = static_cast<const __half*>(p.q);
  a.k = static_cast<const __half*>(p.k);
  a.v = static_cast<const __half*>(p.v);
  a.qs = p.q_strides;
  a.ks = p.k_strides;
  a.vs = p.v_strides;
  a.block_table = p.block_table;
  a.kv_lens = p.kv_lens;
  a.q_offsets = p.q_offsets;
  a.error = p.paged_error;
  const int64_t slots = p.bh() * p.n_q * p.num_splits;
  a.o_part = p.ws;
  a.m_part = a.o_part + slots * p.head_dim;
  a.l_part = a.m_part + slots;
  a.h_q = p.h_q;
  a.h_kv = p.h_kv;
  a.group = p.h_q / p.h_kv;
  a.n_q = p.n_q;
  a.n_k = p.n_k;
  a.pages_per_seq = p.pages_per_seq;
  a.page_shift = 0;
  while ((1 << a.page_shift) < p.page_size) ++a.page_shift;
  a.num_blocks = p.num_blocks;
  a.num_splits = p.num_splits;
  a.chunk = p.split_chunk;
  a.scale = p.scale;
  a.causal = p.causal;
  return a;
}

// Partial grid (ceil(G * n_q / rows_per_cta), S, B * H_kv) (§2.8; v7: G = 1, so (ceil(n_q / 8), S, B * H)).
inline dim3 paged_grid(const AttnParams& p, int rows_per_cta) {
  const int64_t packed = static_cast<int64_t>(p.h_q / p.h_kv) * p.n_q;
  const int64_t z = static_cast<int64_t>(p.batch) * p.h_kv;
  if (z > 65535) throw std::invalid_argument("cuda_ref: B*H_kv must be <= 65535 (a grid dimension)");
  return dim3(static_cast<unsigned>((packed + rows_per_cta - 1) / rows_per_cta), static_cast<unsigned>(p.num_splits),
              static_cast<unsigned>(z));
}

// The merge of every split-KV paged generation: grid (n_q, B*H_q), D threads, lse_merge per element; with
// p.lse set, thread 0 stores the row's m* + log(l*). Defined in kernels/v7_paged.cu.
void launch_paged_merge(const AttnParams& p, cudaStream_t stream);

// --- device side ------------------------------------------------------------------------------------------

__device__ __forceinline__ float paged_nan() { return __int_as_float(0x7fc00000); }

// One packed row of the CTA (m >= M: idle, its warp or lane only helps with loads).
struct PackedRow {
  int i_q;     // query position
  int h_q;     // query head
  bool active;
};

__device__ __forceinline__ PackedRow packed_row(const PagedArgs& a, int h_kv, int m) {
  PackedRow r;
  r.active = m < a.group * a.n_q;
  const int mm = r.active ? m : 0;
  r.i_q = mm % a.n_q;
  r.h_q = h_kv * a.group + mm / a.n_q;
  return r;
}

// The largest query position among packed rows [m0, m0 + rows) ∩ [0, M) (m0 < M): the CTA's causal horizon.
__device__ __forceinline__ int packed_max_iq(int m0, int rows, int M, int n_q) {
  const int m1 = min(m0 + rows, M) - 1;
  if (m1 - m0 + 1 >= n_q || m0 / n_q != m1 / n_q) return n_q - 1;  // spans a head boundary: a full tail
  return m1 % n_q;
}

// Sequence b as the kernels see it.
struct SeqView {
  const int32_t* table;  // block_table row of b
  int kv_len;            // keys [0, kv_len) exist (n_k when kv_lens[b] was out of range)
  int q_off;             // causal offset (may be negative: rows before it see nothing)
  bool bad;              // kv_lens[b] outside [0, n_k]: every key of b loads as NaN
};

__device__ __forceinline__ SeqView seq_view(const PagedArgs& a, int b) {
  SeqView s;
  s.table = a.block_table + static_cast<int64_t>(b) * a.pages_per_seq;
  const int len = a.kv_lens[b];
  s.bad = len < 0 || len > a.n_k;
  if (s.bad && a.error != nullptr) a.error[1] = 1 + b;
  s.kv_len = s.bad ? a.n_k : len;
  s.q_off = a.q_offsets[b];
  return s;
}

// Keys [begin, end) of split `split` that exist for the sequence (empty when the split starts past kv_len).
struct KeyRange {
  int begin, end;
};

__device__ __forceinline__ KeyRange split_keys(const PagedArgs& a, const SeqView& s, int split) {
  const int64_t b64 = static_cast<int64_t>(split) * a.chunk;
  KeyRange r;
  r.begin = static_cast<int>(b64 < s.kv_len ? b64 : s.kv_len);
  r.end = static_cast<int>(b64 + a.chunk < s.kv_len ? b64 + a.chunk : s.kv_len);
  return r;
}

// One past the last key of `r` that query position i_q may see (<= r.begin: none).
__device__ __forceinline__ int visible_end(const PagedArgs& a, const SeqView& s, const KeyRange& r, int i_q) {
  if (!a.causal) return r.end;
  const int64_t last = static_cast<int64_t>(i_q) + s.q_off + 1;
  if (last < r.begin) return r.begin;
  return last < r.end ? static_cast<int>(last) : r.end;
}

// Element offsets of key j's row (element t = 0) for KV head h in the K and V pools, or -1 when its
// block-table entry is outside [0, num_blocks) (or the sequence is bad). Reports in debug mode.
struct KvRow {
  int64_t k, v;
};

__device__ __forceinline__ KvRow paged_kv_row(const PagedArgs& a, const SeqView& s, int h, int j) {
  const int page = j >> a.page_shift;
  const int blk = s.table[page];
  if (s.bad || blk < 0 || blk >= a.num_blocks) {
    if (!s.bad && a.error != nullptr) a.error[0] = 1 + static_cast<int>(s.table - a.block_table) + page;
    return {-1, -1};
  }
  const int off = j & ((1 << a.page_shift) - 1);
  return {blk * a.ks.batch + off * a.ks.row + h * a.ks.head, blk * a.vs.batch + off * a.vs.row + h * a.vs.head};
}

// Pool element at a row offset (NaN when the row is bad), as fp16 and as fp32.
__device__ __forceinline__ __half pool_half(const __half* pool, int64_t row, int t) {
  return row >= 0 ? pool[row + t] : __float2half(paged_nan());
}
__device__ __forceinline__ float pool_float(const __half* pool, int64_t row, int t) {
  return row >= 0 ? __half2float(pool[row + t]) : paged_nan();
}

// Query element t of (b, h_q, i_q).
__device__ __forceinline__ const __half* q_row(const PagedArgs& a, int b, int h_q, int i_q) {
  return a.q + b * a.qs.batch + h_q * a.qs.head + i_q * a.qs.row;
}

// Index of (b, h_q, i_q, split) in the partial arrays (query-head shaped, §2.0).
__device__ __forceinline__ int64_t partial_slot(const PagedArgs& a, int b, int h_q, int i_q, int split) {
  return ((static_cast<int64_t>(b) * a.h_q + h_q) * a.n_q + i_q) * a.num_splits + split;
}

__device__ __forceinline__ float warp_allreduce_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

}  // namespace cuda_ref
