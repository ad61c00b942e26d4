"""v7_paged and the v8 family (Pallas, interpret mode on the CPU): what is particular to them.

``tests/test_conformance.py`` runs every registry row (v7_paged, v8_gqa, v8_gqa_tc, v8_gqa_db, v8_gqa_occ,
v8_gqa_ilp, v8_gqa_ss) against the float64 oracle on its paged shapes, their LSE, and lowers every named
config for CUDA. This file keeps:

* the paged semantics at awkward shapes: every G in {1, 2, 4, 8, 16, 32}, D 64 / 128, page sizes 8 ... 256,
  lengths that are not page multiples, ragged batches, causal with per-sequence offsets (negative included:
  a row with no visible key gives 0 and LSE -inf), forced splits with empty ones, a shuffled pool whose
  spare pages (and the tail of every last page) are NaN: a kernel that reads a key it does not own fails;
* dense equivalence (an unshuffled table over a dense cache gives the dense oracle);
* bad tables: a page index outside the pool or a length the table cannot hold raises eagerly and, under
  jit, poisons only that sequence with NaN; v7 refuses GQA naming v8_gqa;
* each kernel's dataflow delta, read off the traced program and the plan: passes, grid, rows per program,
  warps, one update per key (an inner key loop) vs per 32 keys (none), dots only in v8_gqa_tc and on
  16-bit operands, the prefetched tile carried by v8_gqa_db, ``choose_splits`` with 40 SMs vs the device's.

Shapes are small: interpret-mode compiles dominate the time, so each call covers several features.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from attn_core.paging import build_paged_kv
from pallas_attn import api, registry
from pallas_attn.kernels import v7_paged, v8_gqa, v8_gqa_ss, v8_gqa_tc
from pallas_attn.kernels.contract import Problem

FAMILY = ("v7_paged", "v8_gqa", "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")
TOL = 1e-2  # fp16 operands, fp32 accumulation (relative L2)


def _pool(rng, *, b, hkv, d, lens, page, spare=3, dtype="float16"):
    """Shuffled pools with ``spare`` unowned pages; every byte no sequence owns is NaN."""
    tk = max(lens)
    k = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
    kp, vp, bt = build_paged_kv(k, v, page, seed=int(rng.integers(1 << 30)), kv_lens=lens)
    owned = np.zeros(kp.shape[:2], bool)
    for bi, n in enumerate(lens):
        for lp in range(-(-n // page)):
            owned[bt[bi, lp], : min(page, n - lp * page)] = True
    kp = np.concatenate([kp, np.zeros((spare, *kp.shape[1:]), kp.dtype)])
    vp = np.concatenate([vp, np.zeros((spare, *vp.shape[1:]), vp.dtype)])
    owned = np.concatenate([owned, np.zeros((spare, page), bool)])
    perm = rng.permutation(kp.shape[0])  # spare pages land anywhere in the pool
    inv = np.argsort(perm)
    kp, vp, owned, bt = kp[perm], vp[perm], owned[perm], inv[bt].astype(np.int32)
    ref_kp, ref_vp = kp.copy(), vp.copy()
    kp[~owned], vp[~owned] = np.nan, np.nan
    dt = jnp.dtype(dtype)
    return (jnp.asarray(kp, dt), jnp.asarray(vp, dt), bt, np.asarray(jnp.asarray(ref_kp, dt), np.float32),
            np.asarray(jnp.asarray(ref_vp, dt), np.float32))


def _oracle(q, ref_kp, ref_vp, bt, lens, q_off, *, causal):
    """Per sequence (a length-0 or fully hidden row: output 0, LSE -inf)."""
    b, tq, hq, d = q.shape
    out, lse = np.zeros((b, tq, hq, d)), np.full((b, hq, tq), -np.inf)
    qf = np.asarray(jnp.asarray(q, jnp.float32))
    for bi, n in enumerate(lens):
        if n == 0:
            continue
        k = oracle.gather_paged_kv(ref_kp, bt[bi], n)[None]
        v = oracle.gather_paged_kv(ref_vp, bt[bi], n)[None]
        o, l = oracle.attention_reference(qf[bi : bi + 1], k, v, causal=causal, q_offset=q_off[bi])
        out[bi], lse[bi] = o[0], l[0]
    return out, lse


def _check(out, lse, ref, ref_lse, tol=TOL):
    o = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert o.shape == ref.shape and np.all(np.isfinite(o)), "non-finite output (a NaN page was read, or unwritten)"
    err = np.linalg.norm(o - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err < tol, f"relative L2 error {err:.2e}"
    l = np.asarray(lse, np.float64)
    assert np.array_equal(np.isneginf(l), np.isneginf(ref_lse)), "rows with no visible key differ"
    empty = np.isneginf(ref_lse).transpose(0, 2, 1)  # [B, Tq, Hq]
    assert np.all(o[empty] == 0.0), "a row with no visible key must output exactly 0"
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(l[fin], ref_lse[fin], atol=5e-3, rtol=0)


# (generation, config, G, Hkv, Tq, D, page, lens, causal, q_offset or None (paged default kv_len - Tq))
CASES = [
    ("v8_gqa", "faithful", 1, 2, 3, 64, 8, [37, 5], True, [34, -2]),  # G=1, per key, row 0 of b1 sees nothing
    ("v8_gqa_tc", "faithful", 2, 2, 2, 128, 16, [50, 33], True, None),
    ("v8_gqa_ss", "faithful", 4, 1, 1, 64, 64, [70, 0, 129], False, None),  # an empty sequence, 3 pages
    # 3 splits of 171 keys: split starts (and so tiles) straddle pages; seq 1 has empty splits
    ("v8_gqa", v7_paged.PagedConfig(num_splits=3), 8, 1, 1, 128, 256, [300, 21], True, [299, 3]),
    ("v8_gqa_ss", "reference_sm40", 2, 2, 1, 64, 64, [700, 333], False, None),  # choose_splits: S 3, chunk 235
    ("v8_gqa_ss", "tuned", 16, 1, 2, 128, 8, [45, 17], True, [44, 20]),
    ("v8_gqa_tc", "tuned", 32, 1, 1, 64, 32, [95, 64], False, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-G{c[2]}-d{c[5]}-page{c[6]}")
def test_paged_gqa_awkward_shapes(rng, case):
    gen, config, g, hkv, tq, d, page, lens, causal, q_off = case
    b, hq = len(lens), g * hkv
    kp, vp, bt, ref_kp, ref_vp = _pool(rng, b=b, hkv=hkv, d=d, lens=lens, page=page)
    q = jnp.asarray(rng.standard_normal((b, tq, hq, d)), jnp.float16)
    lens_a = np.asarray(lens, np.int32)
    offs = lens_a - tq if q_off is None else np.asarray(q_off, np.int32)
    out, lse = pallas_attn.paged_attention(
        q, kp, vp, jnp.asarray(bt), jnp.asarray(lens_a), causal=causal, generation=gen, config=config,
        q_offset=None if q_off is None else jnp.asarray(offs), interpret=True, return_lse=True)
    assert out.dtype == q.dtype
    ref, ref_lse = _oracle(q, ref_kp, ref_vp, bt, lens, offs, causal=causal)
    _check(out, lse, ref, ref_lse)


def test_v7_dense_equivalent_fp32_input(rng):
    """An unshuffled table over a dense cache is the dense problem: the dense oracle on the fp16-staged
    operands (fp32 input is cast to fp16 on the way in, as the reference host does; output stays fp32)."""
    b, tq, h, d, tk, page = 2, 1, 3, 64, 40, 16
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((b, tq, h, d), (b, tk, h, d), (b, tk, h, d)))
    kp, vp, bt = build_paged_kv(k, v, page, shuffle=False)
    lens = jnp.full((b,), tk, jnp.int32)
    args = (jnp.asarray(q), jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt), lens)
    with pytest.raises(NotImplementedError, match="float32"):  # never a silent cast through the API
        pallas_attn.paged_attention(*args, causal=True, generation="v7_paged", interpret=True)
    kw = dict(causal=True, scale=1 / np.sqrt(d), q_offset=jnp.full((b,), tk - tq, jnp.int32), interpret=True)
    with pytest.raises(NotImplementedError, match="host_cast=True"):
        v7_paged.paged_forward(*args, **kw, config=v7_paged.CONFIGS["faithful"])
    cfg = dataclasses.replace(v7_paged.CONFIGS["faithful"], host_cast=True)
    out, lse = v7_paged.paged_forward(*args, **kw, return_lse=True, config=cfg)
    assert out.dtype == jnp.float32
    f16 = [np.asarray(x.astype(np.float16), np.float32) for x in (q, k, v)]
    ref, ref_lse = oracle.attention_reference(*f16, causal=True, q_offset=tk - tq)
    _check(out, lse, ref, ref_lse, tol=1e-3)


# --- bad tables and refusals ----------------------------------------------------------------------------


def _small(rng, b=3, page=8, tk=20, hkv=2, g=2):
    k = rng.standard_normal((b, tk, hkv, 64)).astype(np.float16)
    kp, vp, bt = build_paged_kv(k, k, page)
    q = jnp.asarray(rng.standard_normal((b, 1, hkv * g, 64)), jnp.float16)
    return q, jnp.asarray(kp), jnp.asarray(vp), bt, np.full((b,), tk, np.int32)


@pytest.mark.parametrize("gen", FAMILY)
@pytest.mark.parametrize("bad", ["too_big", "negative", "len_past_table"])
def test_bad_tables_raise_eagerly(rng, gen, bad):
    q, kp, vp, bt, lens = _small(rng, g=1 if gen == "v7_paged" else 2)
    if bad == "too_big":
        bt[1, 0] = kp.shape[0]
    elif bad == "negative":
        bt[0, 2] = -1
    else:
        lens[0] = bt.shape[1] * kp.shape[1] + 1
    with pytest.raises(ValueError, match="block_table|kv_lens"):
        pallas_attn.paged_attention(q, kp, vp, jnp.asarray(bt), jnp.asarray(lens), generation=gen, interpret=True)


def test_bad_table_under_jit_poisons_only_that_sequence(rng):
    q, kp, vp, bt, lens = _small(rng)
    ref, _ = oracle.paged_attention_reference(q, kp, vp, bt, lens)
    bt[1, 1] = kp.shape[0] + 5
    f = jax.jit(lambda *a: pallas_attn.paged_attention(*a, generation="v8_gqa_ss", interpret=True))
    out = np.asarray(f(q, kp, vp, jnp.asarray(bt), jnp.asarray(lens)), np.float64)
    assert np.all(np.isnan(out[1]))
    assert np.linalg.norm(out[[0, 2]] - ref[[0, 2]]) / np.linalg.norm(ref[[0, 2]]) < TOL


def test_v7_is_mha_only_and_errors_name_the_fix(rng):
    q, kp, vp, bt, lens = _small(rng, g=2)
    with pytest.raises(NotImplementedError, match="MHA"):
        pallas_attn.paged_attention(q, kp, vp, jnp.asarray(bt), jnp.asarray(lens), generation="v7_paged",
                                    interpret=True)
    with pytest.raises(NotImplementedError, match="v8_gqa"):
        v7_paged.paged_forward(q, kp, vp, jnp.asarray(bt), jnp.asarray(lens), causal=False, scale=0.1,
                               q_offset=0, interpret=True)
    with pytest.raises(NotImplementedError, match="head dims"):
        pallas_attn.paged_attention(q[..., :32], kp[..., :32], vp[..., :32], jnp.asarray(bt), jnp.asarray(lens),
                                    generation="v8_gqa", interpret=True)
    with pytest.raises(ValueError, match="serves"):
        pallas_attn.attention(q, q, q, generation="v8_gqa")  # paged only
    with pytest.raises(ValueError, match="updates once per 32"):
        v8_gqa_ss.forward_with(q, kp, vp, jnp.asarray(bt), jnp.asarray(lens), causal=False, scale=0.1, q_offset=0,
                               interpret=True, config=v7_paged.PagedConfig())


@pytest.mark.parametrize(("factory", "match"), [
    (lambda: v7_paged.PagedConfig(update_keys=3), "update_keys"),
    (lambda: v7_paged.PagedConfig(update_keys=64, key_tile_d128=32), "update_keys"),
    (lambda: v7_paged.PagedConfig(key_ilp=4, update_keys=32), "key_ilp"),
    (lambda: v7_paged.PagedConfig(num_sm=0), "num_sm"),
    (lambda: v8_gqa_tc.TcConfig(block_m=8), "block_m"),
])
def test_bad_configs_raise(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


# --- dataflow: passes, grid, rows per program, update granularity, dots, plans --------------------------


def _walk(jaxpr, fn):
    for eqn in jaxpr.eqns:
        fn(eqn)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _walk(inner, fn)


def _calls(gen, config="faithful", *, g=8, hkv=2, tq=1, d=64, page=16, pages=4, b=2):
    q = jax.ShapeDtypeStruct((b, tq, g * hkv, d), jnp.float16)
    pool = jax.ShapeDtypeStruct((b * pages, page, hkv, d), jnp.float16)
    bt = jax.ShapeDtypeStruct((b, pages), jnp.int32)
    lens = jax.ShapeDtypeStruct((b,), jnp.int32)
    jp = jax.make_jaxpr(lambda q, p, bt, lens: pallas_attn.paged_attention(
        q, p, p, bt, lens, generation=gen, config=config, interpret=True, check_block_table=False))(q, pool, bt, lens)
    calls = []
    _walk(jp.jaxpr, lambda e: calls.append(e) if e.primitive.name == "pallas_call" else None)
    return calls


def _name(eqn) -> str:
    p = eqn.params
    return str(p.get("name") or getattr(p.get("name_and_src_info"), "name", ""))


def _grid(eqn):
    return tuple(eqn.params["grid_mapping"].grid)


def _warps(eqn):
    return eqn.params["compiler_params"].num_warps


def _prims(eqn):
    seen = []
    _walk(eqn.params["jaxpr"], lambda e: seen.append(e))
    return seen


@pytest.mark.parametrize("gen", FAMILY)
def test_passes_grid_and_rows_per_program(gen):
    """Partial grid (row tiles, S, B*Hkv) with 8 packed rows per program (16 for tc) and the reference's
    warps; then the shared merge. v7 is the G = 1 case (its rows are query positions)."""
    g = 1 if gen == "v7_paged" else 8
    kern = registry.kernel(gen)
    part, merge = _calls(gen, g=g, tq=3)
    assert (_name(part), _name(merge)) == kern.passes
    rpp, warps = (16, 1) if gen == "v8_gqa_tc" else (8, 8)
    rows = g * 3
    assert _grid(part)[0] == -(-rows // rpp) and _grid(part)[2] == 2 * 2  # B*Hkv
    assert _warps(part) == warps
    assert [tuple(a.shape) for a in part.params["out_avals"]] == [(2 * 2 * rows, _grid(part)[1], 64),
                                                                  (2 * 2 * rows, _grid(part)[1])]
    plan = kern.plan(api.problem_paged(jnp.zeros((2, 3, 2 * g, 64)), jnp.zeros((8, 16, 2, 64)),
                                       jnp.zeros((2, 4), jnp.int32), causal=False),
                     registry.configs(gen)["faithful"])
    assert plan["partial"]["grid"] == list(_grid(part)) and plan["partial"]["rows_per_program"] == rpp


def _loops(eqn):
    """Loops of a kernel: the tile loop (a ``while``: traced bounds) and a static-trip inner loop (``scan``)."""
    return [e for e in _prims(eqn) if e.primitive.name in ("while", "scan")]


def _dots(eqn):
    return [tuple(jnp.dtype(v.aval.dtype).name for v in e.invars) for e in _prims(eqn)
            if e.primitive.name == "dot_general"]


def test_update_granularity_and_arithmetic_units():
    """Cut 1 (v7, v8_gqa and its knobs) advances the recurrence once per key: an inner loop over the tile's
    keys (TN / KU trips) inside the tile loop. v8_gqa_ss and the per-tile configs have no inner loop (one
    update per 32 keys / per tile). Only v8_gqa_tc has dots, on 16-bit operands; the rest are CUDA-core."""
    for gen in ("v7_paged", "v8_gqa", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp"):
        g = 1 if gen == "v7_paged" else 8
        (part, _) = _calls(gen, g=g)
        loops = _loops(part)
        assert len(loops) == 2, (gen, len(loops))  # tiles, then the keys of a tile
        assert not _dots(part), gen
    for gen, config in (("v8_gqa_ss", "faithful"), ("v8_gqa_ss", "tuned"), ("v8_gqa", "tuned"),
                        ("v7_paged", "per_tile")):
        (part, _) = _calls(gen, config, g=1 if gen == "v7_paged" else 8)
        assert len(_loops(part)) == 1, (gen, config)
        assert not _dots(part)
    (part, _) = _calls("v8_gqa_tc")
    assert len(_loops(part)) == 1 and _dots(part) == [("float16", "float16")] * 2
    for gen in FAMILY:
        prec = registry.kernel(gen).precision_for("float16")
        assert prec.engine == ("tensor" if gen == "v8_gqa_tc" else "fp32") and prec.operand == "fp16"
    assert "host_cast=True" in v7_paged.KERNEL.precision_for("float16").note
    assert v7_paged.KERNEL.dtypes == ("float16",)
    assert v8_gqa.KERNEL.dtypes == v8_gqa_tc.KERNEL.dtypes == v8_gqa_ss.KERNEL.dtypes == ("float16",)


def test_knob_rows_are_configs_of_v8_gqa():
    """v8_gqa_db / _occ / _ilp are rows over v8_gqa's kernel, each with its own 'faithful' (and the API's
    default for the row is that config, not v8_gqa's)."""
    want = {"v8_gqa_db": dict(prefetch=True, stage_fp32=False), "v8_gqa_occ": dict(stage_fp32=False, prefetch=False),
            "v8_gqa_ilp": dict(key_ilp=4, stage_fp32=True)}
    for gen, fields in want.items():
        assert registry.kernel(gen) is registry.kernel("v8_gqa")
        cfg = registry.configs(gen)["faithful"]
        assert all(getattr(cfg, k) == v for k, v in fields.items()), gen
        assert cfg.update_keys == 1 and cfg.num_sm == 40
        prob = Problem(entry="paged", dtype="float16", batch=1, q_len=1, kv_len=64, heads_q=8, heads_kv=1,
                       head_dim=64, page_size=16)
        assert api.resolve(gen, prob, None)[1] == cfg
    # the double buffer is carried through the tile loop: the prefetched K and V tiles are loop state
    (db, _), (cut1, _) = _calls("v8_gqa_db"), _calls("v8_gqa")
    n_carry = lambda call: max(len(e.params["body_jaxpr"].jaxpr.invars)  # noqa: E731
                               for e in _loops(call) if e.primitive.name == "while")
    assert n_carry(db) >= n_carry(cut1) + 2


