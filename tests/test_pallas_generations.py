"""v1_naive ... v6_splitkv (Pallas, Triton lowering) in interpret mode against the float64 oracle.

What catches an unwritten output element: interpret mode allocates every ``pallas_call`` output filled
with NaN (``test_interpret_mode_poisons_unwritten_outputs`` proves it on this jax), intermediate
buffers included (S, M/L, split partials). Every comparison below first asserts that the whole output is
finite and then compares *every* element to the oracle, so a skipped row, tile, split or tail shows up.

Tolerances follow the precision of what the kernel computes on (DESIGN.md "Testing"): FP32 arithmetic
gets ``1e-5`` plus the FP32 rounding of the scores (which grows with |s|, hence the ``4·eps·max|s|·max|v|``
term that matters only for the large-magnitude inputs); 16-bit operands get 5e-3 (fp16) / 2e-2 (bf16).
Kernels that stage FP32 input as FP16 (v5, v6, like the reference host) are compared with the oracle
run on the same FP16-rounded operands (decision 7).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from pallas_attn import registry
from pallas_attn.kernels import common, v4_fused, v5_wmma, v6_splitkv
from pallas_attn.reference import attention_reference, lse_merge_reference, to_f64

GENS = ("v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv")
FP32_GENS = GENS[:4]
LOWP_GENS = ("v5_wmma", "v6_splitkv")
EPS32 = float(np.finfo(np.float32).eps)


# --- helpers -------------------------------------------------------------------------------------------


def _inputs(rng, *, b, tq, tk, h, d, dtype="float32", q_mul=1.0):
    q = q_mul * rng.standard_normal((b, tq, h, d))
    k = rng.standard_normal((b, tk, h, d))
    v = rng.standard_normal((b, tk, h, d))
    return tuple(jnp.asarray(x.astype(np.float32)).astype(dtype) for x in (q, k, v))


def _staged(gen: str, x):
    """The operands the kernel really multiplies: v5/v6 stage FP32 as FP16 (the reference host's cast)."""
    return x.astype(jnp.float16) if gen in LOWP_GENS and x.dtype == jnp.float32 else x


def _compute_dtype(gen: str, dtype: str) -> str:
    if gen in FP32_GENS:
        return "float32"
    if gen == "v6_splitkv":  # 16-bit staging, FP32 arithmetic: only the output is rounded
        return dtype
    return "float16" if dtype == "float32" else dtype  # v5: 16-bit operands and P


def _check(gen, out, q, k, v, *, causal, scale, q_offset):
    out = np.asarray(out.astype(jnp.float32), dtype=np.float64)
    assert out.shape == q.shape
    assert np.isfinite(out).all(), f"{gen}: {np.size(out) - np.isfinite(out).sum()} non-finite output elements"
    qs, ks, vs = (_staged(gen, x) for x in (q, k, v))
    ref, _ = attention_reference(qs, ks, vs, causal=causal, scale=scale, q_offset=q_offset)
    kind = _compute_dtype(gen, jnp.dtype(q.dtype).name)
    if kind == "float32":
        eff = scale if scale is not None else 1.0 / np.sqrt(q.shape[-1])
        smax = np.abs(np.einsum("bqhd,bkhd->bhqk", to_f64(qs), to_f64(ks))).max() * eff
        atol = 1e-5 + 4 * EPS32 * smax * np.abs(to_f64(vs)).max()
        rtol = 1e-5
    else:
        rtol = atol = {"float16": 5e-3, "bfloat16": 2e-2}[kind]
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=gen)


def _run(gen, q, k, v, *, causal=False, scale=None, q_offset=0, config=None):
    out = pallas_attn.attention(q, k, v, causal=causal, scale=scale, q_offset=q_offset, generation=gen,
                                config=config)
    assert out.dtype == q.dtype
    _check(gen, out, q, k, v, causal=causal, scale=scale, q_offset=q_offset)
    return out


def _default_dtype(gen):
    return "float32" if gen in FP32_GENS else "float16"


