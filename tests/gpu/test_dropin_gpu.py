"""pallas_attn.dot_product_attention on the GPU at realistic shapes: fa_train (Triton) everywhere, and on a
Hopper (sm_90) fa_prefill's Mosaic GPU forward + backward for the fp16 / bf16, D 64 / 128 calls without window
or lengths (the drop-in's own choice, ``implementation=None`` / ``"pallas"``; fa_train is also forced with
``"pallas:fa_train"`` so both pairs are checked at 16 bits).

The checks of tests/test_dropin.py at training sizes: outputs and gradients against
``jax.nn.dot_product_attention(implementation="xla")``: fp16 / bf16 at most twice XLA's own error against the
float32 answer (plus 2 eps) for the output and every gradient, including the ``d64`` config; NaN / Inf
patterns as jax.nn's; vmap and remat of the grad; float32 (XLA at HIGHEST precision, so it does not use TF32;
ours runs IEEE fp32 dots) to 1e-5 relative across head dims 64 / 128 / 256, causal / not, GQA 1 / 4 / 8,
odd lengths, per-sequence lengths with empty rows, and windows.

Budget: at most 90 s on an H100, spent almost all on compiling (every shape and static flag is a new
program; the runs are milliseconds), so the file is built to compile little:

* one jitted ``value_and_grad`` per (implementation, causal, window, precision), cached at module level and
  reused by every check with those static arguments (sequence lengths are traced arguments);
* the NaN / Inf checks reuse the compiled programs of the d64 accuracy check (same shapes, poisoned inputs);
* XLA's GEMM autotuning is off for every program here (``xla_gpu_autotune_level=0``): it only picks the
  fastest GEMM algorithm, the numerics stay those of the requested precision, and autotuning the float32
  HIGHEST references' dots was the bulk of the earlier runs' time (4 float32 cases in ~110 s);
* the float32 cases run last, D = 256 last of all: fp32 ``dot`` with IEEE precision lowers to unrolled FMA
  loops, and Triton 3.6 takes about 2.6 / 5.6 / 21 s (fwd + dkdv + dq) to compile them at D = 64 / 128 /
  256 for sm_90 (measured on a CPU host; the fp16 D = 128 kernels take ~1.7 s), so a cut run still reports
  the 16-bit checks. Run with ``-v --durations=0`` to see each test's time.
"""

import contextlib
import functools
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from pallas_attn import dropin  # noqa: E402

pytestmark = pytest.mark.gpu


@functools.cache
def _no_autotune() -> dict:
    """``{"xla_gpu_autotune_level": 0}`` where this jaxlib's XLA knows the option, else ``{}`` (a newer XLA
    that renamed it then autotunes: slower, same verdicts)."""
    opts = {"xla_gpu_autotune_level": 0}
    try:
        jax.jit(lambda x: x + 1, compiler_options=opts)(jnp.zeros((), jnp.float32)).block_until_ready()
    except Exception as e:  # "No such compile option"
        if "compile option" not in str(e):
            raise
        return {}
    return opts


# Shapes (module constants so that a CPU driver can shrink them to try the file in interpret mode).
LOW_SHAPE = (2, 2048, 16, 128)  # B, N, Hq, D of the fp16 / bf16 check (Hkv per case)
NAN_SHAPE = (1, 512, 4, 2, 64)  # B, N, Hq, Hkv, D: fp16, the d64 config
VMAP_SHAPE = (2, 256, 8, 2, 128)  # bf16
ODD_SHAPE = (2, 1000, 1333, 8, 4, 64)  # B, T, S, Hq, Hkv, D: fp16, causal, fa_prefill on sm_90
# (B, T, S, N, K, H, causal, window, q_lens, kv_lens), cheapest compile first
FP32_CASES = [
    pytest.param(2, 1000, 1333, 16, 4, 64, True, None, None, None, id="gqa4-d64-causal-odd"),
    pytest.param(2, 1024, 1024, 8, 8, 128, False, None, None, None, id="mha-d128"),
    pytest.param(1, 777, 2048, 16, 2, 128, True, (256, 0), [777], [1500], id="gqa8-d128-window-lengths"),
    pytest.param(3, 513, 513, 4, 1, 256, False, 100, [513, 1, 300], [0, 513, 77], id="mqa-d256-empty-rows"),
]


