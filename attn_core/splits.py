"""The reference's split-KV heuristic and its constants, shared by both twins (the CUDA side mirrors them in
``cuda_ref/csrc/common/split_plan.cuh``; a CPU test reads that header and checks the numbers agree).

``choose_splits`` (reference §2.0): ``by_occ`` fills ``2 * num_sm`` programs, ``by_size`` keeps every split
>= ``MIN_CHUNK`` keys, ``S = clamp(min(by_occ, by_size), 1, S_CAP)``, ``chunk = ceil(n_k / S)``.
"""

from __future__ import annotations

import numbers

__all__ = ["S_CAP", "MIN_CHUNK", "REFERENCE_NUM_SM", "ROWS_PER_PROGRAM", "choose_splits"]

S_CAP = 32
MIN_CHUNK = 256
REFERENCE_NUM_SM = 40  # the T4 the reference tuned on; every recorded v6-v8 number used it
ROWS_PER_PROGRAM = 8  # v6's partial program holds 8 query rows (one per warp in the CUDA twin)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_splits(*, bh: int, n_q: int, n_k: int, num_sm: int, rows_per_program: int = ROWS_PER_PROGRAM,
                  s_cap: int = S_CAP, min_chunk: int = MIN_CHUNK) -> tuple[int, int]:
    """``(S, chunk)``: split ``s`` covers keys ``[s*chunk, min((s+1)*chunk, n_k))``.

    >>> choose_splits(bh=8, n_q=1, n_k=8192, num_sm=REFERENCE_NUM_SM)
    (10, 820)
    """
    for name, val in (("bh", bh), ("n_q", n_q), ("n_k", n_k), ("num_sm", num_sm),
                      ("rows_per_program", rows_per_program), ("s_cap", s_cap), ("min_chunk", min_chunk)):
        if not isinstance(val, numbers.Integral) or isinstance(val, bool) or val < 1:
            raise ValueError(f"choose_splits: {name} must be a positive int; got {name}={val!r}")
    base = max(bh * _cdiv(n_q, rows_per_program), 1)
    by_occ = _cdiv(2 * num_sm, base)
    by_size = _cdiv(n_k, min_chunk)
    s = max(1, min(by_occ, by_size, s_cap))
    return s, _cdiv(n_k, s)