def test_plans_choose_splits_reference_and_device():
    """docs/reference.md §2.0's worked example: v8, G = 8, B = 1, Hkv = 1, N_k = 8192 -> S = 32 with 40 SMs;
    v7 B = 1, H = 8 -> S = 10 (chunk 820); tc counts 16-row tiles; ss asks the device (132 SMs here)."""
    def prob(g, hkv, n_k=8192, b=1, d=128):
        return Problem(entry="paged", dtype="float16", batch=b, q_len=1, kv_len=n_k, heads_q=g * hkv, heads_kv=hkv,
                       head_dim=d, page_size=256)

    p = v8_gqa.KERNEL.plan(prob(8, 1), v8_gqa.CONFIGS["faithful"])
    assert (p["splits"], p["num_sm"], p["partial"]["grid"]) == (32, 40, [1, 32, 1])
    assert p["partial"]["keys_per_update"] == 1 and p["partial"]["key_tile"] == 32
    p = v7_paged.KERNEL.plan(prob(1, 8), v7_paged.CONFIGS["faithful"])
    assert (p["splits"], p["chunk"]) == (10, 820)
    p = v8_gqa_tc.KERNEL.plan(prob(32, 1, b=4), v8_gqa_tc.CONFIGS["faithful"])
    assert p["partial"]["grid"][0] == 2 and p["partial"]["rows_per_program"] == 16  # ceil(32 / 16)
    assert p["splits"] == 10  # by_occ = ceil(80 / (4 * 2))
    p = v8_gqa_ss.KERNEL.plan(prob(8, 8, b=8), v8_gqa_ss.CONFIGS["faithful"])
    assert p["num_sm"] == 132 and p["splits"] == 5 and p["partial"]["keys_per_update"] == 32  # ceil(264 / 64)
    p = v8_gqa_ss.KERNEL.plan(prob(8, 8, b=8, d=64), v8_gqa_ss.CONFIGS["reference_sm40"])
    assert p["num_sm"] == 40 and p["splits"] == 2 and p["partial"]["key_tile"] == 64


