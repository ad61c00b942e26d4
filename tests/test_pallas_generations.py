"""v1_naive ... v6_splitkv (Pallas, Triton lowering): each kernel's dataflow, in interpret mode on the CPU.

``tests/test_conformance.py`` checks every generation against the float64 oracle over the declared dtypes and
shapes. This file keeps what is particular to these six kernels:

* which ``pallas_call``s run (their names are ``KERNEL.passes``), what each writes to HBM (S, M/L, split
  states; the LSE only with ``return_lse``), which arithmetic unit each product uses, v4's ``lax.cond``,
  v6's forced / empty splits, ragged chunks and split plans, v1/v2's tile configs, and that every config
  lowers to Triton IR for CUDA;
* the calling convention: ``q_offset`` is a traced int32 ``[B]`` (one compile serves every offset, per
  sequence, negative included: a row with no visible key gives 0 and LSE -inf), ``return_lse`` against the
  oracle's LSE, and NaN in q, k or v reaching the outputs that depend on it.

Interpret mode fills every ``pallas_call`` output with NaN (``test_interpret_mode_poisons_unwritten_outputs``),
so an element a kernel forgets to write fails the finiteness checks below.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_core.oracle import attention_reference, to_f64
from pallas_attn.kernels import v1_naive, v2_tiled, v4_fused, v5_wmma, v6_splitkv
from pallas_attn.kernels.contract import Kernel, Problem

GENS = ("v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv")
FP32_GENS = GENS[:4]
LOWP_GENS = ("v5_wmma", "v6_splitkv")
MODS = {gen: importlib.import_module(f"pallas_attn.kernels.{gen}") for gen in GENS}
EPS32 = float(np.finfo(np.float32).eps)
SCALE = 0.125


# --- helpers -------------------------------------------------------------------------------------------


def _dtype(gen: str) -> str:
    return "float32" if gen in FP32_GENS else "float16"


def _inputs(rng, *, b, tq, tk, h, d, dtype):
    return tuple(jnp.asarray(rng.standard_normal(s).astype(np.float32)).astype(dtype)
                 for s in ((b, tq, h, d), (b, tk, h, d), (b, tk, h, d)))


def _staged(gen: str, x):
    """The operands the kernel really multiplies: v5/v6 stage FP32 as FP16 (the reference host's cast)."""
    return x.astype(jnp.float16) if gen in LOWP_GENS and x.dtype == jnp.float32 else x


def _tolerance(gen: str, qs, ks, vs, dtype: str) -> tuple[float, float]:
    kind = "float32" if gen in FP32_GENS else dtype
    if gen == "v5_wmma" and dtype == "float32":
        kind = "float16"  # P is rounded to the fp16 operand dtype
    if kind == "float32":
        smax = np.abs(np.einsum("bqhd,bkhd->bhqk", to_f64(qs), to_f64(ks))).max() * SCALE
        return 1e-5, 1e-5 + 4 * EPS32 * smax * np.abs(to_f64(vs)).max()
    r = {"float16": 5e-3, "bfloat16": 2e-2}[kind]
    return r, r


def _forward(gen, q, k, v, *, causal, q_offset, config="faithful", return_lse=False):
    mod = MODS[gen]
    cfg = mod.CONFIGS[config] if isinstance(config, str) else config
    return mod.forward(q, k, v, causal=causal, scale=SCALE, q_offset=q_offset, interpret=True, config=cfg,
                       return_lse=return_lse)


@functools.cache
def _jitted(gen, *, causal, config, return_lse):
    """A user's ``jax.jit`` around the kernel with the offsets as a traced argument, shared by the tests
    that use the same shapes (interpret-mode compiles dominate this file's time). Returns the function and
    the list of offset shapes it was traced for."""
    traces = []

    def f(q, k, v, off):
        traces.append(tuple(off.shape))
        return _forward(gen, q, k, v, causal=causal, q_offset=off, config=config, return_lse=return_lse)

    return jax.jit(f), traces


# v6 with several splits wherever a test does not pick its config (the faithful plan gives S=1 at these Tk)
_SPLIT_CFG = {"v6_splitkv": v6_splitkv.SplitKVConfig(num_splits=3)}
# the shapes of the per-sequence-offset test, reused by the NaN and v4-cond tests
BSEQ = dict(b=2, tq=11, tk=70, h=2, d=64)


def _check(gen, out, q, k, v, *, causal, q_offset, lse=None):
    """Every output element (and the LSE) against the oracle; rows with no visible key exactly 0 / -inf."""
    b, tq, h, _ = q.shape
    got = np.asarray(out.astype(jnp.float32), dtype=np.float64)
    assert out.dtype == q.dtype and got.shape == q.shape
    assert np.isfinite(got).all(), f"{gen}: {got.size - np.isfinite(got).sum()} non-finite output elements"
    qs, ks, vs = (_staged(gen, x) for x in (q, k, v))
    offs = np.broadcast_to(np.asarray(q_offset, np.int64), (b,))
    ref, ref_lse = attention_reference(qs, ks, vs, causal=causal, scale=SCALE, q_offset=offs)
    rtol, atol = _tolerance(gen, qs, ks, vs, jnp.dtype(q.dtype).name)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=gen)
    empty = np.isneginf(ref_lse)  # [B, H, Tq]: rows that see no key
    assert np.all(got.transpose(0, 2, 1, 3)[empty] == 0.0), f"{gen}: a row with no visible key is not 0"
    if lse is not None:
        got_lse = np.asarray(lse)
        assert lse.dtype == jnp.float32 and got_lse.shape == (b, h, tq)
        assert np.array_equal(np.isneginf(got_lse), empty), f"{gen}: LSE -inf rows differ from the oracle's"
        assert np.isfinite(got_lse[~empty]).all()
        np.testing.assert_allclose(got_lse[~empty], ref_lse[~empty], rtol=1e-5, atol=2e-5, err_msg=f"{gen} lse")


