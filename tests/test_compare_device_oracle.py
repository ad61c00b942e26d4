"""compare's float64 oracle on the device, on the CPU: the causal row ranges of a prefill workload
(``accuracy._device_rows_causal``) and the train family's gradients (``accuracy._grad_device``) give
``attn_core.oracle``'s numpy answers to float64 rounding, NaN where numpy puts it, with one compiled program for
every range of a shape; and the checks against numpy raise when the device result is off (never a silent judge)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from attn_core import oracle as reference
from compare import accuracy, interop
from compare.workloads import Workload


def _wl(**kw) -> Workload:
    base = dict(name="t_dev", family="prefill", batch=2, heads_q=8, heads_kv=2, q_len=300, kv_len=330, head_dim=16,
                dtype="bfloat16", causal=True, q_offset=30, seed=5)
    base.update(kw)
    return Workload(**base)


def _f32(rng, shape) -> np.ndarray:
    """Normal draws that float32 holds exactly (what the device arrays carry), as float64."""
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


def _assert_same(got, want, rel=1e-12):
    """NaN at the same places, the rest within ``rel`` of the largest ``|want|``."""
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    if ok.any():
        scale = max(float(np.max(np.abs(want[ok]))), 1e-300)
        assert float(np.max(np.abs(got[ok] - want[ok]))) <= rel * scale


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("q_offset", [0, 23, -9])
def test_causal_device_rows_equal_the_numpy_oracle(group, q_offset):
    """A causal range of rows (not the first of the sequence, so its offset is ``q_offset + r0``) on the device against
    ``attention_reference`` on the same rows, per KV head of an unsorted head map; at a negative offset the first rows
    see no key and are 0, as in numpy. The per-workload check passes on it and raises on a perturbed copy."""
    rng = np.random.default_rng(7)
    nu, tq, tk = 2, 40, 48
    hmap = [1, 0] * group if group > 1 else [1, 0]
    q = _f32(rng, (1, tq, len(hmap), 16))
    k, v = _f32(rng, (1, tk, nu, 16)), _f32(rng, (1, tk, nu, 16))
    r0, r1 = 5, 18
    got = accuracy._device_rows_causal(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                                       jnp.asarray(v, jnp.float32), hmap, rows=(r0, r1), scale=0.3,
                                       q_offset=q_offset + r0)
    want, _ = reference.attention_reference(q[:, r0:r1], k[:, :, hmap], v[:, :, hmap], causal=True, scale=0.3,
                                            q_offset=q_offset + r0)
    _assert_same(got, want)
    blind = max(0, -(q_offset + r0))  # rows of the range that see no key
    assert blind == (4 if q_offset == -9 else 0) and (got[:, :blind] == 0).all() and (got[:, blind:] != 0).any()
    args = (q[:, r0:r1], jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32), hmap)
    accuracy._check_device_rows(got, *args, causal=True, scale=0.3, q_offset=q_offset + r0)
    bad = got.copy()
    bad[0, -1, 0] += 1e-9  # query head 0 reads hmap[0], the KV head the check recomputes
    with pytest.raises(RuntimeError, match="disagrees with attn_core.oracle"):
        accuracy._check_device_rows(bad, *args, causal=True, scale=0.3, q_offset=q_offset + r0)


@pytest.mark.parametrize("where", ["q", "k_seen", "k_unseen", "v"])
def test_causal_device_rows_put_nan_where_numpy_does(where):
    """NaN in -> NaN out at numpy's places: a NaN query row for its own head only, a NaN key for the rows that see it
    (not the rows it is masked from), a NaN value for every row of its KV head (the masked ``0 * NaN`` included)."""
    rng = np.random.default_rng(8)
    hmap = [0, 0, 1, 1]
    q, k, v = _f32(rng, (1, 30, 4, 16)), _f32(rng, (1, 40, 2, 16)), _f32(rng, (1, 40, 2, 16))
    r0, r1, off = 4, 20, 10  # row i (of the range) sees keys j <= 14 + i
    if where == "q":
        q[0, 9, 2, 0] = np.nan
    elif where == "k_seen":
        k[0, 20, 0, 3] = np.nan  # seen from range row 6 on
    elif where == "k_unseen":
        k[0, 35, 0, 3] = np.nan  # past every row's bound
    else:
        v[0, 39, 1, 5] = np.nan
    got = accuracy._device_rows_causal(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                                       jnp.asarray(v, jnp.float32), hmap, rows=(r0, r1), scale=0.25,
                                       q_offset=off + r0)
    want, _ = reference.attention_reference(q[:, r0:r1], k[:, :, hmap], v[:, :, hmap], causal=True, scale=0.25,
                                            q_offset=off + r0)
    _assert_same(got, want)
    nan_rows = np.isnan(got).any(axis=(0, 3))  # [rows, heads]
    expect = {"q": nan_rows[5, 2] and nan_rows.sum() == 1, "k_seen": nan_rows[6:, :2].all() and not nan_rows[:6].any(),
              "k_unseen": not nan_rows.any(), "v": nan_rows[:, 2:].all() and not nan_rows[:, :2].any()}
    assert expect[where], nan_rows
    accuracy._check_device_rows(got, q[:, r0:r1], jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32), hmap,
                                causal=True, scale=0.25, q_offset=off + r0)


@pytest.mark.parametrize("q_offset,group", [(0, 4), (30, 1), (30, 4)])
def test_causal_prefill_oracle_on_the_device_matches_the_reference(q_offset, group):
    """``accuracy.oracle`` of a causal prefill workload (bf16, sampled row ranges of several lengths, every head) equals
    the full numpy reference on the subset; its ranges go to ``_device_rows_causal``, which compiles per padded range
    length, not per range: the ranges of one length at other offsets add no program."""
    w = _wl(q_offset=q_offset, heads_kv=8 // group)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    assert len(sub.rows) >= 3 and all(r1 - r0 > 1 for r0, r1 in sub.rows)
    full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale, q_offset=q_offset)
    _assert_same(accuracy.oracle(w, inp, sub), sub.take(full))
    before = accuracy._dense_oracle_f64._cache_size()
    _assert_same(accuracy.oracle(w, inp, sub), sub.take(full))
    assert accuracy._dense_oracle_f64._cache_size() == before  # one program a workload (session 25), reused
    # another subset of the same workload (other rows: a program of its own): the same answers
    shifted = accuracy.Subset(sub.batches, sub.heads, tuple((r0 + 1, r1 + 1) for r0, r1 in sub.rows[:-1]))
    _assert_same(accuracy.oracle(w, inp, shifted), shifted.take(full))


@pytest.mark.parametrize("causal", [True, False])
def test_the_oracle_raises_when_the_dense_device_program_is_off(monkeypatch, causal):
    """A device result off by 1e-9 (far under any verdict tolerance) stops the oracle with a RuntimeError: the one
    program a dense workload's oracle runs (``_dense_oracle_f64``, session 25)."""
    w = _wl(q_len=64, kv_len=64, q_offset=0, batch=2, causal=causal)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    accuracy.oracle(w, inp, sub)  # agrees
    real = accuracy._dense_oracle_f64

    def off(*a, **kw):
        out, *rest = real(*a, **kw)
        return (out + 1e-9, *rest)

    monkeypatch.setattr(accuracy, "_dense_oracle_f64", off)
    with pytest.raises(RuntimeError, match="disagrees with attn_core.oracle"):
        accuracy.oracle(w, inp, sub)