def _arrays(seed, b, t, s, n, kh, h, dtype="float32"):
    ks = jax.random.split(jax.random.key(seed), 4)
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(dtype)
                 for k, shape in zip(ks, ((b, t, n, h), (b, s, kh, h), (b, s, kh, h), (b, t, n, h))))


@functools.cache
def _program(impl: str, causal: bool, window=None, highest: bool = False):
    """``f(q, k, v, w, q_lens, kv_lens) -> (out, (dq, dk, dv))`` of ``sum(out * w)``, jitted once per static
    configuration (shapes and dtypes compile on first use and are cached by jit)."""
    attn = pallas_attn.dot_product_attention if impl.startswith("pallas") else jax.nn.dot_product_attention

    def loss(q, k, v, w, q_lens, kv_lens):
        ctx = jax.default_matmul_precision("highest") if highest else contextlib.nullcontext()
        with ctx:  # applies while tracing: every dot of the reference is HIGHEST (no TF32)
            out = attn(q, k, v, is_causal=causal, local_window_size=window, query_seq_lengths=q_lens,
                       key_value_seq_lengths=kv_lens, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), out

    grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)

    def run(q, k, v, w, q_lens=None, kv_lens=None):
        (_, out), grads = grad(q, k, v, w, q_lens, kv_lens)
        return out, grads

    return jax.jit(run, compiler_options=_no_autotune())


def _rel(a, b) -> float:
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _check_within_xla_error(q, k, v, w, causal, impl="pallas"):
    """Ours in q's dtype vs the float32 answer: at most twice XLA's own error in that dtype, plus 2 eps."""
    dtype = q.dtype
    out, grads = _program(impl, causal)(q, k, v, w)
    lo, lo_grads = _program("xla", causal)(q, k, v, w)
    ref, ref_grads = _program("xla", causal, highest=True)(*(x.astype(jnp.float32) for x in (q, k, v, w)))
    eps = float(jnp.finfo(dtype).eps)
    for name, ours, theirs, truth in zip(("out", "dq", "dk", "dv"), (out, *grads), (lo, *lo_grads),
                                         (ref, *ref_grads)):
        assert ours.dtype == dtype, name
        assert np.isfinite(np.asarray(ours, np.float32)).all(), name
        assert _rel(ours, truth) <= 2 * _rel(theirs, truth) + 2 * eps, (name, _rel(ours, truth), _rel(theirs, truth))


