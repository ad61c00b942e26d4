"""Context-parallel decode over a JAX mesh axis: each device attends to its own part of the KV cache with
fa_decode and the partial states are merged across the axis (DESIGN.md: decode, many GPUs).

One long request outgrows one GPU's bandwidth long before its memory. Split the cache along the sequence
over the devices of a mesh axis; every device runs the decode kernel on its slice with ``return_lse=True``
and the normalized partials ``(o, lse)`` are merged with the split-KV identity (``kernels/splitkv.py``):

    lse* = log sum_d exp(lse_d),   out = sum_d exp(lse_d - lse*) o_d

Communication is XLA's (NCCL on GPUs) inside the same jitted program as the kernels, two ways:

* ``merge="all_gather"``: gather every device's ``(o, lse)`` and merge them locally (``splitkv.merge_jnp``):
  one collective of ``n * (D + 1)`` floats per row;
* ``merge="psum"``: ``pmax`` of the LSE, then one ``psum`` of the rescaled ``[o * w, w]``: two collectives of
  ``D + 1`` floats per row, independent of the device count.

Each device's keys are global positions ``kv_start[b] + j`` (``j`` local), so causal masking with the global
``q_offset`` becomes a local offset ``q_offset - kv_start``. Uneven or empty slices are local lengths
(``kv_len``); the local call is fa_decode's paged entry over the device's own pool (paged input) or over a
free identity-table view of its dense slice (dense input), which is what takes per-sequence lengths.

Head-parallel (tensor-parallel) sharding composes: shard the head axes of q and KV over a second mesh axis;
the merge runs over the context axis only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import _compat, api
from .kernels import splitkv

__all__ = ["context_parallel_attention", "context_parallel_decode", "decode_program", "step_program", "merge_across",
           "ring_attention", "ring_attention_sharded",
           "shard_kv", "MERGES"]

# "all_gather": two all_gathers (o, lse) then the merge on every device; "psum": a pmax then a psum of the weighted
# states; "packed" (session 13): ONE all_gather of o and lse packed into one fp32 array [B, Tq, Hq, D + 1], then the
# merge: a decode step's merge moves a few KB, so its cost is the collectives' latency, and this pays it once.
MERGES = ("all_gather", "psum", "packed")


def merge_across(o, lse, *, axis_name, merge: str = "all_gather"):
    """Merge per-device states ``o [B, Tq, Hq, D]`` / ``lse [B, Hq, Tq]`` across ``axis_name``; returns the
    merged ``(out, lse)`` on every device of the axis. FP32 math; ``out`` keeps ``o``'s dtype."""
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}; got {merge!r}")
    lse_t = jnp.transpose(lse, (0, 2, 1)).astype(jnp.float32)  # [B, Tq, Hq], aligned with o's rows
    if merge == "packed":
        both = lax.all_gather(jnp.concatenate([o.astype(jnp.float32), lse_t[..., None]], axis=-1), axis_name)
        out, lse_m = splitkv.merge_jnp(both[..., :-1], both[..., -1], axis=0)
        out = out.astype(o.dtype)
    elif merge == "all_gather":
        o_all = lax.all_gather(o, axis_name)  # [n, B, Tq, Hq, D]
        l_all = lax.all_gather(lse_t, axis_name)  # [n, B, Tq, Hq]
        out, lse_m = splitkv.merge_jnp(o_all, l_all, axis=0)
    else:
        m = lax.pmax(lse_t, axis_name)
        m_safe = jnp.where(jnp.isneginf(m), 0.0, m)  # every device empty for this row: all weights 0
        w = jnp.exp(lse_t - m_safe)
        packed = jnp.concatenate([o.astype(jnp.float32) * w[..., None], w[..., None]], axis=-1)
        tot = lax.psum(packed, axis_name)
        den = tot[..., -1]
        out = (tot[..., :-1] / jnp.where(den == 0, 1.0, den)[..., None]).astype(o.dtype)
        lse_m = jnp.where(den == 0, -jnp.inf, m_safe + jnp.log(jnp.where(den == 0, 1.0, den)))
    return out, jnp.transpose(lse_m, (0, 2, 1))


