"""``pallas:auto``: each public entry exactly as a user calls it, with its defaults, on every workload family.

What a user of pallas_attn gets without naming a kernel or a config is what the model-shape sweep judges
(docs/sweep.md). The timed call is the public function with the workload's arguments and nothing else:

* prefill: ``pallas_attn.dot_product_attention(q, k, v, is_causal=..., local_window_size=...)`` (the drop-in;
  on Hopper fa_prefill, else fa_train, else jax.nn's XLA fallback, as ``which_implementation`` says);
* train: ``jax.value_and_grad`` of the drop-in through the train family's program (``compare.train``), with the
  model's window, soft-cap and sinks, and packed documents (``segment_ids``);
* decode, spec, quant: ``pallas_attn.attention(q, k, v, causal=..., q_offset=...)`` (generation=None);
* paged, chunked: ``pallas_attn.paged_attention(q, k_pool, v_pool, block_table, kv_lens, causal=...)``, with its
  default block-table check (a user's default);
* mla: ``pallas_attn.mla_attention(q, latent_pool, block_table, kv_lens, kv_lora_rank=..., causal=...)``.

The record's ``impl.plan`` (made before the run) says what the defaults chose: ``chose`` = "generation:config"
(or the fallback), ``why`` the entry's own reason, and, where a kernel was chosen, that kernel's launch plan.
Its roofline facts are the chosen kernel's. A workload the entry cannot take is an 'unsupported' record with the
entry's own error message.
"""

from __future__ import annotations

import functools
from typing import Any

from .schema import YES, Ctx, Impl, Prepared, RooflineFacts, Support

__all__ = ["auto_impl", "choice", "chunk_dense_impl"]

NAME = "pallas:auto"
TWIN = "pallas:chunked:dense"  # a chunk's dense twin: fa_prefill on the same keys as one dense cache (issue 32's bar)
# the features each family's public entry implements
# (the drop-in's local_window_size, its softcap / sinks / segment_ids extensions on the forward, and the first three
# differentiable: fa_prefill_bwd, or fa_train's backward for a window fa_prefill_bwd has not)
_ENTRY_FEATURES = {"prefill": frozenset({"window", "softcap", "sinks", "packed"}),
                   "train": frozenset({"window", "softcap", "sinks", "packed"}),
                   # attention / paged_attention on fa_decode (session 11): a causal window, soft-cap, sinks
                   "decode": frozenset({"window", "softcap", "sinks"}),
                   "paged_decode": frozenset({"window", "softcap", "sinks"})}


def _sds(shape, dtype):
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def _window(w) -> tuple[int, int] | None:
    from .impls import window_pair

    return window_pair(w)


def _config_name(gen: str, cfg: Any, head_dim: int | None = None) -> str:
    """The name of a resolved config object among the generation's named configs (by equality; fa_prefill's named
    configs as ``fit`` adapts them to the head dim), else its repr."""
    from pallas_attn import registry

    for name, c in registry.configs(gen).items():
        if c == cfg:
            return name
    if gen == "fa_prefill" and head_dim is not None:
        from pallas_attn.kernels import fa_prefill

        for name, c in registry.configs(gen).items():
            if fa_prefill.fit(c, head_dim) == cfg:
                return name
    return repr(cfg)


def prefill_forward_config(w):
    """``(problem, config name)`` of the drop-in's fa_prefill forward on workload ``w`` when it runs fa_prefill (on a
    Hopper): the heuristic's config at the dense problem (a window that fa_prefill's backward takes counts as causal,
    as the drop-in sends it)."""
    from pallas_attn import dropin
    from pallas_attn.kernels.contract import Problem

    left = dropin._hopper_bwd_left(w.causal, _window(w), w.q_len, w.kv_len)
    p = Problem(entry="dense", dtype=w.dtype, batch=w.batch, q_len=w.q_len, kv_len=w.kv_len, heads_q=w.heads_q,
                heads_kv=w.heads_kv, head_dim=w.head_dim, causal=bool(w.causal) or left is not None)
    return p, _config_name("fa_prefill", dropin.prefill_config(p, _window(w), bool(getattr(w, "packed", False))),
                           w.head_dim)


