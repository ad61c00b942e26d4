"""Public entry points: validate once, look the generation up in the table, resolve its config, call its kernel.

Argument model (DESIGN.md decision 6), the same for every entry:

* causal is top-left with an offset: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``;
  ``q_offset`` is a Python int, an int32 scalar (traced or not) or an int32 ``[B]`` array (one offset per
  sequence), so a jitted decode loop passes its cache position as data. Dense default 0; paged default
  ``kv_len - Tq`` per sequence (the last query on the last key). A row that sees no key outputs 0;
* ``config=`` takes a config object of the generation's kernel, a name (``generations()`` lists them) or
  None (the kernel's heuristic default for the problem);
* ``return_lse=True`` returns ``(out, lse)``, ``lse`` float32 ``[B, Hq, Tq]`` in natural log (-inf for a row
  with no visible key);
* ``scale`` is a static Python float (default ``1/sqrt(D)``); ``interpret=None`` interprets when no GPU is
  present. Bad input raises ValueError naming the argument; a combination the kernel does not support raises
  NotImplementedError naming what it supports.
"""

from __future__ import annotations

import math
import numbers
import os

import jax
import jax.numpy as jnp

from . import _compat, quant, registry
from .kernels import seqlen
from .kernels.contract import Problem

__all__ = ["attention", "paged_attention", "paged_attention_varlen", "generations", "validate_dense", "validate_paged",
           "problem_dense", "problem_paged", "resolve", "resolve_pair", "deterministic_asked",
           "default_generation"]

_FLOAT_DTYPES = {"float32", "float16", "bfloat16"}


def generations() -> tuple[registry.GenerationInfo, ...]:
    """Every generation id with whether Pallas builds it and its kernel's declared facts (dtypes, head dims,
    GQA, max query length, precision per dtype, configs, lowering) and the causal rule."""
    return registry.generations()


def _dtype_name(x) -> str:
    return jnp.dtype(x.dtype).name


def _check_array(name: str, x, rank: int, layout: str) -> None:
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name} must be an array; got {type(x).__name__}")
    if x.ndim != rank:
        raise ValueError(f"{name} must be rank {rank} {layout}; got {name}.shape={tuple(x.shape)}")


def _check_nonempty(name: str, x, dims: tuple[str, ...]) -> None:
    """ValueError naming the argument and the dimension when ``x`` has a zero-sized one (an empty sequence, ...):
    the kernels take no empty input (``pallas_attn.dot_product_attention`` returns jax.nn's result for it)."""
    for i, (dim, n) in enumerate(zip(dims, x.shape)):
        if n < 1:
            raise ValueError(f"{name}.shape[{i}] ({dim}) is {n}: every dimension must be >= 1 (an empty sequence "
                             f"has nothing to attend; pallas_attn.dot_product_attention returns jax.nn's result for "
                             f"it); got {name}.shape={tuple(x.shape)}")


def _check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool):
        raise ValueError(f"scale must be a Python float; got {scale!r}")
    try:
        s = float(scale)
    except (TypeError, jax.errors.ConcretizationTypeError) as e:
        raise ValueError(f"scale must be a Python float (it is static); got {scale!r}") from e
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite; got {scale=}")
    return s


def validate_dense(q, k, v, *, causal: bool, scale) -> float:
    """Shape/dtype checks of the dense entry. Returns the effective scale. k, v may be a quantized pair
    (``pallas_attn.quant`` Fp8Tensor / Nvfp4Tensor): their fields are checked, then their logical shape."""
    k, v = quant.kv_view(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x, 4, "[B, T, H, D] (BTNH)")
        if _dtype_name(x) not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16; got {name}.dtype={_dtype_name(x)}")
    if not (_dtype_name(q) == _dtype_name(k) == _dtype_name(v)):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype=}, {k.dtype=}, {v.dtype=}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, Tk, Hkv, D]; got {k.shape=}, {v.shape=}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch size; got {q.shape[0]=}, {k.shape[0]=}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share the head dim D; got {q.shape[3]=}, {k.shape[3]=}")
    _check_nonempty("q", q, ("B", "Tq", "Hq", "D"))
    _check_nonempty("k", k, ("B", "Tk", "Hkv", "D"))
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={q.shape[2]}, Hkv={k.shape[2]}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool; got {causal=!r}")
    return _check_scale(scale, q.shape[3])


