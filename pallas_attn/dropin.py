"""``pallas_attn.dot_product_attention``: a drop-in for ``jax.nn.dot_product_attention`` with Pallas gradients.

Same signature and semantics as ``jax.nn.dot_product_attention`` (BTNH or TNH arrays, GQA by head count,
``bias`` / ``mask`` / ``is_causal`` / sequence lengths / ``local_window_size`` combined as jax.nn combines
them, ``return_residual``), computed by Pallas kernels (a forward saving the LSE, dK/dV and dQ backward
kernels, wrapped in a ``jax.custom_vjp``; docs/dropin.md). Two kernel pairs:

* ``pallas:fa_prefill`` on a Hopper GPU (compute capability 9.0) when both its forward and its backward take
  the call: fp16 / bf16, head dim 64, 128 or 256 (``DROPIN_HEAD_DIMS``; D 96's pair only when forced,
  ``DEFAULT_SKIPS_HEAD_DIMS``; by default a D 96 call from query length 1024 on runs fa_prefill's forward, and when
  it is differentiated that forward's output and LSE go to jax.nn cuDNN's backward, ``APART``), no sequence
  lengths. At short self-attention (D 64 up to N 4096, D 128 up to N 512 causal / 1024 not;
  ``CUDNN_FORWARD_MAX_Q_LEN``) a default call runs jax.nn's cuDNN forward, and when it is differentiated that
  forward's output and softmax statistics go to fa_prefill_bwd's backward (``CUDNN_FORWARD``, ``CUDNN_FORWARD_STEP``;
  fa_prefill's pair where jax's private cuDNN forward primitive is not the one ``_cudnn_forward`` binds;
  docs/dropin.md, "Short sequences"). The mirror at long causal D 128 (from N 4096, ``TRAIN_ON_CUDNN_MIN_Q_LEN``;
  with no window or a causal one of at least Mistral's 4096 keys, ``TRAIN_ON_CUDNN_MIN_WINDOW``): this pair's
  forward, and when differentiated jax.nn cuDNN's backward on its output and LSE (``APART``, ``APART_STEP``; jax.nn's
  cuDNN pair where jax's private cuDNN backward primitive is not the one ``_cudnn_backward`` binds), unless
  determinism is asked or a ``bwd_config`` named (docs/dropin.md, "Long training steps"). Mosaic GPU kernels
  (TMA, wgmma, warp specialisation): ``fa_prefill`` forward with its LSE, ``fa_prefill_bwd.backward``
  (docs/fa_prefill.md). A ``local_window_size`` that is causal in effect (right 0, or ``is_causal``; left >= 0;
  T <= S) runs its band of key blocks in both; any other window pairs fa_prefill's forward with fa_train's
  backward kernels. The extensions ``softcap`` and ``sinks`` are differentiable there too; ``segment_ids``' backward
  (fa_prefill_bwd's packed kernels, D <= 128, no window) runs in interpret mode and, on a GPU, once
  ``fa_prefill_bwd.PACKED_BWD_ON_GPU`` is on (it is, since its first GPU run; off, a GPU call with it is forward
  only).
* ``pallas:fa_train`` otherwise (Triton-lowered; every mask, fp32, D 16-256; also in interpret mode on a CPU).

``implementation``:

* ``None``: a Pallas kernel when one supports the call (fa_prefill first on sm_90), else jax.nn's cuDNN on a GPU
  where it takes the call (``_cudnn_takes``: fp16 / bf16, no bias, mask or sequence lengths, head dim a multiple of 8
  up to 128; the model-shape sweep measured the XLA fallback 14x slower than cuDNN for Phi-3's head dim 96), else
  jax.nn's XLA implementation. ``which_implementation(...)`` (same arguments) says which and why.
* ``"pallas"``: the same choice among the Pallas kernels, or ``NotImplementedError`` naming what neither
  supports; never a fallback.
* ``"pallas:fa_train"`` / ``"pallas:fa_prefill"``: that kernel pair or ``NotImplementedError`` (fa_prefill
  off sm_90 on a GPU; without a GPU it runs in interpret mode: its forward's Pallas twin and its backward's
  kernels on JAX's Mosaic GPU interpreter, for tests).
* ``"xla"`` / ``"cudnn"``: passed to ``jax.nn.dot_product_attention`` unchanged.

Semantics kept from jax.nn's XLA path, including its corner cases: a query row with no visible key (causal
with a window, ``key_value_seq_lengths`` 0, ...) returns the mean of V over all keys (jax.nn's masked logits
are a large finite negative, so their softmax is uniform), and its gradient flows to every V row; rows at or
past ``query_seq_lengths`` return 0 and get no gradient; NaN or Inf that reaches a visible score gives NaN.

Empty inputs (query length T 0, key length S 0, batch 0, head dim 0) launch no kernel: ``None`` returns jax.nn's
XLA result (an empty output of query's shape; zeros and a -inf residual when only S is 0), a forced Pallas
implementation raises NotImplementedError naming the argument. Rank 1-3 input comes back in query's own shape, as
jax.nn's does.

What runs on the GPU: no GPU -> interpret mode (``pallas_attn._compat.default_interpret``). jvp (forward-mode
autodiff) of the Pallas path is not defined (``jax.custom_vjp``): ``jax.jvp`` raises JAX's TypeError.

Not supported by either kernel pair (``None`` falls back to cuDNN or XLA, ``"pallas"`` raises): ``bias``, ``mask``,
head dims outside (16, 32, 64, 128, 256), dtypes other than float16 / bfloat16 / float32, q/k/v of different dtypes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, api
from .kernels import fa_prefill, fa_prefill_bwd, fa_train
from .kernels.contract import Problem

__all__ = ["dot_product_attention", "which_implementation", "IMPLEMENTATIONS"]

IMPLEMENTATIONS = (None, "pallas", "pallas:fa_train", "pallas:fa_prefill", "xla", "cudnn")
# What ``which_implementation`` returns for a default call whose forward and backward run apart: fa_prefill's forward
# when the call is not differentiated, jax.nn's cuDNN forward and backward when it is (``_forward_apart``). Not an
# ``implementation`` a caller passes: the two named ones force either side.
APART = "pallas:fa_prefill|cudnn"
# The mirror route: jax.nn's cuDNN forward when the call is not differentiated, fa_prefill's own pair (forward with its
# LSE, then its backward) when it is: at the short sequences where cuDNN's forward is faster than fa_prefill's
# (``CUDNN_FORWARD_MAX_Q_LEN``). Not an ``implementation`` a caller passes either.
CUDNN_FORWARD = "cudnn|pallas:fa_prefill"
_PALLAS = "pallas:fa_train"
_PREFILL = "pallas:fa_prefill"


@functools.cache
def _is_sm90() -> bool:
    """True when the GPU jax computes on is a Hopper (compute capability 9.0: wgmma and TMA, what fa_prefill's
    Mosaic GPU kernels are written for). False without a GPU and on other GPUs (sm_80 has no wgmma; sm_100's
    tensor-core instructions differ)."""
    return _compat.gpu_compute_capability() == "9.0"


def _ensure_4d(x):
    if isinstance(x, jax.ShapeDtypeStruct):  # which_implementation asked about shapes only (no arrays made)
        return x if x.ndim >= 4 else jax.ShapeDtypeStruct((1,) * (4 - x.ndim) + tuple(x.shape), x.dtype)
    x = jnp.asarray(x)
    return x[(None,) * (4 - x.ndim)] if x.ndim < 4 else x


def _window(local_window_size, is_causal=False, t: int | None = None, s: int | None = None):
    """``(left, right)`` from jax.nn's ``local_window_size``; None for no window. Given the lengths ``t`` / ``s``, a
    window that masks nothing is None too: jax.nn keeps ``i - left <= j <= i + right`` (top-left), so ``left >=
    t - 1`` excludes no key, and ``right`` excludes none when ``right >= s - 1`` or the call is causal (``j <= i``
    is tighter). Mistral's 4096-key window over a 4096-token prompt is such a window; the kernels' plain causal
    schedule then runs instead of a band (session 11: 416 vs 369 us at B64 N 512 on an H100)."""
    if local_window_size is None:
        return None
    if isinstance(local_window_size, (int, np.integer)) and not isinstance(local_window_size, bool):
        win = (int(local_window_size), int(local_window_size))
    else:
        try:
            left, right = local_window_size
            win = (int(left), int(right))
        except (TypeError, ValueError):
            raise ValueError(f"local_window_size must be an int or a (left, right) pair of ints; "
                             f"got {local_window_size!r}") from None
    if t is not None and s is not None and t >= 1 and s >= 1:
        left, right = win
        if left >= t - 1 and (right >= s - 1 or (bool(is_causal) and right >= 0)):
            return None
    return win


def _check(query, key, value, bias, mask, query_seq_lengths, key_value_seq_lengths, implementation):
    """jax.nn's argument checks (the same conditions, errors that name the argument). Returns 4-D arrays."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    q, k, v = _ensure_4d(query), _ensure_4d(key), _ensure_4d(value)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"query, key, value must be BTNH (rank 4) or TNH (rank 3); got {jnp.shape(query)}, "
                         f"{jnp.shape(key)}, {jnp.shape(value)}")
    b, s, kh, h = k.shape
    if v.shape != k.shape or v.dtype != k.dtype:
        raise ValueError(f"value must match key's shape and dtype; got value {v.shape} {v.dtype}, key {k.shape} "
                         f"{k.dtype}")
    if q.shape[0] != b or q.shape[3] != h or q.dtype != k.dtype:
        raise ValueError(f"query must be [B={b}, T, N, H={h}] with key's dtype {k.dtype}; got {q.shape} {q.dtype}")
    if kh == 0:
        raise ValueError(f"key and value must have at least one head (K >= 1); got key {k.shape}")
    if q.shape[2] % kh:
        raise ValueError(f"the number of query heads must be a multiple of key/value heads; got {q.shape[2]} vs {kh}")
    for name, x in (("bias", bias), ("mask", mask)):
        if x is not None and jnp.ndim(x) > 4:
            raise ValueError(f"{name} must be broadcastable to (B, N, T, S); got shape {jnp.shape(x)}")
    if mask is not None and jnp.asarray(mask).dtype != np.dtype(bool):
        raise ValueError(f"mask must be boolean (True = attend); got dtype {jnp.asarray(mask).dtype}")
    for name, x in (("query_seq_lengths", query_seq_lengths), ("key_value_seq_lengths", key_value_seq_lengths)):
        if x is not None:
            x = jnp.asarray(x)
            if x.shape != (b,) or x.dtype != np.dtype("int32"):
                raise ValueError(f"{name} must be int32 [B={b}]; got shape {x.shape}, dtype {x.dtype}")
    return q, k, v


