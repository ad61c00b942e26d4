"""The oracle: float64 attention on the CPU, for every family.

Every kernel in this project, Pallas or CUDA, is checked against these functions (DESIGN.md decision 7).
They are written for clarity, not speed: numpy float64, explicit max-subtracted softmax, one function per
family, each family built on the dense one.

Conventions (docs/reference.md §1.1, DESIGN.md decisions 4-5):
  * dense inputs are BTNH: q ``[B, Tq, Hq, D]``, k/v ``[B, Tk, Hkv, Dv]``;
  * GQA head map ``h_kv = h_q // G`` with ``G = Hq // Hkv`` (KV expansion is repeat-interleave, never tile);
  * causal is top-left: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``;
  * a fully masked row has output 0 and log-sum-exp ``-inf`` (never NaN).

Inputs may be numpy arrays, JAX arrays (any float dtype, bf16 and fp8 included) or torch tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import formats

__all__ = [
    "to_f64",
    "attention_reference",
    "paged_attention_reference",
    "gather_paged_kv",
    "lse_merge_reference",
    "quantized_attention_reference",
    "mla_attention_reference",
    "mla_materialized_reference",
]


def to_f64(x: Any) -> np.ndarray:
    """Any array-like (numpy, jax, torch; bf16/fp16/fp8 included) as a float64 numpy array."""
    if hasattr(x, "detach"):  # torch: bf16 has no numpy twin, so go through float32 (exact for bf16/fp16)
        x = x.detach().cpu().float().numpy()
    return np.asarray(x).astype(np.float64)


def _check_dense(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[int, int]:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be rank 4 (BTNH); got {q.shape=}, {k.shape=}, {v.shape=}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must share [B, Tk, Hkv]; got {k.shape=}, {v.shape=}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch dim; got {q.shape=}, {k.shape=}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share the head dim; got {q.shape=}, {k.shape=}")
    hq, hkv = q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={hq}, Hkv={hkv}")
    return hq, hkv


def attention_reference(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Float64 attention. Returns ``(out [B, Tq, Hq, Dv], lse [B, Hq, Tq])``.

    ``q_offset`` and ``kv_len`` may be scalars or per-sequence ``[B]`` arrays: keys at positions
    ``>= kv_len[b]`` are invisible (ragged batches); causal uses ``j <= i + q_offset[b]``.
    ``lse`` is the natural-log log-sum-exp of the scaled scores over visible keys (``-inf`` if none).
    """
    q, k, v = to_f64(q), to_f64(k), to_f64(v)
    hq, hkv = _check_dense(q, k, v)
    b, tq, _, d = q.shape
    tk = k.shape[1]
    g = hq // hkv
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)

    # repeat_interleave: query head h reads KV head h // G.
    k_e = np.repeat(k, g, axis=2)
    v_e = np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k_e) * scale  # [B, Hq, Tq, Tk]

    j = np.arange(tk)[None, None, None, :]
    i = np.arange(tq)[None, None, :, None]
    qo = np.broadcast_to(np.asarray(q_offset, dtype=np.int64), (b,))[:, None, None, None]
    visible = np.ones((b, 1, tq, tk), dtype=bool)
    if kv_len is not None:
        kl = np.broadcast_to(np.asarray(kv_len, dtype=np.int64), (b,))[:, None, None, None]
        visible &= j < kl
    if causal:
        visible &= j <= i + qo
    s = np.where(visible, s, -np.inf)
    if tk == 0:  # an empty cache: every row is fully masked
        return np.zeros((b, tq, hq, v.shape[3])), np.full((b, hq, tq), -np.inf)

    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)  # exp(-inf) = 0 for masked keys
    l = p.sum(axis=-1, keepdims=True)
    l_safe = np.where(l > 0, l, 1.0)
    out = np.einsum("bhqk,bkhd->bqhd", p / l_safe, v_e)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l_safe[..., 0]), -np.inf)
    return out, lse