def validate_paged(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale) -> float:
    """Checks of the paged entry (pools ``[num_blocks, page, Hkv, D]``, int32 tables). Returns the scale.
    The pools may be a quantized pair (Fp8Tensor / Nvfp4Tensor of that logical shape, ``pallas_attn.quant``)."""
    _check_array("q", q, 4, "[B, Tq, Hq, D] (BTNH)")
    k_pool, v_pool = quant.kv_view(q, k_pool, v_pool, ("k_pool", "v_pool"))
    for name, x in (("k_pool", k_pool), ("v_pool", v_pool)):
        _check_array(name, x, 4, "[num_blocks, page_size, Hkv, D]")
    if k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool and v_pool must match; got {k_pool.shape=}, {v_pool.shape=}")
    dt = _dtype_name(q)
    if dt not in _FLOAT_DTYPES or _dtype_name(k_pool) != dt or _dtype_name(v_pool) != dt:
        raise ValueError(f"q and the pools must share a float dtype; got {q.dtype=}, {k_pool.dtype=}, {v_pool.dtype=}")
    page = k_pool.shape[1]
    if page < 1 or page & (page - 1):
        raise ValueError(f"page_size (k_pool.shape[1]) must be a power of two; got {page}")
    if min(q.shape) < 1 or min(k_pool.shape) < 1:
        raise ValueError(f"every dimension must be >= 1; got {q.shape=}, {k_pool.shape=}")
    if q.shape[3] != k_pool.shape[3]:
        raise ValueError(f"q and the pools must share D; got {q.shape[3]=}, {k_pool.shape[3]=}")
    if q.shape[2] % k_pool.shape[2]:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={q.shape[2]}, Hkv={k_pool.shape[2]}")
    _check_array("block_table", block_table, 2, "int32 [B, pages_per_seq]")
    if block_table.shape[0] != q.shape[0] or _dtype_name(block_table) != "int32" or block_table.shape[1] < 1:
        raise ValueError(
            f"block_table must be int32 [B={q.shape[0]}, pages_per_seq >= 1]; got {block_table.shape=}, "
            f"{block_table.dtype=}")
    if not hasattr(kv_lens, "shape") or tuple(kv_lens.shape) != (q.shape[0],) or _dtype_name(kv_lens) != "int32":
        raise ValueError(f"kv_lens must be int32 [B={q.shape[0]}]; got {getattr(kv_lens, 'shape', kv_lens)!r}, "
                         f"{getattr(kv_lens, 'dtype', None)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool; got {causal=!r}")
    return _check_scale(scale, q.shape[3])


def problem_dense(q, k, *, causal: bool) -> Problem:
    fmt = quant.kv_format(k)  # a quantized cache is the "quantized" entry, served by the dense function
    return Problem(entry="quantized" if fmt else "dense", dtype=_dtype_name(q), batch=q.shape[0], q_len=q.shape[1],
                   kv_len=k.shape[1], heads_q=q.shape[2], heads_kv=k.shape[2], head_dim=q.shape[3], causal=causal,
                   kv_dtype=fmt)


def problem_paged(q, k_pool, block_table, *, causal: bool) -> Problem:
    fmt = quant.kv_format(k_pool)  # a quantized pool is the "quantized" entry, served by the paged function
    return Problem(entry="quantized" if fmt else "paged", dtype=_dtype_name(q), batch=q.shape[0], q_len=q.shape[1],
                   kv_len=block_table.shape[1] * k_pool.shape[1], heads_q=q.shape[2], heads_kv=k_pool.shape[2],
                   head_dim=q.shape[3], causal=causal, page_size=k_pool.shape[1], kv_dtype=fmt)


