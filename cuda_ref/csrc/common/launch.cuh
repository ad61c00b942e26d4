// Host-side contract between the kernels and the binding: one launcher per generations.def row, the
// workspace each needs, and launch-error reporting. No torch here (see params.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "generations.cuh"
#include "params.cuh"

namespace cuda_ref {

// void launch_<id>(const AttnParams& p, cudaStream_t stream); for every row, defined in kernels/<id>.cu.
#define CUDA_REF_GEN(id, ...) void launch_##id(const AttnParams& p, cudaStream_t stream);
#include "generations.def"  // generated from attn_core (cuda_ref.build.write_generated)

// v2 keeps v1's softmax pass unchanged (§2.2 "Pass 2: identical to v1"), so it calls it instead of
// carrying a copy. Normalises S [BH, n_q, n_k] in place, row by row; writes p.lse when it is set.
void launch_v1_softmax_rows(const AttnParams& p, float* s, cudaStream_t stream);

// Floats of HBM scratch a generation needs (0: none), from its workspace column. p must carry the shape
// and, for kWsSplitPartials, the split plan.
inline int64_t workspace_floats(const GenInfo& g, const AttnParams& p) {
  switch (g.workspace) {
    case Workspace::kWsNone:
      return 0;
    case Workspace::kWsScores:  // the materialised score matrix S (§2.1, §2.2)
      return p.bh() * p.n_q * p.n_k;
    case Workspace::kWsRowStats:  // per-row max M and denominator L (§2.3)
      return 2 * p.bh() * p.n_q;
    case Workspace::kWsSplitPartials:  // O_partial [BH, n_q, S, D] + m_partial, l_partial [BH, n_q, S] (§2.0)
      return p.bh() * p.n_q * p.num_splits * (static_cast<int64_t>(p.head_dim) + 2);
  }
  throw std::logic_error("cuda_ref: unknown workspace kind");
}

// Every launch is followed by this: a bad configuration (grid, smem) becomes a C++ exception, which the
// binding's pybind layer turns into a Python RuntimeError naming the kernel.
inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("cuda_ref: launch of ") + what + " failed: " + cudaGetErrorName(err) +
                             " (" + cudaGetErrorString(err) + ")");
  }
}

}  // namespace cuda_ref
