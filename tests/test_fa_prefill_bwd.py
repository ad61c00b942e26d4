"""fa_prefill's backward on the CPU: the two Mosaic GPU kernels' own code on jax's GPU interpreter (race
detection on; the wgmma products become jnp dots on the same shared-memory tiles) against ``jax.vjp`` of a
float32 reference, their lowering for CUDA, and the refusals. The kernels themselves run on an H100 in
tests/gpu/test_fa_prefill_bwd_gpu.py. Budget: ~60 s (the interpreter is slow: small shapes, few programs)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_attn.kernels import fa_prefill as fp
from pallas_attn.kernels import fa_prefill_bwd as fb


def reference(q, k, v, off, *, causal: bool, scale: float):
    """float32 attention at HIGHEST precision, BTNH, GQA by repetition, top-left causal with per-sequence
    offsets; a row that sees no key outputs 0 with LSE -inf. Returns ``(out, lse [B, Hq, Tq])``."""
    g = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * scale
    tq, tk = q.shape[1], k.shape[1]
    vis = jnp.ones((q.shape[0], 1, tq, tk), bool)
    if causal:
        vis = jnp.arange(tk)[None, None, None, :] <= jnp.arange(tq)[None, None, :, None] + off[:, None, None, None]
    m = jnp.max(jnp.where(vis, s, -jnp.inf), axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    p = jnp.where(vis, jnp.exp(jnp.where(vis, s, 0.0) - m), 0.0)
    l_ = p.sum(-1, keepdims=True)
    out = jnp.einsum("bhqk,bkhd->bqhd", p / jnp.where(l_ == 0, 1.0, l_), v, precision="highest")
    l0 = l_[..., 0]
    lse = jnp.where(l0 == 0, -jnp.inf, jnp.log(jnp.where(l0 == 0, 1.0, l0)) + m[..., 0])
    return out, lse


def _inputs(rng, b, tq, tk, hq, hkv, d, dtype):
    def mk(shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)

    return mk((b, tq, hq, d)), mk((b, tk, hkv, d)), mk((b, tk, hkv, d)), mk((b, tq, hq, d))


def _case_with_reference(rng, b, tq, tk, hq, hkv, d, causal, offs, dt):
    """A case's inputs, offsets and scale, and the float32 reference's output, LSE and (dq, dk, dv) by jax.vjp."""
    q, k, v, do = _inputs(rng, b, tq, tk, hq, hkv, d, dt)
    off = jnp.asarray(offs, jnp.int32)
    scale = 1.0 / np.sqrt(d)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    (out, lse), vjp = jax.vjp(lambda q, k, v: reference(q, k, v, off, causal=causal, scale=scale), *f32)
    return q, k, v, do, off, scale, out, lse, vjp((do.astype(jnp.float32), jnp.zeros_like(lse)))


def _rel(a, b) -> float:
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# b, tq, tk, hq, hkv, d, causal, offsets, dtype. Every case has odd lengths (neither a multiple of 64);
# the first: GQA G 2, Tq < Tk with an offset (bottom-right-like causal), 3 key blocks; the second: non-causal,
# Tq > Tk, D 128; the third: negative and per-sequence offsets (rows that see no key), query blocks before
# a key block's diagonal skipped.
_CASES = [
    (1, 70, 150, 2, 1, 64, True, (80,), "bfloat16"),
    (1, 100, 40, 1, 1, 128, False, (0,), "float16"),
    (2, 90, 70, 1, 1, 64, True, (-5, 3), "float16"),
]
_TOL = {"float16": 2e-3, "bfloat16": 1.5e-2}  # relative norm error; measured ~3e-4 (fp16), ~2.5e-3 (bf16)


# config "wide" (two consumer warpgroups sharing each streamed tile): the first case (GQA 2) has a dK/dV CTA whose
# second consumer skips a query block its keys cannot see, inside the group loop; the second (negative offset,
# Tq > Tk) also a dQ CTA whose first consumer skips a key block loaded for the second one's rows only.
_WIDE_CASES = [_CASES[0], (1, 150, 70, 1, 1, 64, True, (-30,), "float16")]

# config "wide_ovl" (wide + the software-pipelined dQ consumer, 3-deep dQ ring; its dK/dV kernel is wide's): an
# offset of -70 so that the first dQ consumer's 64 rows see no key at all (the pipeline's no-key branch) while
# the second's start seeing keys at row 70; non-causal D 128 with four key blocks (prologue, the unmasked
# pipelined steps, a masked ragged last step, the epilogue; ring slots reused). Releasing K_{s-1}'s slot
# before the dQ wgmma that reads it makes the interpreter report races (checked by hand when it was built).
_OVL_CASES = [(1, 150, 70, 1, 1, 64, True, (-70,), "float16"), (1, 70, 200, 1, 1, 128, False, (0,), "float16")]

# D 256 (the head-dim split, config d256: two consumers on one CTA's 64 keys / rows, each a D half): GQA 2 with an
# offset, a straddling and a ragged key block; and per-sequence offsets with a negative one (rows that see no
# key); the second asks for wide_ovl, which D 256 maps to d256 (config_for). Removing the consumers' "done"
# barrier before the epilogue makes the interpreter report races (checked by hand when it was built).
_D256_CASES = [("d256", (1, 70, 100, 2, 1, 256, True, (30,), "bfloat16")),
               ("wide_ovl", (2, 60, 70, 1, 1, 256, True, (-5, 3), "float16"))]


# config "fused" (the five-product backward: the dS^T exchange between the wide CTA's consumers, dQ by reduce-adds,
# here the interpreter's read-add-write): GQA 2 causal with a positive offset at D 64 (the D 64 layout: one staging
# tile per consumer; the second consumer skips a block inside the group loop and writes a zero dS^T); D 128 with a
# negative offset and Tq > Tk (rows that see no key; the shared staging tile handed between the readers), an odd
# number of steps per CTA (both slots of the exchange, the drain of each).
_FUSED_CASES = [(1, 130, 200, 2, 1, 64, True, (40,), "bfloat16"), (1, 150, 70, 1, 1, 128, True, (-30,), "float16")]


@pytest.mark.slow
@pytest.mark.parametrize("config,case", [("default", c) for c in _CASES] + [("wide", c) for c in _WIDE_CASES]
                         + [("wide_ovl", c) for c in _OVL_CASES] + _D256_CASES
                         + [("fused", c) for c in _FUSED_CASES],
                         ids=lambda c: c if isinstance(c, str) else "-".join(map(str, c)))
def test_mosaic_kernels_on_the_gpu_interpreter(rng, config, case):
    """dQ, dK, dV of both kernels' own code (TMA rings and barriers, block bounds, masks, the GQA loop, the
    epilogues; wide: two consumers per ring slot and the skipped blocks) against jax.vjp of the float32
    reference, with no race reported."""
    b, tq, tk, hq, hkv, d, causal, offs, dt = case
    q, k, v, do, off, scale, out, lse, ref = _case_with_reference(rng, b, tq, tk, hq, hkv, d, causal, offs, dt)
    dq, dk, dv, races = fb.emulate_backward(q, k, v, out.astype(dt), lse, do, causal=causal, scale=scale,
                                            q_offset=off, config=fb.CONFIGS[config])
    assert not races
    for name, ours, r, x in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, (q, k, v)):
        assert ours.dtype == x.dtype and ours.shape == x.shape, name
        assert np.isfinite(np.asarray(ours, np.float32)).all(), name
        assert _rel(ours, r) < _TOL[dt], (name, _rel(ours, r))
    if not np.isfinite(np.asarray(lse)).all():  # rows that see no key: zero dQ
        empty = ~np.isfinite(np.asarray(lse)).transpose(0, 2, 1)
        assert np.all(np.asarray(dq, np.float32)[empty] == 0.0)


@pytest.mark.parametrize("config,causal,d,dtype", [
    (cfg, *c) for cfg in ("default", "wide", "wide_s3", "wide_ovl", "wide_ovl_s2", "fused")
    for c in ((True, 64, jnp.bfloat16), (False, 128, jnp.float16))] + [
    ("d256", True, 256, jnp.bfloat16), ("wide_ovl", False, 256, jnp.float16)])  # D 256: d256's split kernels
def test_mosaic_kernels_lower_for_cuda(causal, d, dtype, config):
    """The real kernels (wgmma, layouts, TMA, register budgets) of every config lower for CUDA on this CPU
    machine: GQA, ragged Tq != Tk, offsets; the wide configs fit the 227 KiB of shared memory at D 128, d256
    (what every config runs at D 256) at D 256."""
    sds = jax.ShapeDtypeStruct
    q, k = sds((2, 200, 4, d), dtype), sds((2, 333, 2, d), dtype)
    lse, off = sds((2, 4, 200), jnp.float32), sds((2,), jnp.int32)

    def f(q, k, v, o, lse, do, off):
        return fb.backward(q, k, v, o, lse, do, causal=causal, scale=0.125, q_offset=off, config=fb.CONFIGS[config])

    text = jax.jit(f).trace(q, k, k, q, lse, q, off).lower(lowering_platforms=("cuda",)).as_text()
    names = set(re.findall(r"pallas_attn_\w+", text))
    ran = fb.config_for(d, fb.CONFIGS[config])
    if ran.fused_dq:  # one kernel, dQ inside; jax's discharge of its accumulator Ref renames it (module docstring)
        assert names == set() and text.count("mpmd_map:") == 1 and "new_body" in text, names
    else:
        assert {fb.PASS_DKDV, fb.PASS_DQ} <= names <= set(fb.PASS_NAMES), names
    assert "wgmma" in text
    assert fb.smem_bytes(max(d, 128), 2, fb.config_for(d, fb.CONFIGS[config])) <= 227 * 1024


def test_fused_config_rules():
    """fused needs the wide CTA (its two consumers exchange dS^T) and excludes the D 256 split and the dQ kernel's
    pipeline (there is no dQ kernel); its shared memory fits at D 64 / 128; D 256 runs d256 (two kernels)."""
    for kw in (dict(), dict(wide=True, dsplit=True), dict(wide=True, dq_overlap=True)):
        with pytest.raises(ValueError, match="fused_dq"):
            fb.BwdConfig(fused_dq=True, consumer_regs=232 if not kw else 240, **kw)
    with pytest.raises(ValueError, match="fused_dq"):
        fb.BwdConfig(fused_dq=1)
    cfg = fb.CONFIGS["fused"]
    assert cfg.fused_dq and cfg.wide and fb.config_for(256, cfg) == fb.CONFIGS["d256"]
    for d in (64, 128):
        assert fb.smem_bytes(d, 2, cfg) <= 227 * 1024


def test_refusals_name_the_problem():
    z = jnp.zeros
    q, k = z((1, 64, 2, 64), jnp.float16), z((1, 64, 1, 64), jnp.float16)
    lse = z((1, 2, 64), jnp.float32)

    def call(q=q, k=k, v=k, o=q, lse=lse, do=q, **kw):
        return fb.backward(q, k, v, o, lse, do, causal=False, scale=1.0, **kw)

    q32 = z((1, 64, 2, 32), jnp.float16)
    with pytest.raises(NotImplementedError, match="head dim 32"):
        call(q=q32, k=z((1, 64, 1, 32), jnp.float16), v=z((1, 64, 1, 32), jnp.float16), o=q32, do=q32)
    with pytest.raises(ValueError, match="dsplit config needs D a multiple of 128"):
        call(config=fb.CONFIGS["d256"])  # D 64: halves of 32 columns
    with pytest.raises(ValueError, match="dsplit"):
        fb.BwdConfig(dsplit=True)  # the split needs the two consumers of wide
    with pytest.raises(ValueError, match="dsplit"):
        fb.BwdConfig(wide=True, dsplit=True, dq_overlap=True, consumer_regs=240)
    for name, cfg in fb.CONFIGS.items():  # D 256 runs d256 whatever was asked; other head dims what was asked
        assert fb.config_for(256, cfg) == fb.CONFIGS["d256"] and fb.config_for(128, cfg) == cfg, name
    assert fb.smem_bytes(256, 2, fb.CONFIGS["d256"]) <= 227 * 1024 < fb.smem_bytes(256, 2, fb.CONFIGS["wide"])
    with pytest.raises(ValueError, match="lse must be float32"):
        call(lse=lse.astype(jnp.float16))
    with pytest.raises(ValueError, match="lse must be float32"):
        call(lse=lse[:, :, :10])
    with pytest.raises(ValueError, match="share one dtype"):
        call(do=q.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="share one dtype"):
        call(q=q.astype(jnp.float32), o=q.astype(jnp.float32), do=q.astype(jnp.float32))
    with pytest.raises(ValueError, match="multiple of Hkv"):
        call(q=z((1, 64, 3, 64), jnp.float16), o=z((1, 64, 3, 64), jnp.float16),
             do=z((1, 64, 3, 64), jnp.float16), lse=z((1, 3, 64), jnp.float32), k=z((1, 64, 2, 64), jnp.float16),
             v=z((1, 64, 2, 64), jnp.float16))
    with pytest.raises(ValueError, match="q's shape"):
        call(o=q[:, :32])
    with pytest.raises(ValueError, match="BwdConfig"):
        fb.BwdConfig(stages=1)
    with pytest.raises(ValueError, match="BwdConfig"):
        fb.BwdConfig(consumer_regs=240, producer_regs=40)
    with pytest.raises(ValueError, match="504"):
        fb.BwdConfig(wide=True, consumer_regs=248, producer_regs=24)
    assert fb.BwdConfig(wide=True, consumer_regs=240, producer_regs=24).consumers == 2
    with pytest.raises(ValueError, match="dq_stages"):
        fb.BwdConfig(dq_stages=5)
    with pytest.raises(ValueError, match="dq_overlap must be a bool"):
        fb.BwdConfig(dq_overlap=1)
    assert fb.CONFIGS["wide_ovl"].dq_ring == 3 and fb.CONFIGS["wide_ovl"].stages == 2
    assert fb.CONFIGS["wide_ovl_s2"].dq_ring == 2


@pytest.mark.slow
def test_attention_lse_custom_vjp_interpret(rng):
    """fa_prefill_bwd.attention_lse (the drop-in's pair on sm_90) in interpret mode under jit + grad: the
    forward's Pallas twin and the backward's kernels on the GPU interpreter, config wide; a loss on the output
    AND on the LSE (its cotangent folds into delta), against jax.vjp of the float32 reference."""
    q, k, v, w = _inputs(rng, 1, 70, 90, 2, 1, 64, "float16")
    off = jnp.asarray([5], jnp.int32)
    wl = jnp.asarray(rng.standard_normal((1, 2, 70)), jnp.float32)

    def loss(f):
        def run(q, k, v):
            o, lse = f(q, k, v)
            return jnp.sum(o.astype(jnp.float32) * w.astype(jnp.float32)) + jnp.sum(lse * wl)
        return run

    ours = jax.jit(jax.grad(loss(lambda q, k, v: fb.attention_lse(
        q, k, v, causal=True, scale=0.125, q_offset=off, bwd_config=fb.CONFIGS["wide"], interpret=True)),
        argnums=(0, 1, 2)))(q, k, v)
    ref = jax.grad(loss(lambda q, k, v: reference(q, k, v, off, causal=True, scale=0.125)), argnums=(0, 1, 2))(
        *(x.astype(jnp.float32) for x in (q, k, v)))
    for name, g, r, x in zip(("dq", "dk", "dv"), ours, ref, (q, k, v)):
        assert g.dtype == x.dtype and g.shape == x.shape, name
        assert _rel(g, r) < _TOL["float16"], (name, _rel(g, r))


@pytest.mark.slow
@pytest.mark.parametrize("config,case", [
    # the default config (one consumer) with a window runs in test_softcap_and_sinks_backward_on_the_gpu_interpreter
    ("wide_ovl", (1, 130, 130, 2, 2, 64, 10, (0,))),  # a window narrower than a block
    ("wide_ovl", (1, 150, 230, 2, 1, 64, 100, (80,))),  # two consumers (skipped blocks at both ends), pipelined dQ
    ("d256", (1, 150, 230, 2, 1, 256, 100, (80,))),  # D 256: the head-dim split kernels
])
def test_window_backward_on_the_gpu_interpreter(rng, config, case):
    """A causal window (``window=left``: row i sees i + off - left <= j <= i + off): the dK/dV kernels' band of query
    blocks and the dQ kernels' band of key blocks (fa_prefill's schedule), the split kernels at D 256 too, against
    the float64 gradient oracle, no race reported. GPU-run in session 10 (tests/gpu/test_fa_prefill_bwd_gpu.py)."""
    from attn_core import oracle

    b, tq, tk, hq, hkv, d, left, offs = case
    q, k, v, do = _inputs(rng, b, tq, tk, hq, hkv, d, "float16")
    off = jnp.asarray(offs, jnp.int32)
    scale = d ** -0.5
    o, lse = fp.forward(q, k, v, causal=True, scale=scale, q_offset=off, interpret=True,
                        config=fp.CONFIGS["default"], return_lse=True, window=(left, 0))
    dq, dk, dv, races = fb.emulate_backward(q, k, v, o, lse, do, causal=True, scale=scale, q_offset=off,
                                            config=fb.CONFIGS[config], window=left)
    assert not races
    ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=scale, q_offset=np.asarray(offs),
                                          window=left + 1)
    for name, ours in zip(("dq", "dk", "dv"), (dq, dk, dv)):
        r = ref[name]
        assert np.linalg.norm(np.asarray(ours, np.float64) - r) / np.linalg.norm(r) < 4e-3, name
    with pytest.raises(NotImplementedError, match="causal attention only"):
        fb.emulate_backward(q, k, v, o, lse, do, causal=False, scale=scale, q_offset=off, window=left)


@pytest.mark.parametrize("config,d", [("default", 128), ("wide", 128), ("wide_ovl", 128), ("d256", 256)])
def test_window_kernels_lower_for_cuda(config, d):
    q = jax.ShapeDtypeStruct((2, 300, 4, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 300, 2, d), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((2, 4, 300), jnp.float32)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)

    def f(q, k, lse, off):
        return fb.backward(q, k, k, q, lse, q, causal=True, scale=0.1, q_offset=off, config=fb.CONFIGS[config],
                           window=127)

    text = jax.jit(f).trace(q, k, lse, off).lower(lowering_platforms=("cuda",)).as_text()
    assert fb.PASS_DKDV in text and fb.PASS_DQ in text


@pytest.mark.slow
@pytest.mark.parametrize("config,kw", [("wide_ovl", dict(softcap=5.0, window=63)),
                                       ("default", dict(softcap=3.0, sinks=True, window=40))], ids=str)
def test_softcap_and_sinks_backward_on_the_gpu_interpreter(rng, config, kw):
    """The soft-cap's backward (dS through tanh's derivative, in the kernels' shared _p_ds) and the sinks' gradient
    (``sinks_grad``, plain jnp; the kernels need no change, the forward's LSE holds the sink) against the float64
    gradient oracle, on the GPU interpreter, no race. GPU-run in session 10."""
    from attn_core import oracle

    b, tq, tk, hq, hkv, d, offs = 1, 150, 230, 2, 1, 64, (80,)
    q, k, v, do = _inputs(rng, b, tq, tk, hq, hkv, d, "float16")
    off = jnp.asarray(offs, jnp.int32)
    sinks = rng.standard_normal(hq).astype(np.float32) if kw.get("sinks") else None
    left, cap = kw.get("window"), kw["softcap"]
    o, lse = fp.forward(q, k, v, causal=True, scale=d ** -0.5, q_offset=off, interpret=True,
                        config=fp.CONFIGS["default"], return_lse=True, window=(left, 0), softcap=cap, sinks=sinks)
    dq, dk, dv, races = fb.emulate_backward(q, k, v, o, lse, do, causal=True, scale=d ** -0.5, q_offset=off,
                                            config=fb.CONFIGS[config], window=left, softcap=cap)
    assert not races
    ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=d ** -0.5, q_offset=np.asarray(offs),
                                          window=left + 1, softcap=cap, sinks=sinks)
    for name, ours in zip(("dq", "dk", "dv"), (dq, dk, dv)):
        assert np.linalg.norm(np.asarray(ours, np.float64) - ref[name]) / np.linalg.norm(ref[name]) < 4e-3, name
    if sinks is not None:
        ds = np.asarray(fb.sinks_grad(o, lse, do, sinks), np.float64)
        assert np.linalg.norm(ds - ref["dsinks"]) / np.linalg.norm(ref["dsinks"]) < 4e-3


@pytest.mark.parametrize("config,d", [("default", 128), ("wide_ovl", 128), ("d256", 256)])
def test_softcap_kernels_lower_for_cuda(config, d):
    q = jax.ShapeDtypeStruct((2, 300, 4, d), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((2, 4, 300), jnp.float32)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)

    def f(q, lse, off):
        return fb.backward(q, q[:, :, :2], q[:, :, :2], q, lse, q, causal=True, scale=0.1, q_offset=off,
                           config=fb.CONFIGS[config], softcap=50.0, window=127)

    text = jax.jit(f).trace(q, lse, off).lower(lowering_platforms=("cuda",)).as_text()
    assert fb.PASS_DKDV in text and fb.PASS_DQ in text


def test_seg_query_blocks_by_brute_force(rng):
    """``_seg_query_blocks`` against the visibility rule itself (row i sees key j iff start[i] <= j <= i, j < tk):
    for random document mixes and every 64-key tile, rows outside [lo, hi) see none of its keys and rows in
    [full, full_hi) see all of them (so the unmasked steps are exact); ``segment_ends`` by its definition."""
    from pallas_attn.kernels import fa_prefill as fp

    for n in range(40):
        t = (1, 63, 64, 200, 399)[n % 5]  # a few lengths (each compiles the eager helpers once), many mixes
        cuts = np.sort(rng.choice(np.arange(1, t), size=min(t - 1, int(rng.integers(0, 6))), replace=False)) \
            if t > 1 else np.zeros(0, int)
        seg = np.zeros(t, np.int32)
        for c in cuts:
            seg[c:] += 1
        starts = np.asarray(fp.segment_starts(jnp.asarray(seg[None])))[0]
        ends = np.asarray(fb.segment_ends(jnp.asarray(starts[None])))[0]
        assert all(ends[j] == next((i for i in range(j + 1, t) if starts[i] > j), t) for j in range(t))
        nq = -(-t // 64)
        i = np.arange(nq * 64)[:, None]
        st = np.concatenate([starts, np.full(nq * 64 - t, starts[-1])])[:, None]
        j0s = np.arange(0, nq * 64, 64)  # every key tile at once (the helper is elementwise)
        e_first = ends[np.minimum(j0s, t - 1)]
        e_last = ends[np.minimum(j0s + 63, t - 1)]
        bounds = np.stack([np.asarray(x) for x in fb._seg_query_blocks(jnp.asarray(j0s, jnp.int32), jnp.asarray(
            e_first, jnp.int32), jnp.asarray(e_last, jnp.int32), nq=nq, tk=t)], axis=1)
        for j0, (lo, full, full_hi, hi) in zip(j0s.tolist(), bounds.tolist()):
            j = np.arange(j0, j0 + 64)[None, :]
            vis = (j <= i) & (j >= st) & (j < t)
            rows_any = vis.reshape(nq, 64, 64).any(axis=(1, 2))
            rows_all = vis.reshape(nq, 64, 64).all(axis=(1, 2))
            assert not rows_any[:lo].any() and not rows_any[hi:].any(), (t, j0, lo, hi)
            assert rows_all[full:full_hi].all(), (t, j0, full, full_hi)


@pytest.mark.slow
def test_packed_backward_on_the_gpu_interpreter(rng):
    """Packed documents (segment_ids) in the dK/dV and dQ kernels, two consumers with the pipelined dQ (wide_ovl):
    against the float64 gradient oracle on the GPU interpreter, no race; documents of 5, 64, 70 and 61 tokens (one
    starting on a block edge, one inside a block)."""
    from attn_core import oracle

    b, t, hq, hkv, d = 1, 200, 2, 1, 64
    q, k, v, do = _inputs(rng, b, t, t, hq, hkv, d, "float16")
    seg = np.repeat(np.arange(4), (5, 64, 70, 61))[None].astype(np.int32)
    off = jnp.zeros((b,), jnp.int32)
    o, lse = fp.forward(q, k, v, causal=True, scale=0.125, q_offset=off, interpret=True, config=fp.CONFIGS["default"],
                        return_lse=True, segment_ids=jnp.asarray(seg))
    dq, dk, dv, races = fb.emulate_backward(q, k, v, o, lse, do, causal=True, scale=0.125, q_offset=off,
                                            config=fb.CONFIGS["wide_ovl"], segment_ids=jnp.asarray(seg))
    assert not races
    ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=0.125, q_segments=seg, kv_segments=seg)
    for name, ours in zip(("dq", "dk", "dv"), (dq, dk, dv)):
        r = ref[name]
        assert np.linalg.norm(np.asarray(ours, np.float64) - r) / np.linalg.norm(r) < 4e-3, name


@pytest.mark.parametrize("config", ["default", "wide", "wide_ovl"])
def test_packed_kernels_lower_for_cuda_and_are_refused_while_off(config, monkeypatch):
    q = jax.ShapeDtypeStruct((2, 300, 4, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 300, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((2, 4, 300), jnp.float32)
    seg = jax.ShapeDtypeStruct((2, 300), jnp.int32)

    def f(q, k, lse, seg):
        return fb.backward(q, k, k, q, lse, q, causal=True, scale=0.1, config=fb.CONFIGS[config], segment_ids=seg)

    monkeypatch.setattr(fb, "PACKED_BWD_ON_GPU", False)
    with pytest.raises(NotImplementedError, match="PACKED_BWD_ON_GPU"):
        jax.jit(f).trace(q, k, lse, seg)
    monkeypatch.setattr(fb, "PACKED_BWD_ON_GPU", True)
    text = jax.jit(f).trace(q, k, lse, seg).lower(lowering_platforms=("cuda",)).as_text()
    assert fb.PASS_DKDV in text and fb.PASS_DQ in text
    with pytest.raises(NotImplementedError, match="D <= 128"):
        d256 = jax.ShapeDtypeStruct((2, 300, 4, 256), jnp.bfloat16)
        jax.jit(f).trace(d256, jax.ShapeDtypeStruct((2, 300, 2, 256), jnp.bfloat16), lse, seg)


@pytest.mark.slow
def test_d96_runs_the_d128_kernels_on_zero_columns(rng):
    """D 96 (Phi-3): the backward pads q, k, v, o, do to 128 zero columns and cuts the gradients back (session 24);
    on the GPU interpreter against jax.vjp of the float32 reference, odd lengths, GQA 2, an offset."""
    b, tq, tk, hq, hkv, d, causal, offs, dt = 1, 70, 150, 2, 1, 96, True, (80,), "bfloat16"
    q, k, v, do, off, scale, out, lse, ref = _case_with_reference(rng, b, tq, tk, hq, hkv, d, causal, offs, dt)
    dq, dk, dv = fb.backward(q, k, v, out.astype(dt), lse, do, causal=causal, scale=scale, q_offset=off,
                             config=fb.CONFIGS["wide"], interpret=True)
    for name, ours, r, x in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, (q, k, v)):
        assert ours.dtype == x.dtype and ours.shape == x.shape, name
        assert _rel(ours, r) < _TOL[dt], (name, _rel(ours, r))


def test_d96_backward_lowers_for_cuda():
    """D 96's padded backward lowers for CUDA with the D 128 kernels (their names in the program)."""
    sds = jax.ShapeDtypeStruct
    q, k = sds((2, 200, 4, 96), jnp.bfloat16), sds((2, 333, 2, 96), jnp.bfloat16)
    lse, off = sds((2, 4, 200), jnp.float32), sds((2,), jnp.int32)

    def f(q, k, v, o, lse, do, off):
        return fb.backward(q, k, v, o, lse, do, causal=True, scale=0.1, q_offset=off, config=fb.CONFIGS["wide"])

    out = jax.eval_shape(f, q, k, k, q, lse, q, off)
    assert [x.shape for x in out] == [q.shape, k.shape, k.shape]
    text = jax.jit(f).trace(q, k, k, q, lse, q, off).lower(lowering_platforms=("cuda",)).as_text()
    names = set(re.findall(r"pallas_attn_\w+", text))
    assert {fb.PASS_DKDV, fb.PASS_DQ} <= names <= set(fb.PASS_NAMES), names
    assert "wgmma" in text


@pytest.mark.slow
def test_fused_backward_under_vmap_is_a_known_gap():
    """vmap of a gradient through the five-product backward (``fused``: its dQ accumulator is a Ref operand, and that
    kernel has no batching rule) raises jax's NotImplementedError (docs/dropin.md, "What it supports": the way out is
    ``deterministic=True`` or ``bwd_config='wide'``); ``wide`` under the same vmap gives each slice's gradient. A
    wrapper cannot turn the error into a clearer one: jax batches the backward's traced program after the rule ran."""
    import pallas_attn

    ks = jax.random.split(jax.random.key(7), 4)
    q = jax.random.normal(ks[0], (2, 1, 128, 2, 64), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(ks[1], (2, 1, 128, 1, 64), jnp.float32).astype(jnp.bfloat16)
    w = jax.random.normal(ks[3], (1, 128, 2, 64), jnp.float32)

    def grad(bwd):
        def loss(q, k, v):
            out = pallas_attn.dot_product_attention(q, k, v, is_causal=True, implementation="pallas:fa_prefill",
                                                    bwd_config=bwd)
            return jnp.sum(out.astype(jnp.float32) * w)
        return jax.grad(loss, argnums=(0, 1, 2))

    with pytest.raises(NotImplementedError, match="batching"):
        jax.vmap(grad("fused"))(q, k, k)
    got = jax.vmap(grad("wide"))(q, k, k)
    want = grad("wide")(q[1], k[1], k[1])
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a[1], np.float32), np.asarray(b, np.float32))