def _page_for(t: int) -> int:
    """The largest power of two <= 256 dividing ``t`` (the identity-table view needs whole pages)."""
    page = 1
    while page < 256 and t % (2 * page) == 0:
        page *= 2
    return page


def _as_pool(x, page: int):
    """Dense ``[B, T, H, D]`` as a pool ``[B*T/page, page, H, D]`` (a free reshape) with table row b = its pages."""
    b, t, h, d = x.shape
    return x.reshape(b * (t // page), page, h, d)


def context_parallel_attention(q, k, v, *, axis_name, kv_len=None, kv_start=None, block_table=None,
                               causal: bool = False, scale: float | None = None, q_offset=None,
                               merge: str = "all_gather", generation: str = "fa_decode", config=None,
                               interpret: bool | None = None, return_lse: bool = False):
    """Decode attention over a KV cache split along the sequence across mesh axis ``axis_name``.

    Call inside ``jax.shard_map`` (or use ``context_parallel_decode``). Per device:

    * dense: ``k, v [B, T_local, Hkv, D]`` (BTNH), keys ``kv_start[b] + j`` of the global sequence, of which
      the first ``kv_len[b]`` are valid (default: all ``T_local``); ``kv_start`` defaults to
      ``axis_index * T_local`` (equal contiguous slices);
    * paged: ``k, v`` the device's own pools ``[blocks, page, Hkv, D]`` with ``block_table [B, P]`` and
      ``kv_len [B]`` (required) and ``kv_start [B]`` (required when causal).

    ``q [B, Tq, Hq, D]`` is replicated over the axis. Causal is top-left with the global offset (key ``j``
    visible to query ``i`` iff ``j <= i + q_offset``; default ``q_offset = total_len - Tq``, the decode case,
    with ``total_len`` the psum of the local lengths). Returns ``out`` (and ``lse [B, Hq, Tq]``), the same on
    every device of the axis. A device whose slice is empty contributes nothing.
    """
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}; got {merge!r}")
    b, tq = q.shape[0], q.shape[1]
    idx = lax.axis_index(axis_name)
    paged = block_table is not None
    if paged:
        if kv_len is None:
            raise ValueError("paged context parallelism needs kv_len [B]: each device's own valid lengths")
        if causal and kv_start is None:
            raise ValueError("causal paged context parallelism needs kv_start [B]: where each device's keys begin")
        pool_k, pool_v, table = k, v, block_table
    else:
        t_local = k.shape[1]
        page = _page_for(t_local)
        pool_k, pool_v = _as_pool(k, page), _as_pool(v, page)
        per = t_local // page
        # a host constant, not iotas: each device would otherwise launch the table's fusions on every call (~30 us
        # of host launch time a call per device at 4 devices, docs/distributed.md "Session 17"); [B, T/page] int32
        table = np.arange(b, dtype=np.int32)[:, None] * per + np.arange(per, dtype=np.int32)[None, :]
        if kv_start is None:
            kv_start = jnp.full((b,), idx * t_local, jnp.int32)
        if kv_len is None:
            kv_len = jnp.full((b,), t_local, jnp.int32)
    kv_len = jnp.asarray(kv_len, jnp.int32)
    if causal:
        if q_offset is None:
            q_offset = lax.psum(kv_len, axis_name) - tq  # the last query on the last key of the whole cache
        local_off = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (b,)) - jnp.asarray(kv_start, jnp.int32)
    else:
        local_off = jnp.zeros((b,), jnp.int32)
    o, lse = api.paged_attention(q, pool_k, pool_v, table, kv_len, causal=causal, scale=scale, q_offset=local_off,
                                 generation=generation, config=config, interpret=interpret, return_lse=True,
                                 check_block_table=False)
    out, lse_m = merge_across(o, lse, axis_name=axis_name, merge=merge)
    return (out, lse_m) if return_lse else out