# --- the calling convention: traced offsets, LSE, negative offsets, NaN --------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("gen", GENS)
def test_smoke_scalar_traced_offset_d128(gen, rng):
    """A smoke check per generation at D=128, causal, with a traced int32 scalar offset under the caller's
    ``jax.jit`` (one compile for two values) and ``return_lse=False`` (the output alone)."""
    q, k, v = _inputs(rng, b=1, tq=11, tk=37, h=2, d=128, dtype=_dtype(gen))
    f, traces = _jitted(gen, causal=True, config="faithful", return_lse=False)
    for off in (2, -3):
        out = f(q, k, v, jnp.int32(off))
        _check(gen, out, q, k, v, causal=True, q_offset=off)
    assert traces == [()]


@pytest.mark.slow
@pytest.mark.parametrize("gen", GENS)
def test_per_sequence_offsets_and_lse_under_jit(gen, rng):
    """Per-sequence int32 [B] offsets, different per batch, under the caller's ``jax.jit``: one compile
    serves every value. Negative offsets hide every key from the first rows (output 0, LSE -inf);
    ``return_lse`` is compared with the oracle's natural-log LSE."""
    q, k, v = _inputs(rng, dtype=_dtype(gen), **BSEQ)
    f, traces = _jitted(gen, causal=True, config=_SPLIT_CFG.get(gen, "faithful"), return_lse=True)
    for off in ([4, -5], [-12, 60], [0, 69]):
        out, lse = f(q, k, v, jnp.array(off, jnp.int32))
        _check(gen, out, q, k, v, causal=True, q_offset=np.array(off), lse=lse)
    assert traces.count((2,)) == 1


@pytest.mark.parametrize("gen", GENS)
def test_nan_propagates_to_the_outputs_that_see_it(gen, rng):
    """NaN in q, k or v is never turned into 0 (nor the LSE into -inf). One call, three independent
    (batch, head) slices: q NaN at (b0, row 4, h0); k NaN at (b1, key 5, h0); v NaN at (b1, key 5, h1).
    Causal, offsets [0, 2]: row i of b1 sees key 5 iff i >= 3. A NaN in v may also reach rows that give its
    key weight 0 (0 * NaN, as in the oracle's p @ V), so for v only the rows that see it are asserted."""
    q, k, v = (np.array(x, np.float32) for x in _inputs(rng, dtype="float32", **BSEQ))
    q[0, 4, 0, 3] = np.nan
    k[1, 5, 0, 7] = np.nan
    v[1, 5, 1, 7] = np.nan
    f, _ = _jitted(gen, causal=True, config=_SPLIT_CFG.get(gen, "faithful"), return_lse=True)
    out, lse = f(*(jnp.asarray(x).astype(_dtype(gen)) for x in (q, k, v)), jnp.array([0, 2], jnp.int32))
    o_nan = np.isnan(np.asarray(out.astype(jnp.float32))).any(-1)  # [B, Tq, H]
    l_nan = np.isnan(np.asarray(lse))  # [B, H, Tq]
    tq = BSEQ["tq"]
    sees = np.arange(tq) >= 3
    want = np.arange(tq) == 4
    assert np.array_equal(o_nan[0, :, 0], want) and np.array_equal(l_nan[0, 0], want), "q"
    assert not o_nan[0, :, 1].any() and not l_nan[0, 1].any()
    assert np.array_equal(o_nan[1, :, 0], sees) and np.array_equal(l_nan[1, 0], sees), "k"
    assert o_nan[1, sees, 1].all() and not l_nan[1, 1].any(), "v"


