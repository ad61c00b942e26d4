"""cuda_ref on the GPU: every generation against the float64 oracle at the reference's test shapes
(docs/reference.md §5), the long-N stability cases, v6 decode, the row log-sum-exp (return_lse), the split
heuristic's C++/Python parity, the built table, and the Pallas twin where one is built.

Runs with ``CUDA_REF_DEBUG=1``: outputs and workspace are NaN-poisoned before each call and each call
synchronises, so an element a kernel forgets to write, or an asynchronous fault, fails the test.
Tolerances (atol = rtol) are the reference's: fp32 generations 1e-4, fp16-operand generations 2e-2. The
log-sum-exp is compared (atol only) with the oracle's on the operands the kernel reads (fp16-rounded for
fp16-operand generations): 1e-4 fp32, 1e-3 fp16.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # jax (Pallas twins) shares the GPU

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuda_ref  # noqa: E402
from attn_core.oracle import attention_reference  # noqa: E402
from cuda_ref import api  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROWS = {g.id: g for g in cuda_ref.table() if g.entry == "dense"}
GENS = tuple(ROWS)
TOL = {i: (1e-4 if g.operand == "fp32" else 2e-2) for i, g in ROWS.items()}
LSE_TOL = {i: (1e-4 if g.operand == "fp32" else 1e-3) for i, g in ROWS.items()}
SPLIT_GENS = tuple(i for i, g in ROWS.items() if g.split_kv)
# test_matches_sdpa shapes (B, H, N, d), docs/reference.md §5
REFERENCE_SHAPES = [(1, 4, 128, 64), (2, 8, 512, 64), (1, 8, 512, 128), (1, 2, 2048, 64), (1, 2, 130, 64),
                    (1, 2, 100, 128)]


@pytest.fixture(autouse=True)
def _debug_mode(monkeypatch):
    monkeypatch.setenv(api.DEBUG_ENV, "1")
    monkeypatch.delenv(api.NUM_SM_ENV, raising=False)


def _randn(*shape, seed, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _qkv(b, h, nq, nk, d, *, seed=0, dtype=torch.float32):
    return (_randn(b, h, nq, d, seed=seed, dtype=dtype), _randn(b, h, nk, d, seed=seed + 1, dtype=dtype),
            _randn(b, h, nk, d, seed=seed + 2, dtype=dtype))


def _bthd(x):
    return x.detach().float().cpu().transpose(1, 2)  # BHND -> BTNH for the oracle


def oracle(q, k, v, *, causal=False, scale=None, q_offset=0, rows=None):
    """Float64 reference output, BHND numpy. ``rows``: a list of (start, stop) query-row ranges, to keep the
    oracle cheap at long N; the result then stacks those rows in order."""
    kb, vb = _bthd(k), _bthd(v)
    if rows is None:
        out, _ = attention_reference(_bthd(q), kb, vb, causal=causal, scale=scale, q_offset=q_offset)
        return out.transpose(0, 2, 1, 3)
    parts = []
    for a, b in rows:
        out, _ = attention_reference(_bthd(q[:, :, a:b]), kb, vb, causal=causal, scale=scale, q_offset=q_offset + a)
        parts.append(out.transpose(0, 2, 1, 3))
    return np.concatenate(parts, axis=2)


def check(out, ref, tol, *, rows=None):
    assert out.dtype == torch.float32 and out.is_cuda
    o = out.detach().cpu().numpy().astype(np.float64)
    assert np.isfinite(o).all(), "NaN/inf in the output (poisoned element never written?)"
    if rows is not None:
        o = np.concatenate([o[:, :, a:b] for a, b in rows], axis=2)
    assert o.shape == ref.shape
    np.testing.assert_allclose(o, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", REFERENCE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("gen", GENS)
def test_matches_oracle(gen, shape, causal):
    b, h, n, d = shape
    q, k, v = _qkv(b, h, n, n, d, seed=sum(shape))
    out = cuda_ref.attention(q, k, v, causal=causal, generation=gen)
    assert out.shape == q.shape
    key = (shape, causal)
    if key not in _ORACLE_CACHE:  # same seeded inputs for every generation: compute the oracle once
        _ORACLE_CACHE[key] = oracle(q, k, v, causal=causal)
    check(out, _ORACLE_CACHE[key], TOL[gen])


_ORACLE_CACHE: dict = {}


@pytest.mark.parametrize("gen", GENS)
def test_explicit_scale(gen):
    q, k, v = _qkv(1, 4, 256, 256, 64, seed=7)
    out = cuda_ref.attention(q, k, v, scale=0.1, generation=gen)
    check(out, oracle(q, k, v, scale=0.1), TOL[gen])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("gen", GENS)
def test_rectangular_with_q_offset(gen, causal):
    # Our extension over the reference's v1-v6: N_q != N_k and q_offset (top-left, j <= i + q_offset).
    q, k, v = _qkv(2, 2, 70, 333, 64, seed=11)
    out = cuda_ref.attention(q, k, v, causal=causal, q_offset=200, generation=gen)
    check(out, oracle(q, k, v, causal=causal, q_offset=200), TOL[gen])


def test_v1_any_head_dim():
    q, k, v = _qkv(1, 2, 40, 50, 96, seed=3)
    check(cuda_ref.attention(q, k, v, causal=True, generation="v1_naive"), oracle(q, k, v, causal=True), 1e-4)


LONG_ROWS = [(0, 16), (8184, 8200), (16368, 16384)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("gen", "d"), [("v3_online", 64), ("v4_fused", 64), ("v4_fused", 128), ("v5_wmma", 64),
                                        ("v5_wmma", 128)])
def test_long_n_stability(gen, d, causal):
    # §5: N = 16384 at B=1, H=2; the oracle is evaluated on three row blocks only (first, middle, last).
    q, k, v = _qkv(1, 2, 16384, 16384, d, seed=5)
    out = cuda_ref.attention(q, k, v, causal=causal, generation=gen)
    check(out, oracle(q, k, v, causal=causal, rows=LONG_ROWS), TOL[gen], rows=LONG_ROWS)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n_k", [4096, 8192, 8190])
def test_v6_decode(n_k, d, causal):
    # §5 test_v6_splitkv_decode: B=1, H=8, N_q=1; top-left causal at q_offset=0 sees key 0 only.
    q, k, v = _qkv(1, 8, 1, n_k, d, seed=n_k + d)
    out = cuda_ref.attention(q, k, v, causal=causal, generation="v6_splitkv")
    check(out, oracle(q, k, v, causal=causal), 2e-2)


@pytest.mark.parametrize("num_sm", [None, 40, 1])
@pytest.mark.parametrize("n_k", [300, 8190])
def test_v6_decode_q_offset_and_num_sm(n_k, num_sm):
    # Decode as v7+ does it: q_offset = n_k - 1 makes causal see the whole cache; any split plan agrees.
    q, k, v = _qkv(2, 4, 1, n_k, 128, seed=21)
    out = cuda_ref.attention(q, k, v, causal=True, q_offset=n_k - 1, generation="v6_splitkv", num_sm=num_sm)
    check(out, oracle(q, k, v), 2e-2)


def test_v6_num_sm_env_knob(monkeypatch):
    q, k, v = _qkv(1, 8, 1, 8192, 64, seed=4)
    monkeypatch.setenv(api.NUM_SM_ENV, str(cuda_ref.REFERENCE_NUM_SM))
    check(cuda_ref.attention(q, k, v, generation="v6_splitkv"), oracle(q, k, v), 2e-2)


def test_choose_splits_python_matches_cpp():
    from cuda_ref import build

    ext = build.load()
    sms = ext.device_sm_count()
    assert sms == torch.cuda.get_device_properties(0).multi_processor_count
    for bh in (1, 8, 64, 1000):
        for n_q in (1, 8, 9, 512, 4096):
            for n_k in (1, 256, 257, 4096, 8190, 8192, 1 << 20):
                for num_sm in (40, 132, sms):
                    assert tuple(ext.choose_splits(bh, n_q, n_k, num_sm)) == api.choose_splits(bh, n_q, n_k, num_sm)
                assert tuple(ext.choose_splits(bh, n_q, n_k, 0)) == api.choose_splits(bh, n_q, n_k)


@pytest.mark.parametrize("gen", ["v5_wmma", "v6_splitkv"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(gen, dtype):
    # v5/v6 cast to fp16 on the host; the oracle sees the same (rounded) operands.
    q, k, v = _qkv(1, 2, 100, 100, 64, seed=13, dtype=dtype)
    out = cuda_ref.attention(q, k, v, causal=True, generation=gen)
    assert out.dtype == torch.float32
    h = [x.half() for x in (q, k, v)]
    check(out, oracle(*h, causal=True), 2e-2)


@pytest.mark.parametrize("gen", GENS)
def test_non_contiguous_inputs(gen):
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in _qkv(1, 2, 64, 96, 64, seed=17))
    assert not q.is_contiguous()
    check(cuda_ref.attention(q, k, v, generation=gen), oracle(q, k, v), TOL[gen])


def test_wrong_device_is_value_error():
    q, k, v = _qkv(1, 2, 16, 16, 64, seed=1)
    with pytest.raises(ValueError, match="CUDA tensor"):
        cuda_ref.attention(q.cpu(), k, v)


def test_build_is_cached_across_processes(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = "import cuda_ref.build as b; b.load()"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "loaded cached build" in res.stderr, res.stderr  # the session's first call already built it


@pytest.mark.parametrize("gen", GENS)
def test_matches_pallas_twin(gen):
    from pallas_attn import registry

    if not registry.built(gen):
        pytest.skip(f"{gen} has no Pallas twin built yet (no row in pallas_attn.registry)")
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")
    import pallas_attn

    q, k, v = _qkv(1, 2, 256, 256, 64, seed=29)
    for causal in (False, True):
        ours = cuda_ref.attention(q, k, v, causal=causal, generation=gen).cpu().numpy()
        # fp16-operand generations: the CUDA twin casts fp32 on the host; the Pallas twin refuses fp32 (no silent
        # cast), so it is handed the same fp16 operands.
        to_jax = [jax.numpy.asarray(x.cpu().numpy().transpose(0, 2, 1, 3)) for x in _kernel_operands(gen, q, k, v)]
        theirs = np.asarray(pallas_attn.attention(*to_jax, causal=causal, generation=gen), dtype=np.float32)
        theirs = theirs.transpose(0, 2, 1, 3)
        assert np.isfinite(theirs).all()
        # Each twin is within TOL of the oracle, so they agree within twice that.
        np.testing.assert_allclose(ours, theirs, atol=2 * TOL[gen], rtol=2 * TOL[gen])


# --- the row log-sum-exp (return_lse=True) ------------------------------------------------------------


def _kernel_operands(gen, *xs):
    """The operands as the kernel reads them: fp16-operand generations see the host's fp16 cast."""
    return [x.half() if ROWS[gen].operand == "fp16" else x for x in xs]


