// Everything C++ knows about the generations, derived from the one table generations.def (rendered from
// attn_core/generations.py at build time, first on the include path; cuda_ref/table.py): the Gen
// enum, one GenInfo per row (constexpr, so kernels can static_assert their tiles against it) and lookups.
// Plain C++17, no CUDA and no torch: binding.cpp, the kernels and host-only test programs include it.
#pragma once

#include <cstdint>

namespace cuda_ref {

// The stable integers Python passes (column `number`). Enumerators are the ids themselves: Gen::v4_fused.
enum class Gen : int {
#define CUDA_REF_GEN(id, number, ...) id = number,
#include "generations.def"  // generated from attn_core (cuda_ref.build.write_generated)
};

// Column value sets. The spellings are the ones generations.def uses (cuda_ref/table.py maps them).
enum class Entry : int { kDense, kPaged, kQuantized, kMla };
enum class Operand : int { kF32, kF16, kNative };
enum class HeadDims : int { kHeadDimsAny, kHeadDims64_128 };
enum class Workspace : int { kWsNone, kWsScores, kWsRowStats, kWsSplitPartials };

struct GenInfo {
  Gen gen;
  const char* name;  // the id as a string ("v4_fused")
  Entry entry;
  Operand operand;
  HeadDims head_dims;
  bool gqa;
  bool materialize_s;
  int tile_m_d64, tile_n_d64, tile_m_d128, tile_n_d128;
  Workspace workspace;
  bool split_kv;
  bool writes_lse;

  constexpr int number() const { return static_cast<int>(gen); }
  constexpr bool takes_fp16() const { return operand == Operand::kF16; }
  constexpr bool supports_head_dim(int64_t d) const {
    return head_dims == HeadDims::kHeadDimsAny || d == 64 || d == 128;
  }
};

inline constexpr GenInfo kGenerations[] = {
#define CUDA_REF_GEN(id, number, entry, operand, head_dims, gqa, materialize_s, tile_m_d64, tile_n_d64, \
                     tile_m_d128, tile_n_d128, workspace, split_kv, writes_lse)                        \
  {Gen::id, #id, Entry::entry, Operand::operand, HeadDims::head_dims, (gqa) != 0, (materialize_s) != 0,   \
   tile_m_d64, tile_n_d64, tile_m_d128, tile_n_d128, Workspace::workspace, (split_kv) != 0, (writes_lse) != 0},
#include "generations.def"  // generated from attn_core (cuda_ref.build.write_generated)
};
inline constexpr int kNumGenerations = static_cast<int>(sizeof(kGenerations) / sizeof(kGenerations[0]));

// The row of a built generation, or nullptr (an integer no row carries).
constexpr const GenInfo* find_gen(int64_t number) {
  for (const GenInfo& g : kGenerations) {
    if (g.number() == number) return &g;
  }
  return nullptr;
}

// The row of a Gen (always present: every enumerator comes from a row). For static_asserts in kernels.
constexpr const GenInfo& gen_info(Gen gen) { return *find_gen(static_cast<int>(gen)); }

// Whether any row serves an entry (the paged binding entry answers NotImplementedError until one does).
constexpr bool any_entry(Entry entry) {
  for (const GenInfo& g : kGenerations) {
    if (g.entry == entry) return true;
  }
  return false;
}

namespace detail {
constexpr bool numbers_positive_and_ascending() {
  int prev = 0;
  for (const GenInfo& g : kGenerations) {
    if (g.number() <= prev) return false;
    prev = g.number();
  }
  return true;
}
constexpr bool tiles_positive() {
  for (const GenInfo& g : kGenerations) {
    if (g.tile_m_d64 < 1 || g.tile_n_d64 < 1 || g.tile_m_d128 < 1 || g.tile_n_d128 < 1) return false;
  }
  return true;
}
}  // namespace detail

static_assert(kNumGenerations > 0, "generations.def has no row");
static_assert(detail::numbers_positive_and_ascending(),
              "generations.def: numbers must be >= 1, unique and ascending in row order");
static_assert(detail::tiles_positive(), "generations.def: tiles must be >= 1 (1 x 1 = untiled)");

}  // namespace cuda_ref
