"""One conformance base for every built Pallas generation, parametrized over the table (DESIGN.md: testing).

For each row of ``pallas_attn.registry`` x each dtype its kernel declares x each shape its kernel supports
(``Kernel.supports``), the public entry is compared with the float64 oracle (``attn_core.oracle``) on output
and log-sum-exp. Nothing here names a generation: a new row is tested by being in the table.

* tolerance comes from the kernel's declared precision (operand fp32 on CUDA cores ~1e-5 relative; 16-bit
  operands 1e-2 / 2e-2), never from the generation id;
* outputs are poisoned: interpret mode fills every pallas_call output with NaN before the kernel runs, so an
  element a kernel forgets to write fails the finiteness check; NaN never passes on finite inputs;
* NaN in -> NaN out: a NaN in one query row makes exactly that row's output NaN.

Per-kernel tests (``test_pallas_generations.py``, ``test_fa_decode.py``) keep only each kernel's dataflow
delta: its passes, what lives in HBM, its configs and plans.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from attn_core.paging import build_paged_kv
from pallas_attn import api, registry

# relative L2 error bound by declared operand precision (fp32 on CUDA cores is near 1e-7 here)
TOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 2e-2}

# (B, Tq, Hq, Hkv, D, Tk, causal, q_offset): small and awkward (odd lengths, Tq != Tk, G in {1, 3, 8}).
DENSE = [
    (1, 33, 2, 2, 64, 47, False, 0),
    (2, 17, 2, 2, 128, 17, True, 0),
    (1, 9, 2, 2, 64, 70, True, [61]),  # prefill chunk at the end of a cache
    (2, 1, 3, 3, 64, 130, False, 0),  # decode, MHA
    (2, 1, 6, 2, 64, 90, True, [89, 40]),  # decode, G = 3, per-sequence offsets
    (1, 4, 8, 1, 128, 50, True, [46]),  # G = 8, Tq = 4
]
# (B, Tq, Hq, Hkv, D, kv_lens, page, causal)
PAGED = [
    (3, 1, 8, 2, 64, [37, 1, 64], 8, False),
    (2, 4, 6, 2, 128, [23, 50], 16, True),
    (2, 1, 4, 4, 64, [0, 9], 8, False),  # an empty sequence: output 0, LSE -inf
]


def _rows(entry: str):
    out = []
    for r in registry.rows():
        if entry not in registry.get(r.generation).entries:
            continue
        k = registry.kernel(r.generation)
        for dt in k.dtypes:
            out.append(pytest.param(r.generation, dt, id=f"{r.generation}-{dt}"))
    return out


def _tol(gen: str, dtype: str) -> float:
    return TOL[registry.kernel(gen).precision_for(dtype).operand]


def _arr(rng, shape, dtype, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype=jnp.dtype(dtype))


def _check(out, lse, ref_o, ref_lse, tol, *, shape):
    o = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert o.shape == shape, (o.shape, shape)
    assert np.all(np.isfinite(o)), "non-finite output: an unwritten (poisoned) element, or NaN from finite inputs"
    err = np.linalg.norm(o - ref_o) / max(np.linalg.norm(ref_o), 1e-30)
    assert err < tol, f"relative L2 error {err:.2e} >= {tol:.0e}"
    l = np.asarray(lse, np.float64)
    assert l.shape == ref_lse.shape and l.dtype == np.float64
    assert np.array_equal(np.isneginf(l), np.isneginf(ref_lse)), "LSE -inf rows differ from the oracle's"
    fin = np.isfinite(ref_lse)
    assert np.all(np.isfinite(l[fin])), "NaN/inf LSE where the oracle's is finite"
    np.testing.assert_allclose(l[fin], ref_lse[fin], atol=max(tol, 1e-5) * 4, rtol=0)


def _supported(gen, problem) -> bool:
    ok, _ = registry.kernel(gen).supports(problem)
    return ok


@pytest.mark.slow
@pytest.mark.parametrize("gen,dtype", _rows("dense"))
def test_dense_matches_oracle(rng, gen, dtype):
    ran = 0
    for b, tq, hq, hkv, d, tk, causal, off in DENSE:
        q, k, v = _arr(rng, (b, tq, hq, d), dtype), _arr(rng, (b, tk, hkv, d), dtype), _arr(rng, (b, tk, hkv, d), dtype)
        if not _supported(gen, api.problem_dense(q, k, causal=causal)):
            continue
        q_offset = jnp.asarray(off, jnp.int32) if isinstance(off, list) else off
        out, lse = pallas_attn.attention(q, k, v, causal=causal, q_offset=q_offset, generation=gen, interpret=True,
                                         return_lse=True)
        assert out.dtype == q.dtype
        ref_o, ref_lse = oracle.attention_reference(q, k, v, causal=causal, q_offset=np.asarray(off))
        _check(out, lse, ref_o, ref_lse, _tol(gen, dtype), shape=q.shape)
        ran += 1
    assert ran, f"{gen} supports none of the dense conformance shapes for {dtype}"


@pytest.mark.slow
@pytest.mark.parametrize("gen,dtype", _rows("paged"))
def test_paged_matches_oracle(rng, gen, dtype):
    ran = 0
    for b, tq, hq, hkv, d, lens, page, causal in PAGED:
        tk = max(lens)
        q, k, v = _arr(rng, (b, tq, hq, d), dtype), _arr(rng, (b, tk, hkv, d), dtype), _arr(rng, (b, tk, hkv, d), dtype)
        kp, vp, bt = build_paged_kv(k, v, page, seed=int(rng.integers(1 << 30)), kv_lens=lens)
        kp, vp, bt = jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt)
        if not _supported(gen, api.problem_paged(q, kp, bt, causal=causal)):
            continue
        lens = np.asarray(lens, np.int32)
        out, lse = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), causal=causal, generation=gen,
                                               interpret=True, return_lse=True)
        # The oracle on the same bytes, with the paged default offset kv_len - Tq.
        ref_o = np.zeros(q.shape)
        ref_lse = np.full((b, hq, tq), -np.inf)
        live = np.nonzero(lens > 0)[0]
        ref_o[live], ref_lse[live] = oracle.paged_attention_reference(q[live], kp, vp, bt[live], lens[live],
                                                                      causal=causal)
        _check(out, lse, ref_o, ref_lse, _tol(gen, dtype), shape=q.shape)
        ran += 1
    assert ran, f"{gen} supports none of the paged conformance shapes for {dtype}"


@pytest.mark.slow
@pytest.mark.parametrize("gen,dtype", _rows("dense"))
def test_dense_under_jit_with_traced_offset_and_default_outputs(rng, gen, dtype):
    """The cache position as data: one compile serves every offset; return_lse=False returns the array alone."""
    b, tq, hq, hkv, d, tk = 2, 2, 4, 4, 64, 40
    q, k, v = _arr(rng, (b, tq, hq, d), dtype), _arr(rng, (b, tk, hkv, d), dtype), _arr(rng, (b, tk, hkv, d), dtype)
    ok, why = registry.kernel(gen).supports(api.problem_dense(q, k, causal=True))
    if not ok:
        pytest.skip(f"{gen} does not take this shape: {why}")
    f = jax.jit(lambda q, k, v, off: pallas_attn.attention(q, k, v, causal=True, q_offset=off, generation=gen,
                                                           interpret=True))
    for off in (np.int32(3), np.asarray([0, 30], np.int32)):
        out = f(q, k, v, jnp.asarray(off))
        ref_o, _ = oracle.attention_reference(q, k, v, causal=True, q_offset=off)
        o = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
        assert np.all(np.isfinite(o))
        assert np.linalg.norm(o - ref_o) / np.linalg.norm(ref_o) < _tol(gen, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("gen,dtype", _rows("dense"))
def test_nan_in_is_nan_out(rng, gen, dtype):
    b, tq, hq, hkv, d, tk = 1, 2, 2, 2, 64, 24
    q, k, v = _arr(rng, (b, tq, hq, d), dtype), _arr(rng, (b, tk, hkv, d), dtype), _arr(rng, (b, tk, hkv, d), dtype)
    if not _supported(gen, api.problem_dense(q, k, causal=False)):
        pytest.skip("shape not supported")
    q = q.at[0, 1, 0, 5].set(jnp.nan)  # query row (t=1, h=0) is NaN
    out = np.asarray(jnp.asarray(pallas_attn.attention(q, k, v, generation=gen, interpret=True), jnp.float32))
    assert np.all(np.isnan(out[0, 1, 0])), "a NaN query row must give a NaN output row"
    others = np.delete(out.reshape(tq * hq, d), 1 * hq + 0, axis=0)
    assert np.all(np.isfinite(others)), "NaN leaked into rows that never saw it"


def test_every_row_declares_a_consistent_contract():
    for r in registry.rows():
        k = registry.kernel(r.generation)
        gen = registry.get(r.generation)
        assert gen.entries <= k.entries, (r.generation, gen.entries, k.entries)
        assert k.lowering in ("triton", "mosaic-gpu")
        names = registry.configs(r.generation)
        assert ("default" in names) if gen.frontier else ("faithful" in names), (r.generation, list(names))
        for dt in k.dtypes:
            assert k.precision_for(dt).operand in TOL


def test_the_declared_backward_is_what_jax_grad_sees(rng):
    """A kernel declares its backward (``Kernel.backward``) and the public functions whose jax.grad runs it; the
    ``attention`` entry differentiates exactly the kernels that declare it there and refuses every other by name:
    fa_train differentiates, v4_fused (no backward) and fa_prefill (its backward serves the drop-in only) raise."""
    declared = {r.generation for r in registry.rows() if registry.built(r.generation)
                and registry.kernel(r.generation).differentiates("attention")}
    assert declared == {"fa_train"}, declared
    assert registry.kernel("fa_prefill").backward.entries == {"dot_product_attention"}
    q = _arr(rng, (1, 8, 2, 64), "float32")
    g = jax.grad(lambda q: pallas_attn.attention(q, q, q, generation="fa_train", interpret=True).sum())(q)
    assert np.all(np.isfinite(np.asarray(g)))
    with pytest.raises(NotImplementedError, match="'v4_fused' has no backward kernel"):
        jax.grad(lambda q: pallas_attn.attention(q, q, q, generation="v4_fused", interpret=True).sum())(q)
    q16 = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.float16)
    with pytest.raises(NotImplementedError, match="'fa_prefill' has no backward kernel"):
        jax.eval_shape(jax.grad(lambda q: pallas_attn.attention(q, q, q, generation="fa_prefill", interpret=True)
                                .astype(jnp.float32).sum()), q16)


def test_unknown_and_unbuilt_generations_are_clear_errors(rng):
    q = _arr(rng, (1, 4, 2, 64), "float32")
    with pytest.raises(ValueError, match="unknown generation"):
        pallas_attn.attention(q, q, q, generation="v99")
    unbuilt = [g for g in registry.ids() if not registry.built(g) and "dense" in registry.get(g).entries]
    for g in unbuilt:
        with pytest.raises(NotImplementedError, match="not built"):
            pallas_attn.attention(q, q, q, generation=g)
    with pytest.raises(ValueError, match="serves"):
        pallas_attn.attention(q, q, q, generation="v7_paged")


@pytest.mark.parametrize("bad,match", [
    (dict(q_offset=1.5), "q_offset"), (dict(q_offset=True), "q_offset"),
    (dict(q_offset=np.zeros((3,), np.int32)), "q_offset"), (dict(q_offset=np.zeros((2,), np.float32)), "q_offset"),
    (dict(scale=float("nan")), "scale"), (dict(causal=1), "causal"), (dict(config="nope"), "configs"),
    (dict(config=object()), "config"),
])
def test_argument_model_errors_name_the_argument(rng, bad, match):
    q = _arr(rng, (2, 4, 2, 64), "float32")
    with pytest.raises(ValueError, match=match):
        pallas_attn.attention(q, q, q, generation="v4_fused", interpret=True, **bad)


def test_generations_lists_every_id_with_its_declared_facts():
    infos = pallas_attn.generations()
    assert [g.id for g in infos] == list(registry.ids())
    for g in infos:
        assert "j <= i + q_offset" in g.causal
        if g.built:
            k = registry.kernel(g.id)
            assert (g.lowering, g.dtypes, g.max_q_len) == (k.lowering, k.dtypes, k.max_q_len)
            assert set(g.precision) == set(g.dtypes)
        else:
            assert g.kernel is None and not g.configs


def test_import_isolation():
    """``import pallas_attn`` loads no torch; ``import attn_core`` neither jax nor torch; no global warning filter."""
    import subprocess
    import sys

    # jax installs filters of its own at import; ours must add none on top
    code = ("import warnings, sys, jax, jax.experimental.pallas.triton; n = len(warnings.filters); "
            "import pallas_attn, pallas_attn.kernels.fa_decode; "
            "assert 'torch' not in sys.modules, 'torch'; assert len(warnings.filters) == n, 'filters'")
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import attn_core, sys; bad = [m for m in ('jax', 'torch') if m in sys.modules]; assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_passes_declared_are_the_ones_traced(rng):
    """Every pallas_call a built kernel launches on a supported shape is one it declares (names are data)."""
    for r in registry.rows():
        k = registry.kernel(r.generation)
        if "dense" not in registry.get(r.generation).entries:
            continue
        dt = k.dtypes[0]
        q, kk = _arr(rng, (1, 1, 2, 64), dt), _arr(rng, (1, 300, 2, 64), dt)
        jaxpr = str(jax.make_jaxpr(lambda q, kk, g=r.generation: pallas_attn.attention(
            q, kk, kk, generation=g, interpret=True))(q, kk))
        seen = set(re.findall(r"pallas_attn_\w+", jaxpr))
        assert seen and seen <= set(k.passes), (r.generation, seen, k.passes)


def _lowering_cases():
    out = []
    for r in registry.rows():
        for cfg in registry.configs(r.generation):
            out.append(pytest.param(r.generation, cfg, id=f"{r.generation}-{cfg}"))
    return out


# (B, Tq, Hq, Hkv, Tk, causal): a prefill-like and a decode-like shape; each kernel lowers those it supports
_LOWER_SHAPES = [(3, 40, 2, 2, 300, True), (3, 1, 8, 2, 4099, False), (1, 4, 8, 2, 1000, True)]


def _quantized_struct(fmt: str, shape):
    """A quantized pool of logical ``shape`` as ShapeDtypeStructs (pallas_attn.quant's pytrees)."""
    from pallas_attn import quant

    sc = jax.ShapeDtypeStruct((), jnp.float32)
    if fmt == "fp8_e4m3":
        return quant.Fp8Tensor(jax.ShapeDtypeStruct(shape, jnp.uint8), sc)
    *lead, d = shape
    return quant.Nvfp4Tensor(jax.ShapeDtypeStruct((*lead, d // 2), jnp.uint8),
                             jax.ShapeDtypeStruct((*lead, d // quant.NVFP4_BLOCK), jnp.uint8), sc)


@pytest.mark.slow
@pytest.mark.parametrize(("gen", "config"), _lowering_cases())
def test_lowers_for_cuda_as_declared(gen, config):
    """Lower every row and config to the CUDA platform on this CPU-only machine (no GPU needed): catches
    what interpret mode lets through (non-power-of-two tensors, dot shapes, unsupported primitives) before
    the GPU run, and checks the kernel's declared lowering and passes against the lowered module."""
    k = registry.kernel(gen)
    dt = jnp.dtype(k.dtypes[-1])
    entries = registry.get(gen).entries
    lowered = 0
    for d in (64, 128):
        for b, tq, hq, hkv, tk, causal in _LOWER_SHAPES:
            q, kk = jax.ShapeDtypeStruct((b, tq, hq, d), dt), jax.ShapeDtypeStruct((b, tk, hkv, d), dt)
            off = jax.ShapeDtypeStruct((b,), jnp.int32)
            calls = []
            if "dense" in entries and k.supports(api.problem_dense(q, kk, causal=causal))[0]:
                calls.append(jax.jit(lambda q, kk, off, c=causal: pallas_attn.attention(
                    q, kk, kk, causal=c, q_offset=off, generation=gen, config=config, interpret=False,
                    return_lse=c)).trace(q, kk, off))
            page = 16
            pool = jax.ShapeDtypeStruct((b * -(-tk // page), page, hkv, d), dt)
            bt = jax.ShapeDtypeStruct((b, -(-tk // page)), jnp.int32)
            if "paged" in entries and k.supports(api.problem_paged(q, pool, bt, causal=causal))[0]:
                calls.append(jax.jit(lambda q, pool, bt, lens, c=causal: pallas_attn.paged_attention(
                    q, pool, pool, bt, lens, causal=c, generation=gen, config=config, interpret=False,
                    check_block_table=False)).trace(q, pool, bt, off))
            for fmt in (k.kv_precision if "quantized" in entries else ()):  # quantized pools, paged at 16
                qpool = _quantized_struct(fmt, pool.shape)
                if k.supports(api.problem_paged(q, qpool, bt, causal=causal))[0]:
                    calls.append(jax.jit(lambda q, qp, bt, lens, c=causal: pallas_attn.paged_attention(
                        q, qp, qp, bt, lens, causal=c, generation=gen, config=config, interpret=False,
                        check_block_table=False)).trace(q, qpool, bt, off))
            for traced in calls:
                text = traced.lower(lowering_platforms=("cuda",)).as_text()
                names = set(re.findall(r"pallas_attn_\w+", text))
                assert names and names <= set(k.passes), (names, k.passes)
                if k.lowering == "triton":
                    assert text.count("xla.gpu.triton") >= len(names)
                lowered += 1
    if "mla" in entries:
        lowered += _lower_mla(k, gen, config)
    assert lowered, f"{gen}:{config} lowered no shape"


def _lower_mla(k, gen: str, config: str) -> int:
    """An MLA kernel lowered for CUDA: every template at a decode shape (page 16), the first also causal with
    Tq = 3 at page 64, each latent format the config reads (a Mosaic config reads 16-bit latents only)."""
    from pallas_attn import quant
    from pallas_attn.mla import mla_attention

    dt = jnp.dtype(k.dtypes[-1])
    cfg = registry.configs(gen)[config]
    mosaic = getattr(cfg, "engine", None) == "mosaic"
    templates = k.templates
    # a row that names another row's kernel and config objects (fa_mla: v12_mla_tc's configs under its names) lowers
    # its route at the first template only: every template of that config object is lowered under the kernel's own row
    if gen != k.name and any(c is cfg for c in registry.configs(k.name).values()):
        templates = templates[:1]
    n = 0
    for i, (dqk, dv) in enumerate(templates):
        for b, tq, hq, page, causal in [(2, 1, 16, 16, False)] + ([(2, 3, 8, 64, True)] if i == 0 else []):
            q = jax.ShapeDtypeStruct((b, tq, hq, dqk), dt)
            shape, bt = (b * 4, page, 1, dqk), jax.ShapeDtypeStruct((b, 4), jnp.int32)
            lens = jax.ShapeDtypeStruct((b,), jnp.int32)
            pools = [jax.ShapeDtypeStruct(shape, dt)]
            for fmt in k.latent_precision if not mosaic else ():
                pools.append(_quantized_struct(fmt, shape))
            for pool in pools:
                qq = q if quant.kv_format(pool) is None else jax.ShapeDtypeStruct(q.shape, k.latent_q_dtypes[
                    quant.kv_format(pool)][0])
                traced = jax.jit(lambda q, p, bt, lens, c=causal, dv=dv: mla_attention(
                    q, p, bt, lens, kv_lora_rank=dv, causal=c, generation=gen, config=config, interpret=False,
                    check_block_table=False)).trace(qq, pool, bt, lens)
                text = traced.lower(lowering_platforms=("cuda",)).as_text()
                names = set(re.findall(r"pallas_attn_\w+", text))
                assert names and names <= set(k.passes), (names, k.passes)
                if k.lowering == "triton" or not mosaic:
                    assert text.count("xla.gpu.triton") >= 1
                n += 1
    return n