def resolve(generation: str, problem: Problem, config):
    """``(kernel, config)`` for a generation on a problem, or NotImplementedError / ValueError saying why not."""
    if not isinstance(generation, str):
        raise ValueError(f"generation must be a string id; got {generation!r}")
    gen = registry.get(generation)
    if problem.entry not in gen.entries:
        raise ValueError(f"generation {generation!r} serves the {sorted(gen.entries)} entries, not {problem.entry!r}")
    kern = registry.kernel(generation)
    ok, why = kern.supports(problem)
    if not ok:
        raise NotImplementedError(why)
    named = registry.configs(generation)
    if isinstance(config, str):
        if config not in named:
            raise ValueError(f"{generation} has configs {sorted(named)}; got config={config!r}")
        return kern, named[config]
    if config is None and kern.heuristic is None:
        # the row's own default: a knob row (v8_gqa_db -> v8_gqa "double_buffered") maps "faithful" to one
        # of its kernel's configs, which the kernel's own default would miss
        for name in ("faithful", "default"):
            if name in named:
                return kern, named[name]
    return kern, kern.config(config, problem)


_DETERMINISTIC_FLAGS = ("--xla_gpu_deterministic_ops=true", "--xla_gpu_exclude_nondeterministic_ops=true")


def deterministic_asked(deterministic: bool | None = None) -> bool:
    """Whether the backward must be bit-reproducible: ``deterministic`` when the caller says, else what XLA is told
    for its own GPU ops (``XLA_FLAGS`` holding ``--xla_gpu_deterministic_ops=true`` or
    ``--xla_gpu_exclude_nondeterministic_ops=true``), else False: the fastest path, as jax.nn's cuDNN and FA3 take."""
    if deterministic is not None:
        return bool(deterministic)
    flags = os.environ.get("XLA_FLAGS", "")
    return any(f in flags for f in _DETERMINISTIC_FLAGS)


def resolve_pair(generation: str, problem: Problem, config=None, bwd_config=None, *,
                 deterministic: bool | None = None, entry: str = "dot_product_attention"):
    """``(kernel, config, backward config)`` of ``generation`` on ``problem``: the forward as ``resolve`` gives it
    (the same checks and refusals), then the backward the kernel declares (``Kernel.backward``) for ``entry``'s
    ``jax.grad``. ``bwd_config``: a config object or name of the backward's kernel (fa_prefill_bwd's ``CONFIGS``) or
    None: its heuristic (this GPU's table, else its rule; with ``deterministic`` (``deterministic_asked``) only
    bit-reproducible configs). The config is the named one; the kernel applies its ``effective`` form (fa_prefill_bwd:
    ``d256`` at D 256). A backward set by the forward's config (fa_train) gives None and refuses a named one; a
    generation without a backward for ``entry`` is a NotImplementedError naming both."""
    kern, cfg = resolve(generation, problem, config)
    if not kern.differentiates(entry):
        raise NotImplementedError(f"pallas_attn.{entry}: generation {generation!r} has no backward kernel, so jax.grad "
                                  f"cannot differentiate it")
    bwd = kern.backward.config(bwd_config, problem, deterministic=deterministic_asked(deterministic),
                               forward=kern.name)
    return kern, cfg, bwd


# The default dense generation, best first: the split-KV decode kernel for a few query rows (GQA and MHA), the
# training kernel (any length, fp16/bf16/fp32, differentiable) for the rest; the first that supports the problem wins.
# Session 16: MHA decode goes to fa_decode too. It had gone to fa_train, whose grid at Tq = 1 is one CTA per
# (batch, head): 32 CTAs at B1 H32, predicted 4x slower than fa_decode's split-KV grid at S 32k (layer 2: 750 against
# 182 us on an H100); fa_decode on MHA measured level with cuDNN at B32 S8k on the H200 (docs/fa_decode.md).
_DEFAULT_DENSE = ("fa_decode", "fa_train")


def default_generation(problem: Problem) -> str:
    """The generation ``attention(..., generation=None)`` runs: fa_decode for decode shapes it takes
    (Tq <= 16, fp16/bf16; GQA or MHA), else fa_train; NotImplementedError naming each refusal if none fits."""
    reasons = []
    for gen in _DEFAULT_DENSE:
        if not registry.built(gen):
            continue
        ok, why = registry.kernel(gen).supports(problem)
        if ok:
            return gen
        reasons.append(why)
    raise NotImplementedError("no default generation supports this call: " + "; ".join(reasons))