# --- the generations against the oracle -----------------------------------------------------------------

# (B, Tq, Tk, H, D, causal, q_offset): odd lengths, Tq != Tk both ways, single element, decode-like causal.
SHAPES = [
    pytest.param((2, 33, 130, 3, 64, False, 0), id="33x130-d64"),
    pytest.param((1, 130, 33, 2, 128, True, 5), id="130x33-d128-causal-off5"),
    pytest.param((1, 1, 1, 1, 64, False, 0), id="1x1"),
    pytest.param((1, 1, 130, 2, 128, True, 129), id="decode-1x130-causal"),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gen", GENS)
def test_generation_matches_oracle(gen, shape, rng):
    b, tq, tk, h, d, causal, q_offset = shape
    q, k, v = _inputs(rng, b=b, tq=tq, tk=tk, h=h, d=d, dtype=_default_dtype(gen))
    _run(gen, q, k, v, causal=causal, q_offset=q_offset)


@pytest.mark.parametrize("gen", GENS)
def test_large_magnitude_and_explicit_scale(gen, rng):
    """Scores with std ~50 (max ~200): exp without max subtraction would overflow FP32 and FP16."""
    q, k, v = _inputs(rng, b=1, tq=33, tk=70, h=2, d=64, dtype=_default_dtype(gen), q_mul=30.0)
    _run(gen, q, k, v, causal=True, q_offset=2, scale=0.2)


@pytest.mark.parametrize("gen", LOWP_GENS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_low_precision_generations_take_every_float_dtype(gen, dtype, rng):
    q, k, v = _inputs(rng, b=1, tq=17, tk=97, h=2, d=128, dtype=dtype)
    _run(gen, q, k, v, causal=True, q_offset=3)


@pytest.mark.parametrize("gen", GENS)
def test_jit_compatible(gen, rng):
    q, k, v = _inputs(rng, b=1, tq=9, tk=40, h=2, d=64, dtype=_default_dtype(gen))
    f = jax.jit(functools.partial(pallas_attn.attention, generation=gen, causal=True, q_offset=1))
    _check(gen, f(q, k, v), q, k, v, causal=True, scale=None, q_offset=1)


def test_v4_without_cond_gives_the_same_result(rng):
    """``skip_idle_rows=False`` (no lax.cond): the fallback if a Triton build rejects scf.if."""
    q, k, v = _inputs(rng, b=1, tq=11, tk=70, h=2, d=64)
    kw = dict(causal=True, scale=0.125, q_offset=0, interpret=True)
    a = v4_fused.forward(q, k, v, config=v4_fused.FusedConfig(skip_idle_rows=False), **kw)
    b = v4_fused.forward(q, k, v, config=v4_fused.CONFIGS["faithful"], **kw)
    _check("v4_fused", a, q, k, v, causal=True, scale=0.125, q_offset=0)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_v5_tuned_config(rng):
    q, k, v = _inputs(rng, b=1, tq=130, tk=200, h=2, d=64, dtype="float16")
    _run("v5_wmma", q, k, v, causal=True, config="tuned")


# --- v6: splits, empty splits, the merge ---------------------------------------------------------------


def test_v6_forced_splits_with_empty_ones(rng):
    """Tk=5 in 4 splits of 2 keys: the last split is empty for every row, and with causal, row 0 sees only
    split 0. Empty splits must write (-FLT_MAX, 0, 0) (unwritten ones would be NaN and poison the merge)."""
    q, k, v = _inputs(rng, b=1, tq=3, tk=5, h=2, d=64, dtype="float16")
    cfg = v6_splitkv.SplitKVConfig(num_splits=4)
    assert cfg.splits(bh=2, n_q=3, n_k=5) == (4, 2)
    for causal in (False, True):
        out = v6_splitkv.forward(q, k, v, causal=causal, scale=0.125, q_offset=0, interpret=True, config=cfg)
        _check("v6_splitkv", out, q, k, v, causal=causal, scale=0.125, q_offset=0)


@pytest.mark.parametrize("config", ["faithful", "reference_sm40"])
def test_v6_decode_ragged_chunks(config, rng):
    """Tq=1, Tk=600: the heuristic gives S=3 splits of 200 keys, which do not align with the 64-key tile."""
    q, k, v = _inputs(rng, b=1, tq=1, tk=600, h=2, d=64, dtype="float16")
    cfg = v6_splitkv.CONFIGS[config]
    assert cfg.splits(bh=2, n_q=1, n_k=600) == (3, 200)
    _run("v6_splitkv", q, k, v, causal=True, q_offset=599, config=config)


@pytest.mark.parametrize(
    ("bh", "n_q", "n_k", "num_sm", "expected"),
    [
        (8, 1, 2048, 40, 8),  # §2.0: v6 B=1, H=8, N_q=1
        (8, 1, 8192, 40, 10),
        (8, 1, 16384, 40, 10),
        (1, 8, 8192, 40, 32),  # v8 G=8, B=1, H_kv=1: 8 packed rows, one row tile
        (1, 128, 8192, 40, 5),  # v11 h_q=128: 16 row tiles
        (1, 128, 8192, 148, 19),  # ... with the B300's 148 SMs (the audit's number)
        (8, 2048, 2048, 40, 1),  # prefill degenerates to S=1
        (8, 1, 100, 40, 1),  # by_size: fewer than 256 keys
    ],
)
def test_choose_splits_reference_examples(bh, n_q, n_k, num_sm, expected):
    s, chunk = common.choose_splits(bh=bh, n_q=n_q, n_k=n_k, num_sm=num_sm)
    assert s == expected
    assert chunk == -(-n_k // s) and (s - 1) * chunk < n_k  # no empty split from the heuristic itself


def test_choose_splits_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_sm"):
        common.choose_splits(bh=1, n_q=1, n_k=10, num_sm=0)


def test_lse_merge_helper_matches_reference():
    """The in-kernel merge, run as plain jnp, against lse_merge_reference (incl. an empty split)."""
    rng = np.random.default_rng(7)
    s_, d = 4, 8
    m = rng.standard_normal(s_).astype(np.float32)
    l = rng.uniform(0.5, 2.0, s_).astype(np.float32)
    o = rng.standard_normal((s_, d)).astype(np.float32)
    m[2], l[2], o[2] = common.NEG_BIG, 0.0, 0.0  # an empty split
    valid = jnp.arange(s_) < s_
    got = np.asarray(common.lse_merge(jnp.asarray(m), jnp.asarray(l), jnp.asarray(o), valid))
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m.astype(np.float64) + np.log(l), -np.inf)
    o_norm = np.where(l[:, None] > 0, o / np.where(l > 0, l, 1)[:, None], 0.0)
    want, _ = lse_merge_reference(o_norm, lse)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    empty = common.lse_merge(jnp.full((2,), common.NEG_BIG), jnp.zeros(2), jnp.zeros((2, d)), jnp.arange(2) < 2)
    assert np.array_equal(np.asarray(empty), np.zeros(d))


# --- the dataflow: passes, names, what lives in HBM, which arithmetic -----------------------------------

EXPECTED_PASSES = {
    "v1_naive": ["qk", "softmax", "pv"],
    "v2_tiled": ["qk", "softmax", "pv"],
    "v3_online": ["stats", "out"],
    "v4_fused": ["fwd"],
    "v5_wmma": ["fwd"],
    "v6_splitkv": ["partial", "merge"],
}


def _walk(jaxpr, fn):
    """Visit every equation of a jaxpr and of every sub-jaxpr (pjit, loops, cond branches, kernels)."""
    for eqn in jaxpr.eqns:
        fn(eqn)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _walk(inner, fn)


def _pallas_calls(gen, *, b=1, tq=5, tk=7, h=2, d=64):
    q = jnp.zeros((b, tq, h, d), _default_dtype(gen))
    k = jnp.zeros((b, tk, h, d), _default_dtype(gen))
    jp = jax.make_jaxpr(functools.partial(pallas_attn.attention, generation=gen, interpret=True))(q, k, k)
    calls = []
    _walk(jp.jaxpr, lambda e: calls.append(e) if e.primitive.name == "pallas_call" else None)
    return calls


def _call_name(eqn) -> str:
    p = eqn.params
    return str(p.get("name") or getattr(p.get("name_and_src_info"), "name", ""))


@pytest.mark.parametrize("gen", GENS)
def test_pallas_calls_are_named_and_counted(gen):
    names = [_call_name(e) for e in _pallas_calls(gen)]
    assert names == [f"pallas_attn_{gen}_{p}" for p in EXPECTED_PASSES[gen]]


def test_hbm_intermediates_are_the_references():
    """v1/v2 materialize S [B*H*Tq, Tk] FP32 and soften it in place; v3 keeps only M, L [B*H, Tq];
    v4/v5 keep nothing; v6 keeps FP32 (O, m, l) per (row, split)."""
    b, tq, tk, h = 1, 5, 7, 2
    for gen in ("v1_naive", "v2_tiled"):
        qk, sm, _ = _pallas_calls(gen, b=b, tq=tq, tk=tk, h=h)
        (s_aval,) = qk.params["out_avals"]
        assert (s_aval.shape, s_aval.dtype) == ((b * h * tq, tk), jnp.float32)
        assert tuple(sm.params["input_output_aliases"]) == ((0, 0),)  # softmax in place
    stats, _ = _pallas_calls("v3_online", b=b, tq=tq, tk=tk, h=h)
    assert [(a.shape, a.dtype) for a in stats.params["out_avals"]] == [((b * h, tq), jnp.float32)] * 2
    part, _ = _pallas_calls("v6_splitkv", b=b, tq=tq, tk=tk, h=h)
    assert all(a.dtype == jnp.float32 for a in part.params["out_avals"])


def _dots(gen):
    found = []

    def visit(e):
        if e.primitive.name == "dot_general":
            found.append((e.params["precision"], tuple(v.aval.dtype for v in e.invars)))

    for call in _pallas_calls(gen):
        _walk(call.params["jaxpr"], visit)
    return found


def test_arithmetic_units_match_the_reference():
    """v1/v4/v6 are CUDA-core GEMV-style (no dot at all); v2/v3 use IEEE-FP32 dots (HIGHEST, no TF32);
    v5 multiplies 16-bit operands (tensor cores)."""
    for gen in ("v1_naive", "v4_fused", "v6_splitkv"):
        assert _dots(gen) == [], gen
    for gen in ("v2_tiled", "v3_online"):
        dots = _dots(gen)
        assert dots and all(jax.lax.Precision.HIGHEST in (p if isinstance(p, tuple) else (p,)) for p, _ in dots)
        assert all(t == (jnp.float32, jnp.float32) for _, t in dots)
    dots = _dots("v5_wmma")
    assert len(dots) == 2 and all(t == (jnp.float16, jnp.float16) for _, t in dots)


def test_interpret_mode_poisons_unwritten_outputs():
    """The premise of every finiteness check above: an element a kernel never stores reads back NaN."""
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[pl.ds(0, 2), :] = x_ref[pl.ds(0, 2), :]

    x = jnp.ones((4, 16), jnp.float32)
    out = np.asarray(pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4, 16), jnp.float32),
                                    interpret=True)(x))
    assert np.array_equal(out[:2], np.ones((2, 16))) and np.isnan(out[2:]).all()