# --- the dataflow: passes, names, what lives in HBM, which arithmetic -----------------------------------


def _walk(jaxpr, fn):
    """Visit every equation of a jaxpr and of every sub-jaxpr (pjit, loops, cond branches, kernels)."""
    for eqn in jaxpr.eqns:
        fn(eqn)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _walk(inner, fn)


def _jaxpr(gen, *, b=1, tq=5, tk=7, h=2, d=64, config="faithful", return_lse=False, causal=True):
    q = jnp.zeros((b, tq, h, d), _dtype(gen))
    k = jnp.zeros((b, tk, h, d), _dtype(gen))
    f = functools.partial(_forward, gen, causal=causal, config=config, return_lse=return_lse)
    return jax.make_jaxpr(lambda q, k, v, off: f(q, k, v, q_offset=off))(q, k, k, jnp.zeros((b,), jnp.int32))


def _pallas_calls(gen, **kw):
    calls = []
    _walk(_jaxpr(gen, **kw).jaxpr, lambda e: calls.append(e) if e.primitive.name == "pallas_call" else None)
    return calls


def _call_name(eqn) -> str:
    p = eqn.params
    return str(p.get("name") or getattr(p.get("name_and_src_info"), "name", ""))


def _outs(eqn):
    return [(tuple(a.shape), jnp.dtype(a.dtype).name) for a in eqn.params["out_avals"]]


@pytest.mark.parametrize("gen", GENS)
def test_pallas_calls_are_the_declared_passes(gen):
    kernel = MODS[gen].KERNEL
    assert isinstance(kernel, Kernel) and kernel.dense is MODS[gen].forward
    for return_lse in (False, True):
        assert tuple(_call_name(e) for e in _pallas_calls(gen, return_lse=return_lse)) == kernel.passes


def test_hbm_outputs_per_pass():
    """What each pass writes: the reference's buffers, plus the FP32 LSE only with ``return_lse``.
    v1/v2: S [B*H*Tq, Tk] FP32, softened in place; v3: M, L [B*H, Tq]; v4/v5: O only; v6: the split state,
    normalized O [B*H, Tq*S, D] and LSE [B*H, Tq*S] (D + 1 floats per row and split)."""
    b, tq, tk, h, d = 1, 5, 7, 2, 64
    bh, o = b * h, ((b, tq, h, d), "float32")
    for gen in ("v1_naive", "v2_tiled"):
        for lse in (False, True):
            qk, sm, pv = _pallas_calls(gen, return_lse=lse)
            assert _outs(qk) == [((bh * tq, tk), "float32")]
            assert _outs(sm) == [((bh * tq, tk), "float32")] + [((bh * tq,), "float32")] * lse
            assert tuple(sm.params["input_output_aliases"]) == ((1, 0),)  # S in place (input 0: offsets)
            assert _outs(pv) == [o]
    for lse in (False, True):
        stats, out = _pallas_calls("v3_online", return_lse=lse)
        assert _outs(stats) == [((bh, tq), "float32")] * 2
        assert _outs(out) == [o] + [((bh, tq), "float32")] * lse
        for gen in ("v4_fused", "v5_wmma"):
            (fwd,) = _pallas_calls(gen, return_lse=lse)
            assert _outs(fwd) == [(o[0], _dtype(gen))] + [((bh, tq), "float32")] * lse
        cfg = v6_splitkv.SplitKVConfig(num_splits=3)
        part, merge = _pallas_calls("v6_splitkv", return_lse=lse, config=cfg)
        assert _outs(part) == [((bh, tq * 3, d), "float32"), ((bh, tq * 3), "float32")]
        assert _outs(merge) == [((b * tq * h, d), "float16")] + [((bh * tq,), "float32")] * lse