_DENSE_HINT = "use generation='fa_train' (or generation=None) or pallas_attn.dot_product_attention"


def _no_backward(gen: str, fn, *, entry: str = "attention", hint: str = _DENSE_HINT):
    """``fn`` with a forward-mode rule that raises: jax.grad / jax.jvp through a generation that has no
    backward kernel fail naming the entry and the generation (instead of an empty AssertionError from inside
    Pallas). ``fn`` takes positional arrays (pytrees) only; every other argument is closed over."""

    @jax.custom_jvp
    def f(*args):
        return fn(*args)

    @f.defjvp
    def _jvp(primals, tangents):
        raise NotImplementedError(
            f"pallas_attn.{entry}: generation {gen!r} has no backward kernel, so jax.grad / jax.jvp cannot "
            f"differentiate it; {hint}")

    return f


# no paged / MLA generation has a backward kernel: the hint for those entries
_DECODE_HINT = ("the paged and MLA entries are inference-only (no generation of theirs has a backward kernel); "
                "differentiate a dense gather of the cache through pallas_attn.dot_product_attention instead")


def _decode_features(generation: str, window, softcap, sinks, refusal: str) -> dict:
    """The feature keywords for fa_decode's entry functions (empty without features); other generations refuse."""
    if window is None and softcap is None and sinks is None:
        return {}
    if generation != "fa_decode":
        raise NotImplementedError(refusal)
    return dict(window=window, softcap=softcap, sinks=None if sinks is None else jnp.asarray(sinks, jnp.float32))


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, q_offset=0,
              generation: str | None = None, interpret: bool | None = None, config=None, return_lse: bool = False,
              window: int | None = None, softcap: float | None = None, sinks=None):
    """Attention on JAX BTNH arrays: q ``[B, Tq, Hq, D]``, k/v ``[B, Tk, Hkv, D]`` -> ``[B, Tq, Hq, D]``.

    Causal is top-left with an offset: key ``j`` is visible to query ``i`` of sequence ``b`` iff
    ``j <= i + q_offset[b]`` (``q_offset``: int, int32 scalar or ``[B]`` array, default 0). See the module
    docstring for ``config``, ``return_lse``, ``scale`` and ``interpret``. Output has q's dtype.
    ``generation=None`` picks the best built kernel for the input (``default_generation``). ``jax.grad``
    works through fa_train (its Pallas backward), and through ``generation=None`` whatever forward it chose (a decode
    shape's fa_decode forward takes fa_train's backward, recomputing the forward there; not with ``return_lse`` or
    window / softcap / sinks); other generations named explicitly have no backward and say so.
    ``window=W`` (causal: a query sees its last W positions), ``softcap``, ``sinks [Hq]``: on fa_decode (the decode
    shapes, Tq <= 16; session 11) only; any other generation refuses them (the drop-in has them for prefill).
    """
    s = validate_dense(q, k, v, causal=causal, scale=scale)
    problem = problem_dense(q, k, causal=causal)
    chosen = generation is None
    if generation is None:
        generation = default_generation(problem)
    kern, cfg = resolve(generation, problem, config)
    offs = seqlen.q_offsets(q_offset, q.shape[0])
    # a static offset past the last key (a decode's kv_len - Tq when Tq = 1, or larger): every row sees every key, so
    # causal masks nothing and the non-causal program runs, with no offset array to materialize (an XLA broadcast
    # launch of ~0.9 us at B >= 8; session 20)
    if causal and window is None and isinstance(q_offset, numbers.Integral) and not isinstance(q_offset, bool) \
            and int(q_offset) >= k.shape[1] - 1:
        causal = False
    feats = _decode_features(generation, window, softcap, sinks,
                             "pallas_attn.attention: window / softcap / sinks run on fa_decode only (Tq <= 16); "
                             f"{generation} has none (for prefill: pallas_attn.dot_product_attention's "
                             "local_window_size / softcap / sinks)")

    def call(q, k, v, offs):
        return kern.dense(q, k, v, causal=causal, scale=s, q_offset=offs,
                          interpret=_compat.default_interpret(interpret), config=cfg, return_lse=bool(return_lse),
                          **feats)

    if not kern.differentiates("attention"):  # the kernel declares its backward (fa_train: a jax.custom_vjp)
        back = _default_backward(problem, s, causal, interpret) if chosen and not return_lse and not any(
            x is not None for x in feats.values()) else None
        call = _no_backward(generation, call) if back is None else _backward_by(call, back)
    with _compat.quiet_triton():
        return call(q, k, v, offs)