@pytest.mark.parametrize("impl", ["pallas", "pallas:fa_train"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal,kh", [(False, 16), (True, 4)])
def test_low_precision_within_xla_error(dtype, causal, kh, impl):
    """B2 H16 N2048 D128, MHA non-causal and GQA4 causal: output and dQ/dK/dV, through the drop-in's own
    choice (fa_prefill on sm_90, else fa_train's default config) and through fa_train forced."""
    b, n, hq, d = LOW_SHAPE
    q, k, v, w = _arrays(1, b, n, n, hq, hq if kh == 16 else kh, d, dtype)
    want = "pallas:fa_prefill" if dropin._is_sm90() and impl == "pallas" else "pallas:fa_train"
    assert pallas_attn.which_implementation(q, k, v, is_causal=causal, implementation=impl)[0] == want
    _check_within_xla_error(q, k, v, w, causal, impl)


@pytest.mark.parametrize("dtype,causal,kh", [("float16", True, 4), ("bfloat16", False, 16)])
def test_sm90_fa_prefill_as_close_as_cudnn(dtype, causal, kh):
    """On a Hopper the drop-in runs fa_prefill (the implementation string says so, and why); its output and
    dQ/dK/dV are as close to the float32 answer as jax.nn's cuDNN path is (at most twice cuDNN's error plus 2
    eps) and agree with cuDNN's own to 2x XLA's distance from cuDNN plus 2 eps. B2 N2048 Hq16 D128."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU: the drop-in keeps fa_train here")
    b, n, hq, d = LOW_SHAPE
    q, k, v, w = _arrays(4, b, n, n, hq, kh, d, dtype)
    impl, why = pallas_attn.which_implementation(q, k, v, is_causal=causal)
    assert impl == "pallas:fa_prefill" and "sm_90" in why, (impl, why)
    ours = _program("pallas", causal)(q, k, v, w)
    cud = _program("cudnn", causal)(q, k, v, w)
    lo = _program("xla", causal)(q, k, v, w)
    ref = _program("xla", causal, highest=True)(*(x.astype(jnp.float32) for x in (q, k, v, w)))
    flat = [jax.tree.leaves(x) for x in (ours, cud, lo, ref)]
    eps = float(jnp.finfo(dtype).eps)
    for name, o, c, x, t in zip(("out", "dq", "dk", "dv"), *flat):
        assert o.dtype == jnp.dtype(dtype) and np.isfinite(np.asarray(o, np.float32)).all(), name
        assert _rel(o, t) <= 2 * _rel(c, t) + 2 * eps, (name, _rel(o, t), _rel(c, t))
        assert _rel(o, c) <= 2 * _rel(x, c) + 2 * eps, (name, _rel(o, c), _rel(x, c))


@pytest.mark.parametrize("bwd", ["wide", "fused", "default"])
def test_sm90_named_bwd_config_within_xla_error(bwd):
    """``bwd_config=`` (api.resolve_pair, session 24): a named fa_prefill_bwd config runs the backward and its
    gradients are within XLA's error as above (GQA 4 causal bf16 D 64, B2 N2048 Hq16: where the table's rule would
    pick ``fused``, so ``wide`` and ``default`` are the named ones that differ from the default path)."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU: bwd_config names a fa_prefill_bwd config, Hopper only")
    b, n, hq, _ = LOW_SHAPE
    q, k, v, w = _arrays(7, b, n, n, hq, 4, 64, "bfloat16")

    def loss(q, k, v, w):
        out = pallas_attn.dot_product_attention(q, k, v, is_causal=True, bwd_config=bwd)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True),
                              compiler_options=_no_autotune())(q, k, v, w)
    lo, lo_grads = _program("xla", True)(q, k, v, w)
    ref, ref_grads = _program("xla", True, highest=True)(*(x.astype(jnp.float32) for x in (q, k, v, w)))
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    for name, ours, theirs, truth in zip(("out", "dq", "dk", "dv"), (out, *grads), (lo, *lo_grads),
                                         (ref, *ref_grads)):
        assert np.isfinite(np.asarray(ours, np.float32)).all(), (bwd, name)
        assert _rel(ours, truth) <= 2 * _rel(theirs, truth) + 2 * eps, (bwd, name, _rel(ours, truth))