# --- registry, configs and errors -----------------------------------------------------------------------


def test_registry_rows_point_at_these_modules():
    for gen in GENS:
        row = registry.get(gen)
        assert row.pallas == gen and "faithful" in registry.pallas_module(gen).CONFIGS


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


def _arr(shape, dtype="float32"):
    return jnp.zeros(shape, dtype)


Q, KV = (1, 4, 2, 64), (1, 6, 2, 64)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((_arr((4, 2, 64)), _arr(KV), _arr(KV)), {}, r"q must be rank 4"),
        ((_arr(Q), _arr(KV), _arr((1, 7, 2, 64))), {}, r"k and v must have the same shape"),
        ((_arr(Q), _arr((2, 6, 2, 64)), _arr((2, 6, 2, 64))), {}, r"batch size"),
        ((_arr((1, 4, 2, 128)), _arr(KV), _arr(KV)), {}, r"head dim D"),
        ((_arr(Q, "int32"), _arr(KV, "int32"), _arr(KV, "int32")), {}, r"float32, float16 or bfloat16"),
        ((_arr(Q), _arr(KV, "float16"), _arr(KV, "float16")), {}, r"share a dtype"),
        ((_arr(Q), _arr(KV), _arr(KV)), {"generation": "v99_fast"}, r"unknown generation"),
        ((_arr(Q), _arr(KV), _arr(KV)), {"q_offset": -1}, r"q_offset"),
        ((_arr(Q), _arr(KV), _arr(KV)), {"scale": float("nan")}, r"scale"),
        ((_arr(Q), _arr(KV), _arr(KV)), {"generation": "v4_fused", "config": "fastest"}, r"configs"),
    ],
)
def test_api_value_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pallas_attn.attention(*args, **kwargs)