def _default_backward(problem: Problem, scale: float, causal: bool, interpret):
    """For ``attention(generation=None)`` whose chosen forward has no backward (fa_decode on a decode shape): the same
    attention through fa_train, the kernel with a backward, whose VJP ``jax.grad`` then takes (session 16: the
    default's forward stays the fastest kernel and the call stays differentiable). None where fa_train is not built or
    does not take the problem."""
    if not registry.built("fa_train"):
        return None
    kern = registry.kernel("fa_train")
    if not kern.supports(problem)[0]:
        return None
    _, cfg = resolve("fa_train", problem, None)

    def back(q, k, v, offs):
        return kern.dense(q, k, v, causal=causal, scale=scale, q_offset=offs,
                          interpret=_compat.default_interpret(interpret), config=cfg, return_lse=False)

    return back


def _backward_by(fn, back):
    """``fn(q, k, v, offs)``'s forward with ``back``'s gradient: the VJP recomputes the attention through ``back``
    (a kernel with a backward, equal to ``fn`` to its rounding) and differentiates that. ``offs`` (int32) gets no
    cotangent. Forward-mode (``jax.jvp``) is not defined, as for fa_train's own custom_vjp."""

    @jax.custom_vjp
    def f(q, k, v, offs):
        return fn(q, k, v, offs)

    def fwd(q, k, v, offs):
        return fn(q, k, v, offs), (q, k, v, offs)

    def bwd(res, g):
        q, k, v, offs = res
        _, vjp = jax.vjp(lambda q, k, v: back(q, k, v, offs), q, k, v)
        return (*vjp(g), None)

    f.defvjp(fwd, bwd)
    return f


