"""fa_prefill's backward (two Mosaic GPU kernels) on an H100/H200 against jax.nn's gradients.

Truth: ``jax.grad`` of ``jax.nn.dot_product_attention(implementation="xla")`` on float32 copies of the inputs at
HIGHEST matmul precision. Ours (fa_prefill's forward for O and LSE, then ``fa_prefill_bwd.backward``) in fp16 /
bf16 must be within twice XLA's own error in that dtype (XLA run on the 16-bit inputs) plus 2 eps, for dQ, dK
and dV (the criterion of tests/gpu/test_dropin_gpu.py). Cases: fp16 / bf16 x D 64 / 128 x (MHA, square,
non-causal; GQA 2, odd Tq != Tk with per-sequence causal offsets; the same non-causal). Causal offsets go to
jax.nn as an explicit mask (it has no q_offset). Every case runs for the configs ``default`` (one consumer
warpgroup, 64-key / 64-row CTAs), ``wide`` (two consumers, 128-key / 128-row CTAs), ``wide_ovl`` (wide with
the software-pipelined dQ consumer) and ``fused`` (the five-product backward: dQ inside the dK/dV kernel).
Also: bit-identical gradients run to run (no atomics; fused: dK and dV), NaN in a query row
reaches exactly the gradients it should, and a timing print of default / wide / wide_s3 / wide_ovl /
wide_ovl_s2 against jax.nn cuDNN's backward at B4 H16 N4096 D128, with the dQ kernel alone for wide and the
wide_ovl pair (``-s`` to see it). Budget: 4-6 minutes on an H100, mostly compiling (~100 programs);
``-k "wide_ovl or timing"``: ~2-3 minutes. D 256 (config ``d256``, the head-dim split): the grads cases at both
dtypes, the determinism / NaN test and a timing print at B4 H16 N4096 D256 against cuDNN: ``-k d256``, ~2 minutes.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import contextlib  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from pallas_attn.kernels import fa_prefill_bwd as fb  # noqa: E402

pytestmark = pytest.mark.gpu

# name: (B, Tq, Tk, Hq, Hkv, causal, offsets)
SHAPES = {
    "mha-square": (2, 1024, 1024, 8, 8, False, (0, 0)),
    "gqa2-odd-causal-offsets": (2, 1000, 1333, 8, 4, True, (333, 100)),
    "gqa2-odd-noncausal": (2, 1000, 1333, 8, 4, False, (0, 0)),
}


def _arrays(seed, b, tq, tk, hq, hkv, d, dtype):
    ks = jax.random.split(jax.random.key(seed), 4)
    shapes = ((b, tq, hq, d), (b, tk, hkv, d), (b, tk, hkv, d), (b, tq, hq, d))
    return tuple(jax.random.normal(k, s, jnp.float32).astype(dtype) for k, s in zip(ks, shapes))


def _mask(b, tq, tk, causal, offs):
    if not causal:
        return None
    off = jnp.asarray(offs, jnp.int32)
    return jnp.arange(tk)[None, None, None, :] <= jnp.arange(tq)[None, None, :, None] + off[:, None, None, None]


@functools.cache
def _xla_grad(highest: bool):
    def loss(q, k, v, w, mask):
        ctx = jax.default_matmul_precision("highest") if highest else contextlib.nullcontext()
        with ctx:
            out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
            return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


@functools.cache
def _ours(causal: bool, scale: float, config: str = "default"):
    def run(q, k, v, w, off):
        o, lse = pallas_attn.attention(q, k, v, causal=causal, q_offset=off, generation="fa_prefill",
                                       interpret=False, return_lse=True)
        return fb.backward(q, k, v, o, lse, w, causal=causal, scale=scale, q_offset=off, config=fb.CONFIGS[config])

    return jax.jit(run)


def _rel(a, b) -> float:
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# D 64 / 128 run every config; D 256 runs d256 (the head-dim split; what any config becomes there)
_D_CONFIGS = [(d, c) for d in (64, 128) for c in ("default", "wide", "wide_ovl", "fused")] + [(256, "d256")]
_D_CONFIGS += [(96, "wide"), (96, "fused")]  # D 96: the D 128 kernels on zero-padded columns (session 24)


@pytest.mark.parametrize("d,config", _D_CONFIGS)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_grads_within_xla_error(dtype, shape, d, config):
    b, tq, tk, hq, hkv, causal, offs = SHAPES[shape]
    q, k, v, w = _arrays(d + len(shape), b, tq, tk, hq, hkv, d, dtype)
    mask = _mask(b, tq, tk, causal, offs)
    off = jnp.asarray(offs, jnp.int32)
    ours = _ours(causal, 1.0 / float(np.sqrt(d)), config)(q, k, v, w, off)
    lo = _xla_grad(False)(q, k, v, w, mask)
    truth = _xla_grad(True)(*(x.astype(jnp.float32) for x in (q, k, v, w)), mask)
    eps = float(jnp.finfo(dtype).eps)
    for name, x, o, l_, t in zip(("dq", "dk", "dv"), (q, k, v), ours, lo, truth):
        assert o.dtype == x.dtype and o.shape == x.shape, name
        assert np.isfinite(np.asarray(o, np.float32)).all(), name
        assert _rel(o, t) <= 2 * _rel(l_, t) + 2 * eps, (name, _rel(o, t), _rel(l_, t))


def _nan_row_reaches_its_gradients(run, q, k, v, w, off):
    """A NaN in one query row (non-causal, GQA 2): exactly that row of dQ and every key of its KV head in dK, dV."""
    q = q.at[0, 77, 3, 5].set(jnp.nan)  # query head 3 reads KV head 1 of sequence 0
    dq, dk, dv = (np.asarray(x, np.float32) for x in run(q, k, v, w, off))
    nan_q = np.zeros(dq.shape[:3], bool)
    nan_q[0, 77, 3] = True
    assert np.isnan(dq[nan_q]).all() and np.isfinite(dq[~nan_q]).all()
    nan_kv = np.zeros(dk.shape[:3], bool)
    nan_kv[0, :, 1] = True  # every key of that KV head is visible to the NaN row (non-causal)
    for g in (dk, dv):
        assert np.isnan(g[nan_kv]).all() and np.isfinite(g[~nan_kv]).all()


@pytest.mark.parametrize("config", ["default", "wide", "wide_ovl", "d256"])
def test_deterministic_and_nan_rows(config):
    b, tq, tk, hq, hkv, d = 2, 512, 700, 4, 2, (256 if config == "d256" else 128)
    q, k, v, w = _arrays(7, b, tq, tk, hq, hkv, d, "float16")
    off = jnp.zeros((b,), jnp.int32)
    run = _ours(False, 1.0 / float(np.sqrt(d)), config)
    first, second = run(q, k, v, w, off), run(q, k, v, w, off)
    for x, y in zip(first, second):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    _nan_row_reaches_its_gradients(run, q, k, v, w, off)


@pytest.mark.parametrize("d", [64, 128])
def test_fused_repeatable_and_nan_rows(d):
    """``fused`` (dQ by TMA reduce-adds, summed in a varying order): dK and dV bit-identical run to run, dQ within
    two units of the dtype's rounding of ``wide``'s deterministic dQ; a NaN query row reaches exactly the gradients
    it should."""
    b, tq, tk, hq, hkv = 2, 512, 700, 4, 2
    q, k, v, w = _arrays(7, b, tq, tk, hq, hkv, d, "float16")
    off = jnp.zeros((b,), jnp.int32)
    run = _ours(False, 1.0 / float(np.sqrt(d)), "fused")
    first, second = run(q, k, v, w, off), run(q, k, v, w, off)
    for x, y in zip(first[1:], second[1:]):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ref = _ours(False, 1.0 / float(np.sqrt(d)), "wide")(q, k, v, w, off)
    eps = float(jnp.finfo(jnp.float16).eps)
    for dq in (first[0], second[0]):
        assert _rel(dq, ref[0]) <= 2 * eps, _rel(dq, ref[0])
    _nan_row_reaches_its_gradients(run, q, k, v, w, off)


def _time(f, *args, n=20):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


@pytest.mark.parametrize("causal", [False, True])
def test_timing_vs_cudnn(causal):
    """B4 H16 N4096 D128 fp16: our backward alone (O, LSE given) vs jax.nn cuDNN's (its fwd+bwd minus its fwd)."""
    b, n, h, d = 4, 4096, 16, 128
    q, k, v, w = _arrays(11, b, n, n, h, h, d, "float16")
    off = jnp.zeros((b,), jnp.int32)
    scale = 1.0 / float(np.sqrt(d))
    o, lse = pallas_attn.attention(q, k, v, causal=causal, generation="fa_prefill", interpret=False, return_lse=True)
    times = {}
    for name in ("default", "wide", "wide_s3", "wide_ovl", "wide_ovl_s2"):
        fn = jax.jit(functools.partial(fb.backward, causal=causal, scale=scale, config=fb.CONFIGS[name]))
        times[name] = _time(lambda *a, fn=fn: fn(*a, q_offset=off), q, k, v, o, lse, w)
    # the dQ kernel alone (inputs prepared once): the part wide_ovl changes (docs/fa_prefill.md, wide_ovl)
    prep = fb._prepare(q, k, v, o, lse, w, off, rows=128, keys=128)
    dq_alone = {}
    for name in ("wide", "wide_ovl", "wide_ovl_s2"):
        dq_fn = jax.jit(fb._build_dq(b, n, n, n, h, h, d, "float16", causal, scale, fb.CONFIGS[name]))
        dq_alone[name] = _time(dq_fn, *prep)
    bwd = jax.jit(functools.partial(fb.backward, causal=causal, scale=scale, config=fb.CONFIGS["wide"]))
    ovl = jax.jit(functools.partial(fb.backward, causal=causal, scale=scale, config=fb.CONFIGS["wide_ovl"]))
    ours = times["wide"]

    def cudnn_fwd(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

    def cudnn_loss(q, k, v, w):
        return jnp.sum(cudnn_fwd(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))

    t_fwd = _time(jax.jit(cudnn_fwd), q, k, v)
    t_fb = _time(jax.jit(jax.grad(cudnn_loss, argnums=(0, 1, 2))), q, k, v, w)
    t_cudnn = t_fb - t_fwd
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    g_ours, g_ref = bwd(q, k, v, o, lse, w, q_offset=off), jax.jit(jax.grad(cudnn_loss, argnums=(0, 1, 2)))(q, k, v, w)
    agree = {nm: _rel(a, r) for nm, a, r in zip(("dq", "dk", "dv"), g_ours, g_ref)}
    agree_ovl = {nm: _rel(a, r) for nm, a, r in zip(("dq", "dk", "dv"), ovl(q, k, v, o, lse, w, q_offset=off), g_ref)}
    each = ", ".join(f"{nm} {t:.0f} us ({flops / t / 1e6:.0f} TFLOP/s, {t_cudnn / t:.2f}x cuDNN)"
                     for nm, t in times.items())
    print(f"\nfa_prefill_bwd B{b} H{h} N{n} D{d} fp16 causal={causal}: {each}; cuDNN bwd {t_cudnn:.0f} us "
          f"(fwd+bwd {t_fb:.0f}, fwd {t_fwd:.0f}; {flops / t_cudnn / 1e6:.0f} TFLOP/s at 2.5x fwd); "
          f"wide vs cuDNN speed {t_cudnn / ours:.2f}x, wide_ovl {t_cudnn / times['wide_ovl']:.2f}x; dQ kernel "
          f"alone: " + ", ".join(f"{nm} {t:.0f} us" for nm, t in dq_alone.items()) + f"; max rel diff vs cuDNN's "
          f"grads: wide {agree}, wide_ovl {agree_ovl}", flush=True)
    assert all(v < 2e-2 for v in agree.values()), agree
    assert all(v < 2e-2 for v in agree_ovl.values()), agree_ovl


@pytest.mark.parametrize("causal", [False, True])
def test_timing_d256_vs_cudnn(causal):
    """B4 H16 N4096 D256 fp16: our backward alone (config d256, O and LSE given) vs jax.nn cuDNN's (its fwd+bwd
    minus its fwd) when this jax / cuDNN takes D 256 (else ours alone, said in the print); and the drop-in's
    fwd+bwd forced onto fa_prefill vs onto fa_train (D 256's route before the split)."""
    b, n, h, d = 4, 4096, 16, 256
    q, k, v, w = _arrays(13, b, n, n, h, h, d, "float16")
    off = jnp.zeros((b,), jnp.int32)
    scale = 1.0 / float(np.sqrt(d))
    o, lse = pallas_attn.attention(q, k, v, causal=causal, generation="fa_prefill", interpret=False, return_lse=True)
    fn = jax.jit(functools.partial(fb.backward, causal=causal, scale=scale, config=fb.CONFIGS["d256"]))
    t_ours = _time(lambda *a: fn(*a, q_offset=off), q, k, v, o, lse, w)
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)

    def dropin_fb(impl):  # fwd+bwd through the drop-in forced onto one pair: what D 256 ran before (fa_train)
        def loss(q, k, v, w):
            out = pallas_attn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

        return _time(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), q, k, v, w)

    t_pf, t_tr = dropin_fb("pallas:fa_prefill"), dropin_fb("pallas:fa_train")
    line = (f"\nfa_prefill_bwd d256 B{b} H{h} N{n} D{d} fp16 causal={causal}: {t_ours:.0f} us "
            f"({flops / t_ours / 1e6:.0f} TFLOP/s); drop-in fwd+bwd: fa_prefill {t_pf:.0f} us, fa_train {t_tr:.0f} us "
            f"({t_tr / t_pf:.2f}x)")

    def cudnn_fwd(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")

    def cudnn_loss(q, k, v, w):
        return jnp.sum(cudnn_fwd(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))

    try:
        grad = jax.jit(jax.grad(cudnn_loss, argnums=(0, 1, 2)))
        t_fb = _time(grad, q, k, v, w)
        t_fwd = _time(jax.jit(cudnn_fwd), q, k, v)
    except Exception as e:  # noqa: BLE001 - cuDNN (through jax) may refuse D 256: report ours alone
        print(line + f"; jax.nn cuDNN unavailable at D 256: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return
    t_cudnn = t_fb - t_fwd
    agree = {nm: _rel(a, r) for nm, a, r in zip(("dq", "dk", "dv"), fn(q, k, v, o, lse, w, q_offset=off),
                                                 grad(q, k, v, w))}
    print(line + f"; cuDNN bwd {t_cudnn:.0f} us (fwd+bwd {t_fb:.0f}, fwd {t_fwd:.0f}); ours {t_cudnn / t_ours:.2f}x "
          f"cuDNN's speed; max rel diff vs cuDNN's grads {agree}", flush=True)
    assert all(x < 2e-2 for x in agree.values()), agree


@pytest.mark.parametrize("config", ["default", "wide", "wide_ovl", "d256", "fused"])
def test_window_backward_matches_oracle(config):
    """fa_prefill_bwd with a causal window (``window=left``; D 256 through the split kernels), after fa_prefill's
    forward with the same window, against the float64 gradient oracle: windows narrower than a block and of a few
    blocks, with per-sequence offsets and GQA (written in session 9; its first GPU run decides whether the drop-in
    may pair a window with this backward instead of fa_train's)."""
    from attn_core import oracle
    from pallas_attn.kernels import fa_prefill as fp

    key = jax.random.PRNGKey(5)
    cases = [(2, 700, 700, 8, 2, 128, 255, (0, 0)), (1, 300, 500, 4, 1, 64, 40, (200,))]
    if config == "d256":  # the head-dim split kernels (what every config runs at D 256)
        cases = [(2, 700, 700, 8, 2, 256, 255, (0, 0)), (1, 300, 500, 4, 1, 256, 40, (200,))]
    for i, (b, tq, tk, hq, hkv, d, left, offs) in enumerate(cases):
        kq, kk, kv, kd = jax.random.split(jax.random.fold_in(key, i), 4)
        q = jax.random.normal(kq, (b, tq, hq, d), jnp.float32).astype(jnp.bfloat16)
        k = jax.random.normal(kk, (b, tk, hkv, d), jnp.float32).astype(jnp.bfloat16)
        v = jax.random.normal(kv, (b, tk, hkv, d), jnp.float32).astype(jnp.bfloat16)
        do = jax.random.normal(kd, (b, tq, hq, d), jnp.float32).astype(jnp.bfloat16)
        off = jnp.asarray(offs, jnp.int32)
        o, lse = fp.forward(q, k, v, causal=True, scale=d ** -0.5, q_offset=off, interpret=False,
                            config=fp.CONFIGS["default"], return_lse=True, window=(left, 0))
        dq, dk, dv = fb.backward(q, k, v, o, lse, do, causal=True, scale=d ** -0.5, q_offset=off,
                                 config=fb.CONFIGS[config], window=left)
        ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=d ** -0.5, q_offset=np.asarray(offs),
                                              window=left + 1)
        for name, ours in zip(("dq", "dk", "dv"), (dq, dk, dv)):
            r = ref[name]
            ours = np.asarray(jnp.asarray(ours, jnp.float32), np.float64)
            assert np.linalg.norm(ours - r) / np.linalg.norm(r) < 2e-2, (config, i, name)


@pytest.mark.parametrize("config", ["wide_ovl", "d256", "fused"])
def test_softcap_and_sinks_backward_matches_oracle(config):
    """The soft-cap's backward in the kernels and the sinks' gradient (``sinks_grad``), with and without a window,
    against the float64 gradient oracle (written in session 9; passed on an H100 in session 10)."""
    from attn_core import oracle
    from pallas_attn.kernels import fa_prefill as fp

    d = 256 if config == "d256" else 128
    b, t, hq, hkv = 2, 700, 8, 2
    key = jax.random.PRNGKey(9)
    kq, kk, kv, kd, ks = jax.random.split(key, 5)
    q = jax.random.normal(kq, (b, t, hq, d), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(kk, (b, t, hkv, d), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(kv, (b, t, hkv, d), jnp.float32).astype(jnp.bfloat16)
    do = jax.random.normal(kd, (b, t, hq, d), jnp.float32).astype(jnp.bfloat16)
    sinks = np.asarray(jax.random.normal(ks, (hq,), jnp.float32))
    off = jnp.zeros((b,), jnp.int32)
    for left in (None, 255):
        o, lse = fp.forward(q, k, v, causal=True, scale=d ** -0.5, q_offset=off, interpret=False,
                            config=fp.CONFIGS["default"], return_lse=True, softcap=50.0, sinks=sinks,
                            window=None if left is None else (left, 0))
        dq, dk, dv = fb.backward(q, k, v, o, lse, do, causal=True, scale=d ** -0.5, q_offset=off,
                                 config=fb.CONFIGS[config], window=left, softcap=50.0)
        ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=d ** -0.5, softcap=50.0, sinks=sinks,
                                              window=None if left is None else left + 1)
        for name, ours in zip(("dq", "dk", "dv"), (dq, dk, dv)):
            ours = np.asarray(jnp.asarray(ours, jnp.float32), np.float64)
            assert np.linalg.norm(ours - ref[name]) / np.linalg.norm(ref[name]) < 2e-2, (config, left, name)
        ds = np.asarray(fb.sinks_grad(o, lse, do, sinks), np.float64)
        assert np.linalg.norm(ds - ref["dsinks"]) / np.linalg.norm(ref["dsinks"]) < 2e-2, (config, left)


@pytest.mark.parametrize("config", ["default", "wide", "wide_ovl", "fused"])
def test_packed_backward_matches_oracle(config, monkeypatch):
    """Packed documents (segment_ids) in fa_prefill_bwd (built in session 10, interpreter-tested), after fa_prefill's
    packed forward, against the float64 gradient oracle: short and long documents, boundaries inside a block and on
    a tile edge, GQA. This test is the gate of ``fa_prefill_bwd.PACKED_BWD_ON_GPU``: it runs the kernels either way."""
    from attn_core import oracle
    from pallas_attn.kernels import fa_prefill as fp

    monkeypatch.setattr(fb, "PACKED_BWD_ON_GPU", True)
    key = jax.random.PRNGKey(23)
    b, t, hq, hkv, d = 2, 1000, 8, 2, 128
    kq, kk, kv, kd = jax.random.split(key, 4)
    q, k, v, do = (jax.random.normal(x, s, jnp.float32).astype(jnp.bfloat16)
                   for x, s in ((kq, (b, t, hq, d)), (kk, (b, t, hkv, d)), (kv, (b, t, hkv, d)), (kd, (b, t, hq, d))))
    seg = np.stack([np.repeat(np.arange(4), (128, 37, 700, 135)), np.repeat(np.arange(3), (5, 900, 95))])
    seg = jnp.asarray(seg, jnp.int32)
    off = jnp.zeros((b,), jnp.int32)
    o, lse = fp.forward(q, k, v, causal=True, scale=d ** -0.5, q_offset=off, interpret=False,
                        config=fp.CONFIGS["default"], return_lse=True, segment_ids=seg)
    dq, dk, dv = fb.backward(q, k, v, o, lse, do, causal=True, scale=d ** -0.5, q_offset=off,
                             config=fb.CONFIGS[config], segment_ids=seg)
    ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=d ** -0.5, q_segments=np.asarray(seg),
                                          kv_segments=np.asarray(seg))
    for name, ours in zip(("dq", "dk", "dv"), (dq, dk, dv)):
        ours = np.asarray(jnp.asarray(ours, jnp.float32), np.float64)
        assert np.linalg.norm(ours - ref[name]) / np.linalg.norm(ref[name]) < 2e-2, (config, name)


def test_dropin_default_runs_fused_at_causal_d64_and_deterministic_true_does_not(monkeypatch):
    """``pallas_attn.dot_product_attention`` at causal D 64 takes the five-product backward by default (``fused``: the
    rule without a table, forced here by ``PALLAS_ATTN_TUNING=off``; the H100 table's rows are tests/test_sweep.py's);
    with ``deterministic=True`` it does not, and its gradients are bit-identical run to run; the default's agree with
    them within two units of bf16 rounding."""
    from pallas_attn import dropin
    from pallas_attn.kernels.contract import Problem

    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # set before jax started, it is read again by the routing only
    b, n, h, d = 2, 1024, 4, 64
    q, k, v, w = _arrays(11, b, n, n, h, h, d, "bfloat16")
    prob = Problem(entry="dense", dtype="bfloat16", batch=b, q_len=n, kv_len=n, heads_q=h, heads_kv=h, head_dim=d,
                   causal=True)
    assert dropin.bwd_config_name(prob) == "fused"
    assert not fb.CONFIGS[dropin.bwd_config_name(prob, deterministic=True)].fused_dq

    def grads(det):
        def loss(q, k, v):
            out = pallas_attn.dot_product_attention(q, k, v, is_causal=True, deterministic=det)
            return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    det, det2, default = grads(True), grads(True), grads(None)
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    for name, a, a2, c in zip(("dq", "dk", "dv"), det, det2, default):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(a2))
        assert _rel(c, a) <= 2 * eps, (name, _rel(c, a))
