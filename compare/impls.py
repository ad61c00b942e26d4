"""Implementations as data: an ``Impl`` per thing compare can run, built from the twins' own declarations.

  * ``pallas:<gen>:<config>`` — every row of ``pallas_attn.registry`` (``registry.rows()``), once per named
    config of the row (``registry.configs(gen)``: "faithful" then "tuned" for a reference generation,
    "default" then the others for a frontier kernel). Lowering, support, roofline inputs and the launch
    plan are the kernel's contract (``registry.kernel(gen)``: ``lowering``, ``supports`` through
    ``pallas_attn.api.resolve``, ``roofline``, ``plan``). A generation of the shared table
    (``attn_core.generations``) without a row is one ``pallas:<gen>`` impl whose records say ``not_built``;
  * ``cuda:<gen>`` — every reference generation; built iff ``cuda_ref.table()`` has its row, whose columns
    give the operand precision, materialization, tile and split plan; support from ``cuda_ref.api.validate``
    (dense) or ``cuda_ref.api.validate_paged`` (paged: v7_paged and the v8 family, ``cuda_ref.paged_attention``
    on BHND q and the workload's own pools, table and lengths) on meta tensors (the same answer on a CPU
    machine as on the GPU);
  * the peers (``compare.peers``).

No per-generation code. A generation applies to a workload iff the workload family's entry
(``ENTRY_FAMILIES``: prefill and decode -> ``dense``, paged_decode -> ``paged``, mla -> ``mla``) is one of the
generation's ``entries``; otherwise ``supports()`` answers ``status == "n/a"`` and no record is written.
Every other refusal is a record with its reason.

The train family (``family = "train"``, ``compare.train``: forward + backward of one training step) runs on the
implementations that declare it in ``Impl.families``: here ``pallas:fa_train:<config>`` (fa_train's custom_vjp,
forward and backward at that named config) and ``pallas:dropin:<bwd config>`` (what the drop-in runs on Hopper:
fa_prefill's forward at its heuristic config and fa_prefill_bwd's backward at each named config, through
``fa_prefill_bwd.attention_lse``, the pair ``pallas_attn.dropin`` calls); the peers in ``compare.peers``. A train
workload is the ``dense`` entry to the contract (``base_entry``). ``pallas:fa_train:*`` also takes a window
(``Impl.features``): fa_train's own ``window=(W - 1, 0)``, the drop-in's window path, on every family it runs.

A workload with a quantized KV cache (``kv_dtype``, docs/quantized_kv.md) is the ``quantized`` entry
(``pallas_attn.kernels.contract.Problem(entry="quantized", kv_dtype=...)``, dense or paged by its family). A
generation serving it runs on the quantized operands; one that serves only the family's fp16 entry refuses with
a record saying so (never a silent fp16 run); the CUDA twins refuse (no quantized CUDA kernel is wired yet).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from attn_core import generations as core

from .schema import YES, Ctx, Impl, Prepared, RooflineFacts, Support

__all__ = ["ENTRY_FAMILIES", "entry_for", "base_entry", "kv_dtype_of", "quantized_refusal", "applies",
           "problem_of", "pallas_impls", "cuda_impls", "all_impls", "cuda_table", "dropin_impls", "DROPIN_PREFIX"]

# Which workload families each public entry serves (attn_core.generations.ENTRIES). The quantized entry serves
# the workloads of these families that set kv_dtype (``entry_for``), dense or paged by the family.
ENTRY_FAMILIES: dict[str, tuple[str, ...]] = {
    "dense": ("prefill", "decode"),
    "paged": ("paged_decode",),
    "quantized": ("prefill", "decode", "paged_decode"),
    "mla": ("mla",),
}
_FAMILY_ENTRY = {fam: entry for entry, fams in ENTRY_FAMILIES.items() if entry != "quantized" for fam in fams}


def kv_dtype_of(w) -> str | None:
    """The workload's quantized KV format (``"fp8_e4m3"`` | ``"nvfp4"``), None for KV in the workload dtype."""
    return getattr(w, "kv_dtype", None)


def base_entry(w) -> str:
    """The entry serving the workload's family with KV in the workload dtype (dense | paged | mla); a train
    workload's attention is the dense entry's (its backward is the train implementations' own)."""
    if w.family == "train":
        return "dense"
    return _FAMILY_ENTRY[w.family]


def entry_for(w) -> str:
    """The public entry that serves a workload: ``quantized`` when it sets kv_dtype, else its family's. An MLA
    workload is always the ``mla`` entry: its quantized latent (kv_dtype) is an operand format of that entry."""
    if w.family == "mla":
        return "mla"
    return "quantized" if kv_dtype_of(w) else base_entry(w)


def applies(gen_id: str, w) -> bool:
    """A generation applies to a workload if it serves the workload's entry, or, for a quantized workload, the
    family's fp16 entry (it then refuses with a reason: it cannot read the quantized cache)."""
    entries = core.get(gen_id).entries
    return entry_for(w) in entries or base_entry(w) in entries


