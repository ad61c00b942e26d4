"""fa_prefill on the CPU: its contract and refusals, its interpret-mode twin against the float64 oracle, and
its Mosaic GPU kernel lowering for CUDA (the kernel itself runs in tests/gpu/test_fa_prefill_gpu.py)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from pallas_attn import api
from pallas_attn.kernels import fa_prefill as fp
from pallas_attn.kernels.contract import Problem

K = fp.KERNEL


def _p(**kw):
    base = dict(entry="dense", dtype="float16", batch=1, q_len=256, kv_len=256, heads_q=4, heads_kv=4, head_dim=128)
    base.update(kw)
    return Problem(**base)


@pytest.mark.parametrize("kw,match", [
    (dict(dtype="float32"), "dtypes"),
    (dict(head_dim=80), "head dims"),
    (dict(heads_q=6, heads_kv=4), "multiple of Hkv"),
    (dict(entry="paged", page_size=16), "serves"),
    (dict(kv_len=0), "at least one key"),
])
def test_supports_refuses_with_a_reason(kw, match):
    ok, why = K.supports(_p(**kw))
    assert not ok and re.search(match, why), why


@pytest.mark.parametrize("kw", [dict(), dict(head_dim=64, heads_q=8, heads_kv=2), dict(head_dim=256, causal=True),
                                dict(dtype="bfloat16", q_len=1, kv_len=7)])
def test_supports_accepts(kw):
    assert K.supports(_p(**kw)) == (True, "")


def test_heuristic_and_config_validation():
    # the pipelined consumers for both (masked blocks run serially after the pipeline; docs/fa_prefill.md)
    assert K.config(None, _p(causal=False)) is fp.CONFIGS["default"] is K.config(None, _p(causal=True))
    big = K.config(None, _p(head_dim=256))
    assert fp.smem_bytes(256, 2, big) <= fp._SMEM_LIMIT and big.block_kv == 64
    for bad in (dict(block_q=128), dict(block_kv=96), dict(stages=1), dict(consumer_regs=250), dict(pingpong=1)):
        with pytest.raises(ValueError, match="PrefillConfig"):
            fp.PrefillConfig(**bad)
    q = jnp.zeros((1, 64, 2, 256), jnp.float16)
    with pytest.raises(ValueError, match="shared memory"):  # too big for an H100 block: refused, not truncated
        fp.forward(q, q, q, causal=False, scale=1.0, q_offset=jnp.zeros((1,), jnp.int32), interpret=False,
                   config=fp.PrefillConfig(block_kv=128, stages=2), return_lse=False)


def _rand(rng, shape, dtype):
    return jnp.asarray(rng.standard_normal(shape), dtype)


# b, tq, tk, hq, hkv, d, causal, offsets, dtype: odd lengths, Tq != Tk, GQA, negative and per-sequence offsets
_CASES = [
    (2, 70, 130, 4, 2, 64, True, (0, 60), "float16"),
    (1, 64, 200, 2, 1, 128, False, (0,), "bfloat16"),
    (2, 40, 30, 2, 2, 64, True, (-5, 3), "float16"),
    (1, 129, 129, 2, 2, 64, True, (0,), "bfloat16"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", _CASES, ids=lambda c: "-".join(map(str, c)))
def test_interpret_twin_matches_the_oracle(rng, case):
    b, tq, tk, hq, hkv, d, causal, offs, dt = case
    q, k, v = _rand(rng, (b, tq, hq, d), dt), _rand(rng, (b, tk, hkv, d), dt), _rand(rng, (b, tk, hkv, d), dt)
    o, lse = pallas_attn.attention(q, k, v, causal=causal, q_offset=jnp.asarray(offs, jnp.int32),
                                   generation="fa_prefill", interpret=True, return_lse=True)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.shape == (b, hq, tq) and lse.dtype == jnp.float32
    ro, rl = oracle.attention_reference(q, k, v, causal=causal, q_offset=np.asarray(offs))
    o = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
    lse = np.asarray(lse, np.float64)
    tol = 2e-2 if dt == "bfloat16" else 4e-3
    assert np.linalg.norm(o - ro) / np.linalg.norm(ro) < tol
    fin = np.isfinite(rl)
    assert np.array_equal(np.isfinite(lse), fin)
    assert np.abs(lse[fin] - rl[fin]).max() < 1e-3
    if not fin.all():  # rows that see no key (negative offset): zero output, LSE -inf
        assert np.all(o[~fin.transpose(0, 2, 1)] == 0.0)
        assert np.all(lse[~fin] == -np.inf)


def test_nan_row_stays_in_its_row(rng):
    q, k = _rand(rng, (1, 64, 2, 64), "float16"), _rand(rng, (1, 80, 1, 64), "float16")
    q = q.at[0, 7, 1, 3].set(jnp.nan)
    o = np.asarray(jnp.asarray(pallas_attn.attention(q, k, k, generation="fa_prefill", interpret=True), jnp.float32))
    assert np.all(np.isnan(o[0, 7, 1]))
    mask = np.ones(o.shape[:3], bool)
    mask[0, 7, 1] = False
    assert np.all(np.isfinite(o[mask]))


@pytest.mark.parametrize(("cfg", "d"), [("default", 64), ("serial", 64), ("pingpong", 64), ("pingpong", 256)])
def test_mosaic_kernel_lowers_for_cuda(cfg, d):
    """The Mosaic GPU kernel (not the twin) lowers on this CPU machine: a GQA, causal, ragged shape with LSE; at
    D=256 a named config runs with 64-key tiles (``fa_prefill.fit``) instead of refusing."""
    q = jax.ShapeDtypeStruct((2, 200, 4, d), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 333, 2, d), jnp.bfloat16)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)

    def f(q, k, off):
        return api.attention(q, k, k, causal=True, q_offset=off, generation="fa_prefill", config=cfg,
                             interpret=False, return_lse=True)

    text = jax.jit(f).trace(q, k, off).lower(lowering_platforms=("cuda",)).as_text()
    names = set(re.findall(r"pallas_attn_\w+", text))
    assert fp.PASS_FWD in names and names <= set(K.passes), names
    assert fp.PASS_FALLBACK not in names


def test_three_consumers_config_and_plan():
    """consumers=3: 192 rows a CTA, four warpgroups sharing 512 registers a thread slot; refused with a reason when
    the budgets do not fit four warpgroups or with ping-pong (a two-consumer handshake)."""
    c3 = fp.PrefillConfig(consumers=3, consumer_regs=160, producer_regs=32)
    for bad, match in ((dict(consumers=4), "consumers must be 2 or 3"), (dict(consumers=True), "consumers"),
                       (dict(consumers=3), "exceed the 512"), (dict(consumer_regs=240), "exceed the 504"),
                       (dict(consumers=3, consumer_regs=160, producer_regs=32, pingpong=True), "needs consumers=2")):
        with pytest.raises(ValueError, match=match):
            fp.PrefillConfig(**bad)
    # three Q/O tiles and three LSE rows instead of two
    assert fp.smem_bytes(64, 2, c3) - fp.smem_bytes(64, 2, fp.CONFIGS["default"]) == 64 * 64 * 2 + 64 * 4
    plan = fp._plan(_p(q_len=500, kv_len=500, head_dim=64, batch=2, heads_q=4, heads_kv=2), c3)
    assert plan["consumers"] == 3 and plan["warpgroups"] == 4 and plan["ctas"] == 2 * 4 * 3  # 500 rows: 3 x 192


@pytest.mark.parametrize("kw", [dict(), dict(tiles=3), dict(overlap=False)], ids=["c3", "c3tiles3", "c3serial"])
@pytest.mark.parametrize("feat", [dict(), dict(window=(100, 0), softcap=30.0), dict(q_lens=True)],
                         ids=["plain", "window-softcap", "q_lens"])
def test_three_consumers_lower_for_cuda(kw, feat):
    """The three-consumer kernel lowers (D 64, causal, ragged, GQA, LSE) with its four warpgroups and a ring freed
    by three arrivals."""
    cfg = fp.PrefillConfig(consumers=3, consumer_regs=160, producer_regs=32, **kw)
    q = jax.ShapeDtypeStruct((2, 500, 4, 64), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 500, 2, 64), jnp.bfloat16)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)
    feat = dict(feat)
    lens = feat.pop("q_lens", None)

    def f(q, k, off):
        extra = {"q_lens": off} if lens else {}
        return fp.forward(q, k, k, causal=True, scale=0.125, q_offset=off, interpret=False, config=cfg,
                          return_lse=True, **feat, **extra)

    text = jax.jit(f).trace(q, k, off).lower(lowering_platforms=("cuda",)).as_text()
    assert fp.PASS_FWD in set(re.findall(r"pallas_attn_\w+", text))
    assert "tensor<2x576x4x64xbf16>" in text  # the rows padded to whole 192-row tiles