@pytest.mark.parametrize("causal,kh", [(True, 32), (False, 8)])
def test_sm90_d96_within_xla_error(causal, kh):
    """D 96 (Phi-3, session 24): fa_prefill's forward with 96-column tiles and the backward on zero-padded D 128
    columns, through the drop-in forced to that pair; output and dQ/dK/dV within XLA's error (bf16, B2 N1024 Hq32)."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU")
    q, k, v, w = _arrays(9, 2, 1024, 1024, 32, kh, 96, "bfloat16")
    # forced: the default keeps cuDNN's pair at D 96 (dropin.DEFAULT_SKIPS_HEAD_DIMS), with fa_prefill's forward for
    # a call not differentiated from N 1024 on (dropin.APART, session 26); session 24's GPU run of this test
    # (results/gpu_runs/20261127_s24_h100_call5_d96/) had the pair as the default choice, the same kernels
    assert pallas_attn.which_implementation(q, k, v, is_causal=causal)[0] == dropin.APART
    assert pallas_attn.which_implementation(q, k, v, is_causal=causal,
                                            implementation="pallas:fa_prefill")[0] == "pallas:fa_prefill"
    _check_within_xla_error(q, k, v, w, causal, impl="pallas:fa_prefill")


def _step(w, impl=None, local_window_size=None, **kw):
    """jit(value_and_grad) of ``sum(out * w)`` in q, k, v through the drop-in's default (``impl`` None, with ``kw``)
    or jax.nn's ``impl``; causal, with ``local_window_size`` on either."""
    def loss(q, k, v):
        if impl is None:
            o = pallas_attn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local_window_size, **kw)
        else:
            o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl,
                                             local_window_size=local_window_size)
        return jnp.sum(o.astype(jnp.float32) * w)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _check_forward_apart(q, k, v, w, **kw):
    """The default is ``dropin.APART`` here: not differentiated, exactly fa_prefill's forward (forced), a program with
    Mosaic GPU kernels and no cuDNN attention; under jax.value_and_grad (session 31, ``dropin.APART_STEP``), that
    forward with its LSE and jax.nn cuDNN's backward on them: a program with Mosaic GPU kernels and cuDNN's backward
    and no cuDNN forward, its value exactly the forced pair's (the same forward), its gradients within bf16 rounding
    of cuDNN's own pair's (cuDNN's backward may sum in a varying order) and no further from the float32 answer than
    twice cuDNN's pair's error plus 2 eps. ``kw``: ``local_window_size``, on every side."""
    assert dropin._cudnn_bwd_api()[1] == ""  # this jax's cuDNN backward primitive takes what the drop-in binds
    assert pallas_attn.which_implementation(q, k, v, is_causal=True, **kw)[0] == dropin.APART
    fwd = jax.jit(lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True, **kw))
    forced = jax.jit(lambda q, k, v: pallas_attn.dot_product_attention(
        q, k, v, is_causal=True, implementation="pallas:fa_prefill", **kw))
    np.testing.assert_array_equal(np.asarray(fwd(q, k, v), np.float32), np.asarray(forced(q, k, v), np.float32))
    text = fwd.lower(q, k, v).as_text()
    assert "mosaic_gpu" in text and "fmha" not in text
    text = _step(w, **kw).lower(q, k, v).as_text()
    assert "mosaic_gpu" in text and "fmhaSoftmaxBackward" in text
    assert "fmhaSoftmax(" not in text and "fmhaSoftmax\"" not in text  # no cuDNN forward
    (val, grads), (_, rgrads) = _step(w, **kw)(q, k, v), _step(w, "cudnn", **kw)(q, k, v)
    fval, _ = _step(w, implementation="pallas:fa_prefill", deterministic=True, **kw)(q, k, v)
    assert float(val) == float(fval)
    with jax.default_matmul_precision("highest"):
        _, tgrads = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="xla", **kw) * w), argnums=(0, 1, 2)))(
            *(x.astype(jnp.float32) for x in (q, k, v)))
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    for name, a, b, t in zip(("dq", "dk", "dv"), grads, rgrads, tgrads):
        an, bn = np.asarray(a, np.float32), np.asarray(b, np.float32)
        rel = np.linalg.norm(an - bn) / np.linalg.norm(bn)
        assert rel < 1e-2, (name, rel)
        assert _rel(a, t) <= 2 * _rel(b, t) + 2 * eps, (name, _rel(a, t), _rel(b, t))


def test_sm90_d96_default_runs_the_forward_apart():
    """D 96 by default (session 26, ``dropin.APART``; B2 N1024 Hq32 Hkv8 bf16, causal): ``_check_forward_apart``."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU")
    _check_forward_apart(*_arrays(10, 2, 1024, 1024, 32, 8, 96, "bfloat16"))


def test_sm90_long_d128_default_trains_through_cudnn_and_keeps_our_forward(monkeypatch):
    """D 128 from N 8192 by default (session 27, ``dropin.TRAIN_ON_CUDNN_MIN_Q_LEN``; B1 N8192 Hq8 Hkv2 bf16 causal):
    ``_check_forward_apart``; with ``deterministic=True``, fa_prefill's pair (Mosaic GPU, no cuDNN attention)."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU")
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # read again by the routing only
    q, k, v, w = _arrays(14, 1, 8192, 8192, 8, 2, 128, "bfloat16")
    _check_forward_apart(q, k, v, w)
    text = _step(w, deterministic=True).lower(q, k, v).as_text()
    assert "mosaic_gpu" in text and "fmha" not in text