def context_parallel_decode(mesh, q, k, v, *, axis: str = "cp", head_axis: str | None = None, causal: bool = False,
                            scale: float | None = None, q_offset=None, kv_len=None, merge: str = "all_gather",
                            generation: str = "fa_decode", config=None, interpret: bool | None = None,
                            return_lse: bool = False):
    """Convenience wrapper: dense BTNH ``q [B, Tq, Hq, D]`` and ``k, v [B, Tk, Hkv, D]`` with ``Tk`` split into
    equal contiguous slices over ``mesh`` axis ``axis`` (and, with ``head_axis``, heads over that axis).

    ``kv_len`` (optional, global int32 ``[B]``) masks keys at or past it (ragged batches); causal uses the
    global ``q_offset`` (a scalar or ``[B]``; default ``kv_len - Tq``). Returns ``out`` replicated over ``axis``
    (sharded over ``head_axis``).

    One call is one jitted program (cached per mesh, shapes and options; ``step_program``): the lengths and offsets
    are computed inside it. A q not yet on the mesh (replicated over ``axis``) is moved there by the program's input
    sharding: on 4 GPUs that costs ~300 us of host time a call (docs/distributed.md), so a decode loop that keeps q
    on the mesh (``jax.device_put(q, NamedSharding(mesh, P()))``, or q computed by a program on the mesh) pays none.
    Inside a caller's ``jax.jit`` it inlines into the caller's program with the same result. Pass the cache placed by
    ``shard_kv`` (a cache on one device is moved every call).
    """
    for ax in (axis, head_axis):
        if ax is not None and ax not in mesh.shape:
            raise ValueError(f"axis {ax!r} is not an axis of the mesh (its axes: {tuple(mesh.shape)})")
    if any(getattr(x, "ndim", None) != 4 for x in (q, k, v)):
        shapes = ", ".join(str(getattr(x, "shape", None)) for x in (q, k, v))
        raise ValueError(f"context_parallel_decode takes BTNH arrays q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D]; got "
                         f"shapes {shapes}")
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}; got {merge!r}")
    n = mesh.shape[axis]
    b, tk = k.shape[0], k.shape[1]
    if tk % n:
        raise ValueError(f"k.shape[1] = {tk} must divide into {n} equal slices over mesh axis {axis!r}")
    step = step_program(mesh, axis=axis, head_axis=head_axis, t_local=tk // n, batch=b, tq=q.shape[1], causal=causal,
                        scale=scale, merge=merge, generation=generation, config=config, interpret=interpret,
                        has_len=kv_len is not None, has_off=q_offset is not None)
    extra = tuple(_int32(x) for x in (kv_len, q_offset) if x is not None)
    out, lse = step(q, k, v, *extra)
    return (out, lse) if return_lse else out


# Two ways of moving a caller's q onto the mesh were built and measured against the program's own input resharding
# (session 12: an explicit device_put; session 13: device 0's q broadcast inside the program). Neither gained on 4
# H200s at B1 S1M (docs/distributed.md, "the wrapper's q"), so both were removed; git has them (commit 9926468).


def _int32(x):
    """An int32 array argument (a Python int or list becomes a host array: no device work, no trace)."""
    if isinstance(x, jax.Array) or hasattr(x, "aval"):  # a device array, or a tracer under the caller's jit
        return x
    return np.asarray(x, np.int32)


