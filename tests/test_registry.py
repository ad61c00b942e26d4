"""The generation table and the Pallas rows: order, ids, and every row's kernel contract checked against what
the kernel actually launches (pallas_call names and lowering, traced, nothing run)."""

import importlib.util
import re

import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jcore

from attn_core import generations as core
from pallas_attn import _compat, api, registry
from pallas_attn.kernels.contract import ENTRIES, LOWERINGS, Kernel

REFERENCE_IDS = ["v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv", "v7_paged", "v8_gqa",
                 "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss", "v9_fp8", "v10_nvfp4",
                 "v11_mla", "v12_mla_tc"]
ROWS = registry.rows()


def test_the_17_reference_generations_in_order():
    assert list(core.REFERENCE_IDS) == REFERENCE_IDS
    assert list(registry.REFERENCE_IDS) == REFERENCE_IDS
    assert list(registry.ids()) == [g.id for g in core.GENERATIONS]
    assert [g.id for g in core.GENERATIONS if not g.frontier] == REFERENCE_IDS


def test_parents_exist_and_precede():
    seen = set()
    for g in core.GENERATIONS:
        assert g.parent is None or g.parent in seen, g.id
        assert g.delta and g.section and g.entries <= set(ENTRIES)
        seen.add(g.id)


def test_built_flags_are_the_rows():
    built = {r.generation for r in ROWS}
    assert len(built) == len(ROWS)
    assert {g.id for g in registry.generations() if g.built} == built
    for g in registry.generations():
        assert registry.built(g.id) == (g.id in built)


def _pallas_calls(jaxpr, out):
    """(name, compiler_params) of every pallas_call in a traced program, sub-jaxprs included."""
    for e in jaxpr.eqns:
        if e.primitive.name == "pallas_call":
            names = [m for k, v in e.params.items() if "name" in k for m in re.findall(r"pallas_attn_\w+", str(v))]
            out.append((names[0] if names else None, e.params.get("compiler_params")))
        for v in e.params.values():
            for sub in v if isinstance(v, (list, tuple)) else (v,):
                if isinstance(sub, jcore.ClosedJaxpr):
                    _pallas_calls(sub.jaxpr, out)
                elif isinstance(sub, jcore.Jaxpr):
                    _pallas_calls(sub, out)
    return out