def _empty_input(q, k) -> str:
    """Why a call has nothing for a kernel to compute ("" when it has): a zero-sized dimension (an empty query or
    key sequence, an empty batch, no query heads, head dim 0). jax.nn's XLA path returns, for those, an empty
    output of query's shape, or zeros (and a -inf residual) when only the key sequence is empty: the drop-in
    falls back to it under ``implementation=None`` so the answer is jax.nn's exactly (values, shapes, gradients)."""
    names = ("batch B", "sequence length", "heads", "head dim H")
    for arg, x, seq in (("query", q, "T"), ("key", k, "S")):
        for i, n in enumerate(x.shape):
            if n == 0:
                what = f"{names[1]} {seq}" if i == 1 else names[i]
                return f"{arg} has {what} 0 ({arg}.shape={tuple(x.shape)}): the kernels take no empty input"
    return ""


def _resolve(generation: str, problem: Problem):
    """``(kernel, config)`` of ``generation`` on ``problem`` through ``api.resolve``, the one resolver of every public
    entry: the kernel's ``supports`` (NotImplementedError with its reason), then its config for the problem (the
    heuristic: this GPU's table, else the kernel's rule). The drop-in picks its kernels and forward configs here."""
    return api.resolve(generation, problem, None)


def _refusal(generation: str, problem: Problem) -> str:
    """Why ``generation`` refuses ``problem`` (the resolver's NotImplementedError, word for word), "" if it takes it."""
    try:
        _resolve(generation, problem)
    except NotImplementedError as e:
        return str(e)
    return ""


def _dense_problem(q, k, causal: bool = False) -> Problem:
    """The dense ``Problem`` of a BTNH call (``q [B, T, N, H]``, ``k [B, S, K, H]``) for the kernels' resolvers."""
    b, t, n, h = q.shape
    return Problem(entry="dense", dtype=jnp.dtype(q.dtype).name, batch=b, q_len=t, kv_len=k.shape[1], heads_q=n,
                   heads_kv=k.shape[2], head_dim=h, causal=bool(causal))


def _unsupported(q, k, bias, mask) -> str:
    """Why the Pallas kernel cannot take this call ("" when it can)."""
    if bias is not None:
        return "bias is not supported by pallas:fa_train (its gradient is a [B, N, T, S] array)"
    if mask is not None:
        return "mask is not supported by pallas:fa_train (use is_causal / seq lengths / local_window_size)"
    return _refusal("fa_train", _dense_problem(q, k))


# Head dims the drop-in sends to fa_prefill: every head dim its forward and backward build (D 256 through the
# backward's config d256), each of them through a passing GPU run (docs/fa_prefill.md). A head dim is added here only
# after its GPU tests pass; the check below names this tuple when it refuses one.
DROPIN_HEAD_DIMS = (64, 96, 128, 256)
# Head dims the drop-in takes when forced (``implementation="pallas:fa_prefill"``) but not by default, with the reason:
# D 96's backward is the D 128 kernels on zero-padded columns, and its training step measured slower than jax.nn's
# cuDNN (H100, session 24: 1.34x / 1.17x / 1.08x at Phi-3 N 1024 / 4096 / 16384), though its forward is faster
# (0.85-0.95x at N >= 1024); the default keeps cuDNN's pair until the backward has a D 96 kernel of its own, or a
# forward-only call is routed apart from a differentiated one.
DEFAULT_SKIPS_HEAD_DIMS = {96: ("head dim 96: pallas:fa_prefill's backward runs it on zero-padded D 128 columns, "
                                "slower than cuDNN's training step on an H100 (docs/fa_prefill.md, 'Head dim 96'); "
                                "force implementation='pallas:fa_prefill' for it")}