@functools.cache
def step_program(mesh, *, axis: str, head_axis: str | None, t_local: int, batch: int, tq: int, causal: bool,
                 scale: float | None, merge: str, generation: str, config, interpret: bool | None, has_len: bool,
                 has_off: bool):
    """The jitted step of ``context_parallel_decode``: ``(q, k, v[, kv_len][, q_offset]) -> (out, lse)``, the lengths
    (default: every key), the offsets (default: ``kv_len - Tq``) and q's placement (replicated over ``axis``, heads
    over ``head_axis``) inside the program, around ``decode_program``'s shard_map."""
    prog = decode_program(mesh, axis=axis, head_axis=head_axis, t_local=t_local, batch=batch, causal=causal,
                          scale=scale, merge=merge, generation=generation, config=config, interpret=interpret)
    h = head_axis
    q_sh = NamedSharding(mesh, P(None, None, h, None))
    kv_sh = NamedSharding(mesh, P(None, axis, h, None))
    rep = NamedSharding(mesh, P())
    tk = t_local * mesh.shape[axis]

    def step(q, k, v, *extra):
        it = iter(extra)
        lens = jnp.asarray(next(it), jnp.int32).reshape((batch,)) if has_len else jnp.full((batch,), tk, jnp.int32)
        if has_off:
            off = jnp.broadcast_to(jnp.asarray(next(it), jnp.int32), (batch,))
        else:
            off = lens - tq if causal else jnp.zeros((batch,), jnp.int32)
        return prog(q, k, v, lens, off)

    return jax.jit(step, in_shardings=(q_sh, kv_sh, kv_sh) + (rep,) * (int(has_len) + int(has_off)))


@functools.cache
def decode_program(mesh, *, axis: str, head_axis: str | None, t_local: int, batch: int, causal: bool,
                   scale: float | None, merge: str, generation: str, config, interpret: bool | None):
    """The jitted ``(q, k, v, kv_len [B], q_offset [B]) -> (out, lse)`` of ``context_parallel_decode``."""
    h = head_axis
    q_spec, kv_spec = P(None, None, h, None), P(None, axis, h, None)

    def local(q, k, v, lens, off):
        start = lax.axis_index(axis) * t_local
        loc_len = jnp.clip(lens - start, 0, t_local)
        return context_parallel_attention(
            q, k, v, axis_name=axis, kv_len=loc_len, kv_start=jnp.full((batch,), start, jnp.int32), causal=causal,
            scale=scale, q_offset=off, merge=merge, generation=generation, config=config, interpret=interpret,
            return_lse=True)

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, P(), P()),
                                 out_specs=(q_spec, P(None, h, None)), check_vma=False))


def shard_kv(mesh, k, *, axis: str = "cp", head_axis: str | None = None):
    """Place a dense cache ``[B, Tk, Hkv, D]`` on ``mesh`` split along the sequence (helper for callers)."""
    return jax.device_put(k, NamedSharding(mesh, P(None, axis, head_axis, None)))



# --------------------------------------------------------------------------------------------------------
# Ring (context-parallel) attention for training: issue 34, first version (session 11; CPU-verified only)
# --------------------------------------------------------------------------------------------------------

def _merge2(o_a, lse_a, o_b, lse_b):
    """Two normalized partial states (o [B, T, H, D] f32, lse [B, H, T] f32) merged with the LSE identity, written so
    that its gradient is finite when a state is empty (LSE -inf: weight 0) or both are."""
    m = jnp.maximum(lse_a, lse_b)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    wa, wb = jnp.exp(lse_a - m), jnp.exp(lse_b - m)
    den = wa + wb
    pos = den > 0
    safe = jnp.where(pos, den, 1.0)
    tr = (0, 2, 1)  # [B, H, T] -> [B, T, H]
    o = (jnp.transpose(wa / safe, tr)[..., None] * o_a + jnp.transpose(wb / safe, tr)[..., None] * o_b)
    return o, jnp.where(pos, m + jnp.log(safe), -jnp.inf)


RING_LAYOUTS = ("striped", "contiguous")


def ring_kernel(dtype_name: str, head_dim: int, interpret: bool, config=None) -> str:
    """The kernel each ring step runs: ``"fa_prefill"`` (its forward with the LSE and its backward, the drop-in's pair:
    2.8x fa_train's training step on an H100 at N 32k) on a Hopper for fp16 / bf16 at its backward's head dims with no
    fa_train ``config`` given, while ``RING_FA_PREFILL`` is on; else ``"fa_train"`` (any GPU, interpret mode)."""
    from . import dropin
    from .kernels import fa_prefill, fa_prefill_bwd

    if (RING_FA_PREFILL and config is None and not interpret and dtype_name in fa_prefill.KERNEL.dtypes
            and head_dim in fa_prefill_bwd.HEAD_DIMS and dropin._is_sm90()):
        return "fa_prefill"
    return "fa_train"