def _trace(gen: str, k: Kernel):
    """The pallas_calls of one small call the kernel declares it supports (traced in interpret mode)."""
    dt = jnp.dtype(k.dtypes[0])
    d = k.head_dims[0] if k.head_dims else 64
    hq, hkv = (4, 2) if k.gqa else (2, 2)
    tq = 1 if k.max_q_len else 3
    q = jnp.zeros((2, tq, hq, d), dt)
    if "mla" in k.entries:  # an MLA kernel: a latent pool of its first (DQK, DV) template
        from pallas_attn.mla import mla_attention

        dqk, dv = k.templates[0]
        q, pool = jnp.zeros((2, tq, hq, dqk), dt), jnp.zeros((6, 16, 1, dqk), dt)
        table, lens = jnp.arange(6, dtype=jnp.int32).reshape(2, 3), jnp.array([40, 33], jnp.int32)
        fn = lambda q, pool: mla_attention(q, pool, table, lens, kv_lora_rank=dv, generation=gen,  # noqa: E731
                                           interpret=True)
        return _pallas_calls(jax.make_jaxpr(fn)(q, pool).jaxpr, [])
    if "dense" in k.entries:
        kv = jnp.zeros((2, 40, hkv, d), dt)
        fn = lambda q, kv: api.attention(q, kv, kv, generation=gen, interpret=True)  # noqa: E731
        return _pallas_calls(jax.make_jaxpr(fn)(q, kv).jaxpr, [])
    pool = jnp.zeros((6, 16, hkv, d), dt)
    if "paged" not in k.entries:  # a quantized-only kernel (v9_fp8, v10_nvfp4): a pool of its first format
        from pallas_attn import quant

        pool = {"fp8_e4m3": quant.quantize_fp8_e4m3, "nvfp4": quant.quantize_nvfp4}[next(iter(k.kv_precision))](pool)
    table = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    lens = jnp.array([40, 33], jnp.int32)
    fn = lambda q, pool: api.paged_attention(q, pool, pool, table, lens, generation=gen, interpret=True)  # noqa: E731
    return _pallas_calls(jax.make_jaxpr(fn)(q, pool).jaxpr, [])


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.generation)
def test_row_kernel_declares_a_consistent_contract(row):
    k = registry.kernel(row.generation)
    g = core.get(row.generation)
    assert isinstance(k, Kernel) and k.lowering in LOWERINGS
    # a generation serves exactly the entries its kernel declares, each through the kernel's own function
    assert g.entries == k.entries, (g.entries, k.entries)
    for e in k.entries & {"dense", "paged", "quantized"}:
        assert callable(k.dense if e == "dense" else k.paged), e
    cfgs = registry.configs(row.generation)
    assert cfgs and all(isinstance(c, k.config_cls) for c in cfgs.values())
    if g.frontier:  # a frontier kernel has a heuristic "default", never a "faithful" one
        assert "default" in cfgs and "faithful" not in cfgs
    else:  # a mirror has the reference's faithful config, lowered through Triton (CPU-interpretable); v12_mla_tc,
        # which the reference never built, is Hopper's Mosaic GPU kernel with a Triton twin (docs/mla.md)
        assert "faithful" in cfgs and (k.lowering == "triton" or row.generation == "v12_mla_tc")
    assert len(set(k.passes)) == len(k.passes) and all(p.startswith(f"pallas_attn_{k.name}_") for p in k.passes)
    # what it launches: declared passes only, lowered as declared
    calls = _trace(row.generation, k)
    assert calls and {n for n, _ in calls} <= set(k.passes), (calls, k.passes)
    triton = [isinstance(cp, _compat.pltriton.CompilerParams) for n, cp in calls if n not in k.triton_passes]
    assert all(triton) if k.lowering == "triton" else not any(triton), (k.lowering, calls)
    # a pass declared Triton-lowered inside a kernel of another lowering (v12_mla_tc's finish) is traced, and is Triton
    assert all(isinstance(cp, _compat.pltriton.CompilerParams) for n, cp in calls if n in k.triton_passes), calls
    assert not k.triton_passes or {n for n, _ in calls} & k.triton_passes, (k.triton_passes, calls)


def test_every_generation_is_built():
    # a generation of attn_core with neither a module pallas_attn/kernels/<id>.py nor an explicit row fails here
    assert [g.id for g in core.GENERATIONS if not registry.built(g.id)] == []


def test_default_rows_and_explicit_rows():
    # Rows in attn_core's order; a generation whose module exists gets Row(id, id); EXPLICIT holds only the others.
    assert [r.generation for r in ROWS] == [i for i in core.ids() if registry.built(i)]
    assert all(r != registry.Row(r.generation, r.generation) for r in registry.EXPLICIT), "an explicit default row"
    explicit = {r.generation for r in registry.EXPLICIT}
    assert {r.generation for r in ROWS if r.kernel != r.generation or r.configs is not None} == explicit
    assert all(registry.has_module(r.kernel) for r in ROWS)
    assert not registry.has_module("no_such_kernel")