# Of those head dims, from which query length a default call runs fa_prefill's forward when it is not differentiated
# and cuDNN's pair when it is (``APART``): Phi-3's forward through fa_prefill took 0.95 / 0.89 / 0.88 / 0.84 / 0.85x
# jax.nn cuDNN's time at N 1024 / 2048 / 4096 / 8192 / 16384 and 1.04x at N 512 (H100, session 24,
# results/sweep/20261127_s24_h100_call5/). Below it, cuDNN's forward too.
FORWARD_APART_MIN_Q_LEN = {96: 1024}
# ``(head dim, causal)``: up to which query length a default self-attention call (T == S, no window, no lengths, no
# extension) runs jax.nn's cuDNN forward when it is not differentiated and fa_prefill's pair when it is
# (``CUDNN_FORWARD``). Evidence, H100: the model-shape sweep (session 26, lanes, call 3:
# results/gpu_runs/20261128_s26_h100_call3_lanes_sweep/): fa_prefill's forward took 1.275 / 1.113 / 1.125 / 1.172x
# jax.nn cuDNN's time at GPT-2 (D 64, H 12, 32k tokens a call) N 512 / 1024 / 2048 / 4096 causal, 1.003x at N 8192,
# 0.927x at N 16384; 1.041-1.078x at D 128 N 512 (Llama-3.1-8B / 70B, Qwen2.5-7B), 0.996-0.998x at N 1024. Then one
# process, every config beside cuDNN (session 27, results/gpu_runs/20261128_s27_h100_call1_route/,
# configs/route_short_prefill.toml), fa_prefill's best named config over cuDNN: causal D 64 N 256-4096 1.35 / 1.28 /
# 1.13 / 1.13 / 1.12x, N 8192 1.002x; causal D 128 (GQA 32 / 8) N 256 / 512 1.29 / 1.06x, N 1024 / 2048 1.00 / 0.99x;
# non-causal D 64 N 256-4096 1.28 / 1.17 / 1.11 / 1.06 / 1.01x, N 8192 0.94x (c3); non-causal D 128 N 256 / 512 /
# 1024 1.27 / 1.06 / 1.02x, N 2048 1.006x. The training steps stay ours (0.96-1.05x cuDNN's at GPT-2 N 512 / 4096,
# 0.71x at Llama-3.1-8B N 512). The per-row-tile fixed cost that makes fa_prefill's forward slow at short N is
# docs/fa_prefill.md's "What is left".
CUDNN_FORWARD_MAX_Q_LEN = {(64, True): 4096, (64, False): 4096, (128, True): 512, (128, False): 1024}
# ``(head dim, causal)``: from which query length a default self-attention call (T == S, no window, no lengths, no
# extension, no ``bwd_config``, determinism not asked) runs fa_prefill's forward when it is not differentiated and
# jax.nn's cuDNN forward and backward when it is (``APART``, as D 96 does). Evidence, H100, the training step (our pair
# over jax.nn cuDNN's, each within one run): one process, Llama-3.1-70B N 8192 1.073x and Qwen2.5-7B N 16384 1.082x
# (session 22, results/sweep/20261127_s22_h100_call1/), Llama-3.1-8B N 16384 1.069x (session 21,
# results/gpu_runs/20261127_s21_h100_call4/); the six-lane sweep (session 27,
# results/gpu_runs/20261128_s27_h100_call2_lanes_sweep/) Llama-3.1-8B / 70B / Qwen2.5-7B 1.136 / 1.085 / 1.042x at
# N 8192 and 1.035 / 1.104 / 1.138x at N 16384. Session 28's one process, 4 rounds
# (results/gpu_runs/20261128_s28_h100_call0_long_d128_route/): 8192 to 16384 on cuDNN's pair measured 0.98-1.02x
# cuDNN's own step (the route works), our pair 1.06-1.10x there, and at N 4096 our pair 1.025 / 1.059 / 1.044x
# cuDNN's (Llama-3.1-8B / 70B / Qwen2.5-7B; the lanes said 1.025 / 1.005 / 1.092x), so the row starts at 4096 now
# (sessions 21-22 had read 0.97-1.01x there). At N 2048 ours is 0.94-0.98x cuDNN's. fa_prefill's forward is
# 0.91-1.00x cuDNN's at these lengths, so a call not differentiated keeps it. docs/fa_prefill.md, "Long training
# steps on cuDNN's pair".
TRAIN_ON_CUDNN_MIN_Q_LEN = {(128, True): 4096}
# The narrowest causal window that the row above also routes, as ``left`` (keys before the query's own): Mistral's
# 4096-key window, ``(4095, 0)``, the one measured.
# Our pair's step over jax.nn cuDNN's at Mistral-7B N 8192 / 16384 (H100; each within one run): 1.018 / 1.010x
# (session 10), 1.027x (session 21), 1.032 / 0.959x (session 26's lanes), 1.001 / 1.043x (session 27's lanes),
# 1.042 / 1.045x (session 28's lanes, results/gpu_runs/20261128_s28_h100_call3_whole_sweep/): cuDNN's is faster in 8
# of 10, by ~3% at the median. Narrower windows were never measured against cuDNN's and keep our pair.
TRAIN_ON_CUDNN_MIN_WINDOW = 4095


def _prefill_unsupported(q, k, bias, mask, *, is_causal, window, q_lens, kv_lens) -> str:
    """Why fa_prefill's forward + backward cannot take this call ("" when they can), hardware aside."""
    if bias is not None or mask is not None:
        return "bias / mask are not supported by pallas:fa_prefill"
    if not isinstance(is_causal, (bool, np.bool_)):
        return f"is_causal must be a bool; got {is_causal!r}"
    if q_lens is not None or kv_lens is not None:
        return "sequence lengths are not supported by pallas:fa_prefill (its forward has no per-sequence lengths)"
    b, t, n, h = q.shape
    dt = jnp.dtype(q.dtype).name
    if dt not in fa_prefill_bwd.DTYPES:
        return f"pallas:fa_prefill takes float16 / bfloat16; got {dt}"
    if h not in fa_prefill_bwd.HEAD_DIMS:
        return f"pallas:fa_prefill's backward takes head dims {fa_prefill_bwd.HEAD_DIMS}; got {h}"
    if h not in DROPIN_HEAD_DIMS:
        return (f"pallas:fa_prefill at head dim {h} has not passed a GPU run; the drop-in takes head dims "
                f"{DROPIN_HEAD_DIMS} (dropin.DROPIN_HEAD_DIMS)")
    problem = _dense_problem(q, k, is_causal)
    why = _refusal("fa_prefill", problem)
    if not why and window is not None and _hopper_bwd_left(is_causal, window, t, k.shape[1]) is None:
        # a window fa_prefill_bwd has not (not causal-shaped, or rows that may see no key): fa_train's backward
        why = _refusal("fa_train", problem)
        why = f"this window's backward runs on pallas:fa_train, which refuses: {why}" if why else ""
    return why


def _hopper_bwd_left(is_causal, window, t: int, s: int) -> int | None:
    """The causal window's left side when fa_prefill_bwd takes this window (None otherwise): a window that is
    causal in effect (``right == 0``, or ``is_causal`` with ``right >= 0``), ``left >= 0``, and ``T <= S`` (every
    row then sees its own key: no empty rows, whose jax.nn answer fa_train's pair handles)."""
    if window is None:
        return None
    left, right = window
    if left < 0 or right < 0 or not (right == 0 or is_causal) or t > s:
        return None
    return int(left)


def which_implementation(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                         query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                         implementation=None, return_residual=False, softcap=None, sinks=None,
                         segment_ids=None, deterministic=None, bwd_config=None) -> tuple[str, str]:
    """``(impl, reason)``: what ``dot_product_attention`` with these arguments runs.

    ``impl`` is ``"pallas:fa_prefill"``, ``"pallas:fa_train"``, ``"xla"``, ``"cudnn"``, ``APART`` (fa_prefill's
    forward when the call is not differentiated, cuDNN's pair when it is: head dim 96 from a query length on, a
    Hopper GPU, no ``return_residual``; ``FORWARD_APART_MIN_Q_LEN``) or ``CUDNN_FORWARD`` (the mirror: cuDNN's
    forward when not differentiated, fa_prefill's pair when it is: short self-attention at D 64 / 128 on a Hopper
    GPU, ``implementation=None`` only; ``CUDNN_FORWARD_MAX_Q_LEN``); ``reason`` says
    why (for ``None``: the unsupported argument that made it fall back, or which kernel pair supports the
    call and, when fa_train is chosen, why fa_prefill is not; "interpret mode" when no GPU is present).
    ``implementation="pallas"`` (or a named kernel pair) on an unsupported call raises NotImplementedError.
    ``softcap`` / ``sinks`` / ``segment_ids`` (extensions beyond jax.nn) run on fa_prefill only: anything else raises.
    ``deterministic`` / ``bwd_config`` as ``dot_product_attention`` takes them: asking for determinism or naming a
    backward config keeps a differentiated call on fa_prefill's pair (``TRAIN_ON_CUDNN_MIN_Q_LEN``).
    """
    del scale
    q, k, _ = _check(query, key, value, bias, mask, query_seq_lengths, key_value_seq_lengths, implementation)
    if softcap is not None or sinks is not None or segment_ids is not None:
        win = _window(local_window_size, is_causal, q.shape[1], k.shape[1])
        return _which_extension(q, k, bias, mask, is_causal=is_causal, window=win,
                                q_lens=query_seq_lengths, kv_lens=key_value_seq_lengths,
                                implementation=implementation, softcap=softcap, sinks=sinks, segment_ids=segment_ids)
    if implementation in ("xla", "cudnn"):
        return implementation, f"implementation={implementation!r} passes through to jax.nn"
    why_empty = _empty_input(q, k)
    if why_empty:
        if implementation is not None:
            raise NotImplementedError(f"implementation={implementation!r}: {why_empty}; implementation=None "
                                      f"returns jax.nn's result for it")
        return "xla", f"fallback: {why_empty} (jax.nn's XLA path gives its exact result: no work to launch)"
    interpret = _compat.default_interpret(None)
    win = _window(local_window_size, is_causal, q.shape[1], k.shape[1])
    why_prefill = _prefill_unsupported(q, k, bias, mask, is_causal=is_causal, window=win,
                                       q_lens=query_seq_lengths, kv_lens=key_value_seq_lengths)
    sm90 = _is_sm90()
    if implementation == _PREFILL:
        if why_prefill:
            raise NotImplementedError(f"implementation={_PREFILL!r}: {why_prefill}")
        if not (sm90 or interpret):
            raise NotImplementedError(f"implementation={_PREFILL!r}: its Mosaic GPU kernels (wgmma, TMA) need a "
                                      f"Hopper GPU (compute capability 9.0)")
        mode = "interpret mode: no GPU" if interpret else "Mosaic GPU on sm_90"
        pair = _pair_words(q, k, is_causal, win)
        return _PREFILL, f"forced: {pair} support the call ({mode})"
    slow = DEFAULT_SKIPS_HEAD_DIMS.get(q.shape[3]) if implementation is None else None
    if implementation is None and sm90 and not why_prefill and not slow and not interpret and not return_residual:
        route = _cudnn_route(q, k, is_causal=is_causal, window=win, deterministic=deterministic, bwd_config=bwd_config)
        if route is not None:
            return route
    if implementation in (None, "pallas") and sm90 and not why_prefill and not slow:
        pair = _pair_words(q, k, is_causal, win)
        return _PREFILL, f"{pair} support the call (Mosaic GPU on sm_90)"
    apart_from = FORWARD_APART_MIN_Q_LEN.get(q.shape[3])
    if (slow and sm90 and not why_prefill and not interpret and not return_residual and apart_from is not None
            and q.shape[1] >= apart_from and _cudnn_takes(q, bias, mask, query_seq_lengths, key_value_seq_lengths,
                                                          is_causal=is_causal, window=win)):
        return APART, (f"head dim {q.shape[3]}, query length >= {apart_from}: pallas:fa_prefill's forward when the "
                       "call is not differentiated (faster than cuDNN's there), "
                       f"{_apart_step_words(q, k, is_causal, win)} when it is (cuDNN's backward is faster than our "
                       "zero-padded one); docs/fa_prefill.md, 'Head dim 96'")
    why = _unsupported(q, k, bias, mask)
    if slow and sm90 and not why_prefill:
        why = f"{slow}; {why}" if why else slow
    if why:
        if implementation is not None:
            raise NotImplementedError(f"implementation={implementation!r}: {why}")
        if not interpret and _cudnn_takes(q, bias, mask, query_seq_lengths, key_value_seq_lengths,
                                          is_causal=is_causal, window=win):
            return "cudnn", f"fallback to jax.nn's cuDNN (it takes the call on this GPU): {why}"
        return "xla", f"fallback: {why}"
    mode = "interpret mode: no GPU" if interpret else "Triton on the GPU"
    if implementation == _PALLAS:
        return _PALLAS, f"forced: the kernel supports the call ({mode})"
    not_prefill = (f"; not pallas:fa_prefill: {why_prefill}" if why_prefill else
                   "; not pallas:fa_prefill: no Hopper GPU (compute capability 9.0)")
    return _PALLAS, f"the kernel supports the call ({mode}){not_prefill}"