def test_sm90_mistral_window_default_trains_through_cudnn_and_keeps_our_forward(monkeypatch):
    """Mistral's causal 4096-key window at N 8192, where it masks (session 28, ``dropin.TRAIN_ON_CUDNN_MIN_WINDOW``;
    B1 Hq8 Hkv2 D128 bf16): ``_check_forward_apart`` with the window on every side; a narrower window (1024 keys)
    keeps fa_prefill's pair under grad (Mosaic GPU, no cuDNN attention)."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    q, k, v, w = _arrays(15, 1, 8192, 8192, 8, 2, 128, "bfloat16")
    _check_forward_apart(q, k, v, w, local_window_size=(4095, 0))
    text = _step(w, local_window_size=(1023, 0)).lower(q, k, v).as_text()
    assert "mosaic_gpu" in text and "fmha" not in text


@pytest.mark.parametrize("b,h,kh,d", [(4, 12, 12, 64), (2, 32, 8, 128)])
def test_sm90_short_causal_default_runs_cudnns_forward_and_our_pair_under_grad(b, h, kh, d):
    """Short causal self-attention by default (``dropin.CUDNN_FORWARD``; GPT-2's shape, B4 N512 H12 D64 bf16, and
    Llama's GQA at D 128, B2 N512 Hq32 Hkv8): not
    differentiated, exactly jax.nn cuDNN's forward, a program with cuDNN's attention and no Mosaic GPU kernel; under
    jax.value_and_grad (session 31, ``dropin.CUDNN_FORWARD_STEP``), cuDNN's training forward with its softmax
    statistics and fa_prefill_bwd's backward on them: a program with cuDNN's forward, Mosaic GPU kernels and no cuDNN
    backward, its value exactly cuDNN's own pair's (the same forward), with ``deterministic=True`` gradients
    bit-identical run to run, and every gradient within 1e-2 (relative norm) of the forced fa_prefill pair's and no
    further from the float32 answer than twice cuDNN's pair's error plus 2 eps."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU")
    assert dropin._cudnn_fwd_api()[1] == ""  # this jax's cuDNN forward primitive takes what the drop-in binds
    q, k, v, w = _arrays(12, b, 512, 512, h, kh, d, "bfloat16")
    assert pallas_attn.which_implementation(q, k, v, is_causal=True)[0] == dropin.CUDNN_FORWARD
    fwd = jax.jit(lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True))
    cud = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"))
    np.testing.assert_array_equal(np.asarray(fwd(q, k, v), np.float32), np.asarray(cud(q, k, v), np.float32))
    text = fwd.lower(q, k, v).as_text()
    assert "fmha" in text and "mosaic_gpu" not in text

    text = _step(w).lower(q, k, v).as_text()
    assert "mosaic_gpu" in text and "fmhaSoftmax(" in text and "fmhaSoftmaxBackward" not in text
    (val, grads), (rval, rgrads) = _step(w)(q, k, v), _step(w, "cudnn")(q, k, v)
    assert float(val) == float(rval)
    dval, dgrads = _step(w, deterministic=True)(q, k, v)
    _, dgrads2 = _step(w, deterministic=True)(q, k, v)
    assert float(dval) == float(rval)
    for a, b in zip(dgrads, dgrads2):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    _, fgrads = _step(w, implementation="pallas:fa_prefill")(q, k, v)
    with jax.default_matmul_precision("highest"):
        _, tgrads = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="xla") * w), argnums=(0, 1, 2)))(
            *(x.astype(jnp.float32) for x in (q, k, v)))
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    for name, a, da, f, c, t in zip(("dq", "dk", "dv"), grads, dgrads, fgrads, rgrads, tgrads):
        for ours in (a, da):
            on, fn = np.asarray(ours, np.float32), np.asarray(f, np.float32)
            assert np.linalg.norm(on - fn) / np.linalg.norm(fn) < 1e-2, name
            assert _rel(ours, t) <= 2 * _rel(c, t) + 2 * eps, (name, _rel(ours, t), _rel(c, t))