def gather_paged_kv(pool: Any, block_table: Any, length: int) -> np.ndarray:
    """Dense ``[length, H, W]`` view of one sequence from a pool ``[num_blocks, page, H, W]``.

    Logical key ``j`` lives in physical page ``block_table[j // page]`` at offset ``j % page``
    (docs/reference.md §1.3). Raises ValueError on a page index outside the pool.
    """
    pool = to_f64(pool)
    bt = np.asarray(block_table, dtype=np.int64)
    page = pool.shape[1]
    n_pages = -(-int(length) // page)
    if n_pages > bt.shape[0]:
        raise ValueError(f"block_table holds {bt.shape[0]} pages, {length=} needs {n_pages}")
    idx = bt[:n_pages]
    if np.any(idx < 0) or np.any(idx >= pool.shape[0]):
        raise ValueError(f"block_table entries must lie in [0, {pool.shape[0]}); got {idx.min()}..{idx.max()}")
    dense = pool[idx].reshape(n_pages * page, *pool.shape[2:])
    return dense[:length]


def paged_attention_reference(
    q: Any,
    k_pool: Any,
    v_pool: Any,
    block_table: Any,
    kv_lens: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Paged-KV attention oracle (ragged batch). Causal decode uses ``q_offset = kv_len - Tq`` per sequence.

    q ``[B, Tq, Hq, D]``; pools ``[num_blocks, page, Hkv, D]``; block_table int ``[B, pages_per_seq]``;
    kv_lens int ``[B]``. Returns ``(out [B, Tq, Hq, D], lse [B, Hq, Tq])``.
    """
    q = to_f64(q)
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    bt = np.asarray(block_table, dtype=np.int64)
    if kv_lens.shape != (q.shape[0],) or bt.shape[0] != q.shape[0]:
        raise ValueError(f"kv_lens must be [B] and block_table [B, P]; got {kv_lens.shape=}, {bt.shape=}")
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(kv_lens[b])
        kb = gather_paged_kv(k_pool, bt[b], n)[None]
        vb = gather_paged_kv(v_pool, bt[b], n)[None]
        o, lse = attention_reference(
            q[b : b + 1], kb, vb, causal=causal, scale=scale, q_offset=n - q.shape[1]
        )
        outs.append(o)
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


def lse_merge_reference(o_parts: Any, lse_parts: Any) -> tuple[np.ndarray, np.ndarray]:
    """Merge normalized partial outputs ``[S, ..., D]`` with their log-sum-exps ``[S, ...]``.

    The exact identity behind split-KV (docs/reference.md §2.0): ``out = Σ_s exp(lse_s - lse*) o_s`` with
    ``lse* = log Σ_s exp(lse_s)``; empty splits carry ``lse = -inf`` and contribute nothing.
    """
    o = to_f64(o_parts)
    lse = to_f64(lse_parts)
    m = lse.max(axis=0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(lse - m_safe)
    tot = w.sum(axis=0)
    tot_safe = np.where(tot > 0, tot, 1.0)
    out = (w[..., None] * o).sum(axis=0) / tot_safe[..., None]
    with np.errstate(divide="ignore"):
        lse_out = np.where(tot > 0, m_safe + np.log(tot_safe), -np.inf)
    return out, lse_out


def _quantize_dequantize(x: np.ndarray, kv_format: str) -> np.ndarray:
    """``x`` after a round trip through ``kv_format``: the values a kernel reading that cache actually sees."""
    if kv_format == "fp8":
        return formats.dequantize_fp8_e4m3(formats.quantize_fp8_e4m3(x))
    if kv_format == "nvfp4":
        return formats.dequantize_nvfp4(formats.quantize_nvfp4(x))
    raise ValueError(f"kv_format must be 'fp8' or 'nvfp4'; got {kv_format!r}")


def quantized_attention_reference(
    q: Any,
    k: Any,
    v: Any,
    *,
    kv_format: str,
    causal: bool = False,
    scale: float | None = None,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention over a quantized KV cache: the oracle run on the operands the kernel sees, not the originals.

    K and V are each quantized as one whole tensor (separate per-tensor scales; NVFP4 micro-blocks run along the
    head dim) with :mod:`attn_core.formats`, dequantized to float32, then passed to :func:`attention_reference`
    in float64. ``q`` stays unquantized. So a kernel is judged on its attention arithmetic alone; the
    quantization error itself is the format's, measured separately. Returns ``(out, lse)`` as the dense oracle.
    """
    k_seen = _quantize_dequantize(to_f64(k), kv_format)
    v_seen = _quantize_dequantize(to_f64(v), kv_format)
    return attention_reference(q, k_seen, v_seen, causal=causal, scale=scale, q_offset=q_offset, kv_len=kv_len)


def mla_attention_reference(
    q: Any,
    latent: Any,
    *,
    kv_lora_rank: int,
    scale: float | None = None,
    causal: bool = False,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Absorbed MLA (multi-head latent attention) decode: every query head attends over one shared latent head.

    q ``[B, Tq, Hq, DQK]`` (already absorbed: ``[q_nope . W_UK, q_rope]``), latent ``[B, Tk, 1, DQK]`` with
    ``DQK = kv_lora_rank + rope_dim``. Keys are the whole latent, values its first ``kv_lora_rank`` columns, and
    the single KV head broadcasts to all query heads (GQA with Hkv = 1). Returns
    ``(out [B, Tq, Hq, kv_lora_rank], lse [B, Hq, Tq])``.

    ``scale`` defaults to ``1/sqrt(DQK)``. That is rarely what a model wants: an absorbed kernel must be given the
    scale of the materialized attention it stands for (``1/sqrt(Dn + R)``, see :func:`mla_materialized_reference`).
    """
    q, latent = to_f64(q), to_f64(latent)
    if q.ndim != 4 or latent.ndim != 4 or latent.shape[2] != 1:
        raise ValueError(f"q must be [B, Tq, Hq, DQK] and latent [B, Tk, 1, DQK]; got {q.shape=}, {latent.shape=}")
    if q.shape[-1] != latent.shape[-1]:
        raise ValueError(f"q and latent must share DQK; got {q.shape=}, {latent.shape=}")
    if not 0 < kv_lora_rank <= latent.shape[-1]:
        raise ValueError(f"kv_lora_rank must lie in [1, DQK={latent.shape[-1]}]; got {kv_lora_rank}")
    return attention_reference(
        q, latent, latent[..., :kv_lora_rank], causal=causal, scale=scale, q_offset=q_offset, kv_len=kv_len
    )


def mla_materialized_reference(
    q_nope: Any,
    q_rope: Any,
    latent: Any,
    *,
    kv_lora_rank: int,
    w_uk: Any,
    w_uv: Any,
    scale: float | None = None,
    causal: bool = False,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """MLA with per-head K and V materialized from the latent: the oracle for the absorption identity.

    latent ``[B, Tk, 1, L + R]`` splits into content ``c = latent[..., :L]`` and rope part ``r = latent[..., L:]``
    (``L = kv_lora_rank``). Per head ``h``: ``K_h = [c . W_UK[h]^T, r]`` and ``V_h = c . W_UV[h]^T`` with
    ``w_uk [H, Dn, L]`` and ``w_uv [H, Dv, L]``; queries are ``[q_nope, q_rope]`` (``[B, Tq, H, Dn]`` and
    ``[B, Tq, H, R]``). Plain attention then gives ``(out [B, Tq, H, Dv], lse [B, H, Tq])``.

    The identity it checks: with ``q_abs = [q_nope . W_UK[h], q_rope]`` (``[B, Tq, H, L + R]``),
    ``mla_attention_reference(q_abs, latent, scale=s)`` returns ``o_abs`` with ``out = o_abs . W_UV[h]^T`` and the
    same lse, because ``q_nope . (c W_UK[h]^T) = (q_nope W_UK[h]) . c``. ``scale`` defaults to ``1/sqrt(Dn + R)``,
    the materialized head dim; the absorbed form must be passed that same scale explicitly (its own default is
    ``1/sqrt(L + R)``).
    """
    q_nope, q_rope, latent = to_f64(q_nope), to_f64(q_rope), to_f64(latent)
    w_uk, w_uv = to_f64(w_uk), to_f64(w_uv)
    if latent.ndim != 4 or latent.shape[2] != 1 or not 0 < kv_lora_rank <= latent.shape[-1]:
        raise ValueError(f"latent must be [B, Tk, 1, L + R] with L = {kv_lora_rank=}; got {latent.shape=}")
    lora, rope = kv_lora_rank, latent.shape[-1] - kv_lora_rank
    if q_nope.ndim != 4 or q_rope.shape != (*q_nope.shape[:3], rope):
        raise ValueError(
            f"q_nope must be [B, Tq, H, Dn] and q_rope [B, Tq, H, {rope}]; got {q_nope.shape=}, {q_rope.shape=}"
        )
    heads, d_nope = q_nope.shape[2], q_nope.shape[3]
    if w_uk.shape != (heads, d_nope, lora) or w_uv.ndim != 3 or w_uv.shape[::2] != (heads, lora):
        raise ValueError(
            f"w_uk must be [{heads}, {d_nope}, {lora}] and w_uv [{heads}, Dv, {lora}]; got {w_uk.shape=}, {w_uv.shape=}"
        )

    content = latent[:, :, 0, :lora]  # [B, Tk, L]
    rope_k = np.broadcast_to(latent[:, :, :, lora:], (*latent.shape[:2], heads, rope))  # shared by every head
    k = np.concatenate([np.einsum("bkl,hdl->bkhd", content, w_uk), rope_k], axis=-1)  # [B, Tk, H, Dn + R]
    v = np.einsum("bkl,hdl->bkhd", content, w_uv)  # [B, Tk, H, Dv]
    q = np.concatenate([q_nope, q_rope], axis=-1)
    scale = 1.0 / np.sqrt(d_nope + rope) if scale is None else scale
    return attention_reference(q, k, v, causal=causal, scale=scale, q_offset=q_offset, kv_len=kv_len)