@pytest.mark.parametrize(("gen", "config"), [
    ("v8_gqa", v7_paged.PagedConfig(num_splits=2)),  # per key, one contiguous load per tile
    ("v8_gqa", v7_paged.PagedConfig(num_splits=2, prefetch=True, stage_fp32=False)),
    ("v8_gqa_ss", v7_paged.PagedConfig(num_splits=2, update_keys=32, stage_fp32=False)),
    ("v8_gqa_tc", v8_gqa_tc.TcConfig(num_splits=2)),
])
def test_contiguous_page_path_lowers_for_cuda(gen, config):
    """Page 256 with aligned splits: every load reads one page (the conformance lowering uses page 16, the
    per-key gather). Lowered to Triton for CUDA on this CPU machine."""
    b, hkv, d, pages = 2, 2, 128, 16
    q = jax.ShapeDtypeStruct((b, 1, 8 * hkv, d), jnp.float16)
    pool = jax.ShapeDtypeStruct((b * pages, 256, hkv, d), jnp.float16)
    bt = jax.ShapeDtypeStruct((b, pages), jnp.int32)
    lens = jax.ShapeDtypeStruct((b,), jnp.int32)
    f = jax.jit(lambda q, p, bt, lens: pallas_attn.paged_attention(
        q, p, p, bt, lens, causal=True, generation=gen, config=config, interpret=False, check_block_table=False))
    text = f.trace(q, pool, bt, lens).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") >= 2 and f"pallas_attn_{gen}_partial" in text