def test_a_generation_without_module_or_row_is_not_built(monkeypatch):
    fake = core.Generation("toy_nomod", "frontier_prefill", "v4_fused", "d", "s", {"dense"}, frontier=True)
    monkeypatch.setattr(core, "GENERATIONS", core.GENERATIONS + (fake,))
    monkeypatch.setattr(core, "_BY_ID", {**core._BY_ID, fake.id: fake})
    rows = registry._table(registry.EXPLICIT)
    assert [r.generation for r in rows] == [r.generation for r in ROWS]  # the same rows, toy_nomod not among them
    monkeypatch.setattr(registry, "_BY_ID", {r.generation: r for r in rows})
    assert not registry.built("toy_nomod")
    with pytest.raises(NotImplementedError, match=r"'toy_nomod' is not built in Pallas yet \(no module "
                                                  r"pallas_attn/kernels/toy_nomod.py and no row"):
        registry.row("toy_nomod")
    # with a module of that name, the default row appears in attn_core's place
    monkeypatch.setattr(registry, "has_module", lambda name: name == "toy_nomod" or importlib.util.find_spec(
        f"pallas_attn.kernels.{name}") is not None)
    assert registry._table(registry.EXPLICIT)[-1] == registry.Row("toy_nomod", "toy_nomod")


def test_explicit_rows_are_checked():
    with pytest.raises(ValueError, match="unknown generation 'v99'"):
        registry.Row("v99", "v4_fused")
    with pytest.raises(ValueError, match="names kernel module pallas_attn.kernels.v4_fusedd, which does not exist"):
        registry._table((registry.Row("v4_fused", "v4_fusedd"),))
    with pytest.raises(ValueError, match="two explicit rows for generation 'v8_gqa_db'"):
        registry._table(registry.EXPLICIT + (registry.Row("v8_gqa_db", "v8_gqa"),))


def test_unbuilt_generation_is_a_visible_state(monkeypatch):
    """All 17 generations are built, so the unbuilt state is made by removing one row: a table generation
    without a Pallas row says "not built", never an unknown id or a silent fallback."""
    gen = "v12_mla_tc"
    registry.kernel.cache_clear()  # cached per id; errors are never cached
    registry.configs.cache_clear()
    monkeypatch.setattr(registry, "_BY_ID", {k: v for k, v in registry._BY_ID.items() if k != gen})
    assert not registry.built(gen) and registry.get(gen).id == gen
    with pytest.raises(NotImplementedError, match="not built"):
        registry.kernel(gen)
    with pytest.raises(NotImplementedError, match="not built"):
        registry.configs(gen)
    monkeypatch.undo()
    assert registry.built(gen) and registry.kernel(gen).name == gen


def test_unknown_id():
    with pytest.raises(ValueError, match="unknown generation"):
        registry.get("v99")


def test_one_problem_and_one_kernel_for_every_entry():
    """Issue 26, item 2: one Problem and one Kernel type; the "mla" entry's fields are declared on them and checked
    against the entry, and a kernel's own refusals are its declared ``limits`` (no subclass of the contract)."""
    import dataclasses

    from pallas_attn.kernels import mla_common
    from pallas_attn.kernels.contract import Problem

    dense = dict(dtype="float16", batch=1, q_len=4, kv_len=8, heads_q=2, heads_kv=2, head_dim=64)
    with pytest.raises(ValueError, match="kv_lora_rank is the 'mla' entry's"):
        Problem(entry="dense", kv_lora_rank=512, **dense)
    assert not hasattr(mla_common, "MlaProblem")  # the subclass is gone, no alias left
    for row in ROWS:
        k = registry.kernel(row.generation)
        assert type(k) is Kernel, row.generation  # no subclass: supports / roofline are the contract's
        assert (k.mla is not None) == ("mla" in k.entries)
    prefill = registry.kernel("fa_prefill")
    assert prefill.limits is not None
    ok, why = prefill.supports(Problem(entry="dense", **{**dense, "kv_len": 0}))
    assert not ok and why == "fa_prefill: needs at least one key (Tk >= 1); got Tk=0"
    v7 = registry.kernel("v7_paged")
    with pytest.raises(ValueError, match="templates are the 'mla' entry's"):
        dataclasses.replace(v7, templates=((576, 512),))
    with pytest.raises(ValueError, match="an MLA kernel serves the 'mla' entry through its mla function"):
        dataclasses.replace(registry.kernel("fa_mla"), mla=None)