def test_sm90_non_causal_d64_long_step_runs_c3_within_xla_error():
    """fa_prefill's table's first non-causal rows (session 27: c3 at D 64 N >= 4096, measured 0.83-0.88x ``default``):
    a non-causal D 64 training step at N 4096 (B1 H12 bf16) resolves its forward to c3 (three consumers) and its
    output and dQ/dK/dV are within XLA's error as above."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU")
    from pallas_attn.kernels import fa_prefill
    from pallas_attn.kernels.contract import Problem

    q, k, v, w = _arrays(13, 1, 4096, 4096, 12, 12, 64, "bfloat16")
    p = Problem(entry="dense", dtype="bfloat16", batch=1, q_len=4096, kv_len=4096, heads_q=12, heads_kv=12,
                head_dim=64, causal=False)
    assert dropin.prefill_config(p, None) == fa_prefill.fit(fa_prefill.CONFIGS["c3"], 64)
    _check_within_xla_error(q, k, v, w, False)


def test_sm90_fa_prefill_odd_lengths_residual_deterministic():
    """fa_prefill through the drop-in at odd lengths (T 1000 < S 1333, neither a multiple of 64; causal
    top-left, GQA 2, fp16 D 64): output and gradients within XLA's error as above, jax.nn's residual (the
    logsumexp, BTN) to fp16 rounding, and bit-identical gradients run to run (no atomics)."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU: the drop-in keeps fa_train here")
    b, t, s, hq, hkv, d = ODD_SHAPE
    q, k, v, w = _arrays(6, b, t, s, hq, hkv, d, "float16")
    assert pallas_attn.which_implementation(q, k, v, is_causal=True)[0] == "pallas:fa_prefill"
    _check_within_xla_error(q, k, v, w, True)
    first, second = _program("pallas", True)(q, k, v, w), _program("pallas", True)(q, k, v, w)
    for x, y in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    res_fn = jax.jit(lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True,
                                                                       return_residual=True)[1])
    ref_fn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla",
                                                                  return_residual=True)[1])
    res, rres = res_fn(q, k, v), ref_fn(*(x.astype(jnp.float32) for x in (q, k, v)))
    assert res.shape == (b, t, hq) and res.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(res, np.float32), np.asarray(rres, np.float32), rtol=2e-3, atol=2e-3)