@pytest.mark.parametrize("causal,q_len,q_offset", [(True, 1, 329), (True, 5, 325), (False, 7, 0), (True, 40, -9)])
def test_the_dense_program_on_sampled_heads_and_batches(causal, q_len, q_offset):
    """``_dense_oracle`` on a subset with sampled batches and heads whose KV groups differ in size (heads 0 and 1 read
    KV head 0, head 5 reads KV head 1: padded to one shape) and on decode-like rows: attn_core's full reference."""
    w = _wl(batch=3, q_len=q_len, kv_len=330, q_offset=q_offset, causal=causal)
    inp = interop.make_inputs(w)
    full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=causal, scale=inp.scale, q_offset=q_offset)
    rows = ((0, q_len),) if q_len < 8 else ((0, 3), (17, 30), (q_len - 2, q_len))
    for heads in ((0, 1, 5), (7,), tuple(range(8))):
        sub = accuracy.Subset((0, 2), heads, rows)
        _assert_same(accuracy.oracle(w, inp, sub), sub.take(full))
    assert accuracy._head_groups((0, 1, 5), 4) == ((0, (0, 1)), (1, (2, 2)))


def test_the_causal_range_check_raises_when_its_rows_are_off():
    """The per-range causal path (a quantized dense cache's rows) and its check against numpy: off by 1e-9, it
    raises."""
    w = _wl(q_len=64, kv_len=64, q_offset=0, batch=1)
    inp = interop.make_inputs(w)
    hmap = [h // 4 for h in range(8)]
    got = accuracy._device_rows_causal(inp.q, inp.k, inp.v, hmap, rows=(3, 40), scale=inp.scale, q_offset=3)
    qf = reference.to_f64(inp.q[:, 3:40])
    accuracy._check_device_rows(got, qf, inp.k, inp.v, hmap, causal=True, scale=inp.scale, q_offset=3)
    with pytest.raises(RuntimeError, match="disagrees with attn_core.oracle"):
        accuracy._check_device_rows(got + 1e-9, qf, inp.k, inp.v, hmap, causal=True, scale=inp.scale, q_offset=3)


def _grad_problem(rng, n, g, tk, nan=None):
    q, do = _f32(rng, (1, n, g, 16)), _f32(rng, (1, n, g, 16))
    k, v = _f32(rng, (1, tk, 1, 16)), _f32(rng, (1, tk, 1, 16))
    if nan is not None:
        a = {"q": q, "k": k, "v": v, "do": do}[nan]
        a[0, a.shape[1] // 2, 0, 3] = np.nan
    return q, k, v, do


@pytest.mark.parametrize("causal,q_offset,n,group,tk", [
    (True, 0, 40, 4, 40), (True, 25, 40, 4, 70), (True, -6, 30, 2, 30), (False, 0, 24, 4, 36),
    (True, 0, 300, 1, 300)],  # 300 rows of one head: numpy's two row blocks (256 + 44)
    ids=["causal", "offset", "blind_rows", "noncausal", "two_blocks"])
@pytest.mark.parametrize("nan", [None, "q", "k", "v", "do"])
def test_device_gradients_equal_attention_grad_reference(causal, q_offset, n, group, tk, nan):
    """dq, dk, dv of the device backward against ``attention_grad_reference`` on the same problem (GQA group, causal
    with offsets, rows that see no key, non-causal, numpy's blocks), and NaN wherever numpy puts it (numpy's row blocks
    and key ranges decide where a masked ``0 * NaN`` lands; the device follows them). Checked inside too."""
    q, k, v, do = _grad_problem(np.random.default_rng(11), n, group, tk, nan)
    want = reference.attention_grad_reference(q, k, v, do, causal=causal, scale=0.3, q_offset=q_offset)
    got = accuracy._grad_device(*(jnp.asarray(x, jnp.float32) for x in (q, k, v, do)), causal=causal, scale=0.3,
                                q_offset=q_offset)
    assert set(got) == {"dq", "dk", "dv"}
    for name in ("dq", "dk", "dv"):
        _assert_same(got[name], want[name])
    if nan is None:
        assert all(np.isfinite(x).all() for x in got.values())


@pytest.mark.parametrize("tail", [False, True])
def test_grad_oracle_on_the_device_matches_the_full_gradient(tail):
    """``accuracy.grad_oracle`` of a causal GQA train workload (no features: the device path) equals the float64
    gradients of the whole problem on its subset: every row, or the tail (rows from ``r0 > 0`` and the keys only they
    see), the shapes ``GradSubset.take`` gives."""
    w = _wl(family="train", q_len=160, kv_len=160, q_offset=0, batch=2, heads_q=8, heads_kv=2, dtype="float32")
    inp = interop.make_inputs(w)
    gs = accuracy.choose_grad_subset(w, max_scores=4 * 96 * 160) if tail else accuracy.choose_grad_subset(w)
    assert (gs.rows, gs.keys) == (((64, 160), (64, 160)) if tail else ((0, 160), (0, 160)))
    b = gs.batch
    full = reference.attention_grad_reference(inp.q[b:b + 1], inp.k[b:b + 1], inp.v[b:b + 1], inp.w[b:b + 1],
                                              causal=True, scale=inp.scale)
    h, kv = list(gs.heads), slice(gs.kv_head, gs.kv_head + 1)
    want = {"dq": full["dq"][:, slice(*gs.rows)][:, :, h], "dk": full["dk"][:, slice(*gs.keys), kv],
            "dv": full["dv"][:, slice(*gs.keys), kv]}
    got = accuracy.grad_oracle(w, inp, gs)
    for name in ("dq", "dk", "dv"):
        _assert_same(got[name], want[name])


@pytest.mark.parametrize("how", ["every_block", "first_block"])
def test_grad_oracle_raises_when_the_device_gradients_are_off(monkeypatch, how):
    """The per-call check stops ``grad_oracle`` with a RuntimeError: the device program off everywhere (its run on the
    check's sub-problem disagrees with numpy), or off only in the subset's first block (the result itself disagrees
    with numpy's dQ of the last rows, which the sub-problem's own run would not show)."""
    w = _wl(family="train", q_len=96, kv_len=96, q_offset=0, batch=1, heads_q=4, heads_kv=1, dtype="float32")
    inp = interop.make_inputs(w)
    gs = accuracy.choose_grad_subset(w)
    accuracy.grad_oracle(w, inp, gs)  # agrees
    real = accuracy._grad_block_f64

    def off(q, do, k, v, dk, dv, start, *a, **kw):
        dq, dk, dv = real(q, do, k, v, dk, dv, start, *a, **kw)
        return (dq * (1 + 1e-9), dk, dv) if how == "every_block" or start == 0 else (dq, dk, dv)

    monkeypatch.setattr(accuracy, "_grad_block_f64", off)
    match = "disagrees with attn_core.oracle.attention_grad_reference" if how == "every_block" else \
        "gradients disagree with attn_core.oracle.attention_grad_reference"
    with pytest.raises(RuntimeError, match=match):
        accuracy.grad_oracle(w, inp, gs)


def test_the_oracle_notes_say_where_the_math_runs():
    gs = accuracy.choose_grad_subset(_wl(family="train", q_len=32, kv_len=32))
    note = gs.describe()["oracle"]
    assert "device" in note and "attention_grad_reference" in note and "numpy" in note
    assert "_dense_oracle_f64" in accuracy.ORACLE_NOTE and "numpy" in accuracy.ORACLE_NOTE
