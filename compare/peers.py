"""The peers: what the project measures itself against (docs/peers.md), each with its own ``supports()``.

  * ``torch:cudnn|flash|efficient|math`` — torch SDPA with one backend selected explicitly
    (``torch.nn.attention.sdpa_kernel``; FLASH is FlashAttention-2). BHND contiguous copies are made once,
    outside the timed region. MATH only where its materialized scores stay small.
  * ``jax:cudnn|xla`` — ``jax.nn.dot_product_attention(implementation=...)`` on the BTNH arrays.
  * ``jax-pallas:mha|mgpu|decode_gqa|paged`` — JAX's own Pallas ops, with their traps handled
    (docs/peers.md §3): ``mha`` defaults to ``sm_scale=1.0`` (we pass the scale); ``attention_mgpu`` and
    ``paged_attention`` apply no scale at all (q is pre-scaled once, untimed, in the input dtype, so their
    error includes that one rounding); ``attention_mgpu`` takes fp16 only, D % 64 == 0, block multiples of
    64 (we use block_q 64, block_kv 128, 2 stages: docs/peers.md §1); ``decode_attention.gqa`` is decode only
    and transposes the KV cache inside its op, so compare calls its per-head kernel on K/V transposed once,
    untimed (``_gqa_inner``; where this JAX's internals differ, the public op, with a note saying the two
    transposes are timed). Every layout change a peer needs is made outside the timed region, or its
    ``prepared_notes`` says the peer's own op includes it.

  * ``fa3:mha|varlen|kvcache`` — FlashAttention-3 through its JAX binding ``flash_attn3_jax`` (XLA FFI custom calls;
    the published wheel 0.2.3 is built for Hopper and head dim 128 only): ``flash_mha`` on BTNH (prefill, train,
    dense decode), ``flash_mha_varlen`` on the packed documents of each row concatenated (``cu_seqlens``; packed
    prefill and train), ``flash_mha_with_kvcache`` on the dense cache or the paged pools (``page_table``,
    ``cache_seqlens``: ragged, chunked q_len > 1). FA3 aligns its causal mask bottom-right (key ``j`` visible to query
    ``i`` iff ``j <= i + Tk - Tq``, per sequence with cache lengths): our top-left-with-offset mask where
    ``q_offset == Tk - Tq``, refused otherwise. Windows pass as ``window_size=(W - 1, 0)``.

The train family (``family = "train"``: compare.train's program, the jitted ``jax.value_and_grad`` of
``sum(out * w)`` w.r.t. q, k, v, or torch autograd of the same) runs on ``jax:cudnn``, ``jax:xla``, ``torch:cudnn``,
``torch:flash`` and ``fa3:mha`` / ``fa3:varlen``. torch's backward runs on the autograd engine's device thread,
whose kernels the Mosaic CUPTI collector does not see: torch train programs are timed with CUDA events
(``Prepared.clock = "events"``, which the runner honours and notes).

Features (``Impl.features``; a workload needing another one is refused before anything runs): ``jax:xla`` takes a
window (``local_window_size=(W - 1, 0)``, or an explicit mask with a query offset) and packed documents (an explicit
``[B, 1, T, T]`` segment mask); ``jax:cudnn`` a window at ``q_offset == 0`` (cuDNN's sliding window has no query
offset); the FA3 peers a window; ``fa3:varlen`` packed documents. No peer implements a soft-cap or sinks.

Causal masks: our convention is top-left with ``q_offset`` (``j <= i + q_offset``). When every row sees
every key the mask is dropped; ``q_offset == 0`` maps to the peers' top-left ``is_causal``; for SDPA,
``q_offset == Tk - Tq`` maps to ``causal_lower_right``; any other offset needs an explicit mask (MATH,
EFFICIENT and jax:xla only). Paged workloads give dense-KV peers the dense view of the same cache
(``notes`` says so); ragged lengths become ``key_value_seq_lengths`` (jax) or a boolean mask (SDPA).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from .schema import YES, Ctx, Impl, Prepared, Support

__all__ = ["peer_impls", "causal_mode", "FA3_HEAD_DIMS"]

MATH_MAX_SCORE_BYTES = 512 << 20  # fp32 scores B*H*Tq*Tk*4 above this: MATH is not "cheap"


def causal_mode(w) -> str:
    """``none`` | ``top_left`` | ``bottom_right`` | ``offset``: the mask a peer must apply."""
    if not w.causal or w.q_offset >= w.kv_len - 1:  # row 0 already sees every key: no mask at all
        return "none"
    if w.q_offset == 0:
        return "top_left"
    if w.q_offset == w.kv_len - w.q_len:
        return "bottom_right"
    return "offset"


def _dense_like(w) -> Support:
    if w.family == "mla":
        return Support(False, "", "n/a")  # the MLA workloads have their own peers (_mla_peer_impls)
    return YES


def _lowp(w) -> Support:
    if w.dtype not in ("float16", "bfloat16"):
        return Support(False, f"takes float16/bfloat16 only; got {w.dtype}")
    return YES


def _first_fail(*checks: Support) -> Support:
    for c in checks:
        if not c.ok:
            return c
    return YES


def _ragged(w) -> bool:
    return w.family == "paged_decode" and bool(w.ragged)


def _kv_note(w) -> str:
    return "dense view of the paged cache" if w.family == "paged_decode" else ""


# --------------------------------------------------------------------------------------- torch SDPA

_SDPA = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def _sdpa_supports(backend: str, w, ctx: Ctx) -> Support:
    base = _dense_like(w)
    if not base.ok:
        return base
    if not ctx.torch_cuda:
        return Support(False, "needs a CUDA GPU", "unavailable")
    mode = causal_mode(w)
    gqa = w.heads_q != w.heads_kv
    masked = mode == "offset" or _ragged(w)
    if backend in ("cudnn", "flash"):
        c = _lowp(w)
        if not c.ok:
            return c
        if masked:
            return Support(False, f"{backend} takes no explicit mask (causal offset {w.q_offset} / ragged lengths)")
    if backend == "cudnn" and gqa and w.kv_len == 1:
        return Support(False, "cuDNN SDPA cannot take Sk == 1 with GQA (docs/peers.md §3)")
    if backend == "efficient" and gqa:
        return Support(False, "EFFICIENT refuses Hq != Hkv with enable_gqa (docs/peers.md §3)")
    if w.family == "train" and mode not in ("none", "top_left"):
        return Support(False, f"the train program passes is_causal (top-left) only; causal offset {w.q_offset}")
    if backend == "math":
        score_bytes = w.batch * w.heads_q * w.q_len * w.kv_len * 4
        if score_bytes > MATH_MAX_SCORE_BYTES:
            return Support(False, f"MATH materializes {score_bytes / 2**20:.0f} MiB of scores (> "
                                  f"{MATH_MAX_SCORE_BYTES >> 20} MiB): not cheap", "skipped")
    return YES


def _sdpa_prepare(backend: str, w, inp, ctx: Ctx) -> Prepared:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if w.family == "train":
        return _sdpa_train_prepare(backend, w, inp)
    q, k, v = inp.torch_bhnd()
    mode = causal_mode(w)
    kwargs = {"scale": inp.scale}
    if w.heads_q != w.heads_kv:
        kwargs["enable_gqa"] = True
    mask = None
    if mode == "top_left":
        kwargs["is_causal"] = True
    elif mode == "bottom_right" and not _ragged(w):
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(w.q_len, w.kv_len)
    if mode == "offset" or _ragged(w):
        j = torch.arange(w.kv_len, device=q.device)
        vis = torch.ones((w.batch, 1, w.q_len, w.kv_len), dtype=torch.bool, device=q.device)
        if _ragged(w):
            lens = torch.as_tensor(inp.kv_lens, device=q.device).long()
            vis &= j[None, None, None, :] < lens[:, None, None, None]
            offs = lens - w.q_len  # paged causal: q_offset = kv_len[b] - Tq per sequence
        else:
            offs = torch.full((w.batch,), w.q_offset, device=q.device)
        if w.causal:
            i = torch.arange(w.q_len, device=q.device)
            vis &= j[None, None, None, :] <= (i[None, None, :, None] + offs[:, None, None, None])
        mask = vis
    be = getattr(SDPBackend, _SDPA[backend])

    def fn(q, k, v):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)

    return Prepared(fn, (q, k, v), "torch", "BHND", notes=_kv_note(w))


def _sdpa_train_prepare(backend: str, w, inp) -> Prepared:
    """torch autograd of ``sum(out * w)`` through SDPA with one backend (``compare.train.torch_step``)."""
    from . import train

    return train.torch_step(_SDPA[backend], w, inp, causal=causal_mode(w) == "top_left")


# ----------------------------------------------------------------------------------------- jax.nn


def _jaxnn_supports(impl: str, w, ctx: Ctx) -> Support:
    base = _dense_like(w)
    if not base.ok:
        return base
    if impl == "xla" and not ctx.jax_gpu and w.dtype != "float32":
        return Support(False, f"jax.nn xla on the CPU backend has no {w.dtype} dot with fp32 accumulation "
                              "(F16_F16_F32 / BF16_BF16_F32 unsupported there); runs on a GPU")
    if impl == "cudnn":
        if not ctx.jax_gpu:
            return Support(False, "needs a CUDA GPU", "unavailable")
        c = _lowp(w)
        if not c.ok:
            return c
        if causal_mode(w) not in ("none", "top_left"):
            return Support(False, f"jax.nn cudnn path: only top-left causal here (q_offset={w.q_offset})")
        if getattr(w, "window", None) is not None and w.q_offset != 0:
            return Support(False, f"jax.nn's cudnn path places its sliding window relative to query i (no query "
                                  f"offset); this workload's window ends at i + q_offset (q_offset={w.q_offset})")
    return YES


def _explicit_mask(w) -> bool:
    """jax.nn needs an explicit boolean mask: a causal offset, packed documents, or a window at an offset (jax.nn's
    local_window_size is relative to query i)."""
    return (causal_mode(w) in ("bottom_right", "offset") or bool(getattr(w, "packed", False))
            or (getattr(w, "window", None) is not None and w.q_offset != 0))


def _jaxnn_prepare(impl: str, w, inp, ctx: Ctx) -> Prepared:
    import jax
    import jax.numpy as jnp

    mode = causal_mode(w)
    window = getattr(w, "window", None)
    args = [inp.q, inp.k, inp.v]
    kw = {"scale": inp.scale, "implementation": impl}
    use_lens = _ragged(w)
    mask_arr = None
    notes = [_kv_note(w)]
    if not _explicit_mask(w):
        if mode == "top_left" or (window is not None and w.causal):
            kw["is_causal"] = True
        if window is not None:  # query i sees keys (i - W, i]
            kw["local_window_size"] = (window - 1, 0)
    else:
        # explicit top-left-with-offset mask (per sequence for paged: q_offset = kv_len[b] - Tq), with the window
        # and the packed documents; built once, untimed
        offs = (np.asarray(inp.kv_lens) - w.q_len) if w.family == "paged_decode" else np.full(w.batch, w.q_offset)
        i = np.arange(w.q_len)[None, :, None]
        j = np.arange(w.kv_len)[None, None, :]
        vis = np.ones((w.batch, w.q_len, w.kv_len), dtype=bool)
        if w.causal:
            vis &= j <= i + offs[:, None, None]
        if window is not None:
            vis &= j > i + offs[:, None, None] - window
        if getattr(w, "packed", False):
            seg = np.asarray(inp.segment_ids)
            vis &= seg[:, :, None] == seg[:, None, :]
            notes.append("packed documents as an explicit [B, 1, T, T] segment mask (untimed)")
        mask_arr = jnp.asarray(vis[:, None])  # [B, 1, Tq, Tk]
    if use_lens:
        args.append(inp.kv_lens_jax())
    if mask_arr is not None:
        args.append(mask_arr)

    def fn(q, k, v, *rest):
        rest = list(rest)
        lens = rest.pop(0) if use_lens else None
        m = rest.pop(0) if mask_arr is not None else None
        return jax.nn.dot_product_attention(q, k, v, mask=m, key_value_seq_lengths=lens, **kw)

    if w.family == "train":
        from . import train

        return train.jax_step(fn, w, inp, notes="; ".join(n for n in notes if n), extra=tuple(args[3:]))
    return Prepared(jax.jit(fn), tuple(args), "jax", "BTNH", notes="; ".join(n for n in notes if n))


# ------------------------------------------------------------------------------ JAX's Pallas ops


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _mha_block(n: int) -> bool:
    """mha uses block = min(128, n) and needs n % block == 0; Triton needs a power-of-two block >= 16."""
    return n % 128 == 0 or (_pow2(n) and n >= 16)


def _mha_supports(w, ctx: Ctx) -> Support:
    base = _dense_like(w)
    if not base.ok:
        return base
    if w.family == "paged_decode":
        return Support(False, "dense prefill kernel: paged workloads go to jax-pallas:paged")
    if w.heads_q != w.heads_kv:
        return Support(False, "ops.gpu.attention.mha indexes K/V by the query head: Hq == Hkv only")
    if causal_mode(w) not in ("none", "top_left"):
        return Support(False, f"mha's causal mask is top-left without offset (q_offset={w.q_offset})")
    if not (_mha_block(w.q_len) and _mha_block(w.kv_len)):
        return Support(False, f"mha needs Tq, Tk multiples of 128 or powers of two >= 16; got {w.q_len}, {w.kv_len}")
    return YES


def _mha_prepare(w, inp, ctx: Ctx) -> Prepared:
    import jax
    from jax.experimental.pallas.ops.gpu import attention

    fn = jax.jit(functools.partial(attention.mha, segment_ids=None, sm_scale=inp.scale,
                                   causal=causal_mode(w) == "top_left", interpret=ctx.interpret))
    return Prepared(fn, (inp.q, inp.k, inp.v), "jax", "BTNH", notes="sm_scale passed (its default is 1.0)")


_MGPU_BLOCK_Q, _MGPU_BLOCK_KV, _MGPU_STAGES = 64, 128, 2


def _mgpu_supports(w, ctx: Ctx) -> Support:
    base = _dense_like(w)
    if not base.ok:
        return base
    if not ctx.hopper:
        return Support(False, "needs a Hopper GPU (Mosaic GPU kernel; not interpretable)", "unavailable")
    if w.family == "paged_decode":
        return Support(False, "dense prefill kernel: no paged path")
    if w.dtype != "float16":
        return Support(False, f"attention_mgpu stages through fp16 shared memory: float16 only; got {w.dtype}")
    if w.head_dim % 64:
        return Support(False, f"attention_mgpu needs D % 64 == 0; got {w.head_dim}")
    if w.q_len % (2 * _MGPU_BLOCK_Q) or w.kv_len % _MGPU_BLOCK_KV:
        return Support(False, f"attention_mgpu needs Tq % {2 * _MGPU_BLOCK_Q} == 0 and Tk % {_MGPU_BLOCK_KV} "
                              f"== 0; got {w.q_len}, {w.kv_len}")
    if causal_mode(w) not in ("none", "top_left"):
        return Support(False, f"attention_mgpu's causal mask is top-left without offset (q_offset={w.q_offset})")
    return YES


def _mgpu_prepare(w, inp, ctx: Ctx) -> Prepared:
    import jax
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    cfg = attention_mgpu.TuningConfig(block_q=_MGPU_BLOCK_Q, block_kv=_MGPU_BLOCK_KV,
                                      max_concurrent_steps=_MGPU_STAGES, causal=causal_mode(w) == "top_left")
    q_scaled = inp.cached("q_prescaled", lambda: (inp.q * inp.scale).astype(inp.q.dtype))
    fn = jax.jit(lambda q, k, v: attention_mgpu.attention(q, k, v, cfg))  # config is a nondiff positional
    return Prepared(fn, (q_scaled, inp.k, inp.v), "jax", "BTNH",
                    notes="applies no softmax scale: q pre-scaled once (untimed)")


def _splits(n: int, block: int, cap: int = 16) -> int | None:
    """Largest k_splits <= cap with n % k == 0, n/k >= 16 and (n/k) % min(block, n/k) == 0."""
    for k in range(cap, 0, -1):
        if n % k:
            continue
        part = n // k
        if part >= 16 and part % min(block, part) == 0:
            return k
    return None


def _decode_gqa_supports(w, ctx: Ctx) -> Support:
    base = _dense_like(w)
    if not base.ok:
        return base
    if w.q_len != 1:
        return Support(False, f"decode_attention.gqa is decode only (Tq == 1); got Tq={w.q_len}")
    if causal_mode(w) != "none":
        return Support(False, "decode_attention.gqa takes no causal mask")
    if _splits(w.kv_len, 128) is None:
        return Support(False, f"no k_splits divides Tk={w.kv_len} into blocks of >= 16 keys")
    return YES


_GQA_INNER_PARAMS = ("q", "k", "v", "start_idx", "kv_seq_len", "sm_scale", "block_h", "block_k", "k_splits",
                     "num_warps", "num_stages", "grid", "interpret", "debug", "return_residuals", "normalize_output")


def _gqa_inner():
    """JAX's per-(batch, KV head) decode kernel entry, when its signature is the one we call (else None).

    ``decode_attention.gqa`` takes K/V as ``[B, T, Hkv, D]`` and transposes both to ``[B, Hkv, T, D]``
    (``swapaxes``) inside its own op, in every call: two full KV-cache copies timed with the kernel, where
    every other implementation is timed on its own layout made once, untimed. Calling the per-head entry
    on K/V transposed once (untimed) times the kernel alone, as ``gqa`` launches it (same block_h 16,
    block_k 128, num_stages 2, k_splits)."""
    import inspect

    from jax.experimental.pallas.ops.gpu import decode_attention

    fn = getattr(decode_attention, "decode_attn_unbatched", None)
    if fn is None:
        return None
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return fn if params == _GQA_INNER_PARAMS else None


def _decode_gqa_prepare(w, inp, ctx: Ctx) -> Prepared:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import decode_attention

    ks = _splits(w.kv_len, 128)
    ragged = _ragged(w)
    lens = [inp.kv_lens_jax()] if ragged else []
    inner = _gqa_inner()
    if inner is None:  # this JAX's internals differ: time its public op and say what the timing includes
        def fn(q, k, v, *lens):
            return decode_attention.gqa(q[:, 0], k, v, kv_seq_len=lens[0] if lens else None, sm_scale=inp.scale,
                                        k_splits=ks, interpret=ctx.interpret)

        note = (f"k_splits={ks}; the timed op includes its own two KV-cache transposes ([B, T, Hkv, D] -> "
                "[B, Hkv, T, D], one full copy each: decode_attention.gqa's API; docs/peers.md §3)")
        return Prepared(jax.jit(fn), (inp.q, inp.k, inp.v, *lens), "jax", "BND",
                        notes=", ".join(x for x in (note, _kv_note(w)) if x))

    k_t = inp.cached("k_bhtd", lambda: jnp.swapaxes(inp.k, 1, 2))
    v_t = inp.cached("v_bhtd", lambda: jnp.swapaxes(inp.v, 1, 2))
    one = functools.partial(inner, sm_scale=inp.scale, block_h=16, block_k=128, k_splits=ks, num_warps=None,
                            num_stages=2, grid=None, interpret=ctx.interpret, debug=False, return_residuals=False,
                            normalize_output=True)

    def fn(q, k_t, v_t, *lens):
        b, _, hq, d = q.shape
        hkv = k_t.shape[1]
        qg = q[:, 0].reshape(b, hkv, hq // hkv, d)
        n = jnp.broadcast_to(lens[0][:, None], (b, hkv)) if lens else None
        o = jax.vmap(jax.vmap(one))(qg, k_t, v_t, None, n)
        return o.reshape(b, hq, d)

    note = (f"k_splits={ks}; K/V transposed once to [B, Hkv, T, D] (untimed) and the per-head kernel "
            "decode_attn_unbatched called as gqa calls it (gqa's own op would transpose both in every call)")
    return Prepared(jax.jit(fn), (inp.q, k_t, v_t, *lens), "jax", "BND",
                    notes=", ".join(x for x in (note, _kv_note(w)) if x))


def _paged_split(pages: int, page_size: int) -> tuple[int, int] | None:
    # at most 128 keys per compute block: 8 pages of 64 asked for 276 KiB of shared memory on an H200
    # (run 20261121T093034), more than the 227 KiB a block may have
    cap = max(1, min(8, 128 // page_size))
    for ks in range(min(16, pages), 0, -1):
        if pages % ks == 0:
            part = pages // ks
            for ppcb in range(min(cap, part), 0, -1):
                if part % ppcb == 0:
                    return ks, ppcb
    return None


def _paged_supports(w, ctx: Ctx) -> Support:
    if w.family != "paged_decode":
        return Support(False, "", "n/a")
    if w.q_len != 1:  # a decode token at q_offset = kv_len - 1 sees every key, so causal needs no mask
        return Support(False, f"ops.gpu.paged_attention is decode only (Tq == 1); got Tq={w.q_len}")
    if _paged_split(math.ceil(w.kv_len / w.page_size), w.page_size) is None:
        return Support(False, "no k_splits/pages_per_compute_block fits the table")
    return YES


def _paged_prepare(w, inp, ctx: Ctx) -> Prepared:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import paged_attention

    pages = int(inp.block_table.shape[1])
    ks, ppcb = _paged_split(pages, w.page_size)
    # its layout is [Hkv, num_pages, page, D]: one transpose of the pools, untimed
    kp = inp.cached("k_pages_hnpd", lambda: jnp.transpose(inp.k_pool, (2, 0, 1, 3)))
    vp = inp.cached("v_pages_hnpd", lambda: jnp.transpose(inp.v_pool, (2, 0, 1, 3)))
    q_scaled = inp.cached("q_prescaled", lambda: (inp.q * inp.scale).astype(inp.q.dtype))

    def fn(q, k_pages, v_pages, table, lens):
        return paged_attention.paged_attention(q[:, 0], k_pages, v_pages, table, lens, k_splits=ks,
                                               pages_per_compute_block=ppcb, interpret=ctx.interpret)

    return Prepared(jax.jit(fn), (q_scaled, kp, vp, inp.block_table, inp.kv_lens_jax()), "jax", "BND",
                    notes=f"applies no softmax scale: q pre-scaled once (untimed); k_splits={ks}, "
                          f"pages_per_compute_block={ppcb}; pools transposed to [Hkv, pages, page, D] (untimed)")


# ------------------------------------------------------------------------------- FlashAttention-3 (JAX)

FA3_HEAD_DIMS = (128,)  # the published flash-attn3-jax 0.2.3 wheel is built for head dim 128 only (its README)
_FA3_MODULE = "flash_attn3_jax"


@functools.cache
def _fa3():
    """``(module, None)`` or ``(None, why)``: the FA3 JAX binding, imported once."""
    try:
        import importlib

        return importlib.import_module(_FA3_MODULE), None
    except Exception as e:  # not installed, or its CUDA library does not load here
        return None, f"{type(e).__name__}: {str(e)[:200]}"


def _fa3_supports(variant: str, w, ctx: Ctx) -> Support:
    """What FA3 takes (dtype, head dim, its bottom-right causal mask), then whether this machine can run it."""
    fam = w.family
    if variant == "mha" and fam not in ("prefill", "train", "decode"):
        return Support(False, "", "n/a")
    if variant == "varlen" and (fam not in ("prefill", "train") or not getattr(w, "packed", False)):
        return Support(False, "", "n/a")  # varlen is the packed workloads' FA3; the others run fa3:mha
    if variant == "kvcache" and fam not in ("decode", "paged_decode"):
        return Support(False, "", "n/a")
    if w.dtype not in ("float16", "bfloat16"):
        return Support(False, f"FA3 takes float16/bfloat16; got {w.dtype}")
    if w.head_dim not in FA3_HEAD_DIMS:
        return Support(False, f"the published wheel is built for D 128 only (flash-attn3-jax 0.2.3: Hopper, head dim "
                              f"128); got D {w.head_dim}")
    if w.causal and fam != "paged_decode" and w.q_offset != w.kv_len - w.q_len:
        return Support(False, f"FA3 aligns the causal mask bottom-right (key j visible to query i iff j <= i + Tk - "
                              f"Tq); this workload's q_offset {w.q_offset} != Tk - Tq = {w.kv_len - w.q_len}")
    mod, err = _fa3()
    if mod is None:
        return Support(False, f"{_FA3_MODULE} is not importable here ({err})", "unavailable")
    if not (ctx.jax_gpu and ctx.hopper):
        return Support(False, "needs a Hopper (sm_90) GPU: the published wheel is built for sm_90 only", "unavailable")
    return YES


def _fa3_kw(w, inp) -> dict:
    window = getattr(w, "window", None)
    return {"softmax_scale": float(inp.scale), "is_causal": bool(w.causal),
            "window_size": (window - 1, 0) if window is not None else (-1, -1)}


def _fa3_window_note(w) -> str:
    window = getattr(w, "window", None)
    return f"window_size=({window - 1}, 0)" if window is not None else ""


def _fa3_mha_prepare(w, inp, ctx: Ctx) -> Prepared:
    import jax

    mod, _ = _fa3()
    kw = _fa3_kw(w, inp)

    def attn(q, k, v):
        return mod.flash_mha(q, k, v, **kw)

    note = ", ".join(x for x in ("flash_mha on BTNH (GQA by head count)", _fa3_window_note(w)) if x)
    if w.family == "train":
        from . import train

        return train.jax_step(attn, w, inp, notes=note)
    return Prepared(jax.jit(attn), (inp.q, inp.k, inp.v), "jax", "BTNH", notes=note)


def _fa3_varlen_prepare(w, inp, ctx: Ctx) -> Prepared:
    """The packed documents of every row, back to back over the flattened ``[B * T]`` tokens (a free reshape of
    the BTNH buffers), one sequence each in ``cu_seqlens``: causal within each document, none sees another."""
    import jax

    mod, _ = _fa3()
    kw = _fa3_kw(w, inp)
    b, t = w.batch, w.q_len
    longest = int(inp.max_doc_len)

    def attn(q, k, v, cu):
        flat = [x.reshape(b * t, *x.shape[2:]) for x in (q, k, v)]
        o = mod.flash_mha_varlen(*flat, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                                 max_seqlen_k=longest, **kw)
        return o.reshape(b, t, *o.shape[1:])

    docs = len(inp.cu_seqlens) - 1
    note = ", ".join(x for x in (f"flash_mha_varlen over {docs} documents of {b} rows (cu_seqlens, max "
                                 f"{longest})", _fa3_window_note(w)) if x)
    if w.family == "train":
        from . import train

        return train.jax_step(attn, w, inp, notes=note, extra=(inp.cu_seqlens,))
    return Prepared(jax.jit(attn), (inp.q, inp.k, inp.v, inp.cu_seqlens), "jax", "BTNH", notes=note)


def _fa3_splits(w) -> int:
    """``num_splits`` for ``flash_mha_with_kvcache`` (the binding has no heuristic: its default is 1): enough
    splits of the keys for about one program per SM when batch x KV heads x query tiles cannot fill the GPU, each
    split at least 1024 keys, at most 16. Our rule, recorded in the record's notes."""
    from pallas_attn import _compat

    sms = _compat.device_sm_count()
    programs = w.batch * w.heads_kv * max(1, math.ceil(w.q_len * w.group / 128))
    if programs >= sms:
        return 1
    return int(max(1, min(16, math.ceil(sms / programs), w.kv_len // 1024)))


def _fa3_kvcache_prepare(w, inp, ctx: Ctx) -> Prepared:
    import functools as ft

    import jax

    mod, _ = _fa3()
    ns = _fa3_splits(w)
    call = ft.partial(mod.flash_mha_with_kvcache, num_splits=ns, **_fa3_kw(w, inp))
    win = _fa3_window_note(w)
    if w.family == "paged_decode":
        def fn(q, kp, vp, table, lens):
            return call(q, kp, vp, cache_seqlens=lens, page_table=table)

        note = (f"paged pools [blocks, {w.page_size}, Hkv, D] with page_table and cache_seqlens (causal bottom-right "
                f"per sequence: q_offset = kv_len[b] - Tq), num_splits={ns}")
        return Prepared(jax.jit(fn), (inp.q, inp.k_pool, inp.v_pool, inp.block_table, inp.kv_lens_jax()), "jax",
                        "BTNH", notes=", ".join(x for x in (note, win) if x))

    def fn_dense(q, k, v):
        return call(q, k, v)

    return Prepared(jax.jit(fn_dense), (inp.q, inp.k, inp.v), "jax", "BTNH",
                    notes=", ".join(x for x in (f"dense cache, num_splits={ns}", win) if x))


def _fa3_impls() -> list[Impl]:
    lowering = "cutlass (FA3, XLA FFI)"
    return [
        Impl("fa3:mha", "jax", None, None, "peer", lowering,
             "FlashAttention-3 flash_attn3_jax.flash_mha (BTNH, GQA, differentiable)",
             functools.partial(_fa3_supports, "mha"), _fa3_mha_prepare,
             families=frozenset({"prefill", "train", "decode"}), features=frozenset({"window"})),
        Impl("fa3:varlen", "jax", None, None, "peer", lowering,
             "FlashAttention-3 flash_attn3_jax.flash_mha_varlen (packed documents, cu_seqlens, differentiable)",
             functools.partial(_fa3_supports, "varlen"), _fa3_varlen_prepare,
             families=frozenset({"prefill", "train"}), features=frozenset({"window", "packed"})),
        Impl("fa3:kvcache", "jax", None, None, "peer", lowering,
             "FlashAttention-3 flash_attn3_jax.flash_mha_with_kvcache (dense or paged cache, cache_seqlens)",
             functools.partial(_fa3_supports, "kvcache"), _fa3_kvcache_prepare,
             families=frozenset({"decode", "paged_decode"}), features=frozenset({"window"})),
    ]


def _fp16_kv_only(supports, w, ctx: Ctx) -> Support:
    """Every peer reads KV in the workload dtype: on a quantized-KV workload (``kv_dtype``) it refuses, with a
    record, wherever it would otherwise apply (no silent fp16 run beside quantized kernels)."""
    kvd = getattr(w, "kv_dtype", None)
    sup = supports(w, ctx)
    if not kvd or sup.status == "n/a":
        return sup
    return Support(False, f"reads KV in the workload dtype ({w.dtype}), not kv_dtype={kvd}: no quantized-KV path "
                          "in this peer (no silent fp16 run)", "unsupported")


# ------------------------------------------------------------------------------------------------ MLA
# docs/mla.md "Peers". The MLA workloads' peers: an XLA implementation written here (einsum MQA over the latent),
# and, with their reasons, JAX's own Pallas decode kernel and FlashInfer.


def _mla_only(w) -> Support | None:
    return None if w.family == "mla" else Support(False, "", "n/a")


def _xla_mla_supports(w, ctx: Ctx) -> Support:
    no = _mla_only(w)
    if no is not None:
        return no
    if w.dtype not in ("float16", "bfloat16"):
        return Support(False, f"the MLA entries take float16/bfloat16 queries; got {w.dtype}")
    return YES


def _xla_mla_prepare(w, inp, ctx: Ctx) -> Prepared:
    """Absorbed MLA as plain XLA (our code): scores ``q . latent`` over all DQK columns on the dense latent, one
    latent head broadcast to every query head (no per-head copy), masked by the sequence's length (and causal
    offset), softmax in float32, then ``p . latent[:, :, :kv_lora_rank]`` with float32 accumulation; output in q's
    dtype. The latent is the dense view of the pool the kernels read, made untimed (``interop.make_mla_inputs``:
    the pages gathered = the dense latent, bit for bit); a quantized latent is dequantized inside the timed call
    (XLA fuses it into the first product), so this peer reads the same bytes the kernels do."""
    import jax
    import jax.numpy as jnp

    from . import interop

    lora, scale, causal, tq = int(inp.kv_lora_rank), float(inp.scale), bool(w.causal), w.q_len
    kvd = getattr(inp, "kv_dtype", None)
    lat = inp.k_quant if kvd else inp.k
    # XLA's CPU backend has no bf16 x bf16 -> f32 (nor f16) dot: there the operands are widened to float32
    # (exact) so CI checks this peer's semantics; on a GPU the products run in the workload dtype
    wide = not ctx.jax_gpu

    def fn(q, lat, lens):
        out_dtype = q.dtype
        t_scale = jnp.float32(1.0)
        if kvd:  # the codes times their micro-scales, without the tensor scale: exact in bf16 and fp16 (an E4M3
            # value, or an E2M1 level times an E4M3 micro-scale, has at most 6 significant bits and lies in
            # [2^-10, 2688]); the float32 tensor scale multiplies the scores and the output instead
            t_scale = lat.scale.astype(jnp.float32)
            lat = interop.dequantized(dataclasses.replace(lat, scale=jnp.ones((), jnp.float32))).astype(q.dtype)
        lat = lat[:, :, 0]  # [B, Tk, DQK]
        if wide:
            q, lat = q.astype(jnp.float32), lat.astype(jnp.float32)
        s = jnp.einsum("bqhd,bkd->bhqk", q, lat, preferred_element_type=jnp.float32) * (scale * t_scale)
        j = jnp.arange(lat.shape[1])[None, None, None, :]
        vis = j < lens[:, None, None, None]
        if causal:
            i = jnp.arange(tq)[None, None, :, None]
            vis &= j <= i + (lens - tq)[:, None, None, None]
        s = jnp.where(vis, s, -jnp.inf)
        m = jnp.max(s, axis=-1, keepdims=True)
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        p = jnp.exp(s - m)
        l = jnp.sum(p, axis=-1, keepdims=True)
        o = jnp.einsum("bhqk,bkl->bqhl", p.astype(q.dtype), lat[..., :lora], preferred_element_type=jnp.float32)
        o = o * (t_scale / jnp.where(l > 0, l, 1.0).transpose(0, 2, 1, 3))
        return o.astype(out_dtype)

    note = "jnp.einsum MQA over the dense latent (the pool's pages gathered once, untimed)"
    if wide:
        note += "; CPU backend: operands widened to float32 (exact), products and p in float32"
    else:
        note += f"; p cast to {w.dtype} for the PV product (fp32 accumulation)"
    if kvd:
        note += (f"; the {kvd} latent decoded inside the timed call to {w.dtype} without its tensor scale (exact), "
                 "the scale applied to the float32 scores and output")
    return Prepared(jax.jit(fn), (inp.q, lat, inp.kv_lens_jax()), "jax", "BTNH", notes=note)


def _decode_mla_supports(w, ctx: Ctx) -> Support:
    no = _mla_only(w)
    if no is not None:
        return no
    dqk, dv = w.head_dim, w.kv_lora_rank
    return Support(False, (
        "jax.experimental.pallas.ops.gpu.decode_attention cannot express MLA: its kernel takes one head dim for q, "
        f"K, V and the output (it reshapes v with q's head dim and writes o of q's shape), so V = the latent's first "
        f"{dv} of {dqk} columns needs V = the whole latent (PV over {dqk} columns, the extra sliced off) read a "
        f"second time as its own operand; and its Triton blocks span the whole head dim, which Triton needs a power "
        f"of two ({dqk} is not: padding the latent to {1 << (dqk - 1).bit_length()} columns would read "
        f"{(1 << (dqk - 1).bit_length()) / dqk:.2f}x the bytes). Not a like-for-like peer (docs/mla.md)"),
        "unsupported")


def _flashinfer_mla_supports(w, ctx: Ctx) -> Support:
    no = _mla_only(w)
    if no is not None:
        return no
    import importlib.util

    if importlib.util.find_spec("flashinfer") is None:
        return Support(False, "flashinfer is not installed in this environment (docs/mla.md)", "unavailable")
    return Support(False, "flashinfer is installed, but compare has no FlashInfer MLA path wired yet "
                          "(its batched MLA paged-attention wrapper): not run", "unsupported")


def _mla_peer_impls() -> list[Impl]:
    return [
        Impl("jax:xla_mla", "jax", None, None, "peer", "xla",
             "absorbed MLA in XLA (jnp.einsum MQA over the dense latent, float32 softmax; written here)",
             _xla_mla_supports, _xla_mla_prepare),
        Impl("jax-pallas:decode_mla", "jax-pallas", None, None, "peer", "triton",
             "jax.experimental.pallas.ops.gpu.decode_attention (mqa) asked to run MLA", _decode_mla_supports),
        Impl("flashinfer:mla", "flashinfer", None, None, "peer", None, "FlashInfer's MLA paged decode",
             _flashinfer_mla_supports),
    ]


def peer_impls() -> list[Impl]:
    out = _peer_impls()
    # the MLA peers handle a quantized latent themselves (the XLA peer dequantizes it in its timed call)
    return [dataclasses.replace(i, supports_fn=functools.partial(_fp16_kv_only, i.supports_fn)) for i in out] \
        + _mla_peer_impls()


_BASE_FAMILIES = frozenset({"prefill", "decode", "paged_decode", "mla"})  # Impl's default: every family but train
_JAXNN_FEATURES = {"cudnn": frozenset({"window"}), "xla": frozenset({"window", "packed"})}


def _peer_impls() -> list[Impl]:
    out = [Impl(f"torch:{b}", "torch", None, None, "peer", f"sdpa:{_SDPA[b]}",
                f"torch SDPA, backend {_SDPA[b]} selected explicitly" + (" (FlashAttention-2)" if b == "flash" else ""),
                functools.partial(_sdpa_supports, b), functools.partial(_sdpa_prepare, b),
                families=_BASE_FAMILIES | ({"train"} if b in ("cudnn", "flash") else set()))
           for b in ("cudnn", "flash", "efficient", "math")]
    out += [Impl(f"jax:{i}", "jax", None, None, "peer", i, f"jax.nn.dot_product_attention(implementation={i!r})",
                 functools.partial(_jaxnn_supports, i), functools.partial(_jaxnn_prepare, i),
                 families=_BASE_FAMILIES | {"train"}, features=_JAXNN_FEATURES[i])
            for i in ("cudnn", "xla")]
    out += [
        Impl("jax-pallas:mha", "jax-pallas", None, None, "peer", "triton",
             "jax.experimental.pallas.ops.gpu.attention.mha", _mha_supports, _mha_prepare),
        Impl("jax-pallas:mgpu", "jax-pallas", None, None, "peer", "mosaic-gpu",
             "jax.experimental.pallas.ops.gpu.attention_mgpu (block_q 64, block_kv 128, 2 stages)",
             _mgpu_supports, _mgpu_prepare),
        Impl("jax-pallas:decode_gqa", "jax-pallas", None, None, "peer", "triton",
             "jax.experimental.pallas.ops.gpu.decode_attention.gqa", _decode_gqa_supports, _decode_gqa_prepare),
        Impl("jax-pallas:paged", "jax-pallas", None, None, "peer", "triton",
             "jax.experimental.pallas.ops.gpu.paged_attention", _paged_supports, _paged_prepare),
    ]
    return out + _fa3_impls()