@pytest.mark.parametrize("gen", GENS)
def test_gqa_is_not_implemented_for_mha_generations(gen):
    dt = _default_dtype(gen)
    with pytest.raises(NotImplementedError, match=r"MHA.*fa_decode"):
        pallas_attn.attention(_arr((1, 4, 4, 64), dt), _arr((1, 6, 2, 64), dt), _arr((1, 6, 2, 64), dt),
                              generation=gen)


@pytest.mark.parametrize("gen", FP32_GENS)
def test_fp32_generations_refuse_16_bit_input(gen):
    with pytest.raises(NotImplementedError, match="float32"):
        pallas_attn.attention(_arr(Q, "float16"), _arr(KV, "float16"), _arr(KV, "float16"), generation=gen)


@pytest.mark.parametrize("gen", GENS)
def test_unsupported_head_dim(gen):
    dt = _default_dtype(gen)
    with pytest.raises(NotImplementedError, match="head dims"):
        pallas_attn.attention(_arr((1, 4, 2, 96), dt), _arr((1, 6, 2, 96), dt), _arr((1, 6, 2, 96), dt),
                              generation=gen)


# --- the Triton lowering itself (what interpret mode does not check) ----------------------------------


def _config_ids():
    return [(gen, cfg) for gen in GENS for cfg in registry.pallas_module(gen).CONFIGS]


@pytest.mark.parametrize(("gen", "config"), _config_ids(), ids=lambda x: str(x))
def test_lowers_to_triton_for_cuda(gen, config):
    """Lower every config to Triton IR for the CUDA platform on this CPU-only machine: catches what
    interpret mode lets through (non-power-of-two tensors, dot shapes, unsupported primitives) before the
    GPU run. Triton's own compilation to PTX still happens only on the device."""
    mod = registry.pallas_module(gen)
    dt = _default_dtype(gen)
    for d in (64, 128):
        for tq, tk, causal in ((40, 300, True), (1, 4099, False)):
            q = jax.ShapeDtypeStruct((1, tq, 2, d), dt)
            k = jax.ShapeDtypeStruct((1, tk, 2, d), dt)
            f = jax.jit(functools.partial(mod.forward, causal=causal, scale=0.1, q_offset=0, interpret=False,
                                          config=mod.CONFIGS[config]))
            text = f.trace(q, k, k).lower(lowering_platforms=("cuda",)).as_text()
            assert text.count("xla.gpu.triton") == len(EXPECTED_PASSES[gen])
            for p in EXPECTED_PASSES[gen]:
                assert f"pallas_attn_{gen}_{p}" in text