@pytest.mark.parametrize("gen", GENS)
def test_btnh_in_place_no_transpose(gen):
    """Every kernel reads BTNH through BlockSpecs and v6's merge writes BTNH rows directly: no transpose
    (or any copy but free reshapes and v5/v6's fp32 -> fp16 staging cast) runs outside the kernels."""
    prims = set()

    def visit(e):
        prims.add(e.primitive.name)

    for lse in (False, True):
        jp = _jaxpr(gen, return_lse=lse, b=2, config=v6_splitkv.SplitKVConfig(num_splits=2)
                    if gen == "v6_splitkv" else "faithful")
        for e in jp.jaxpr.eqns:
            inner = e.params.get("jaxpr")
            for e2 in (getattr(inner, "jaxpr", inner).eqns if e.primitive.name in ("pjit", "jit") else [e]):
                visit(e2)
    assert "transpose" not in prims
    assert prims <= {"pallas_call", "reshape", "broadcast_in_dim", "convert_element_type", "pjit", "jit"}, prims


def _dots(gen):
    found = []

    def visit(e):
        if e.primitive.name == "dot_general":
            found.append((e.params["precision"], tuple(jnp.dtype(v.aval.dtype).name for v in e.invars)))

    for call in _pallas_calls(gen):
        _walk(call.params["jaxpr"], visit)
    return found


def test_arithmetic_units_match_the_declared_precision():
    """v1/v4/v6 are CUDA-core GEMV-style (no dot at all); v2/v3 use IEEE-FP32 dots (HIGHEST, no TF32);
    v5 multiplies 16-bit operands (tensor cores), also for FP32 input (the declared fp16 cast)."""
    for gen in ("v1_naive", "v4_fused", "v6_splitkv"):
        assert _dots(gen) == [], gen
        assert MODS[gen].KERNEL.precision_for(_dtype(gen)).engine == "fp32"
    for gen in ("v2_tiled", "v3_online"):
        dots = _dots(gen)
        assert dots and all(jax.lax.Precision.HIGHEST in (p if isinstance(p, tuple) else (p,)) for p, _ in dots)
        assert all(t == ("float32", "float32") for _, t in dots)
    dots = _dots("v5_wmma")
    assert len(dots) == 2 and all(t == ("float16", "float16") for _, t in dots)
    for dtype, operand in (("float16", "fp16"), ("bfloat16", "bf16")):
        for gen in LOWP_GENS:
            prec = MODS[gen].KERNEL.precision_for(dtype)
            assert prec.operand == operand and prec.accumulate == "fp32"
            assert prec.engine == ("tensor" if gen == "v5_wmma" else "fp32")
            assert "host_cast=True" in prec.note  # fp32 is refused unless the config asks for the host cast
    for gen in LOWP_GENS:
        assert MODS[gen].KERNEL.dtypes == ("float16", "bfloat16")
    for gen in FP32_GENS:
        assert MODS[gen].KERNEL.dtypes == ("float32",)
        assert MODS[gen].KERNEL.precision_for("float32").operand == "fp32"


@pytest.mark.parametrize("gen", FP32_GENS)
def test_fp32_generations_refuse_16_bit_input(gen):
    x = jnp.zeros((1, 4, 2, 64), jnp.float16)
    with pytest.raises(NotImplementedError, match="float32"):
        _forward(gen, x, x, x, causal=False, q_offset=jnp.zeros((1,), jnp.int32))


def test_interpret_mode_poisons_unwritten_outputs():
    """The premise of every finiteness check above: an element a kernel never stores reads back NaN."""
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[pl.ds(0, 2), :] = x_ref[pl.ds(0, 2), :]

    x = jnp.ones((4, 16), jnp.float32)
    out = np.asarray(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4, 16), jnp.float32),
                                    interpret=True)(x))
    assert np.array_equal(out[:2], np.ones((2, 16))) and np.isnan(out[2:]).all()


# --- v1/v2: tiles and plans ----------------------------------------------------------------------------


def _problem(*, b=1, tq=2048, tk=2048, h=8, d=64, dtype="float32"):
    return Problem(entry="dense", dtype=dtype, batch=b, q_len=tq, kv_len=tk, heads_q=h, heads_kv=h, head_dim=d)