# Ring steps on fa_prefill's pair on a Hopper (session 12; off: fa_train everywhere, the session-11 path).
RING_FA_PREFILL = True


def ring_attention(q, k, v, *, axis_name: str, causal: bool = True, scale: float | None = None,
                   interpret: bool | None = None, config=None, layout: str = "striped"):
    """Ring attention inside ``jax.shard_map``: q ``[B, T_loc, Hq, D]``, k / v ``[B, T_loc, Hkv, D]``, the device's
    share of the sequence. Returns the share's output.

    ``layout`` says which tokens a device holds (device ``i`` of ``n``, local row ``r``): ``"striped"`` (default)
    the global token ``r * n + i`` (every ``n``-th token: each block of a causal ring is then a near-triangle on
    every device, so the devices do equal work: Striped Attention, Brandon et al. 2023); ``"contiguous"`` the token
    ``i * T_loc + r`` (a causal ring is unbalanced: device ``n - 1`` computes ``n`` blocks, device 0 one).
    ``ring_attention_sharded`` reorders global arrays into the layout and back.

    ``n`` steps (``n`` = the axis size): each attends the local queries to the K/V block it holds with fa_train's
    differentiable ``attention_lse`` (the block's global offset as ``q_offset``: a causal block past the queries gives
    empty rows, LSE -inf), merges the partial state with the LSE identity, and passes K/V to the next device with
    ``ppermute``. The backward is JAX's reverse of that program: the kernel's Pallas backward per block (through the
    LSE too) and the transposed ``ppermute``, which carries dK / dV back around the ring to the device that owns them.

    The kernel per step: ``ring_kernel`` (fa_prefill's forward + backward pair on a Hopper, fa_train otherwise or
    when ``config``, a fa_train config, is given). The steps are unrolled (``n`` is a small static int): step ``s``
    issues its ``ppermute`` before its kernel (the transfer hides behind it), the last step sends nothing, and JAX's
    reverse of the straight-line program overlaps the dK/dV sends with the next backward kernels
    (the scan it replaced was 1.26-1.28x slower on the training step at N 128k). GPU runs: docs/distributed.md,
    "Ring attention"."""
    from .kernels import fa_prefill_bwd, fa_train
    from .kernels.contract import Problem

    if layout not in RING_LAYOUTS:
        raise ValueError(f"layout must be one of {RING_LAYOUTS}; got {layout!r}")

    n = jax.lax.axis_size(axis_name)
    i = jax.lax.axis_index(axis_name)
    b, t, hq, d = q.shape
    sc = float(scale) if scale is not None else 1.0 / float(np.sqrt(d))
    cfg = config or fa_train.heuristic(Problem(entry="dense", dtype=jnp.dtype(q.dtype).name, batch=b, q_len=t,
                                               kv_len=t, heads_q=hq, heads_kv=k.shape[2], head_dim=d, causal=causal))
    interp = _compat.default_interpret(interpret)
    perm = [(j, (j + 1) % n) for j in range(n)]
    kernel = ring_kernel(jnp.dtype(q.dtype).name, d, interp, config)
    if kernel == "fa_prefill":  # the drop-in's configs at the block's shape (its tuned backward, not the default)
        from . import dropin

        shape = Problem(entry="dense", dtype=jnp.dtype(q.dtype).name, batch=b, q_len=t, kv_len=t, heads_q=hq,
                        heads_kv=k.shape[2], head_dim=d, causal=causal)
        fwd_cfg = dropin.prefill_config(shape, None)
        bwd_cfg = fa_prefill_bwd.CONFIGS[dropin.bwd_config_name(shape)]

    def block(kc, vc, s):
        j = (i - s) % n  # the device whose K/V this device holds at step s
        if layout == "contiguous":  # key c of chunk j (token j*t + c) is visible to row r (token i*t + r): c <= r + off
            off = jnp.full((b,), (i - j) * t, jnp.int32)
        else:  # striped: token c*n + j <= r*n + i  <=>  c <= r (j <= i) or c <= r - 1 (j > i)
            off = jnp.full((b,), jnp.where(j <= i, 0, -1), jnp.int32)
        if kernel == "fa_prefill":
            return fa_prefill_bwd.attention_lse(q, kc, vc, causal=causal, scale=sc, q_offset=off if causal else None,
                                                config=fwd_cfg, bwd_config=bwd_cfg)
        return fa_train.attention_lse(q, kc, vc, causal=causal, scale=sc, q_offset=off if causal else None,
                                      interpret=interp, config=cfg)

    # The n steps unrolled (n is the mesh axis size, a small static int): step s sends the block it holds on before
    # computing on it, so the transfer has the step's kernel to hide behind; the last step sends nothing; step 0's
    # state is the block's own (no merge with an empty state). The jax.lax.scan of session 12 (send after the kernel,
    # once more than needed) measured 1.26-1.28x slower on the training step at N 128k (docs/distributed.md).
    kc, vc = k, v
    o_acc = lse_acc = None
    for s in range(n):
        if s + 1 < n:
            k_next, v_next = jax.lax.ppermute(kc, axis_name, perm), jax.lax.ppermute(vc, axis_name, perm)
        o_s, lse_s = block(kc, vc, s)
        if o_acc is None:
            o_acc, lse_acc = o_s.astype(jnp.float32), lse_s
        else:
            o_acc, lse_acc = _merge2(o_acc, lse_acc, o_s.astype(jnp.float32), lse_s)
        if s + 1 < n:
            kc, vc = k_next, v_next
    return o_acc.astype(q.dtype)