def lse_oracle(gen, q, k, v, *, causal=False, scale=None, q_offset=0):
    """Float64 reference lse [B, H, Nq] (and output BHND) on the operands the kernel reads."""
    qh, kh, vh = (_bthd(x) for x in _kernel_operands(gen, q, k, v))
    out, lse = attention_reference(qh, kh, vh, causal=causal, scale=scale, q_offset=q_offset)
    return out.transpose(0, 2, 1, 3), lse


def check_lse(lse, ref_lse, gen, shape):
    assert lse.dtype == torch.float32 and lse.is_cuda and tuple(lse.shape) == tuple(shape)
    got = lse.detach().cpu().numpy().astype(np.float64)
    # Top-left causal with q_offset >= 0 always sees key 0, so no row is empty: every lse is finite.
    assert np.isfinite(got).all(), "NaN/inf in lse (poisoned row never written?)"
    assert np.isfinite(ref_lse).all()
    np.testing.assert_allclose(got, ref_lse, atol=LSE_TOL[gen], rtol=0)


LSE_SHAPES = [(1, 4, 128, 64), (1, 8, 512, 128), (1, 2, 2048, 64), (1, 2, 130, 64), (1, 2, 100, 128)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", LSE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("gen", GENS)
def test_lse_matches_oracle(gen, shape, causal):
    b, h, n, d = shape
    q, k, v = _qkv(b, h, n, n, d, seed=sum(shape) + 1)
    out, lse = cuda_ref.attention(q, k, v, causal=causal, generation=gen, return_lse=True)
    ref_out, ref_lse = lse_oracle(gen, q, k, v, causal=causal)
    check(out, ref_out, TOL[gen])
    check_lse(lse, ref_lse, gen, (b, h, n))
    # The LSE store leaves the output untouched: same kernels, same bits as without return_lse.
    assert torch.equal(out, cuda_ref.attention(q, k, v, causal=causal, generation=gen))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("gen", GENS)
def test_lse_rectangular_with_q_offset_and_scale(gen, causal):
    q, k, v = _qkv(2, 2, 70, 333, 64, seed=12)
    out, lse = cuda_ref.attention(q, k, v, causal=causal, q_offset=200, scale=0.3, generation=gen, return_lse=True)
    ref_out, ref_lse = lse_oracle(gen, q, k, v, causal=causal, q_offset=200, scale=0.3)
    check(out, ref_out, TOL[gen])
    check_lse(lse, ref_lse, gen, (2, 2, 70))


def test_lse_v1_any_head_dim():
    q, k, v = _qkv(1, 2, 40, 50, 96, seed=3)
    out, lse = cuda_ref.attention(q, k, v, causal=True, generation="v1_naive", return_lse=True)
    _, ref_lse = lse_oracle("v1_naive", q, k, v, causal=True)
    check_lse(lse, ref_lse, "v1_naive", (1, 2, 40))


@pytest.mark.parametrize("num_sm", [None, 40, 1])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("gen", SPLIT_GENS)
def test_lse_split_kv_decode_every_plan(gen, d, num_sm):
    # B*H = 8, N_q = 1, N_k = 8190: S = 32 with 132 SMs, 10 with the reference's 40, 1 with num_sm = 1. The
    # merged lse m* + log(l*) must not depend on the plan (S = 1 is the unmerged single split).
    q, k, v = _qkv(1, 8, 1, 8190, d, seed=31 + d)
    out, lse = cuda_ref.attention(q, k, v, causal=True, q_offset=8189, generation=gen, num_sm=num_sm,
                                  return_lse=True)
    ref_out, ref_lse = lse_oracle(gen, q, k, v)
    check(out, ref_out, TOL[gen])
    check_lse(lse, ref_lse, gen, (1, 8, 1))


@pytest.mark.parametrize("gen", GENS)
def test_lse_low_precision_inputs(gen):
    if ROWS[gen].operand != "fp16":
        pytest.skip(f"{gen} takes float32 only")
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(1, 2, 100, 100, 64, seed=13, dtype=dtype)
        _, lse = cuda_ref.attention(q, k, v, causal=True, generation=gen, return_lse=True)
        _, ref_lse = lse_oracle(gen, q, k, v, causal=True)
        check_lse(lse, ref_lse, gen, (1, 2, 100))


# --- the table as built (the paged entry: tests/gpu/test_cuda_paged_gpu.py) --------------------------------


def test_built_extension_has_the_current_table():
    from cuda_ref import build

    built = [tuple(r) for r in build.load().table()]
    assert built == [(g.number, g.id, g.entry) for g in cuda_ref.table()]


def test_binding_errors_raise_instead_of_crashing():
    # The binding's own checks (direct callers): messages with numbers must raise, not segfault (see the
    # comment at the top of binding.cpp); this process would die if one did.
    from cuda_ref import build

    ext = build.load()
    q = _randn(1, 2, 16, 64, seed=1)
    with pytest.raises(ValueError, match="unknown generation id 99"):
        ext.forward(99, q, q, q, 0.125, False, 0, 0, True, False)
    with pytest.raises(ValueError, match=r"must share D; got 64 and 32"):
        ext.forward(4, q, q[..., :32], q[..., :32], 0.125, False, 0, 0, True, False)
    with pytest.raises(ValueError, match="scale must be finite"):
        ext.forward(4, q, q, q, float("nan"), False, 0, 0, True, False)
    with pytest.raises(ValueError, match=r"rank 4 \[B, H, N, D\]; got \[2, 16, 64\]"):
        ext.forward(4, q, q[0], q, 0.125, False, 0, 0, True, False)
    with pytest.raises(NotImplementedError, match="supports head dims 64 and 128; got 96"):
        ext.forward(2, q[..., :48].repeat(1, 1, 1, 2), q[..., :48].repeat(1, 1, 1, 2), q[..., :48].repeat(1, 1, 1, 2),
                    0.125, False, 0, 0, True, False)