def paged_attention_varlen(q, k_pool, v_pool, block_table, kv_lens, cu_q_lens, *, scale: float | None = None,
                           q_offset=None, interpret: bool | None = None, return_lse: bool = False,
                           check_block_table: bool = True, window: int | None = None, softcap: float | None = None,
                           sinks=None, decode_max_q: int = 16):
    """Causal paged-KV attention over packed queries (a serving batch mixing chunks and decodes with no padding).
    q ``[T, Hq, D]``: sequence ``b``'s queries are rows ``cu_q_lens[b] : cu_q_lens[b + 1]`` (int32 ``[B + 1]``,
    starting at 0, never decreasing, ending at most at ``T``; rows past ``cu_q_lens[B]`` are unused and return 0, LSE
    -inf); pools ``[num_blocks, page, Hkv, D]``; block_table int32 ``[B, pages_per_seq]``; kv_lens int32 ``[B]``.
    Query ``i`` of sequence ``b`` sees key ``j`` iff ``j < kv_lens[b]`` and ``j <= i + q_offset[b]`` (default
    ``kv_lens - q_lens``: the queries are the last cached tokens); ``window``, ``softcap``, ``sinks [Hq]`` as
    ``paged_attention``'s chunked path. Returns ``out [T, Hq, D]`` and, with ``return_lse``, ``lse [Hq, T]``.

    Sequences of 1 to ``decode_max_q`` (at most fa_decode's 16, the default) queries run on fa_decode, longer ones on
    fa_prefill in row tiles (``chunked.varlen_paged_attention``): a batch of a long chunk and many decodes launches
    the chunk's tiles and the decodes, not a chunk-length tile grid for every sequence as ``paged_attention(q_lens=
    ...)``'s padded ``[B, Tq]`` layout must. ``decode_max_q`` is a static hint a scheduler knows (1 when its decodes
    are single tokens, k + 1 with k speculative tokens): the decode part is sized for that many queries a sequence
    instead of 16 (session 39: its partial outputs and their merge shrink with it); the answer does not depend on
    it. fp16 / bf16, D 64 / 128 / 256, a Hopper (interpret mode on a CPU); inference only. Bad lengths or table
    entries raise when concrete and poison that sequence's rows with NaN under ``jit``."""
    if not hasattr(q, "shape") or getattr(q, "ndim", None) != 3:
        raise ValueError(f"q must be rank 3 [T, Hq, D] (packed queries); got {getattr(q, 'shape', type(q).__name__)}")
    if not hasattr(block_table, "shape") or block_table.ndim != 2:
        raise ValueError(f"block_table must be int32 [B, pages_per_seq]; got {getattr(block_table, 'shape', None)}")
    b = block_table.shape[0]
    view = jax.ShapeDtypeStruct((b, 1) + tuple(q.shape[1:]), q.dtype)  # the checks of the padded entry
    s = validate_paged(view, k_pool, v_pool, block_table, kv_lens, causal=True, scale=scale)
    if quant.kv_format(k_pool):
        raise NotImplementedError("paged_attention_varlen over a quantized cache is not built; dequantize the pool")
    if (not hasattr(cu_q_lens, "shape") or tuple(cu_q_lens.shape) != (b + 1,)
            or _dtype_name(cu_q_lens) != "int32"):
        raise ValueError(f"cu_q_lens must be int32 [B + 1 = {b + 1}]; got {getattr(cu_q_lens, 'shape', cu_q_lens)!r}, "
                         f"{getattr(cu_q_lens, 'dtype', None)}")
    from . import chunked
    from .kernels import fa_decode

    n_max = fa_decode.KERNEL.max_q_len
    if isinstance(decode_max_q, bool) or not isinstance(decode_max_q, numbers.Integral) \
            or not 1 <= decode_max_q <= n_max:
        raise ValueError(f"decode_max_q must be a static int in [1, {n_max}] (the most queries a sequence run on "
                         f"fa_decode has); got {decode_max_q!r}")

    def call(q, k_pool, v_pool, block_table, kv_lens, cu_q_lens, q_offset, sinks):
        return chunked.varlen_paged_attention(q, k_pool, v_pool, block_table, kv_lens, cu_q_lens, scale=s,
                                              q_offset=q_offset, interpret=interpret, return_lse=bool(return_lse),
                                              check_block_table=check_block_table, window=window, softcap=softcap,
                                              sinks=sinks, decode_max_q=int(decode_max_q))

    call = _no_backward("chunked", call, entry="paged_attention_varlen", hint=_DECODE_HINT)
    with _compat.quiet_triton():
        return call(q, k_pool, v_pool, block_table, kv_lens, cu_q_lens, q_offset,
                    None if sinks is None else jnp.asarray(sinks, jnp.float32))