def ring_attention_sharded(mesh, q, k, v, *, axis: str = "cp", causal: bool = True, scale: float | None = None,
                           interpret: bool | None = None, config=None, layout: str = "striped"):
    """``ring_attention`` over ``mesh``'s ``axis`` for global BTNH arrays in sequence order (q, k, v of the same
    length: self-attention, as in training). With ``layout="striped"`` the tokens are reordered so device ``i`` holds
    every ``n``-th token from ``i`` (a transpose of T, and its inverse on the output: an all-to-all when the inputs
    are already sharded; a model that keeps its activations striped calls ``ring_attention`` inside its own
    ``shard_map`` and pays none); ``"contiguous"`` splits T in order. Differentiable (``jax.grad`` gives dq, dk, dv
    like the inputs). Returns the output in sequence order."""
    if layout not in RING_LAYOUTS:
        raise ValueError(f"layout must be one of {RING_LAYOUTS}; got {layout!r}")
    if axis not in mesh.shape:
        raise ValueError(f"axis {axis!r} is not an axis of the mesh (its axes: {tuple(mesh.shape)})")
    if any(x.ndim != 4 for x in (q, k, v)):
        raise ValueError(f"ring attention takes BTNH arrays q [B, T, Hq, D], k and v [B, T, Hkv, D]; got ranks "
                         f"{q.ndim}, {k.ndim}, {v.ndim} (shapes {q.shape}, {k.shape}, {v.shape})")
    n = mesh.shape[axis]
    if q.shape[1] != k.shape[1] or k.shape != v.shape:
        raise ValueError(f"ring attention is self-attention: q, k, v must share the sequence length; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    if q.shape[1] % n:
        raise ValueError(f"the sequence ({q.shape[1]}) must split into {n} equal chunks over mesh axis {axis!r}")
    spec = P(None, axis, None, None)

    def local(q, k, v):
        return ring_attention(q, k, v, axis_name=axis, causal=causal, scale=scale, interpret=interpret,
                              config=config, layout=layout)

    def stripe(x):  # token r*n + i -> device i, local row r
        b, t = x.shape[:2]
        return x.reshape(b, t // n, n, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)

    def unstripe(x):
        b, t = x.shape[:2]
        return x.reshape(b, n, t // n, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)

    ring = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
    if layout == "contiguous":
        return ring(q, k, v)
    return unstripe(ring(stripe(q), stripe(k), stripe(v)))