def _which_extension(q, k, bias, mask, *, is_causal, window, q_lens, kv_lens, implementation, softcap, sinks,
                     segment_ids=None):
    """which_implementation for a call with ``softcap`` / ``sinks`` / ``segment_ids``: fa_prefill's forward or
    NotImplementedError (jax.nn has none of them, so there is no fallback to give)."""
    names = " and ".join(n for n, x in (("softcap", softcap), ("sinks", sinks), ("segment_ids", segment_ids))
                         if x is not None)
    if implementation in ("xla", "cudnn", _PALLAS):
        raise NotImplementedError(f"implementation={implementation!r}: {names} run on pallas:fa_prefill only "
                                  f"(jax.nn and fa_train have no {names})")
    why = _empty_input(q, k)
    if not why:
        why = _prefill_unsupported(q, k, bias, mask, is_causal=is_causal, window=window, q_lens=q_lens,
                                   kv_lens=kv_lens)
    interpret = _compat.default_interpret(None)
    if not why and not (_is_sm90() or interpret):
        why = "its Mosaic GPU kernels (wgmma, TMA) need a Hopper GPU (compute capability 9.0)"
    if why:
        raise NotImplementedError(f"{names} run on pallas:fa_prefill only, which cannot take this call: {why}")
    if softcap is not None and (isinstance(softcap, bool) or not float(softcap) > 0):
        raise ValueError(f"softcap must be a positive number; got {softcap!r}")
    b, t, n = q.shape[:3]
    if sinks is not None and tuple(jnp.shape(sinks)) != (n,):
        raise ValueError(f"sinks must be one logit per query head, shape ({n},); got {tuple(jnp.shape(sinks))}")
    if segment_ids is not None:
        if tuple(jnp.shape(segment_ids)) != (b, t) or not jnp.issubdtype(jnp.result_type(segment_ids), jnp.integer):
            raise ValueError(f"segment_ids must be int [B, T] = [{b}, {t}]; got {tuple(jnp.shape(segment_ids))} "
                             f"{jnp.result_type(segment_ids)}")
        if not is_causal or k.shape[1] != t:
            raise NotImplementedError(f"segment_ids (packed documents) run causal self-attention only (T == S); got "
                                      f"is_causal={is_causal}, T={t}, S={k.shape[1]}")
        if not interpret and not fa_prefill.PACKED_ON_GPU:
            raise NotImplementedError("segment_ids (packed documents): fa_prefill's Mosaic kernel for them is switched "
                                      "off (fa_prefill.PACKED_ON_GPU; docs/fa_prefill.md, 'Packed documents'); no "
                                      "other implementation has them")
    mode = "interpret mode: no GPU" if interpret else "Mosaic GPU on sm_90"
    if _extension_grads(q, k, is_causal, window, segment_ids):
        return _PREFILL, (f"{names}: fa_prefill's forward and backward ({mode}; the sinks' gradient in jnp from the "
                          f"backward's delta)" if sinks is not None else
                          f"{names}: fa_prefill's forward and backward ({mode})")
    why_not = ("segment_ids: fa_prefill_bwd's packed kernels take no window and D <= 128, and run on a GPU only "
               "once fa_prefill_bwd.PACKED_BWD_ON_GPU is on" if segment_ids is not None else
               "fa_prefill's backward has no window of this form (only a causal window, left >= 0, T <= S)")
    return _PREFILL, (f"{names}: fa_prefill's forward ({mode}); forward only ({why_not}), so differentiating the "
                      f"call raises")


def _pair_words(q, k, is_causal, window) -> str:
    if window is not None and _hopper_bwd_left(is_causal, window, q.shape[1], k.shape[1]) is None:
        return "fa_prefill's forward (the window's band of key blocks) with fa_train's backward kernels (this window)"
    if window is not None:
        return "fa_prefill's forward and backward (the window's band of key blocks in both)"
    return "fa_prefill's forward and backward"


def _packed_grads(q) -> bool:
    """Whether packed documents are differentiable here: fa_prefill_bwd's packed kernels (D <= 128), on a GPU only
    while ``fa_prefill_bwd.PACKED_BWD_ON_GPU`` is on (on since their first GPU run), always in interpret mode."""
    return q.shape[3] <= 128 and (fa_prefill_bwd.PACKED_BWD_ON_GPU or _compat.default_interpret(None))


def _extension_grads(q, k, is_causal, window, segment_ids) -> bool:
    """Whether a softcap / sinks / segment_ids call is differentiable: fa_prefill_bwd has the soft-cap and the
    sinks' gradient, the window (if any) in its causal form, packed documents without a window (``_packed_grads``)."""
    if segment_ids is not None:
        return window is None and _packed_grads(q)
    return window is None or _hopper_bwd_left(is_causal, window, q.shape[1], k.shape[1]) is not None