def _must_be_nan(q, hkv, bad_q, bad_k):
    """Causal rows and keys whose value is NaN by the math, for q ``[B, T, Hq, H]`` with a NaN in query row
    ``bad_q = (b, i, h)`` and +Inf at feature ``f`` of key ``bad_k = (b, j, kh, f)``: the NaN row; each row
    of KV head ``kh``'s query heads at or after key ``j`` whose score with it is +Inf or NaN (``q[f] >= 0``:
    +Inf - +Inf is NaN; a -Inf score only removes the key). Returns ``(rows [B, T, Hq], keys [B, S, Hkv])``: the
    NaN rows of the output and of dQ, and the keys such a row sees (their dK and dV rows are NaN)."""
    qf = np.asarray(q, np.float32)
    b, t, hq, _ = qf.shape
    g = hq // hkv
    rows = np.zeros((b, t, hq), bool)
    rows[bad_q] = True
    kb, j, kh, f = bad_k
    heads = slice(kh * g, (kh + 1) * g)
    rows[kb, j:, heads] |= ~(qf[kb, j:, heads, f] < 0)
    keys = np.zeros((b, t, hkv), bool)
    for bb, i, h in np.argwhere(rows):
        keys[bb, :i + 1, h // g] = True
    return rows, keys


def test_d64_and_nan_inf():
    """fp16 D64 (GQA2, causal; fa_train's d64 config, or fa_prefill on sm_90): accuracy as above; then NaN in q
    and +Inf in k through the same compiled programs. The output's NaN rows are exactly jax.nn's (= the math's).
    Gradients: NaN wherever the math has it, and never where jax.nn has none. Not equality: jax.nn's dense
    products multiply the zero probability of a masked +Inf key (dQ = dS K) and a NaN row's masked entries (dK,
    dV) into every row; ours skips blocks the causal bound excludes, so its extra NaN rows are confined to the
    +Inf key's tile."""
    b, n, hq, hkv, d = NAN_SHAPE
    q, k, v, w = _arrays(2, b, n, n, hq, hkv, d, "float16")
    _check_within_xla_error(q, k, v, w, True)
    bad_q, bad_k = (0, n // 5, 0), (0, (3 * n) // 5, hkv - 1, 5)
    q = q.at[(*bad_q, 3)].set(jnp.nan)
    k = k.at[bad_k].set(jnp.inf)
    out, grads = _program("pallas", True)(q, k, v, w)
    ref, ref_grads = _program("xla", True)(q, k, v, w)
    rows, keys = _must_be_nan(q, hkv, bad_q, bad_k)
    np.testing.assert_array_equal(np.isnan(np.asarray(ref, np.float32)).any(-1), rows)  # the premise
    np.testing.assert_array_equal(np.isnan(np.asarray(out, np.float32)).any(-1), rows)
    dq_nan = np.isnan(np.asarray(ref_grads[0], np.float32)).any(-1)
    assert dq_nan.any() and not dq_nan.all()  # jax.nn's dQ pattern is partial: "NaN where jax.nn has none" can fail
    for name, g, rg, must in zip(("dq", "dk", "dv"), grads, ref_grads, (rows, keys, keys)):
        ours = np.isnan(np.asarray(g, np.float32)).any(-1)
        theirs = np.isnan(np.asarray(rg, np.float32)).any(-1)
        assert must.any() and not must.all(), name  # the first inclusion can fail (the second can for dQ)
        assert (ours | ~must).all(), (name, "a row that must be NaN is not", np.argwhere(must & ~ours)[:5])
        assert (theirs | ~ours).all(), (name, "NaN where jax.nn has none", np.argwhere(ours & ~theirs)[:5])


def test_vmap_and_remat():
    """bf16 causal GQA4: vmap of the forward over a stacked batch, and grad through jax.checkpoint."""
    b, n, hq, hkv, d = VMAP_SHAPE
    q, k, v, w = _arrays(3, b, n, n, hq, hkv, d, "bfloat16")
    # the Pallas pair named (by default this short causal call runs cuDNN's forward on sm_90, dropin.CUDNN_FORWARD,
    # since session 27; its vmap is checked below too)
    f = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True, implementation="pallas")  # noqa
    r = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")  # noqa: E731
    stack = [jnp.stack([x, x[::-1]]) for x in (q, k, v)]
    want = "pallas:fa_prefill" if dropin._is_sm90() else "pallas:fa_train"
    assert pallas_attn.which_implementation(q, k, v, is_causal=True, implementation="pallas")[0] == want
    out = jax.jit(jax.vmap(f), compiler_options=_no_autotune())(*stack)
    assert out.shape == stack[0].shape and out.dtype == jnp.bfloat16
    ref = jax.jit(jax.vmap(r), compiler_options=_no_autotune())(*stack)
    assert _rel(out, ref) < 2e-2
    default = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    assert _rel(jax.jit(jax.vmap(default), compiler_options=_no_autotune())(*stack), ref) < 2e-2

    def grad_k(attn, remat):
        loss = lambda k: jnp.sum(attn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))  # noqa: E731
        return jax.jit(jax.grad(jax.checkpoint(loss) if remat else loss), compiler_options=_no_autotune())(k)

    g, rg = grad_k(f, True), grad_k(r, False)
    assert g.dtype == jnp.bfloat16 and _rel(g, rg) < 2e-2

    # vmap of the gradient: the default (cuDNN's forward and our backward here since session 31) and the pair at
    # its deterministic backward; the five-product backward ('fused') has no batching rule (docs/dropin.md)
    wide = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True,  # noqa: E731
                                                             implementation="pallas", bwd_config="wide")

    def vgrad(attn):
        loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))  # noqa: E731
        return jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))), compiler_options=_no_autotune())(*stack)

    ref_g = vgrad(r)
    for attn in (default, wide):
        for name, a, b in zip(("dq", "dk", "dv"), vgrad(attn), ref_g):
            assert a.shape == b.shape and a.dtype == jnp.bfloat16, name
            assert _rel(a, b) < 2e-2, (name, _rel(a, b))