def paged_attention(q, k_pool, v_pool, block_table, kv_lens, *, scale: float | None = None, causal: bool = False,
                    q_offset=None, generation: str = "fa_decode", interpret: bool | None = None, config=None,
                    return_lse: bool = False, check_block_table: bool = True, q_lens=None, window: int | None = None,
                    softcap: float | None = None, sinks=None):
    """Paged-KV attention (ragged batch). q ``[B, Tq, Hq, D]``; pools ``[num_blocks, page, Hkv, D]``;
    block_table int32 ``[B, pages_per_seq]``; kv_lens int32 ``[B]``. The pools may be quantized
    (``pallas_attn.quant.Fp8Tensor`` / ``Nvfp4Tensor`` of that logical shape; generations serving "quantized").

    Causal is top-left with an offset: key ``j`` is visible to query ``i`` of sequence ``b`` iff
    ``j <= i + q_offset[b]``; ``q_offset=None`` (default) means ``kv_lens - q_lens`` (decode: the last query sits
    on the last key; a chunk: its queries are the last ``q_lens[b]`` cached tokens). With ``check_block_table``
    (default) a page index outside the pool raises (eagerly) or poisons that sequence's output with NaN (under jit);
    a kernel never reads out of bounds.

    ``q_lens`` (int32 ``[B]``, optional, each in ``[0, Tq]``): each sequence's real query count (a batch mixing chunks
    and single-token decodes); rows past it are padding and return 0 (LSE -inf). Chunked prefill: with the default
    generation, more than fa_decode's 16 queries per sequence (causal only) run ``pallas_attn.chunked`` (the pages
    gathered, then fa_prefill, or fa_train off Hopper; docs/serving.md). There, ``window=W`` (a query sees its last W
    positions), ``softcap`` and ``sinks [Hq]`` (fa_prefill's path) are taken; fa_decode (Tq <= 16) takes them too
    (its splits then tile only the window's band: a windowed decode reads the window, not the cache).
    """
    s = validate_paged(q, k_pool, v_pool, block_table, kv_lens, causal=causal, scale=scale)
    b, tq = q.shape[0], q.shape[1]
    from .kernels import fa_decode

    if generation == "fa_decode" and config is None and tq > fa_decode.KERNEL.max_q_len:
        if not causal:
            raise NotImplementedError(f"paged_attention with Tq={tq} > {fa_decode.KERNEL.max_q_len} (chunked prefill) "
                                      f"is causal only: a chunk attends to the cache before it; pass causal=True")
        if quant.kv_format(k_pool):
            raise NotImplementedError(f"paged_attention: chunked prefill (Tq={tq}) over a quantized cache is not "
                                      f"built; dequantize the pool or send at most {fa_decode.KERNEL.max_q_len} "
                                      f"queries")
        from . import chunked

        def chunk_call(q, k_pool, v_pool, block_table, kv_lens, q_lens, q_offset, sinks):
            return chunked.chunked_paged_attention(q, k_pool, v_pool, block_table, kv_lens, scale=s,
                                                   q_offset=q_offset, q_lens=q_lens, interpret=interpret,
                                                   return_lse=bool(return_lse), check_block_table=check_block_table,
                                                   window=window, softcap=softcap, sinks=sinks,
                                                   mixed_decodes=mixed)

        mixed = q_lens is not None  # a batch that may mix decodes into the chunks (chunked.py splits them off)

        call = _no_backward("chunked", chunk_call, entry="paged_attention", hint=_DECODE_HINT)
        with _compat.quiet_triton():
            return call(q, k_pool, v_pool, block_table, kv_lens, q_lens, q_offset,
                        None if sinks is None else jnp.asarray(sinks, jnp.float32))
    feats = _decode_features(generation, window, softcap, sinks,
                             f"paged_attention: window / softcap / sinks are not built in {generation}; fa_decode "
                             f"(the default, Tq <= {fa_decode.KERNEL.max_q_len}) and the chunked path (Tq > "
                             f"{fa_decode.KERNEL.max_q_len}) take them")
    kern, cfg = resolve(generation, problem_paged(q, k_pool, block_table, causal=causal), config)
    if q_lens is not None:
        from . import chunked

        q_lens = chunked._check_q_lens(q_lens, b, tq)
    # fa_decode, one query on the default offset (kv_len - 1), no window: causal masks nothing the length does not,
    # so the non-causal program runs and no offset array is computed (an XLA launch of ~1.3 us saved per call)
    k_causal = causal and not (kern.name == "fa_decode" and tq == 1 and q_offset is None and q_lens is None
                               and window is None)
    if not k_causal:
        offs = kv_lens  # unread
    elif q_offset is not None:
        offs = seqlen.q_offsets(q_offset, b)
    elif q_lens is not None:
        offs = kv_lens.astype(jnp.int32) - q_lens
    else:
        offs = seqlen.paged_q_offsets(kv_lens, tq)

    def call(q, k_pool, v_pool, block_table, kv_lens, offs):
        return kern.paged(q, k_pool, v_pool, block_table, kv_lens, causal=k_causal, scale=s, q_offset=offs,
                          interpret=_compat.default_interpret(interpret), config=cfg, return_lse=bool(return_lse),
                          check_block_table=check_block_table, **feats)

    if not kern.differentiates("paged_attention"):  # every paged kernel today
        call = _no_backward(generation, call, entry="paged_attention", hint=_DECODE_HINT)
    with _compat.quiet_triton():
        res = call(q, k_pool, v_pool, block_table, kv_lens, offs)
    if q_lens is None:
        return res
    out, lse = seqlen.cut_padding(*(res if return_lse else (res, None)), q_lens)  # padding rows: 0, LSE -inf
    return (out, lse) if return_lse else out