def _cudnn_route(q, k, *, is_causal, window, deterministic, bwd_config) -> tuple[str, str] | None:
    """For a default call that fa_prefill's pair takes on a Hopper: ``(APART, reason)`` from a
    ``TRAIN_ON_CUDNN_MIN_Q_LEN`` row's length on (unless determinism is asked or a ``bwd_config`` named; a causal
    window of at least ``TRAIN_ON_CUDNN_MIN_WINDOW`` keys too), ``(CUDNN_FORWARD, reason)`` up to a
    ``CUDNN_FORWARD_MAX_Q_LEN`` row's length without a window, else None. Both only for self-attention (T == S)
    where cuDNN takes the call."""
    row = (q.shape[3], bool(is_causal))
    t = q.shape[1]
    if t != k.shape[1] or not _cudnn_takes(q, None, None, None, None, is_causal=is_causal, window=window):
        return None
    shape = f"head dim {q.shape[3]}, {'causal ' if is_causal else ''}query length {t}"
    start = TRAIN_ON_CUDNN_MIN_Q_LEN.get(row)
    wide_window = window is None or (is_causal and window[0] >= TRAIN_ON_CUDNN_MIN_WINDOW)
    if (start is not None and t >= start and wide_window and bwd_config is None
            and not api.deterministic_asked(deterministic)):
        return APART, (f"{shape} >= {start}{'' if window is None else f', window left {window[0]}'}: "
                       f"pallas:fa_prefill's forward when the call is not differentiated, "
                       f"{_apart_step_words(q, k, is_causal, window)} when it is (cuDNN's backward is faster than "
                       "ours at this length; deterministic=True or a bwd_config keeps our training step); "
                       "docs/fa_prefill.md, 'Long training steps on cuDNN's pair'")
    limit = CUDNN_FORWARD_MAX_Q_LEN.get(row)
    if window is None and limit is not None and t <= limit:
        why = _mirror_takes()
        step = ("that forward with its softmax statistics and pallas:fa_prefill's backward on them" if not why else
                f"pallas:fa_prefill's forward and backward ({why})")
        return CUDNN_FORWARD, (f"{shape} <= {limit}: jax.nn's cuDNN forward when the call is not differentiated "
                               f"(faster than fa_prefill's at this length), {step} when it is; docs/dropin.md, "
                               "'Short sequences'")
    return None


def _cudnn_takes(q, bias, mask, q_lens, kv_lens, *, is_causal, window) -> bool:
    """Whether the fallback may be jax.nn's cuDNN rather than XLA: a conservative subset of what cuDNN's fused
    attention takes, where its answer is jax.nn's (no bias / mask / lengths, whose empty-row corner cases differ;
    a window only as cuDNN expresses it: right 0 or causal)."""
    if bias is not None or mask is not None or q_lens is not None or kv_lens is not None:
        return False
    if jnp.dtype(q.dtype).name not in ("float16", "bfloat16"):
        return False
    d = q.shape[3]
    if d % 8 or d > 128:
        return False
    if window is not None and not (window[1] == 0 or is_causal):
        return False
    return _compat.has_gpu()


_LARGE_NEG = -0.7 * float(np.finfo(np.float32).max)  # jax.nn's masked logit (float32 logits)


def _empty_rows(t: int, s: int, *, causal: bool, window, kv_lens):
    """[B or 1, T] True where query row i sees no key (by jax.nn's mask rule, ignoring query lengths)."""
    i = jnp.arange(t, dtype=jnp.int32)[None, :]
    hi = jnp.full((1, 1), s, jnp.int32) if kv_lens is None else jnp.minimum(kv_lens, s)[:, None]
    lo = jnp.zeros((1, 1), jnp.int32)
    if causal:
        hi = jnp.minimum(hi, i + 1)
    if window is not None:
        left, right = window
        hi = jnp.minimum(hi, i + right + 1)
        lo = jnp.maximum(lo, i - left)
    return hi <= lo


# fa_prefill's backward config in the drop-in without a table row, by causal, and the non-deterministic one at causal
# D 64: declared beside the backward's configs (fa_prefill_bwd.RULE_CONFIG / NONDET_CONFIG, where the measurements
# that chose them are noted); the names stay here for their readers
DROPIN_BWD_CONFIG = fa_prefill_bwd.RULE_CONFIG
NONDET_BWD_CONFIG = fa_prefill_bwd.NONDET_CONFIG
deterministic_asked = api.deterministic_asked  # whether the backward must be bit-reproducible (XLA's flag)


def _feature_config(cfg, problem: Problem, window, packed: bool):
    return fa_prefill.config_for_features(cfg, causal=bool(problem.causal), window=window, q_len=problem.q_len,
                                          packed=packed, kv_len=problem.kv_len, head_dim=problem.head_dim)


def prefill_config(problem: Problem, window, packed: bool = False):
    """fa_prefill's forward config for the drop-in: its heuristic (this GPU's table, rows of a shape kind the chip
    lacks from its sibling's: ``tuning.choose``; else its own rule) at the shape, then ``fa_prefill.config_for_window``
    (several row tiles per CTA under a narrow window) and, with packed documents (``segment_ids``),
    ``fa_prefill.config_for_packed``. No support check (distributed and compare ask it for shapes they checked
    themselves); the drop-in's own calls and the chunked path (``chunked.resolve_chunk``) get the same config by way of
    the resolver."""
    return _feature_config(fa_prefill.KERNEL.heuristic(problem), problem, window, packed)


def _prefill_fwd_config(problem: Problem, window, packed: bool = False):
    """``prefill_config`` through the resolver: ``api.resolve("fa_prefill", problem)``'s config (the kernel's
    heuristic once ``supports`` passes), then the window's and packed documents' rules."""
    return _feature_config(_resolve("fa_prefill", problem)[1], problem, window, packed)


def bwd_config_name(problem: Problem, deterministic: bool | None = None) -> str:
    """The name of fa_prefill's backward config for the drop-in when the caller names none: the chooser fa_prefill's
    contract declares for its backward (``fa_prefill.KERNEL.backward.heuristic``, ``fa_prefill_bwd.heuristic``: this
    GPU's table at the problem's bucket, else ``DROPIN_BWD_CONFIG`` by causal, ``fused`` at causal D 64 without a table
    unless determinism is asked: ``deterministic`` or XLA's flag, ``deterministic_asked``), the one
    ``api.resolve_pair`` asks. No support check (distributed and compare ask it for shapes they checked themselves);
    the drop-in's own calls resolve the pair through ``api.resolve_pair``."""
    return fa_prefill.KERNEL.backward.heuristic(problem, deterministic_asked(deterministic))


@dataclasses.dataclass(frozen=True)
class _WindowStatic:
    causal: bool
    scale: float
    window: tuple[int, int]
    fwd_config: object  # fa_prefill.PrefillConfig
    bwd_config: object  # fa_train.TrainConfig
    interpret: bool


def _window_fwd_call(q, k, v, st: _WindowStatic, with_lse: bool):
    return fa_prefill.forward(q, k, v, causal=st.causal, scale=st.scale, q_offset=jnp.zeros((q.shape[0],), jnp.int32),
                              interpret=st.interpret, config=st.fwd_config, return_lse=with_lse, window=st.window)


def _window_bwd_call(st: _WindowStatic, q, k, v, out, lse, dout, dlse=None):
    return fa_train.backward(q, k, v, out, lse, dout, causal=st.causal, scale=st.scale, window=st.window,
                             interpret=st.interpret, config=st.bwd_config, dlse=dlse)


# a window fa_prefill_bwd does not take (not causal-shaped, or T > S) on sm_90: fa_prefill's forward (which skips the
# key blocks outside the band), fa_train's backward kernels (a causal-shaped window runs fa_prefill_bwd's band through
# fa_prefill_bwd.attention_lse, in _pallas). Two custom_vjps as fa_prefill_bwd
# has them: with the LSE as an output, and the output alone (a call that is not differentiated then runs the forward
# without the LSE)
@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _window_lse(q, k, v, st: _WindowStatic):
    return _window_fwd_call(q, k, v, st, True)


def _window_lse_fwd(q, k, v, st):
    out, lse = _window_fwd_call(q, k, v, st, True)
    return (out, lse), (q, k, v, out, lse)


def _window_lse_bwd(st, res, cts):
    q, k, v, out, lse = res
    dout, dlse = cts
    return _window_bwd_call(st, q, k, v, out, lse, dout, dlse)