@pytest.mark.parametrize("b,t,s,n,kh,h,causal,window,q_lens,kv_lens", FP32_CASES)
def test_float32_matches_xla(b, t, s, n, kh, h, causal, window, q_lens, kv_lens):
    q, k, v, w = _arrays(0, b, t, s, n, kh, h)
    lens = (None if q_lens is None else jnp.asarray(q_lens, jnp.int32),
            None if kv_lens is None else jnp.asarray(kv_lens, jnp.int32))
    assert pallas_attn.which_implementation(q, k, v, is_causal=causal, local_window_size=window,
                                            query_seq_lengths=lens[0], key_value_seq_lengths=lens[1],
                                            implementation="pallas")[0] == "pallas:fa_train"
    out, grads = _program("pallas", causal, window)(q, k, v, w, *lens)
    ref, ref_grads = _program("xla", causal, window, highest=True)(q, k, v, w, *lens)
    assert np.isfinite(np.asarray(out)).all()
    assert _rel(out, ref) < 1e-5, _rel(out, ref)
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert g.dtype == q.dtype and _rel(g, rg) < 1e-5, (name, _rel(g, rg))


def test_sm90_packed_training_step_at_4096_runs_four_tiles_and_matches_oracle(monkeypatch):
    """Packed documents by default (session 29, ``fa_prefill.config_for_packed``; B1 N4096 Hq8 Hkv2 D128 bf16,
    documents of 256 to 2048 tokens): the drop-in's training step hands fa_prefill's pair the four-tile forward, and
    the output and dQ / dK / dV agree with the float64 oracle within 2e-2 relative (the packed backward's gate)."""
    if not dropin._is_sm90():
        pytest.skip("not a Hopper (sm_90) GPU")
    from attn_core import oracle
    from pallas_attn.kernels import fa_prefill, fa_prefill_bwd

    seen = []
    real = fa_prefill_bwd.attention_lse

    def spy(*a, config=None, **kw):
        seen.append(config)
        return real(*a, config=config, **kw)

    monkeypatch.setattr(fa_prefill_bwd, "attention_lse", spy)
    q, k, v, w = _arrays(16, 1, 4096, 4096, 8, 2, 128, "bfloat16")
    lens = oracle.packed_doc_lengths(4096, 0)
    seg = jnp.asarray(np.repeat(np.arange(len(lens)), lens)[None], jnp.int32)

    def loss(q, k, v):
        out = pallas_attn.dot_product_attention(q, k, v, is_causal=True, segment_ids=seg)
        return jnp.sum(out.astype(jnp.float32) * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    assert seen and all(c == fa_prefill.CONFIGS["tiles4"] for c in seen), seen
    segs = np.asarray(seg)
    ro, _ = oracle.attention_reference(q, k, v, causal=True, q_segments=segs)
    ref = oracle.attention_grad_reference(q, k, v, np.asarray(w, np.float64), causal=True, scale=128 ** -0.5,
                                          q_segments=segs, kv_segments=segs)
    o64 = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert np.linalg.norm(o64 - ro) / np.linalg.norm(ro) < 2e-2
    for name, g in zip(("dq", "dk", "dv"), grads):
        g64 = np.asarray(jnp.asarray(g, jnp.float32), np.float64)
        assert np.linalg.norm(g64 - ref[name]) / np.linalg.norm(ref[name]) < 2e-2, name
