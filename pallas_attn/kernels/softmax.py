"""The online-softmax recurrence, written once (reference §2.0; FlashAttention-2's block form).

State per query row: running max ``m`` (starts at -FLT_MAX, a large finite negative, so ``m - m_new`` is
never ``-inf - -inf``), running denominator ``l`` and an FP32 accumulator that the caller rescales by
``alpha`` *before* adding ``p @ V`` (the reference's order). Masked scores become ``-inf``, so their ``p``
is exactly 0 even while ``m`` is still -FLT_MAX.

Two bases: natural (``exp``; the reference and the prefill mirrors) and base 2 (``exp2`` on scores
pre-multiplied by ``scale * log2(e)``; one multiply fewer per score, what the frontier kernels use). The
log-sum-exp they report is always in natural-log units.

NaN in, NaN out: ``finalize`` divides by ``l`` unless ``l`` is exactly 0 (a row that saw no visible key,
whose accumulator is 0), so a NaN score reaches the output instead of being turned into 0.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

__all__ = ["NEG_BIG", "LOG2E", "LN2", "init_state", "step", "finalize", "lse"]

NEG_BIG = float(np.finfo(np.float32).min)  # -FLT_MAX: the reference's running-max init
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def init_state(shape: tuple[int, ...], d: int | None = None):
    """``(m, l, acc)`` for rows of ``shape``; ``acc`` gets a trailing ``d`` axis (None: no accumulator)."""
    m = jnp.full(shape, NEG_BIG, jnp.float32)
    l = jnp.zeros(shape, jnp.float32)
    if d is None:
        return m, l
    return m, l, jnp.zeros((*shape, d), jnp.float32)


def step(m, l, s, valid, *, base2: bool = False):
    """One block of the recurrence on FP32 scores ``s [..., N]`` with running ``m, l [...]``.

    Returns ``(m_new, l_new, alpha, p)``. ``valid`` broadcasts against ``s``. With ``base2`` the scores are
    already in log2 units (``scale * log2(e)`` applied) and the exponentials are ``exp2``.
    """
    ex = jnp.exp2 if base2 else jnp.exp
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    alpha = ex(m - m_new)
    p = ex(s - (m_new[..., None] if s.ndim > m_new.ndim else m_new))
    l_new = l * alpha + jnp.sum(p, axis=-1)
    return m_new, l_new, alpha, p


def finalize(acc, l):
    """``acc / l`` per row; a row with ``l == 0`` (no visible key, ``acc == 0``) gives 0; NaN stays NaN."""
    l_b = l[..., None] if acc.ndim > l.ndim else l
    return acc / jnp.where(l_b == 0, 1.0, l_b)


def lse(m, l, *, base2: bool = False):
    """Natural-log log-sum-exp of the scaled scores from the final ``(m, l)``; ``-inf`` where ``l == 0``."""
    safe = jnp.where(l == 0, 1.0, l)
    out = (m + jnp.log2(safe)) * LN2 if base2 else m + jnp.log(safe)
    return jnp.where(l == 0, -jnp.inf, out)