_window_lse.defvjp(_window_lse_fwd, _window_lse_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _window_out(q, k, v, st: _WindowStatic):
    return _window_fwd_call(q, k, v, st, False)


def _window_out_fwd(q, k, v, st):
    out, lse = _window_fwd_call(q, k, v, st, True)
    return out, (q, k, v, out, lse)


def _window_out_bwd(st, res, dout):
    q, k, v, out, lse = res
    return _window_bwd_call(st, q, k, v, out, lse, dout)


_window_out.defvjp(_window_out_fwd, _window_out_bwd)


def _no_grad(fn, sinks, segment_ids=None):
    """``fn(q, k, v, sinks=..., segment_ids=...)`` whose differentiation raises (packed documents, and soft-cap /
    sinks under a window fa_prefill_bwd does not have, have a forward kernel only)."""

    @jax.custom_jvp
    def f(q, k, v, sinks, segment_ids):
        return fn(q, k, v, sinks=sinks, segment_ids=segment_ids)

    @f.defjvp
    def _jvp(primals, tangents):
        raise NotImplementedError("pallas_attn.dot_product_attention: this call (segment_ids, or softcap / sinks "
                                  "with a window that is not causal-shaped) runs on fa_prefill's forward only; no "
                                  "backward kernel has it yet, so jax.grad / jax.jvp cannot differentiate it")

    return lambda q, k, v: f(q, k, v, sinks, segment_ids)


def _train_config(problem: Problem, bwd_config, deterministic):
    """fa_train's config through the resolver (``api.resolve_pair``): it sets fa_train's forward and backward kernels,
    so a named ``bwd_config`` is refused there, naming fa_train."""
    return api.resolve_pair("fa_train", problem, None, bwd_config, deterministic=deterministic)[1]


def _pallas(q, k, v, *, kernel, scale, is_causal, q_lens, kv_lens, window, return_residual, softcap=None,
            sinks=None, segment_ids=None, deterministic: bool | None = None, bwd_config=None):
    b, t, n, _ = q.shape
    s, kh = k.shape[1], k.shape[2]
    problem = _dense_problem(q, k, is_causal)
    left = _hopper_bwd_left(is_causal, window, t, s) if kernel == _PREFILL and segment_ids is None else None
    packed = kernel == _PREFILL and segment_ids is not None and window is None and _packed_grads(q)
    if kernel == _PREFILL and (packed or segment_ids is None and (left is not None or window is None)):
        # fa_prefill's forward and backward (which_implementation checked: no lengths): the causal mask, a
        # causal-shaped window (its band of key blocks in both), soft-cap, sinks (differentiable), packed documents
        causal = bool(is_causal) or left is not None
        problem = dataclasses.replace(problem, causal=causal)
        # the pair through the one resolver: fa_prefill's config, and its declared backward's (the caller's, else
        # this GPU's table, else the rule)
        _, fwd, bwd = api.resolve_pair("fa_prefill", problem, None, bwd_config, deterministic=deterministic)
        fwd = _feature_config(fwd, problem, None if left is None else (left, 0), segment_ids is not None)
        res = fa_prefill_bwd.attention_lse(
            q, k, v, causal=causal, scale=scale, config=fwd, bwd_config=bwd,
            interpret=_compat.default_interpret(None),
            with_lse=return_residual, window=left, softcap=softcap, sinks=sinks, segment_ids=segment_ids)
        out, lse = res if return_residual else (res, None)
    elif kernel == _PREFILL and (softcap is not None or sinks is not None or segment_ids is not None):  # fwd only
        if bwd_config is not None:
            raise NotImplementedError(f"bwd_config={bwd_config!r}: this call (segment_ids, or softcap / sinks with a "
                                      "window that is not causal-shaped) runs on fa_prefill's forward only; it has no "
                                      "backward to configure")
        res = _no_grad(functools.partial(
            fa_prefill.forward, causal=bool(is_causal), scale=scale, q_offset=jnp.zeros((b,), jnp.int32),
            interpret=_compat.default_interpret(None),
            config=_prefill_fwd_config(problem, window, segment_ids is not None),
            return_lse=bool(return_residual), window=window, softcap=softcap), sinks, segment_ids)(q, k, v)
        out, lse = res if return_residual else (res, None)
    elif kernel == _PREFILL and window is not None:  # fa_prefill's forward, fa_train's backward (this window)
        st = _WindowStatic(causal=bool(is_causal), scale=scale, window=window,
                           fwd_config=_prefill_fwd_config(problem, window),
                           bwd_config=_train_config(problem, bwd_config, deterministic),
                           interpret=_compat.default_interpret(None))
        if not return_residual:
            out = _window_out(q, k, v, st)
            lse = None
        else:
            out, lse = _window_lse(q, k, v, st)
    else:
        with _compat.quiet_triton():
            out, lse = fa_train.attention_lse(
                q, k, v, causal=bool(is_causal), scale=scale, q_lens=q_lens, kv_lens=kv_lens,
                window=window, interpret=_compat.default_interpret(None),
                config=_train_config(problem, bwd_config, deterministic))
    # jax.nn's corner cases, outside the kernel (cheap [B, T] work; autodiff sees plain jnp):
    empty = None
    # a row can see no key only with lengths, a negative window side, or more queries than keys; otherwise the
    # corner-case pass (a mean of V over every key, a select over the output) is skipped: it is not free
    can_be_empty = kv_lens is not None or t > s or (window is not None and min(window) < 0)
    # with sinks a row that sees no key returns 0 (its softmax is the sink's alone; jax.nn's large negative masked
    # logits give the same limit), so the pass is jax.nn's rule for the other rows only
    if can_be_empty and (window is not None or kv_lens is not None) and sinks is None:
        empty = _empty_rows(t, s, causal=bool(is_causal), window=window, kv_lens=kv_lens)  # [B|1, T]
        # a row with no visible key: softmax of equal masked logits = the mean of V over all S keys
        mean_v = jnp.mean(v.astype(jnp.float32), axis=1)  # [B, KH, H]
        mean_v = jnp.repeat(mean_v, n // kh, axis=1)[:, None].astype(out.dtype)  # [B, 1, N, H]
        out = jnp.where(empty[:, :, None, None], mean_v, out)
    if q_lens is not None:  # rows at or past the query length are zeroed (jax.nn multiplies them by 0)
        valid = jnp.arange(t, dtype=jnp.int32)[None, :] < q_lens[:, None]  # [B, T]
        out = jnp.where(valid[:, :, None, None], out, jnp.zeros((), out.dtype))
    if not return_residual:
        return out
    # jax.nn's residual: logsumexp of the masked logits, BTN, in the key dtype, no gradient
    res = jnp.swapaxes(jax.lax.stop_gradient(lse), 1, 2)  # [B, T, N]
    masked = jnp.isneginf(res)
    if empty is not None:
        masked = masked | empty[:, :, None]
    if q_lens is not None:
        masked = masked | ~valid[:, :, None]
    res = jnp.where(masked, jnp.float32(_LARGE_NEG + math.log(s)), res)
    return out, res.astype(k.dtype)


# jax.nn's implementation that ``APART`` differentiates through (the tests on a CPU, where cuDNN is not, set "xla")
_APART_DIFFERENTIATED = "cudnn"
# jax.nn's implementation that ``CUDNN_FORWARD`` runs when not differentiated (the same for the CPU tests)
_CUDNN_FORWARD_IMPL = "cudnn"


def _forward_apart(forward, differentiable):
    """``forward`` when the call is not differentiated, ``differentiable``'s forward and backward when it is: a
    ``jax.custom_vjp`` whose primal is ``forward`` and whose rule takes ``jax.vjp`` of ``differentiable`` (its vjp
    function, a pytree of arrays, is the residual). Under ``jax.grad`` / ``jax.value_and_grad`` every output, the
    value included, is ``differentiable``'s, so a training step is exactly that implementation's."""

    @jax.custom_vjp
    def f(q, k, v):
        return forward(q, k, v)

    def fwd(q, k, v):
        return jax.vjp(differentiable, q, k, v)

    def bwd(vjp_fn, g):
        return vjp_fn(g)

    f.defvjp(fwd, bwd)
    return f


# How a differentiated ``APART`` call runs: ``"ours+cudnn_bwd"`` (fa_prefill's forward with its LSE, then jax.nn cuDNN's
# backward primitive on that output and LSE: ``_ours_then_cudnn``, session 31) or ``"cudnn"`` (jax.nn's cuDNN forward
# and backward, sessions 26-30). The first needs a private jax module whose signature ``_cudnn_bwd_api`` checks; when
# it differs the second runs, and ``which_implementation``'s reason says so. docs/fa_prefill.md, "Our forward, cuDNN's
# backward".
APART_STEP = "ours+cudnn_bwd"
# the positional operands and keyword parameters of jax's cuDNN attention primitives that ``_cudnn_forward`` /
# ``_cudnn_backward`` bind
_CUDNN_OPERANDS = {
    "fwd": ("query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "page_table_k",
            "page_table_v"),
    "bwd": ("query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "page_table_k",
            "page_table_v", "activation", "fwd_output", "grad_output"),
}
_CUDNN_PARAMS = {
    "fwd": frozenset(("scale", "seed", "dropout_rate", "variadic_args", "mask_type", "layout", "sliding_window_length",
                      "is_training")),
    "bwd": frozenset(("scale", "seed", "dropout_rate", "variadic_args", "mask_type", "layout",
                      "sliding_window_length")),
}


@functools.cache
def _cudnn_api(direction: str):
    """``(module, "")``: jax's cuDNN attention module (``jax._src.cudnn.fused_attention_stablehlo``, private) when its
    ``direction`` ("fwd" or "bwd") primitive has the operands and parameters ``_cudnn_forward`` / ``_cudnn_backward``
    bind, else ``(None, why)``."""
    import inspect

    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
    except ImportError as e:  # pragma: no cover - every jax this project supports has it
        return None, f"jax's cuDNN attention module does not import ({e})"
    names = (f"_dot_product_attention_{direction}_p_wrapper", f"_dot_product_attention_{direction}_abstract",
             "MaskType", "AttentionLayout")
    missing = [n for n in names if not hasattr(fa, n)]
    if missing:
        return None, f"jax's cuDNN attention module lacks {', '.join(missing)}"
    params = inspect.signature(getattr(fa, names[1])).parameters.values()
    operands = tuple(p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
    keywords = frozenset(p.name for p in params if p.kind == p.KEYWORD_ONLY)
    if operands != _CUDNN_OPERANDS[direction] or keywords != _CUDNN_PARAMS[direction]:
        return None, (f"jax's cuDNN {direction} primitive has operands {operands} and parameters {sorted(keywords)}, "
                      f"not the ones this drop-in binds")
    return fa, ""


def _cudnn_bwd_api():
    return _cudnn_api("bwd")


def _cudnn_fwd_api():
    return _cudnn_api("fwd")


def _cudnn_forward(q, k, v, *, scale: float, causal: bool):
    """``(out, lse)`` of jax.nn cuDNN's training forward (BTNH ``out``; ``lse`` its softmax statistics, the natural-log
    LSE of the scaled scores, fp32 ``[B, N, T]``: what fa_prefill's forward returns and its backward reads). No
    window, lengths or bias (the ``CUDNN_FORWARD`` route has none)."""
    fa, why = _cudnn_fwd_api()
    if fa is None:
        raise NotImplementedError(why)
    none, params = _cudnn_operands(fa, q, scale=scale, causal=causal, left=None)
    out, lse = fa._dot_product_attention_fwd_p_wrapper.bind(q, k, v, *none, **params, is_training=True)
    return out, lse


def _cudnn_operands(fa, q, *, scale: float, causal: bool, left: int | None):
    """What both of jax's cuDNN primitives take beside q, k, v (and the backward's residuals): the seven empty
    placeholders jax.nn passes for no bias, lengths, offsets or page tables, and the parameters of a BTNH call
    without dropout (the mask; a causal window of ``left + 1`` keys, as jax.nn maps ``local_window_size``)."""
    none = jnp.zeros((0,), q.dtype)
    params = dict(scale=float(scale), seed=42, dropout_rate=0.0, variadic_args=(False, False),
                  mask_type=fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK,
                  layout=fa.AttentionLayout.BTNH.value, sliding_window_length=None if left is None else int(left) + 1)
    return (none,) * 7, params


def _cudnn_backward(q, k, v, out, lse, dout, *, scale: float, causal: bool, left: int | None):
    """``(dq, dk, dv)`` from jax.nn cuDNN's backward kernel given a forward's ``out`` (BTNH) and its natural-log LSE
    (fp32 ``[B, N, T]``, what cuDNN's own forward saves as its softmax statistics); ``left``: a causal window's left
    side (cuDNN's sliding window of ``left + 1`` keys, as jax.nn maps ``local_window_size``)."""
    fa, why = _cudnn_bwd_api()
    if fa is None:
        raise NotImplementedError(why)
    none, params = _cudnn_operands(fa, q, scale=scale, causal=causal, left=left)
    grads = fa._dot_product_attention_bwd_p_wrapper.bind(q, k, v, *none, lse.astype(jnp.float32), out,
                                                         dout.astype(out.dtype), **params)
    return tuple(grads[:3])


def _hybrid_takes(q, k, *, is_causal, window) -> str:
    """Why a differentiated ``APART`` call keeps jax.nn cuDNN's pair ("" when ``_ours_then_cudnn`` takes it):
    self-attention (T == S) with no window or a causal one."""
    if APART_STEP != "ours+cudnn_bwd":
        return f"APART_STEP is {APART_STEP!r}"
    why = _cudnn_bwd_api()[1]
    if why:
        return why
    if q.shape[1] != k.shape[1]:
        return f"query length {q.shape[1]} != key length {k.shape[1]}"
    if window is not None and not (is_causal and _hopper_bwd_left(is_causal, window, q.shape[1], k.shape[1])
                                   is not None):
        return f"window {window} is not a causal one"
    return ""


def _apart_step_words(q, k, is_causal, window) -> str:
    """How a differentiated ``APART`` call runs, in words for ``which_implementation``."""
    why = _hybrid_takes(q, k, is_causal=is_causal, window=window)
    if not why:
        return "that forward with its LSE and jax.nn cuDNN's backward on them"
    return f"jax.nn's cuDNN forward and backward ({why})"


def _ours_then_cudnn(q, k, v, *, scale: float, is_causal: bool, window):
    """A ``jax.custom_vjp`` over BTNH ``q, k, v``: not differentiated, fa_prefill's forward (the forced pair's, the
    same program); differentiated, fa_prefill's forward with its LSE and then ``_cudnn_backward`` on that output and
    LSE. ``window``: None or a causal window (``_hybrid_takes``)."""
    left = None if window is None else _hopper_bwd_left(is_causal, window, q.shape[1], k.shape[1])
    causal = bool(is_causal) or left is not None
    problem = dataclasses.replace(_dense_problem(q, k, causal), causal=causal)
    # the forward as the forced pair binds it (fa_prefill_bwd._fwd_call; its backward config is not used here)
    st = fa_prefill_bwd._Static(causal=causal, scale=scale, fwd_config=_prefill_fwd_config(
        problem, None if left is None else (left, 0)), bwd_config=fa_prefill_bwd.CONFIGS["default"],
        interpret=_compat.default_interpret(None), left=left)
    off = jnp.zeros((q.shape[0],), jnp.int32)

    @jax.custom_vjp
    def f(q, k, v):
        return fa_prefill_bwd._fwd_call(q, k, v, off, None, None, st, with_lse=False)

    def fwd(q, k, v):
        out, lse = fa_prefill_bwd._fwd_call(q, k, v, off, None, None, st)
        return out, (q, k, v, out, lse)

    def bwd(res, g):
        q, k, v, out, lse = res
        return _cudnn_backward(q, k, v, out, lse, g, scale=scale, causal=causal, left=left)

    f.defvjp(fwd, bwd)
    return f(q, k, v)


# How a differentiated ``CUDNN_FORWARD`` call runs: ``"cudnn+ours_bwd"`` (jax.nn cuDNN's training forward with its
# softmax statistics, then fa_prefill_bwd's backward on that output and LSE: ``_cudnn_then_ours``, session 31) or
# ``"ours"`` (fa_prefill's forward and backward, sessions 26-30). The first needs jax's private cuDNN forward
# primitive as ``_cudnn_api("fwd")`` checks it. docs/dropin.md, "Short sequences".
CUDNN_FORWARD_STEP = "cudnn+ours_bwd"


def _mirror_takes() -> str:
    """Why a differentiated ``CUDNN_FORWARD`` call keeps fa_prefill's pair ("" when ``_cudnn_then_ours`` takes it)."""
    if CUDNN_FORWARD_STEP != "cudnn+ours_bwd":
        return f"CUDNN_FORWARD_STEP is {CUDNN_FORWARD_STEP!r}"
    return _cudnn_fwd_api()[1]


def _static_scale(scale, head_dim: int) -> float:
    """The softmax scale as the Pallas kernels take it (a static Python float): ``1 / sqrt(head_dim)`` for None."""
    sc = (1.0 / math.sqrt(head_dim)) if scale is None else scale
    try:
        return float(sc)
    except (TypeError, jax.errors.ConcretizationTypeError) as e:
        raise ValueError(f"scale must be a Python float for the Pallas path (it is static); got {scale!r}") from e


def _cudnn_then_ours(q, k, v, *, scale: float, is_causal: bool, deterministic, bwd_config):
    """A ``jax.custom_vjp`` over BTNH self-attention ``q, k, v`` (no window): not differentiated, jax.nn cuDNN's
    forward (``_CUDNN_FORWARD_IMPL``, the call's own); differentiated, cuDNN's training forward with its softmax
    statistics (``_cudnn_forward``) and then fa_prefill_bwd's backward on that output and LSE, at the config the pair
    would run (``api.resolve_pair``: this GPU's table, ``deterministic``, a named ``bwd_config``)."""
    problem = _dense_problem(q, k, is_causal)
    bwd = api.resolve_pair("fa_prefill", problem, None, bwd_config, deterministic=deterministic)[2]
    interpret = _compat.default_interpret(None)

    @jax.custom_vjp
    def f(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=is_causal,
                                            implementation=_CUDNN_FORWARD_IMPL)

    def fwd(q, k, v):
        out, lse = _cudnn_forward(q, k, v, scale=scale, causal=is_causal)
        return out, (q, k, v, out, lse)

    def bwd_rule(res, g):
        q, k, v, out, lse = res
        return fa_prefill_bwd.backward(q, k, v, out, lse, g.astype(out.dtype), causal=bool(is_causal), scale=scale,
                                       config=bwd, interpret=interpret)

    f.defvjp(fwd, bwd_rule)
    return f(q, k, v)


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale: float | None = None,
                          is_causal: bool = False, query_seq_lengths=None, key_value_seq_lengths=None,
                          local_window_size: int | tuple[int, int] | None = None, implementation: str | None = None,
                          return_residual: bool = False, softcap: float | None = None, sinks=None, segment_ids=None,
                          deterministic: bool | None = None, bwd_config=None):
    """``jax.nn.dot_product_attention`` on Pallas kernels (forward and backward). See the module docstring.

    query ``[B, T, N, H]`` (or ``[T, N, H]``), key/value ``[B, S, K, H]`` with ``N % K == 0`` (GQA); the
    output has query's shape and dtype. ``scale`` defaults to ``1/sqrt(H)``; ``is_causal`` masks key ``j > i``
    (top-left); ``local_window_size`` ``(left, right)`` (or an int for both) keeps ``i - left <= j <= i +
    right``; ``query_seq_lengths`` / ``key_value_seq_lengths`` int32 ``[B]``. ``implementation``: None
    (Pallas when supported, else XLA: ``which_implementation`` says which), ``"pallas"`` (never falls back),
    ``"pallas:fa_train"`` / ``"pallas:fa_prefill"`` (that kernel pair), ``"xla"`` / ``"cudnn"`` (jax.nn's).
    ``return_residual=True`` also returns jax.nn's logsumexp residual.

    Extensions beyond jax.nn's signature (keyword-only; jax.nn's own arguments keep jax.nn's semantics):
    ``softcap=cap`` maps each scaled logit ``s -> cap * tanh(s / cap)`` before the softmax (Gemma-2: 50);
    ``sinks`` (float ``[N]``, one logit per query head, unscaled, not soft-capped) joins every row's softmax
    denominator with no value (gpt-oss); the residual then includes it. ``segment_ids`` (int ``[B, T]``, causal
    self-attention): packed documents, each query sees keys of its own contiguous segment only (causal within each
    document). These run on fa_prefill only (a Hopper GPU, or interpret mode without a GPU): no fallback has them.
    ``softcap`` and ``sinks`` are differentiable (fa_prefill_bwd; the sinks get a gradient too) without a window or
    with a causal-shaped one (see the module docstring); ``segment_ids``, or a window of another form, is forward
    only: differentiating raises NotImplementedError. ``deterministic`` (default None: XLA's deterministic-ops flag,
    else False): the backward is the fastest path, which where this GPU's table (or, without one, causal D 64) says
    so is fa_prefill_bwd's five-product kernel (``fused``: dQ summed by TMA reduce-adds in a varying order, as
    cuDNN's and FA3's backwards sum it; dK and dV stay bit-identical); ``True`` keeps every gradient bit-identical
    run to run (docs/fa_prefill.md, "The five-product backward"). ``bwd_config`` (default None: this GPU's table, else
    the rule, as ``deterministic`` says): fa_prefill_bwd's config for the Hopper pair, a name of
    ``fa_prefill_bwd.CONFIGS`` or a ``BwdConfig``, resolved with the forward (``api.resolve_pair``; an unknown name is
    a ValueError listing the names; a named config runs as named, at D 256 as ``d256``); a call whose backward is
    another (fa_train's, set by its forward config), or that has none (jax.nn's fallbacks, forward-only features),
    refuses a named one.
    """
    if deterministic is not None and not isinstance(deterministic, (bool, np.bool_)):
        raise ValueError(f"deterministic must be None or a bool; got {deterministic!r}")
    impl, _ = which_implementation(query, key, value, bias, mask, is_causal=is_causal,
                                   query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                                   local_window_size=local_window_size, implementation=implementation,
                                   return_residual=return_residual, softcap=softcap, sinks=sinks,
                                   segment_ids=segment_ids, deterministic=deterministic, bwd_config=bwd_config)
    if impl == APART:
        if bwd_config is not None:
            raise NotImplementedError(f"bwd_config={bwd_config!r} configures a Pallas backward; this call's backward "
                                      "is jax.nn's cuDNN (its forward, not differentiated, fa_prefill's)")
        q4, k4, v4 = (_ensure_4d(x) for x in (query, key, value))
        win = _window(local_window_size, is_causal, q4.shape[1], k4.shape[1])
        if not _hybrid_takes(q4, k4, is_causal=is_causal, window=win):
            sc = _static_scale(scale, q4.shape[3])
            return jnp.reshape(_ours_then_cudnn(q4, k4, v4, scale=sc, is_causal=bool(is_causal), window=win),
                               jnp.shape(query))
        kw = dict(scale=scale, is_causal=is_causal, local_window_size=local_window_size)
        return _forward_apart(
            lambda q, k, v: dot_product_attention(q, k, v, implementation=_PREFILL, **kw),
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation=_APART_DIFFERENTIATED, **kw),
        )(query, key, value)
    if impl == CUDNN_FORWARD:
        if bwd_config is not None:  # refused now if unknown, as the pair refuses it, not only once differentiated
            api.resolve_pair("fa_prefill", _dense_problem(_ensure_4d(query), _ensure_4d(key), is_causal), None,
                             bwd_config, deterministic=deterministic)
        if not _mirror_takes():
            q4, k4, v4 = (_ensure_4d(x) for x in (query, key, value))
            sc = _static_scale(scale, q4.shape[3])
            return jnp.reshape(_cudnn_then_ours(q4, k4, v4, scale=sc, is_causal=bool(is_causal),
                                                deterministic=deterministic, bwd_config=bwd_config),
                               jnp.shape(query))
        kw = dict(scale=scale, is_causal=is_causal)
        return _forward_apart(
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation=_CUDNN_FORWARD_IMPL, **kw),
            lambda q, k, v: dot_product_attention(q, k, v, implementation=_PREFILL, deterministic=deterministic,
                                                  bwd_config=bwd_config, **kw),
        )(query, key, value)
    if impl not in (_PALLAS, _PREFILL):
        if bwd_config is not None:
            raise NotImplementedError(f"bwd_config={bwd_config!r} configures a Pallas backward; this call runs "
                                      f"jax.nn's {impl!r} implementation")
        return jax.nn.dot_product_attention(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal, query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths, local_window_size=local_window_size,
            implementation=impl, return_residual=return_residual)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise ValueError(f"is_causal must be a bool; got {is_causal!r}")
    out_shape = tuple(jnp.shape(query))  # jax.nn returns query's shape and a residual of query's shape[:-1]
    q, k, v = (_ensure_4d(x) for x in (query, key, value))
    sc = _static_scale(scale, q.shape[3])
    res = _pallas(q, k, v, kernel=impl, scale=sc, is_causal=bool(is_causal),
                  q_lens=None if query_seq_lengths is None else jnp.asarray(query_seq_lengths),
                  kv_lens=None if key_value_seq_lengths is None else jnp.asarray(key_value_seq_lengths),
                  window=_window(local_window_size, is_causal, q.shape[1], k.shape[1]),
                  return_residual=bool(return_residual), softcap=softcap,
                  sinks=None if sinks is None else jnp.asarray(sinks, jnp.float32),
                  segment_ids=None if segment_ids is None else jnp.asarray(segment_ids),
                  deterministic=None if deterministic is None else bool(deterministic), bwd_config=bwd_config)
    if len(out_shape) == 4:
        return res
    if return_residual:
        return jnp.reshape(res[0], out_shape), jnp.reshape(res[1], out_shape[:-1])
    return jnp.reshape(res, out_shape)