def chunk_prefill_config(w) -> tuple[Any, str]:
    """``(config, name)`` of fa_prefill for a chunk of a paged cache (``paged_attention`` with Tq > 16 on a
    Hopper): the drop-in's heuristic at the chunk's dense shape over the page-rounded cache."""
    from pallas_attn import chunked, dropin

    page = w.page_size or 1
    cfg = dropin.prefill_config(chunked._problem(_sds((w.batch, w.q_len, w.heads_q, w.head_dim), w.dtype),
                                                 -(-w.kv_len // page) * page, w.heads_kv),
                                None if w.window is None else (int(w.window) - 1, 0))
    return cfg, _config_name("fa_prefill", cfg, w.head_dim)


def _dropin_choice(w) -> dict[str, Any]:
    import pallas_attn
    from pallas_attn import dropin
    from pallas_attn.kernels import fa_prefill_bwd
    from pallas_attn.kernels.contract import Problem

    if w.q_offset or w.q_len != w.kv_len and w.causal:
        raise NotImplementedError(f"the drop-in's causal mask is jax.nn's (top-left, no offset); this workload has "
                                  f"q_len {w.q_len}, kv_len {w.kv_len}, q_offset {w.q_offset}")
    q = _sds((w.batch, w.q_len, w.heads_q, w.head_dim), w.dtype)
    kv = _sds((w.batch, w.kv_len, w.heads_kv, w.head_dim), w.dtype)
    sinks = _sds((w.heads_q,), "float32") if getattr(w, "sinks", False) else None
    seg = _sds((w.batch, w.q_len), "int32") if getattr(w, "packed", False) else None
    impl, why = pallas_attn.which_implementation(q, kv, kv, is_causal=w.causal, local_window_size=_window(w),
                                                 softcap=w.softcap, sinks=sinks, segment_ids=seg)
    out: dict[str, Any] = {"why": why}
    if impl == dropin.APART:  # fa_prefill's forward when not differentiated; differentiated, that forward and
        # cuDNN's backward (session 31, dropin.APART_STEP), else cuDNN's pair (D 96, and causal D 128 from N 4096:
        # dropin.TRAIN_ON_CUDNN_MIN_Q_LEN)
        hybrid = not dropin._hybrid_takes(q, kv, is_causal=w.causal,
                                          window=dropin._window(_window(w), w.causal, w.q_len, w.kv_len))
        if w.family == "train" and hybrid:
            _, fwd = prefill_forward_config(w)
            out.update(generation="fa_prefill", config=fwd, bwd_config="jax:cudnn", chose=f"fa_prefill:{fwd}+bwd:cudnn")
        elif w.family == "train":
            out.update(generation=None, config=None, chose="cudnn")
        else:
            _, fwd = prefill_forward_config(w)
            out.update(generation="fa_prefill", config=fwd, chose=f"fa_prefill:{fwd}")
    elif impl == dropin.CUDNN_FORWARD and w.family != "train":  # cuDNN's forward when not differentiated
        out.update(generation=None, config=None, chose="cudnn")
    elif impl in ("pallas:fa_prefill", dropin.CUDNN_FORWARD):  # differentiated: fa_prefill's pair either way
        p, fwd = prefill_forward_config(w)
        left = dropin._hopper_bwd_left(w.causal, _window(w), w.q_len, w.kv_len)
        out.update(generation="fa_prefill", config=fwd, chose=f"fa_prefill:{fwd}")
        if w.family == "train" and w.window is not None and left is None:  # this window's backward: fa_train's
            from pallas_attn.kernels import fa_train

            bwd = _config_name("fa_train", fa_train.heuristic(p))
            out.update(bwd_config=f"fa_train:{bwd}", chose=f"fa_prefill:{fwd}+bwd:fa_train:{bwd}")
        elif w.family == "train":
            bwd = dropin.bwd_config_name(p)
            ran = fa_prefill_bwd.config_for(w.head_dim, fa_prefill_bwd.CONFIGS[bwd])
            bwd = next((n for n, c in fa_prefill_bwd.CONFIGS.items() if c == ran), repr(ran))
            out.update(bwd_config=bwd, chose=f"fa_prefill:{fwd}+bwd:{bwd}")
            if impl == dropin.CUDNN_FORWARD and not dropin._mirror_takes():  # cuDNN's forward, our backward
                # (session 31, dropin.CUDNN_FORWARD_STEP): layer 2 has no model of cuDNN's forward
                out.update(config=None, forward_impl="jax:cudnn", chose=f"cudnn+bwd:{bwd}")
    elif impl == "pallas:fa_train":
        p = Problem(entry="dense", dtype=w.dtype, batch=w.batch, q_len=w.q_len, kv_len=w.kv_len, heads_q=w.heads_q,
                    heads_kv=w.heads_kv, head_dim=w.head_dim, causal=w.causal)
        from pallas_attn.kernels import fa_train

        cfg = _config_name("fa_train", fa_train.heuristic(p))
        out.update(generation="fa_train", config=cfg, chose=f"fa_train:{cfg}")
    else:
        out.update(generation=None, config=None, chose=impl)
    return out


def choice(w) -> dict[str, Any]:
    """What the public entry does on workload ``w`` with its defaults: ``{"chose", "generation", "config", "why"}``;
    NotImplementedError / ValueError when the entry refuses the call (the entry's own message)."""
    from pallas_attn import api

    from .impls import problem_of

    if w.family in ("prefill", "train"):
        return _dropin_choice(w)
    feats = w.window is not None or w.softcap is not None or w.sinks
    if w.packed or (feats and w.family not in ("decode", "paged_decode")):
        raise NotImplementedError(f"pallas_attn's {w.family} entry has no {', '.join(sorted(w.features))}")
    if w.family == "paged_decode":
        from pallas_attn.kernels import fa_decode

        if w.q_len > fa_decode.KERNEL.max_q_len:  # paged_attention's chunked prefill (pallas_attn.chunked)
            if not w.causal or w.kv_dtype:
                raise NotImplementedError(f"paged_attention's chunked prefill (Tq={w.q_len}) is causal over a 16-bit "
                                          f"cache only")
            from pallas_attn import _compat, chunked

            interp = _compat.default_interpret(None)
            path = "fa_prefill" if chunked.uses_fa_prefill(w.dtype, w.head_dim, interp) else "fa_train"
            if path == "fa_train":
                return {"chose": "chunked:fa_train", "generation": None, "config": None,
                        "why": f"paged_attention with Tq={w.q_len} > {fa_decode.KERNEL.max_q_len}: the pages gathered "
                               f"into a dense cache, then fa_train (pallas_attn.chunked)"}
            cfg, name = chunk_prefill_config(w)
            in_kernel = not interp and chunked.paged_in_kernel(w.page_size or 1, cfg)
            # layer 2 prices it as fa_prefill at the dense shape with this config (the page copies are not modelled)
            return {"chose": "chunked:fa_prefill", "generation": "fa_prefill", "config": name,
                    "why": f"paged_attention with Tq={w.q_len} > {fa_decode.KERNEL.max_q_len}: fa_prefill ({name}) "
                           + ("reading the pages through the block table" if in_kernel
                              else "over the pages gathered into a dense cache") + " (pallas_attn.chunked)"}
    problem = problem_of(w)  # an MLA workload's carries kv_lora_rank (a key of the table), as problem_mla's does
    if w.family == "mla":
        gen = "fa_mla"
    elif w.family == "paged_decode":
        gen = "fa_decode"  # paged_attention's default generation
    else:
        gen = api.default_generation(problem)
    if feats and gen != "fa_decode":
        raise NotImplementedError(f"pallas_attn's {w.family} entry takes window / softcap / sinks on fa_decode only; "
                                  f"its default here is {gen}")
    if feats and w.window is not None and not w.causal:
        raise NotImplementedError("fa_decode's window is causal")
    kern, cfg = api.resolve(gen, problem, None)
    name = _config_name(gen, cfg)
    why = {"mla": "mla_attention's default generation fa_mla; config from its heuristic (this GPU's tuning table, "
                  "else its own rule: kv64_mc at DeepSeek's 576 / 512 template, the reference's plan elsewhere)",
           "paged_decode": "paged_attention's default generation fa_decode; config from its heuristic",
           }.get(w.family, f"attention(generation=None) picks {gen} (api.default_generation); config from its "
                           "heuristic")
    del kern
    return {"chose": f"{gen}:{name}", "generation": gen, "config": name, "why": why}


def _supports(w, ctx: Ctx) -> Support:
    missing = sorted(w.features - _ENTRY_FEATURES.get(w.family, frozenset()))
    if missing:
        return Support(False, f"the public {w.family} entry has no {', '.join(missing)} yet", "unsupported")
    try:
        c = choice(w)
    except (NotImplementedError, ValueError) as e:
        return Support(False, str(e), "unsupported")
    if w.family == "train" and c.get("generation") is None and c.get("chose") != "cudnn":
        # XLA's fallback materialises the scores (out of memory or minutes at the sweep's lengths); cuDNN's pair, which
        # the drop-in differentiates through at D 96 and at long D 128 steps (dropin.APART), is timed as what a user
        # gets (session 27; before, every train fallback was 'unsupported' and left the yardstick)
        return Support(False, f"the drop-in falls back to {c['chose']} here ({c['why']})", "unsupported")
    if w.family == "train" and "forward only" in c.get("why", ""):  # e.g. packed documents before their GPU run
        return Support(False, f"the drop-in cannot differentiate this call: {c['why']}", "unsupported")
    return YES


def _plan(w, ctx: Ctx) -> dict[str, Any]:
    from pallas_attn import registry

    from .impls import _pallas_plan

    c = choice(w)
    out = dict(c)
    if c.get("generation") and w.family != "train" and c["config"] in registry.configs(c["generation"]):
        try:
            out["kernel_plan"] = _pallas_plan(c["generation"], c["config"], w, ctx)
        except Exception as e:  # noqa: BLE001 -- a plan that cannot be made is a note, not a failure
            out["kernel_plan"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _roofline(w) -> RooflineFacts | None:
    from pallas_attn import registry

    from .impls import _pallas_roofline

    c = choice(w)
    if not c.get("generation") or w.family == "train" or c["config"] not in registry.configs(c["generation"]):
        return None
    return _pallas_roofline(c["generation"], c["config"], w)


def _prepare(w, inp, ctx: Ctx) -> Prepared:
    import jax

    import pallas_attn

    c = choice(w)
    note = f"chose {c['chose']}"
    if w.family == "prefill":
        if getattr(w, "sinks", False) or getattr(w, "packed", False):
            fn = jax.jit(lambda q, k, v, s, g: pallas_attn.dot_product_attention(
                q, k, v, scale=inp.scale, is_causal=w.causal, local_window_size=_window(w), softcap=w.softcap,
                sinks=s, segment_ids=g))
            seg = inp.segment_ids if getattr(w, "packed", False) else None
            return Prepared(fn, (inp.q, inp.k, inp.v, inp.sinks, seg), "jax", "BTNH", notes=note)
        fn = jax.jit(functools.partial(pallas_attn.dot_product_attention, scale=inp.scale, is_causal=w.causal,
                                       local_window_size=_window(w), softcap=w.softcap))
        return Prepared(fn, (inp.q, inp.k, inp.v), "jax", "BTNH", notes=note)
    if w.family == "train":
        from . import train

        # the sinks as a constant of the step (its gradient is made by the custom_vjp, not returned: the train
        # family's step differentiates q, k, v)
        sinks = inp.sinks if getattr(w, "sinks", False) else None
        seg = inp.segment_ids if getattr(w, "packed", False) else None
        attn = functools.partial(pallas_attn.dot_product_attention, scale=inp.scale, is_causal=w.causal,
                                 local_window_size=_window(w), softcap=w.softcap, sinks=sinks, segment_ids=seg)
        return train.jax_step(attn, w, inp, notes=note)
    if w.family == "mla":
        fn = jax.jit(functools.partial(pallas_attn.mla_attention, kv_lora_rank=inp.kv_lora_rank, scale=inp.scale,
                                       causal=w.causal, interpret=ctx.interpret))
        return Prepared(fn, (inp.q, inp.latent_pool, inp.block_table, inp.kv_lens_jax()), "jax", "BTNH", notes=note)
    # the model's window (keys a query sees), soft-cap and sinks on the decode entries (fa_decode); the sinks an
    # argument of the jitted call
    fkw = dict(window=w.window, softcap=w.softcap) if w.window is not None or w.softcap is not None else {}
    sinks = (inp.sinks,) if getattr(w, "sinks", False) else ()
    if w.family == "paged_decode":
        fn = jax.jit(lambda *a: pallas_attn.paged_attention(*a[:5], scale=inp.scale, causal=w.causal,
                                                            interpret=ctx.interpret, **fkw,
                                                            **({"sinks": a[5]} if len(a) > 5 else {})))
        return Prepared(fn, (inp.q, inp.k_pool, inp.v_pool, inp.block_table, inp.kv_lens_jax(), *sinks), "jax",
                        "BTNH", notes=note + "; default check_block_table=True (a user's default)")
    fn = jax.jit(lambda *a: pallas_attn.attention(*a[:3], causal=w.causal, scale=inp.scale, q_offset=w.q_offset,
                                                  interpret=ctx.interpret, **fkw,
                                                  **({"sinks": a[3]} if len(a) > 3 else {})))
    if w.kv_dtype:
        return Prepared(fn, (inp.q, inp.k_quant, inp.v_quant, *sinks), "jax", "BTNH", notes=note)
    return Prepared(fn, (inp.q, inp.k, inp.v, *sinks), "jax", "BTNH", notes=note)


def auto_impl() -> Impl:
    return Impl(NAME, "pallas", None, "auto", "auto", None,
                "each public entry with its defaults, as a user calls it (compare/auto.py)", _supports, _prepare,
                roofline_fn=_roofline, plan_fn=_plan,
                families=frozenset({"prefill", "train", "decode", "paged_decode", "mla"}),
                features=frozenset({"window", "softcap", "sinks", "packed"}))


def _twin_supports(w, ctx: Ctx) -> Support:
    """The dense twin runs where the chunk runs fa_prefill (``paged_attention`` with Tq > 16 over a 16-bit cache on a
    Hopper): a chunk without window, soft-cap or sinks (the bar's shapes)."""
    from pallas_attn import chunked
    from pallas_attn.kernels import fa_decode

    if w.family != "paged_decode" or w.q_len <= fa_decode.KERNEL.max_q_len:
        return Support(False, f"the dense twin of a chunk (paged_attention with Tq > {fa_decode.KERNEL.max_q_len}); "
                              f"got {w.family} Tq={w.q_len}", "n/a")
    if w.features or w.kv_dtype or not w.causal:
        return Support(False, "the dense twin is timed at the bar's shapes: causal, 16-bit cache, no window / soft-cap "
                              "/ sinks", "unsupported")
    if not chunked.uses_fa_prefill(w.dtype, w.head_dim, ctx.interpret):
        return Support(False, "the chunk does not run fa_prefill here (it needs Mosaic GPU on sm_90): no dense twin "
                              "to compare it with", "unsupported")
    return YES


def _twin_prepare(w, inp, ctx: Ctx) -> Prepared:
    """fa_prefill with the config the chunk runs (``chunk_prefill_config``) on the workload's dense cache (the keys
    the pool was paged from, already in place: nothing gathered inside the timed call), each sequence's queries at
    its end (offset ``kv_len - Tq``, the paged entry's default)."""
    import jax
    import jax.numpy as jnp

    from pallas_attn.kernels import fa_prefill

    cfg, name = chunk_prefill_config(w)
    off = inp.kv_lens_jax() - w.q_len
    fn = jax.jit(lambda q, k, v, o: fa_prefill.forward(q, k, v, causal=True, scale=inp.scale, q_offset=o,
                                                       interpret=ctx.interpret, config=cfg))
    return Prepared(fn, (inp.q, inp.k, inp.v, off.astype(jnp.int32)), "jax", "BTNH",
                    notes=f"fa_prefill ({name}, the chunk's config) on the same keys as one dense cache")


def _twin_plan(w, ctx: Ctx) -> dict[str, Any]:
    _, name = chunk_prefill_config(w)
    return {"chose": f"fa_prefill:{name}", "generation": "fa_prefill", "config": name,
            "why": "the chunk's config on the dense cache (the serving issue's 'dense fa_prefill at the same shape')"}


def chunk_dense_impl() -> Impl:
    """``pallas:chunked:dense`` (kind "twin"): the yardstick of the chunked entry's bar, chunked prefill at >= 0.95x
    the speed of dense fa_prefill at the same shape (docs/serving.md); never a peer, never a named config."""
    return Impl(TWIN, "pallas", None, "dense", "twin", None,
                "a chunk's dense twin: fa_prefill with the chunk's config on the same keys as one dense cache",
                _twin_supports, _twin_prepare, plan_fn=_twin_plan, families=frozenset({"paged_decode"}))
