"""Run every cuda_ref generation once at small shapes and check the results, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/cuda_sanitize.py

Shapes are small and awkward on purpose (N=100 is not a multiple of any tile; a decode shape with an
uneven last split; causal with a q_offset), so every tail and guard path is executed under memcheck.
Build the extension first (any cuda_ref call, e.g. scripts/time_cuda_ref.py) so that the sanitizer does
not watch the compiler. Exits 1 if a result is wrong.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CUDA_REF_DEBUG", "1")  # NaN-poisoned outputs, a sync after every call
# One cudaMalloc per tensor, so memcheck sees the true end of every buffer (the caching allocator hides
# overruns into pool slack).
os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cuda_ref  # noqa: E402
from attn_core.oracle import attention_reference  # noqa: E402

# Output tolerance per generation from its operand column (the reference's: fp32 1e-4, fp16 operands 2e-2);
# the log-sum-exp against the oracle on the operands the kernel reads: 1e-4 / 1e-3.
ROWS = {g.id: g for g in cuda_ref.table() if g.entry == "dense"}
TOL = {i: 1e-4 if g.operand == "fp32" else 2e-2 for i, g in ROWS.items()}
LSE_TOL = {i: 1e-4 if g.operand == "fp32" else 1e-3 for i, g in ROWS.items()}

# (label, B, H, Nq, Nk, D, causal, q_offset)
CASES = [
    ("prefill", 1, 2, 100, 100, 64, False, 0),
    ("prefill-causal", 1, 2, 100, 100, 128, True, 0),
    ("rect-offset", 1, 2, 37, 300, 64, True, 250),
    ("decode", 1, 2, 1, 1000, 128, True, 999),
]


def main() -> int:
    torch.manual_seed(0)
    failures = 0
    for gen, row in ROWS.items():
        for label, b, h, nq, nk, d, causal, q_offset in CASES:
            q = torch.randn(b, h, nq, d, device="cuda")
            k = torch.randn(b, h, nk, d, device="cuda")
            v = torch.randn(b, h, nk, d, device="cuda")
            kw = {"num_sm": cuda_ref.REFERENCE_NUM_SM} if row.split_kv else {}
            # return_lse=True so that every kernel's LSE store runs under memcheck too.
            out, lse = cuda_ref.attention(q, k, v, causal=causal, q_offset=q_offset, generation=gen,
                                          return_lse=True, **kw)
            torch.cuda.synchronize()
            operands = [x.half() if row.operand == "fp16" else x for x in (q, k, v)]  # what the kernel reads
            bt = [x.cpu().transpose(1, 2) for x in operands]
            ref, ref_lse = attention_reference(*bt, causal=causal, q_offset=q_offset)
            o, ls = out.cpu().numpy(), lse.cpu().numpy()
            err = float(np.max(np.abs(o - ref.transpose(0, 2, 1, 3))))
            lse_err = float(np.max(np.abs(ls - ref_lse)))
            ok = (bool(np.isfinite(o).all()) and bool(np.isfinite(ls).all())
                  and np.allclose(o, ref.transpose(0, 2, 1, 3), atol=TOL[gen], rtol=TOL[gen])
                  and np.allclose(ls, ref_lse, atol=LSE_TOL[gen], rtol=0))
            failures += not ok
            print(f"{gen:<11} {label:<15} B={b} H={h} Nq={nq} Nk={nk} D={d} causal={causal} "
                  f"q_offset={q_offset}: max|err|={err:.2e} lse {lse_err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    print(f"{failures} wrong result(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