def test_v1_v2_tiles_and_plans():
    """What the roofline charges for S: v1 no reuse (1, 1); v2 the reference's TM = TN = 64 (D=64) / 32."""
    v1, v2 = v1_naive.KERNEL, v2_tiled.KERNEL
    assert v1.materializes_s and v2.materializes_s
    assert v1.roofline(_problem()).tile == (1, 1)
    assert v2.roofline(_problem(d=64)).tile == (64, 64) and v2.roofline(_problem(d=128)).tile == (32, 32)
    p1 = v1.plan(_problem(), v1.configs["faithful"])
    assert p1["qk"]["grid"] == [8, 2048, 8] and p1["softmax"]["grid"] == [64] and p1["pv"]["grid"] == [2048, 8]
    assert p1["pv"]["num_warps"] == 2
    p2 = v2.plan(_problem(d=128), v2.configs["faithful"])
    assert p2["tile"] == 32 and p2["qk"]["grid"] == [64, 64, 8] and p2["pv"]["grid"] == [64, 8]


@pytest.mark.parametrize(
    ("gen", "config"),
    [
        # softmax programs of 8 flattened rows that straddle (head, sequence) boundaries, 16-column sweeps
        ("v1_naive", v1_naive.NaiveConfig(qk_keys=16, softmax_rows=8, softmax_cols=16, pv_keys=16)),
        ("v2_tiled", v2_tiled.TiledConfig(tile_d64=16, softmax=v1_naive.NaiveConfig(softmax_rows=16))),
    ],
    ids=["v1-small", "v2-small"],
)
def test_v1_v2_small_tiles(gen, config, rng):
    q, k, v = _inputs(rng, b=2, tq=7, tk=37, h=2, d=64, dtype="float32")
    off = jnp.array([20, -3], jnp.int32)
    out, lse = _forward(gen, q, k, v, causal=True, q_offset=off, config=config, return_lse=True)
    _check(gen, out, q, k, v, causal=True, q_offset=np.asarray(off), lse=lse)


# --- v4: the idle-row cond ------------------------------------------------------------------------------


def _has_cond(gen, config):
    found = []
    for call in _pallas_calls(gen, config=config):
        _walk(call.params["jaxpr"], lambda e: found.append(e) if e.primitive.name == "cond" else None)
    return bool(found)


def test_v4_with_and_without_cond(rng):
    """``skip_idle_rows=False`` (no lax.cond): the fallback if a Triton build rejects scf.if; same result."""
    no_cond = v4_fused.FusedConfig(skip_idle_rows=False)
    assert _has_cond("v4_fused", "faithful") and not _has_cond("v4_fused", no_cond)
    q, k, v = _inputs(rng, dtype="float32", **BSEQ)
    off = jnp.array([0, -4], jnp.int32)
    a, la = _jitted("v4_fused", causal=True, config=no_cond, return_lse=True)[0](q, k, v, off)
    b, lb = _jitted("v4_fused", causal=True, config="faithful", return_lse=True)[0](q, k, v, off)
    _check("v4_fused", a, q, k, v, causal=True, q_offset=np.asarray(off), lse=la)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(la), np.asarray(lb), rtol=1e-6, atol=1e-6)


def test_v5_tuned_config(rng):
    q, k, v = _inputs(rng, b=1, tq=130, tk=75, h=1, d=64, dtype="float16")
    out, lse = _forward("v5_wmma", q, k, v, causal=True, q_offset=jnp.array([-60], jnp.int32), config="tuned",
                        return_lse=True)
    _check("v5_wmma", out, q, k, v, causal=True, q_offset=-60, lse=lse)


# --- v6: splits, empty splits, plans --------------------------------------------------------------------


@pytest.mark.slow
def test_v6_forced_splits_with_empty_ones(rng):
    """Tk=5 in 4 splits of 2 keys: the last split is empty for every row, and with causal, row 0 sees only
    split 0. An empty split must write (O = 0, LSE = -inf): an unwritten one would be NaN and poison the
    merge. Also FP32 input (staged fp16 when the config asks for the host cast) and bf16."""
    cfg = v6_splitkv.SplitKVConfig(num_splits=4, host_cast=True)
    assert cfg.splits(bh=2, n_q=3, n_k=5) == (4, 2)
    for dtype, causal in (("float16", False), ("float32", True), ("bfloat16", True)):
        q, k, v = _inputs(rng, b=1, tq=3, tk=5, h=2, d=64, dtype=dtype)
        out, lse = _forward("v6_splitkv", q, k, v, causal=causal, q_offset=jnp.zeros((1,), jnp.int32),
                            config=cfg, return_lse=True)
        _check("v6_splitkv", out, q, k, v, causal=causal, q_offset=0, lse=lse)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["faithful", "reference_sm40"])