def quantized_refusal(gen_id: str, w) -> str | None:
    """Why ``gen_id`` cannot run a quantized workload it would run with fp16 KV (None: no such refusal)."""
    kvd = kv_dtype_of(w)
    if w.family == "mla":  # the mla entry takes quantized latents; whether a kernel reads one is its supports()
        return None
    if kvd and "quantized" not in core.get(gen_id).entries:
        return (f"{gen_id} serves the {sorted(core.get(gen_id).entries)} entries, not 'quantized': it reads KV in "
                f"the workload dtype, not kv_dtype={kvd} (no silent fp16 run)")
    return None


def problem_of(w):
    """The kernel contract's ``Problem`` for a workload (paged: ``kv_len`` = pages_per_seq x page_size, the
    table width ``attn_core.paging.build_paged_kv`` gives it, as ``pallas_attn.api.problem_paged`` sees it; MLA: with
    ``kv_lora_rank``, as ``pallas_attn.mla.problem_mla`` sees it)."""
    from pallas_attn.kernels.contract import Problem

    entry = entry_for(w)
    kv_len, page = w.kv_len, None
    if w.family in ("paged_decode", "mla") and w.page_size:
        page = w.page_size
        kv_len = -(-w.kv_len // page) * page
    return Problem(entry=entry, dtype=w.dtype, batch=w.batch, q_len=w.q_len, kv_len=kv_len, heads_q=w.heads_q,
                   heads_kv=w.heads_kv, head_dim=w.head_dim, causal=bool(w.causal), page_size=page,
                   kv_dtype=kv_dtype_of(w), kv_lora_rank=w.kv_lora_rank if entry == "mla" else None)


def _not_built_facts(gen_id: str, w) -> RooflineFacts:
    """An unbuilt generation is predicted at the reference's storage precision (``compare.predict``)."""
    from .predict import reference_storage

    return RooflineFacts(reference_storage(gen_id), source="reference storage convention (not built)")


# ------------------------------------------------------------------------------------------ Pallas


def _resolve(gen_id: str, config: str, w):
    from pallas_attn import api

    problem = problem_of(w)
    kern, cfg = api.resolve(gen_id, problem, config)
    return kern, cfg, problem


def _pallas_supports(gen_id: str, config: str, w, ctx: Ctx) -> Support:
    if not applies(gen_id, w):
        return Support(False, "", "n/a")
    if w.family == "mla":
        import pallas_attn

        if not callable(getattr(pallas_attn, "mla_attention", None)):
            return Support(False, "pallas_attn exports no mla_attention entry yet", "not_built")
    why = quantized_refusal(gen_id, w)
    if why:
        return Support(False, why, "unsupported")
    try:
        _resolve(gen_id, config, w)
    except (NotImplementedError, ValueError) as e:
        return Support(False, str(e), "unsupported")
    return YES


def _pallas_roofline(gen_id: str, config: str, w) -> RooflineFacts:
    kern, cfg, problem = _resolve(gen_id, config, w)
    ri = kern.roofline(problem, cfg)
    return RooflineFacts(ri.precision, bool(ri.materialize_s), tuple(ri.tile), bool(ri.tensor_cores),
                         f"pallas contract ({kern.name})", float(getattr(ri, "dequant_ops", 0.0)))


def _pallas_plan(gen_id: str, config: str, w, ctx: Ctx) -> dict[str, Any]:
    kern, cfg, problem = _resolve(gen_id, config, w)
    return dict(kern.plan(problem, cfg))


def _pallas_program_key(gen_id: str, config: str, w):
    """``(generation, the config as w runs it)`` where the kernel declares ``effective`` (else None): named configs
    that differ only in knobs w does not use launch the same programs."""
    kern, cfg, problem = _resolve(gen_id, config, w)
    return None if kern.effective is None else (gen_id, kern.effective(problem, cfg))


def _pallas_prepare(gen_id: str, config: str, w, inp, ctx: Ctx) -> Prepared:
    import jax

    import pallas_attn

    kvd = kv_dtype_of(w)
    note = f"KV {kvd}: quantized on the device over the whole cache, untimed" if kvd else ""
    if w.family == "mla":
        return _pallas_mla_prepare(gen_id, config, w, inp, ctx)
    if w.family == "paged_decode":
        fn = jax.jit(functools.partial(
            pallas_attn.paged_attention, scale=inp.scale, causal=w.causal, generation=gen_id,
            interpret=ctx.interpret, config=config,
            # compare builds valid tables; the bounds check is validation cost, not attention
            check_block_table=False))
        # for a quantized workload the pools are Fp8Tensor / Nvfp4Tensor pools (interop.make_inputs)
        return Prepared(fn, (inp.q, inp.k_pool, inp.v_pool, inp.block_table, inp.kv_lens_jax()), "jax", "BTNH",
                        notes=note)
    fn = jax.jit(functools.partial(
        pallas_attn.attention, causal=w.causal, scale=inp.scale, q_offset=w.q_offset, generation=gen_id,
        interpret=ctx.interpret, config=config))
    if kvd:
        return Prepared(fn, (inp.q, inp.k_quant, inp.v_quant), "jax", "BTNH", notes=note)
    return Prepared(fn, (inp.q, inp.k, inp.v), "jax", "BTNH")


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _pallas_mla_prepare(gen_id: str, config: str, w, inp, ctx: Ctx) -> Prepared:
    """``pallas_attn.mla_attention`` on the workload's latent pool (bf16/fp16, or an Fp8Tensor / Nvfp4Tensor pool),
    block table and lengths; causal offsets are the entry's default (``kv_len - Tq`` per sequence)."""
    import jax

    import pallas_attn

    kw = dict(kv_lora_rank=inp.kv_lora_rank, scale=inp.scale, causal=w.causal, generation=gen_id, config=config)
    if _accepts(pallas_attn.mla_attention, "interpret"):
        kw["interpret"] = ctx.interpret
    fn = jax.jit(functools.partial(pallas_attn.mla_attention, **kw))
    kvd = kv_dtype_of(w)
    note = (f"latent {kvd}: quantized on the device over the whole latent, then paged (untimed)" if kvd
            else f"latent {w.dtype}, paged (page {inp.latent_pool.shape[1]})")
    return Prepared(fn, (inp.q, inp.latent_pool, inp.block_table, inp.kv_lens_jax()), "jax", "BTNH", notes=note)


# ------------------------------------------------------------------------------- train and features


def window_pair(w):
    """The workload's window as the kernels and jax.nn take it: ``(W - 1, 0)`` (W keys up to the query's own), or
    None."""
    return None if w.window is None else (w.window - 1, 0)

_FA_TRAIN = "fa_train"


def _fa_train_attn(config: str, w, inp, ctx: Ctx):
    """``attn(q, k, v) -> out`` through fa_train's ``attention_lse`` (its custom_vjp: the Pallas backward under
    ``jax.grad``) at the named config, with the workload's causal offset and window ``(W - 1, 0)``: what
    ``pallas_attn.dot_product_attention`` runs for fa_train (its corner cases, rows that see no key, cannot occur
    with a causal window)."""
    from pallas_attn import _compat, registry
    from pallas_attn.kernels import fa_train

    cfg = registry.configs(_FA_TRAIN)[config]
    window = window_pair(w)

    def attn(q, k, v):
        with _compat.quiet_triton():
            out, _ = fa_train.attention_lse(q, k, v, causal=bool(w.causal), scale=inp.scale, q_offset=w.q_offset,
                                            window=window, interpret=ctx.interpret, config=cfg)
        return out

    return attn


def _fa_train_prepare(config: str, w, inp, ctx: Ctx) -> Prepared:
    """fa_train: the train family's step over its custom_vjp; a windowed prefill / decode through
    ``fa_train.attention_lse`` with the window; anything else as every Pallas generation (``_pallas_prepare``)."""
    import jax

    if w.family == "train":
        from . import train

        win = f", window ({w.window - 1}, 0)" if w.window is not None else ""
        return train.jax_step(_fa_train_attn(config, w, inp, ctx), w, inp,
                              notes=f"fa_train.attention_lse (config {config}{win}): Pallas forward and backward")
    if w.window is not None:
        return Prepared(jax.jit(_fa_train_attn(config, w, inp, ctx)), (inp.q, inp.k, inp.v), "jax", "BTNH",
                        notes=f"fa_train.attention_lse with window ({w.window - 1}, 0) (the drop-in's window path)")
    return _pallas_prepare(_FA_TRAIN, config, w, inp, ctx)


def _with_train(impl: Impl) -> Impl:
    """fa_train's rows: the train family and the window besides what every Pallas generation runs."""
    import dataclasses

    return dataclasses.replace(impl, prepare_fn=functools.partial(_fa_train_prepare, impl.config),
                               families=impl.families | {"train"}, features=impl.features | {"window"})


_FA_PREFILL = "fa_prefill"
_PREFILL_FEATURES = frozenset({"window", "softcap", "sinks", "packed"})


def _fa_prefill_prepare(config, w, inp, ctx: Ctx) -> Prepared:
    """fa_prefill at a named config: a workload with features (window ``(W - 1, 0)``, soft-cap, sinks, packed
    documents as ``segment_ids``) through ``fa_prefill.forward``'s keyword extensions (the forward the drop-in runs
    for them); anything else as every Pallas generation (``_pallas_prepare``)."""
    import jax
    import jax.numpy as jnp

    from pallas_attn import registry
    from pallas_attn.kernels import fa_prefill

    if not (w.features & _PREFILL_FEATURES):
        return _pallas_prepare(_FA_PREFILL, config, w, inp, ctx)
    cfg = registry.configs(_FA_PREFILL)[config] if isinstance(config, str) else config  # a tuning point's object
    window = window_pair(w)
    off = jnp.full((w.batch,), w.q_offset, jnp.int32)
    sinks = inp.sinks if getattr(w, "sinks", False) else None
    seg = inp.segment_ids if getattr(w, "packed", False) else None

    def call(q, k, v, s=None, g=None):
        return fa_prefill.forward(q, k, v, causal=bool(w.causal), scale=inp.scale, q_offset=off,
                                  interpret=ctx.interpret, config=cfg, window=window, softcap=w.softcap, sinks=s,
                                  segment_ids=g)

    feats = ", ".join(sorted(w.features & _PREFILL_FEATURES))
    args = (inp.q, inp.k, inp.v, sinks, seg) if seg is not None else (inp.q, inp.k, inp.v) + (
        () if sinks is None else (sinks,))
    return Prepared(jax.jit(call), args, "jax", "BTNH",
                    notes=f"fa_prefill.forward with {feats} (window ({w.window - 1}, 0))" if w.window else
                    f"fa_prefill.forward with {feats}")


def _with_features(impl: Impl) -> Impl:
    """fa_prefill's rows: the window, soft-cap, sinks and packed documents (its forward's extensions)."""
    import dataclasses

    return dataclasses.replace(impl, prepare_fn=functools.partial(_fa_prefill_prepare, impl.config),
                               features=impl.features | _PREFILL_FEATURES)


DROPIN_PREFIX = "pallas:dropin"


def _dropin_problem(w):
    from pallas_attn.kernels.contract import Problem

    return Problem(entry="dense", dtype=w.dtype, batch=w.batch, q_len=w.q_len, kv_len=w.kv_len, heads_q=w.heads_q,
                   heads_kv=w.heads_kv, head_dim=w.head_dim, causal=bool(w.causal))


_DROPIN_FEATURES = frozenset({"window", "softcap", "sinks", "packed"})




def _dropin_forward(w):
    """fa_prefill's forward config for the workload (as the drop-in asks: its heuristic, then the window's rule,
    ``dropin.prefill_config``) and its name."""
    from pallas_attn import dropin, registry

    kern = registry.kernel("fa_prefill")
    cfg = dropin.prefill_config(_dropin_problem(w), window_pair(w), bool(getattr(w, "packed", False)))
    name = next((n for n, c in registry.configs("fa_prefill").items() if c == cfg), repr(cfg))
    return kern, cfg, name


def _dropin_supports(bwd: str, w, ctx: Ctx) -> Support:
    """fa_prefill's forward + backward on this train workload: the drop-in's own reasons (dtype, head dim, the
    causal mask's form, via ``dropin._prefill_unsupported``), then Hopper."""
    import jax

    from pallas_attn import dropin

    if w.family != "train":
        return Support(False, "", "n/a")
    if w.q_offset:
        return Support(False, f"the drop-in's causal mask is jax.nn's (top-left, no query offset); q_offset "
                              f"{w.q_offset}")
    q = jax.ShapeDtypeStruct((w.batch, w.q_len, w.heads_q, w.head_dim), w.dtype)
    kv = jax.ShapeDtypeStruct((w.batch, w.kv_len, w.heads_kv, w.head_dim), w.dtype)
    why = dropin._prefill_unsupported(q, kv, None, None, is_causal=bool(w.causal), window=window_pair(w),
                                      q_lens=None, kv_lens=None)
    if not why and w.window is not None and dropin._hopper_bwd_left(bool(w.causal), window_pair(w), w.q_len,
                                                                    w.kv_len) is None:
        why = "fa_prefill_bwd has no window of this form (causal-shaped, T <= S only); the drop-in pairs fa_train's"
    if not why and getattr(w, "packed", False) and (w.head_dim > 128 or w.window is not None):
        why = (f"fa_prefill_bwd's packed kernels take D <= 128 without a window; got D {w.head_dim}, window "
               f"{w.window}")
    if why:
        return Support(False, why, "unsupported")
    if not ctx.hopper:
        return Support(False, "needs a Hopper GPU (sm_90): fa_prefill's forward and backward are Mosaic GPU kernels "
                              "(wgmma, TMA)", "unavailable")
    return YES


def _dropin_prepare(bwd: str, w, inp, ctx: Ctx) -> Prepared:
    from pallas_attn.kernels import fa_prefill_bwd

    from . import train

    _, fwd_cfg, fwd_name = _dropin_forward(w)
    bwd_cfg = fa_prefill_bwd.CONFIGS[bwd]
    # the output alone, as the drop-in asks for it (no LSE cotangent), where this fa_prefill_bwd offers that
    out_only = _accepts(fa_prefill_bwd.attention_lse, "with_lse")

    feats = {}
    if w.features & _DROPIN_FEATURES:  # the model's window / soft-cap / sinks (the sinks a constant of the step) /
        # packed documents (the segment ids a constant of the step, as the drop-in takes them)
        feats = dict(window=None if w.window is None else w.window - 1, softcap=w.softcap,
                     sinks=inp.sinks if getattr(w, "sinks", False) else None,
                     segment_ids=inp.segment_ids if getattr(w, "packed", False) else None)

    def attn(q, k, v):
        res = fa_prefill_bwd.attention_lse(q, k, v, causal=bool(w.causal), scale=inp.scale, config=fwd_cfg,
                                           bwd_config=bwd_cfg, interpret=ctx.interpret,
                                           **({"with_lse": False} if out_only else {}), **feats)
        return res if out_only else res[0]

    ran = fa_prefill_bwd.config_for(w.head_dim, bwd_cfg)
    note = f"fa_prefill forward (heuristic: {fwd_name}) + fa_prefill_bwd backward {bwd}"
    if feats:
        note += f" with {', '.join(sorted(w.features & _DROPIN_FEATURES))}"
    if ran != bwd_cfg:
        note += f" (at D {w.head_dim} fa_prefill_bwd.config_for runs d256)"
    return train.jax_step(attn, w, inp, notes=note + " (fa_prefill_bwd.attention_lse, the drop-in's Hopper pair)")


def _dropin_roofline(bwd: str, w) -> RooflineFacts:
    kern, cfg, name = _dropin_forward(w)
    ri = kern.roofline(_dropin_problem(w), cfg)
    return RooflineFacts(ri.precision, bool(ri.materialize_s), tuple(ri.tile), bool(ri.tensor_cores),
                         f"pallas contract (fa_prefill forward {name}; backward fa_prefill_bwd {bwd})")


def _dropin_plan(bwd: str, w, ctx: Ctx) -> dict[str, Any]:
    import dataclasses

    from pallas_attn.kernels import fa_prefill_bwd

    kern, cfg, name = _dropin_forward(w)
    ran = fa_prefill_bwd.config_for(w.head_dim, fa_prefill_bwd.CONFIGS[bwd])
    return {"forward_config": name, "forward": dict(kern.plan(_dropin_problem(w), cfg)), "backward_config": bwd,
            "backward": dataclasses.asdict(ran)}


def dropin_impls() -> list[Impl]:
    """``pallas:dropin:<bwd config>``: one per named config of ``fa_prefill_bwd.CONFIGS``, train family only."""
    try:
        from pallas_attn.kernels import fa_prefill_bwd

        names = list(fa_prefill_bwd.CONFIGS)
    except Exception as e:  # noqa: BLE001 -- a kernel that fails to import is a record per workload
        err = f"importing pallas_attn.kernels.fa_prefill_bwd failed: {type(e).__name__}: {e}"
        return [Impl(DROPIN_PREFIX, "pallas", "fa_prefill", None, "frontier", "mosaic-gpu", "",
                     lambda w, ctx: Support(False, err, "failed") if w.family == "train" else Support(False, "", "n/a"),
                     families=frozenset({"train"}))]
    return [Impl(f"{DROPIN_PREFIX}:{n}", "pallas", "fa_prefill", n, "frontier", "mosaic-gpu",
                 f"the drop-in's Hopper pair: fa_prefill forward (heuristic config) + fa_prefill_bwd backward {n}",
                 functools.partial(_dropin_supports, n), functools.partial(_dropin_prepare, n),
                 roofline_fn=functools.partial(_dropin_roofline, n), plan_fn=functools.partial(_dropin_plan, n),
                 families=frozenset({"train"}), features=_DROPIN_FEATURES)
            for n in names]


def _config_order(names) -> list[str]:
    """The named configs, the kernel's usual choice first ("faithful", then "tuned"; "default" for a
    frontier kernel), the rest in the order the row declares them."""
    names = list(names)
    first = [n for n in ("faithful", "default", "tuned") if n in names]
    return first + [n for n in names if n not in first]


def _unbuilt(gen_id: str, twin: str, w, ctx: Ctx) -> Support:
    if not applies(gen_id, w):
        return Support(False, "", "n/a")
    return Support(False, f"{gen_id} is not built {twin}", "not_built")


def _broken(gen_id: str, err: str, w, ctx: Ctx) -> Support:
    if not applies(gen_id, w):
        return Support(False, "", "n/a")
    return Support(False, err, "failed")


def pallas_impls() -> list[Impl]:
    from pallas_attn import registry

    rows = {r.generation: r for r in registry.rows()}
    out: list[Impl] = []
    for g in core.GENERATIONS:
        kind = "frontier" if g.frontier else "mirror"
        if g.id not in rows:
            out.append(Impl(f"pallas:{g.id}", "pallas", g.id, None, kind, None, g.delta,
                            functools.partial(_unbuilt, g.id, "in Pallas yet (no row in pallas_attn.registry)"),
                            roofline_fn=functools.partial(_not_built_facts, g.id)))
            continue
        try:
            kern = registry.kernel(g.id)
            names = list(registry.configs(g.id))
        except Exception as e:  # a kernel that fails to import is a record per workload, not a crash
            err = f"importing the kernel of {g.id} (pallas_attn.kernels.{rows[g.id].kernel}) failed: " \
                  f"{type(e).__name__}: {e}"
            out.append(Impl(f"pallas:{g.id}", "pallas", g.id, None, kind, None, g.delta,
                            functools.partial(_broken, g.id, err)))
            continue
        for cfg in _config_order(names):
            impl = Impl(
                f"pallas:{g.id}:{cfg}", "pallas", g.id, cfg, kind, kern.lowering, g.delta,
                functools.partial(_pallas_supports, g.id, cfg),
                functools.partial(_pallas_prepare, g.id, cfg),
                roofline_fn=functools.partial(_pallas_roofline, g.id, cfg),
                plan_fn=functools.partial(_pallas_plan, g.id, cfg),
                program_key_fn=functools.partial(_pallas_program_key, g.id, cfg))
            out.append(_with_train(impl) if g.id == _FA_TRAIN else _with_features(impl) if g.id == _FA_PREFILL
                       else impl)
    return out


# -------------------------------------------------------------------------------------------- CUDA


def cuda_table() -> tuple[Any, ...]:
    """``cuda_ref.table()``: cuda_ref's generation rows (raises, saying why, when cuda_ref cannot give them)."""
    import cuda_ref

    table = getattr(cuda_ref, "table", None)
    if not callable(table):
        raise AttributeError("cuda_ref exposes no table() function")
    return tuple(table())


def _paged_capacity(w) -> tuple[int, int]:
    """``(pages_per_seq, n_k)`` of a paged workload's table: the capacity ``pages_per_seq x page_size`` that
    ``attn_core.paging.build_paged_kv`` gives it and both twins plan their splits over."""
    pages = max(1, -(-w.kv_len // w.page_size))
    return pages, pages * w.page_size


def _meta_validate(gen_id: str, w) -> None:
    """cuda_ref's own argument checks on meta tensors (no GPU, no allocation): ``validate`` for a dense workload,
    ``validate_paged`` for a paged one (pools ``[B x pages_per_seq, page, H_kv, D]``, int32 table and lengths,
    the default causal offset ``kv_len - N_q`` per sequence, as compare's oracle)."""
    import torch

    from cuda_ref import api as capi

    dt = getattr(torch, w.dtype)
    q = torch.empty((w.batch, w.heads_q, w.q_len, w.head_dim), dtype=dt, device="meta")
    if base_entry(w) == "paged":
        pages, _ = _paged_capacity(w)
        pool = torch.empty((w.batch * pages, w.page_size, w.heads_kv, w.head_dim), dtype=dt, device="meta")
        table = torch.empty((w.batch, pages), dtype=torch.int32, device="meta")
        lens = torch.empty((w.batch,), dtype=torch.int32, device="meta")
        capi.validate_paged(q, pool, pool, table, lens, generation=gen_id, causal=w.causal, scale=None,
                            q_offset=None, return_lse=False)
        return
    k = torch.empty((w.batch, w.heads_kv, w.kv_len, w.head_dim), dtype=dt, device="meta")
    capi.validate(q, k, k, causal=w.causal, scale=None, q_offset=w.q_offset, generation=gen_id)


def _cuda_supports(gen_id: str, row, table_error: str | None, w, ctx: Ctx) -> Support:
    if not applies(gen_id, w):
        return Support(False, "", "n/a")
    if table_error is not None:
        return Support(False, table_error, "unavailable")
    if row is None:
        return Support(False, f"{gen_id} is not built in cuda_ref yet (no row in its generation table)", "not_built")
    if w.family == "mla":
        return _cuda_mla_supports(gen_id, row, w, ctx)
    kvd = kv_dtype_of(w)
    if kvd:
        return Support(False, f"cuda_ref has no quantized-KV kernel wired into compare yet: cuda:{gen_id} reads KV in "
                              f"the workload dtype, not kv_dtype={kvd} (no silent fp16 run)", "unsupported")
    entry = entry_for(w)
    if entry not in ("dense", "paged") or entry != row.entry:
        return Support(False, f"compare has no cuda_ref path for the {entry!r} entry yet (cuda_ref serves {gen_id} "
                              f"through {row.entry!r})", "unsupported")
    try:
        _meta_validate(gen_id, w)
    except (NotImplementedError, ValueError) as e:
        return Support(False, str(e), "unsupported")
    except (ImportError, AttributeError, TypeError) as e:
        return Support(False, f"cuda_ref or torch not usable here: {type(e).__name__}: {e}", "unavailable")
    if not ctx.torch_cuda:
        return Support(False, "needs a CUDA GPU (torch.cuda unavailable)", "unavailable")
    return YES


def _cuda_mla_supports(gen_id: str, row, w, ctx: Ctx) -> Support:
    """An MLA row of cuda_ref's table: ``cuda_ref.mla_attention`` on BHND q and the workload's latent pool (a
    cuda_ref.quant Fp8Tensor / Nvfp4Tensor pool for a quantized latent); cuda_ref's own argument checks on meta
    tensors when it exposes them (``cuda_ref.api.validate_mla``), else the run's first call says."""
    if row.entry != "mla":
        return Support(False, f"cuda_ref serves {gen_id} through {row.entry!r}, not the MLA entry", "unsupported")
    try:
        import cuda_ref
    except Exception as e:  # noqa: BLE001
        return Support(False, f"cuda_ref not importable: {type(e).__name__}: {e}", "unavailable")
    if not callable(getattr(cuda_ref, "mla_attention", None)):
        return Support(False, "cuda_ref exports no mla_attention entry yet", "not_built")
    validate = getattr(getattr(cuda_ref, "api", None), "validate_mla", None)
    if callable(validate) and not kv_dtype_of(w):
        try:
            import torch

            dt = getattr(torch, w.dtype)
            pages, _ = _paged_capacity(w)
            q = torch.empty((w.batch, w.heads_q, w.q_len, w.head_dim), dtype=dt, device="meta")
            pool = torch.empty((w.batch * pages, w.page_size, 1, w.head_dim), dtype=dt, device="meta")
            table = torch.empty((w.batch, pages), dtype=torch.int32, device="meta")
            lens = torch.empty((w.batch,), dtype=torch.int32, device="meta")
            validate(q, pool, table, lens, kv_lora_rank=w.kv_lora_rank, generation=gen_id, causal=w.causal,
                     scale=None, q_offset=None)
        except (NotImplementedError, ValueError) as e:
            return Support(False, str(e), "unsupported")
        except (ImportError, AttributeError, TypeError) as e:
            return Support(False, f"cuda_ref or torch not usable here: {type(e).__name__}: {e}", "unavailable")
    if not ctx.torch_cuda:
        return Support(False, "needs a CUDA GPU (torch.cuda unavailable)", "unavailable")
    return YES


def _torch_latent_pool(inp) -> Any:
    """The latent pool as torch tensors on the same device buffers (zero copy): a plain tensor, or a
    cuda_ref.quant Fp8Tensor / Nvfp4Tensor whose fields are the pallas_attn.quant pool's."""
    from pallas_attn import quant as jq

    from . import interop

    pool = inp.latent_pool
    fmt = jq.kv_format(pool)
    if fmt is None:
        return interop.to_torch(pool)
    from cuda_ref import quant as tq

    if fmt == "fp8_e4m3":
        return tq.Fp8Tensor(data=interop.to_torch(pool.data), scale=interop.to_torch(pool.scale))
    return tq.Nvfp4Tensor(packed=interop.to_torch(pool.packed), micro=interop.to_torch(pool.micro),
                          scale=interop.to_torch(pool.scale))


def _cuda_mla_prepare(gen_id: str, w, inp, ctx: Ctx) -> Prepared:
    import cuda_ref

    from . import interop

    def make():
        q = interop.to_torch(inp.q).transpose(1, 2).contiguous()
        return (q, _torch_latent_pool(inp), interop.to_torch(inp.block_table), interop.to_torch(inp.kv_lens_jax()))
    q, pool, table, lens = inp.cached("torch_mla", make)
    fn = functools.partial(cuda_ref.mla_attention, kv_lora_rank=inp.kv_lora_rank, scale=inp.scale, causal=w.causal,
                           generation=gen_id)
    kvd = kv_dtype_of(w)
    return Prepared(fn, (q, pool, table, lens), "torch", "BHND",
                    notes="q BHND (one layout copy, untimed); latent pool, table and lengths zero-copy"
                          + (f"; latent {kvd} (cuda_ref.quant fields of the same pool)" if kvd else ""))


def _cuda_roofline(row, w) -> RooflineFacts:
    if w.family == "mla":  # one latent read once (fused): charged at the latent's storage precision
        from .roofline import kv_precision

        return RooflineFacts(kv_precision(w), False, (1, 1), None, f"cuda_ref table ({row.id}; MLA latent format)")
    mat = bool(row.materializes_s)
    tile = tuple(row.tile(w.head_dim)) if mat else (1, 1)
    return RooflineFacts(row.operand_precision(w.dtype), mat, tile, None, f"cuda_ref table ({row.id})")


def _cuda_num_sm() -> int | None:
    """The SM count cuda_ref plans with: ``$CUDA_REF_NUM_SM`` when set (as the twins read it), else None (the
    device's)."""
    env = os.environ.get("CUDA_REF_NUM_SM", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


def _cuda_plan(row, w, ctx: Ctx) -> dict[str, Any]:
    """What the table row says about the launch; for a split-KV row also the split plan, which needs the SM
    count (the device's, or ``$CUDA_REF_NUM_SM``), so on a machine without a CUDA GPU and without that variable
    it stays null. Dense rows: ``cuda_ref.choose_splits`` over B x H. Paged rows: ``cuda_ref.api.split_plan``
    (packed row tiles of G x N_q over B x H_kv) with ``n_k`` the table's capacity, as the launch does."""
    plan: dict[str, Any] = {
        "source": "cuda_ref generation table", "entry": row.entry, "operand": row.operand,
        "tile": list(row.tile(w.head_dim)), "materializes_s": bool(row.materializes_s),
        "workspace": row.workspace, "split_kv": bool(row.split_kv), "writes_lse": bool(row.writes_lse)}
    if row.split_kv:
        plan.update(splits=None, chunk=None)
        num_sm = _cuda_num_sm()
        if num_sm is None and not ctx.torch_cuda:
            plan["splits_note"] = "the split plan needs the device's SM count: a CUDA GPU (or $CUDA_REF_NUM_SM)"
            return plan
        try:
            import cuda_ref

            if row.entry in ("paged", "mla"):
                _, n_k = _paged_capacity(w)
                s, chunk = cuda_ref.api.split_plan(row.id, batch=w.batch, h_q=w.heads_q, h_kv=w.heads_kv,
                                                   n_q=w.q_len, n_k=n_k, head_dim=w.head_dim, num_sm=num_sm)
                plan.update(n_k=n_k, rows_per_program=int(row.tile(w.head_dim)[0]))
            else:
                s, chunk = cuda_ref.choose_splits(bh=w.batch * w.heads_q, n_q=w.q_len, n_k=w.kv_len, num_sm=num_sm)
            plan.update(splits=int(s), chunk=int(chunk), num_sm=num_sm or "device")
        except Exception as e:  # the plan is a record field: its failure is written, the run goes on
            plan["splits_error"] = f"{type(e).__name__}: {e}"
    return plan


def _torch_paged(w, inp) -> tuple[Any, ...]:
    """The paged operands as torch CUDA tensors, made once per workload outside the timed region: q BHND
    (one layout copy), the pools, table and lengths zero-copy (the same device buffers the Pallas rows read),
    and the per-sequence causal offsets ``kv_len - N_q`` as an int32 tensor (the binding's default, computed
    here so the timed call launches no subtraction kernel)."""
    from . import interop

    def make():
        q = interop.to_torch(inp.q).transpose(1, 2).contiguous()
        kp, vp, table = (interop.to_torch(x) for x in (inp.k_pool, inp.v_pool, inp.block_table))
        lens = interop.to_torch(inp.kv_lens_jax())
        return q, kp, vp, table, lens, (lens - w.q_len).contiguous()
    return inp.cached("torch_paged", make)


def _cuda_prepare(gen_id: str, w, inp, ctx: Ctx) -> Prepared:
    import cuda_ref

    if w.family == "mla":
        return _cuda_mla_prepare(gen_id, w, inp, ctx)
    if base_entry(w) == "paged":
        q, kp, vp, table, lens, offs = _torch_paged(w, inp)
        fn = functools.partial(cuda_ref.paged_attention, causal=w.causal, scale=inp.scale, q_offset=offs,
                               generation=gen_id)
        return Prepared(fn, (q, kp, vp, table, lens), "torch", "BHND",
                        notes="fp32 output; q_offset = kv_len - N_q per sequence")
    q, k, v = inp.torch_bhnd()
    fn = functools.partial(cuda_ref.attention, causal=w.causal, scale=inp.scale, q_offset=w.q_offset,
                           generation=gen_id)
    return Prepared(fn, (q, k, v), "torch", "BHND", notes="fp32 output")


def cuda_impls() -> list[Impl]:
    """One ``cuda:<gen>`` per generation with a CUDA twin (``attn_core.generations``' ``twin``: every reference
    generation, and a frontier kernel whose row declares one)."""
    try:
        rows, table_error = {r.id: r for r in cuda_table()}, None
    except Exception as e:  # cuda_ref not importable or its table unreadable: every record says so
        rows, table_error = {}, f"cuda_ref's generation table is unavailable: {type(e).__name__}: {e}"
    out = []
    for g in core.GENERATIONS:
        if not g.twin:
            continue
        row = rows.get(g.id)
        kind = "frontier" if g.frontier else "mirror"  # a frontier kernel's twin is ours too, not the reference's
        supports = functools.partial(_cuda_supports, g.id, row, table_error)
        if row is None:
            out.append(Impl(f"cuda:{g.id}", "cuda", g.id, None, kind, None, g.delta, supports,
                            roofline_fn=functools.partial(_not_built_facts, g.id)))
            continue
        out.append(Impl(f"cuda:{g.id}", "cuda", g.id, None, kind, "cuda-jit", g.delta, supports,
                        functools.partial(_cuda_prepare, g.id),
                        roofline_fn=functools.partial(_cuda_roofline, row),
                        plan_fn=functools.partial(_cuda_plan, row)))
    return out


def all_impls() -> list[Impl]:
    """Pallas generations, CUDA twins, multi-device implementations, then the peers, in that order (twins
    pair by generation id)."""
    from . import auto, multidevice, peers

    return ([auto.auto_impl(), auto.chunk_dense_impl()] + pallas_impls() + dropin_impls() + cuda_impls()
            + multidevice.cp_impls() + multidevice.ring_impls()
            + peers.peer_impls())