def test_v6_decode_ragged_chunks(config, rng):
    """Tq=1, Tk=600: S=3 splits of 200 keys, not aligned with the 64-key tile; per-sequence decode offsets
    (the query on the last key, and one sequence that sees only the first 250 keys: splits 2 is empty)."""
    q, k, v = _inputs(rng, b=2, tq=1, tk=600, h=1, d=64, dtype="float16")
    cfg = v6_splitkv.CONFIGS[config]
    assert cfg.splits(bh=2, n_q=1, n_k=600) == (3, 200)
    off = jnp.array([599, 249], jnp.int32)
    out, lse = _forward("v6_splitkv", q, k, v, causal=True, q_offset=off, config=config, return_lse=True)
    _check("v6_splitkv", out, q, k, v, causal=True, q_offset=np.asarray(off), lse=lse)


def test_v6_plans():
    """The reference's T4 plan (40 SMs) and the device plan (132 SMs on a CPU-only machine: an H100/H200)."""
    kern = v6_splitkv.KERNEL
    p = kern.plan(_problem(tq=1, tk=8192, d=128, dtype="float16"), kern.configs["reference_sm40"])
    assert (p["splits"], p["chunk"], p["num_sm"]) == (10, 820, 40)
    assert p["partial"]["grid"] == [1, 10, 8] and p["merge"]["grid"] == [8]
    assert p["workspace_floats_per_row_split"] == 129  # D + 1: normalized O and the LSE
    p = kern.plan(_problem(tq=1, tk=8192, d=128, dtype="float16"), v6_splitkv.SplitKVConfig(num_sm=132))
    assert (p["splits"], p["chunk"]) == (32, 256)
    p = kern.plan(_problem(tq=2048, tk=2048, dtype="float16"), kern.configs["reference_sm40"])
    assert p["splits"] == 1  # prefill degenerates to one split


# --- configs and the Triton lowering --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: v5_wmma.WmmaConfig(block_n_d64=8), "block_n_d64"),  # tensor-core dot needs >= 16
        (lambda: v5_wmma.WmmaConfig(block_m_d128=48), "block_m_d128"),  # not a power of two
        (lambda: v4_fused.FusedConfig(rows=3), "rows"),
        (lambda: v6_splitkv.SplitKVConfig(num_sm=0), "num_sm"),
        (lambda: v6_splitkv.SplitKVConfig(fp32_stage_dtype="float8"), "fp32_stage_dtype"),
    ],
)
def test_bad_configs_raise(factory, match):
    with pytest.raises(ValueError, match=match):
        factory()


def _config_ids():
    return [(gen, cfg) for gen in GENS for cfg in MODS[gen].CONFIGS]


@pytest.mark.slow
@pytest.mark.parametrize(("gen", "config"), _config_ids(), ids=lambda x: str(x))
def test_lowers_to_triton_for_cuda(gen, config):
    """Lower every config to Triton IR for the CUDA platform on this CPU-only machine: catches what
    interpret mode lets through (non-power-of-two tensors, dot shapes, unsupported primitives, the offset
    gather of v1's softmax) before the GPU run. Triton's own compilation to PTX happens on the device."""
    mod = MODS[gen]
    dt = _dtype(gen)
    for d in (64, 128):
        for tq, tk, causal in ((40, 300, True), (1, 4099, False)):
            q = jax.ShapeDtypeStruct((3, tq, 2, d), dt)
            k = jax.ShapeDtypeStruct((3, tk, 2, d), dt)
            off = jax.ShapeDtypeStruct((3,), jnp.int32)
            f = jax.jit(functools.partial(mod.forward, causal=causal, scale=0.1, interpret=False,
                                          config=mod.CONFIGS[config], return_lse=causal))
            text = f.trace(q, k, k, q_offset=off).lower(lowering_platforms=("cuda",)).as_text()
            assert text.count("xla.gpu.triton") == len(mod.KERNEL.passes)
            for name in mod.KERNEL.passes:
                assert name in text
