"""compare's float64 oracle (session 25): the one pass a workload's forward oracle runs (``accuracy._dense_oracle_f64``,
numpy on the host: sampled batches, row ranges and query heads, causal offsets, GQA groups, per-batch ragged key
counts, window / soft-cap / sinks / packed documents, MLA latents) and the train family's gradients
(``accuracy.grad_oracle``) give ``attn_core.oracle``'s answers to float64 rounding, NaN where numpy puts it (keys past
a sequence's length exist for neither), with nothing compiled; the check against attn_core raises when the result is
off (never a silent judge); and the agreement's one-program finite check and gathers equal the op-by-op ones."""

from __future__ import annotations

import jax
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


def _dense(q, k, v, *, group, batches, rows, heads, causal, scale, q_offs, kv_valid):
    """``_dense_oracle_f64`` on float32 device copies of ``q [B, Tq, Hq, D]``, ``k, v [B, Tk, Hkv, D]`` (query head
    ``h`` reads KV head ``h // group``): ``(out [nb, nrows, nh, Dv]`` in the subset's head order, the program's raw
    ``(out, q0, k0, v0)`` for ``_check_dense_oracle``). A head position the program's groups never fill stays NaN."""
    groups = accuracy._head_groups(tuple(heads), group)
    with jax.enable_x64(True):
        raw = accuracy._dense_oracle_f64(
            *(jnp.asarray(x, jnp.float32) for x in (q, k, v)), jax.device_put(np.asarray(q_offs, np.int64)),
            jax.device_put(np.asarray(kv_valid, np.int64)), batches=tuple(batches), rows=tuple(rows),
            heads=tuple(heads), groups=groups, causal=causal, scale=scale)
        raw = tuple(np.asarray(x) for x in raw)
    out = raw[0]
    res = np.full(out.shape[:2] + (len(heads), out.shape[-1]), np.nan)
    for gi, (_, pos) in enumerate(groups):
        for j, i in enumerate(pos):
            res[:, :, i] = out[:, :, gi, j]
    return res, raw


def _numpy(q, k, v, *, batches, rows, heads, causal, scale, q_offs, kv_valid):
    """``attention_reference`` per sampled batch on that sequence's keys only (``k[b, :kv_valid]``: keys past its
    length do not exist), the subset's rows and query heads: ``[nb, nrows, nh, Dv]``."""
    ridx = np.concatenate([np.arange(r0, r1) for r0, r1 in rows])
    outs = []
    for b, off, n in zip(batches, q_offs, kv_valid):
        o, _ = reference.attention_reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=causal, scale=scale,
                                             q_offset=int(off))
        outs.append(o[:, ridx][:, :, list(heads)])
    return np.concatenate(outs)


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("q_offset", [0, 23, -9])
def test_dense_program_equals_the_numpy_oracle(group, q_offset):
    """Causal row ranges (the first not at row 0, so its rows sit at ``q_offset + r``) of two batches and every query
    head in a shuffled order, in one program, against ``attention_reference`` on the same rows; at a negative offset
    the first rows see no key and are 0, as in numpy. ``_check_dense_oracle`` passes on the program's own result and
    raises on a copy off by 1e-9 in the group it recomputes."""
    rng = np.random.default_rng(7)
    nu, tq, tk = 2, 40, 48
    hq = nu * group
    heads = tuple(int(h) for h in rng.permutation(hq))
    q = _f32(rng, (2, tq, hq, 16))
    k, v = _f32(rng, (2, tk, nu, 16)), _f32(rng, (2, tk, nu, 16))
    rows = ((5, 18), (30, 33))
    kw = dict(batches=(0, 1), rows=rows, heads=heads, causal=True, scale=0.3, q_offs=[q_offset] * 2,
              kv_valid=[tk] * 2)
    got, (out, q0, k0, v0) = _dense(q, k, v, group=group, **kw)
    _assert_same(got, _numpy(q, k, v, **kw))
    blind = max(0, -(q_offset + rows[0][0]))  # rows of the first range that see no key
    assert blind == (4 if q_offset == -9 else 0) and (got[:, :blind] == 0).all() and (got[:, blind:] != 0).all()
    check = dict(rows=rows[0], causal=True, scale=0.3, q_offset=q_offset)
    accuracy._check_dense_oracle(out, q0, k0, v0, **check)
    bad = out.copy()
    bad[0, rows[0][1] - rows[0][0] - 1, 0, 0, 0] += 1e-9  # batch 0, last row of the first range, first group
    with pytest.raises(RuntimeError, match="disagrees with attn_core.oracle"):
        accuracy._check_dense_oracle(bad, q0, k0, v0, **check)


@pytest.mark.parametrize("where", ["q", "k_seen", "k_unseen", "v"])
def test_dense_program_puts_nan_where_numpy_does(where):
    """NaN in -> NaN out at numpy's places: a NaN query row for its own head only, a NaN key for the rows that see it
    (not the rows it is masked from), a NaN value of an existing key for every row of its KV head (the masked
    ``0 * NaN`` included). The check against numpy passes on it."""
    rng = np.random.default_rng(8)
    q, k, v = _f32(rng, (1, 30, 4, 16)), _f32(rng, (1, 40, 2, 16)), _f32(rng, (1, 40, 2, 16))
    off = 10  # row i sees keys j <= 10 + i; the range's row 0 is row 4 of the sequence
    if where == "q":
        q[0, 9, 2, 0] = np.nan
    elif where == "k_seen":
        k[0, 20, 0, 3] = np.nan  # seen from range row 6 on
    elif where == "k_unseen":
        k[0, 35, 0, 3] = np.nan  # past every row's bound
    else:
        v[0, 39, 1, 5] = np.nan  # past every row's causal bound, a key of the sequence all the same
    kw = dict(batches=(0,), rows=((4, 20),), heads=(0, 1, 2, 3), causal=True, scale=0.25, q_offs=[off],
              kv_valid=[40])
    got, (out, q0, k0, v0) = _dense(q, k, v, group=2, **kw)
    _assert_same(got, _numpy(q, k, v, **kw))
    nan_rows = np.isnan(got).any(axis=(0, 3))  # [rows, heads]
    expect = {"q": nan_rows[5, 2] and nan_rows.sum() == 1, "k_seen": nan_rows[6:, :2].all() and not nan_rows[:6].any(),
              "k_unseen": not nan_rows.any(), "v": nan_rows[:, 2:].all() and not nan_rows[:, :2].any()}
    assert expect[where], nan_rows
    accuracy._check_dense_oracle(out, q0, k0, v0, rows=(4, 20), causal=True, scale=0.25, q_offset=off)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("batches", [(0, 1, 2), (1, 2)])
def test_dense_program_on_ragged_lengths(causal, batches):
    """Per-batch key counts (``kv_valid``, a paged cache's ragged lengths; the paged contract's offsets ``len - Tq``):
    each sampled sequence sees only its own keys, so what is stored past its length never leaks, not a huge value and
    not a NaN key or value (numpy run on each sequence's keys alone; a sample of batches keeps each one's length)."""
    rng = np.random.default_rng(9)
    tq, tk, lens = 5, 48, np.array([48, 31, 17])
    q = _f32(rng, (3, tq, 8, 16))
    k, v = _f32(rng, (3, tk, 2, 16)), _f32(rng, (3, tk, 2, 16))
    k[1, 31:], v[1, 31:] = 1e3, 1e6  # past sequence 1: scores and values that would swamp it
    k[2, 20, 0, 3], v[2, 40, 1, 5], v[1, 35, 0, 0] = np.nan, np.nan, np.nan  # past sequences 2 and 1
    kw = dict(batches=batches, rows=((0, tq),), heads=tuple(range(8)), causal=causal, scale=0.3,
              q_offs=lens[list(batches)] - tq, kv_valid=lens[list(batches)])
    got, (out, q0, k0, v0) = _dense(q, k, v, group=4, **kw)
    assert np.isfinite(got).all()
    _assert_same(got, _numpy(q, k, v, **kw))
    n0 = int(lens[batches[0]])
    accuracy._check_dense_oracle(out, q0, k0[:n0], v0[:n0], rows=(0, tq), causal=causal, scale=0.3,
                                 q_offset=n0 - tq)


@pytest.mark.parametrize("q_offset,group", [(0, 4), (30, 1), (30, 4)])
def test_causal_prefill_oracle_on_the_device_matches_the_reference(q_offset, group):
    """``accuracy.oracle`` of a causal prefill workload (bf16, sampled row ranges of several lengths, every head) equals
    the full numpy reference on the subset (``_dense_oracle_f64``, numpy on the host: it compiles no XLA program);
    another subset of the same workload gives the same answers."""
    w = _wl(q_offset=q_offset, heads_kv=8 // group)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    assert len(sub.rows) >= 3 and all(r1 - r0 > 1 for r0, r1 in sub.rows)
    full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale, q_offset=q_offset)
    _assert_same(accuracy.oracle(w, inp, sub), sub.take(full))
    from jax._src import monitoring

    compiles = []

    def listener(name, _secs, **_kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    monitoring.register_event_duration_secs_listener(listener)
    try:
        _assert_same(accuracy.oracle(w, inp, sub), sub.take(full))
    finally:
        monitoring.unregister_event_duration_listener(listener)
    assert compiles == []  # the oracle of a workload whose inputs exist compiles nothing (session 25)
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


def test_the_dense_check_raises_when_its_rows_are_off():
    """``_check_dense_oracle`` on a workload's bf16 inputs as stored (a causal range from row 3, GQA group 4): it passes
    on the program's own result, raises on a copy off by 1e-9, and on one with a NaN numpy does not have."""
    w = _wl(q_len=64, kv_len=64, q_offset=0, batch=1)
    inp = interop.make_inputs(w)
    groups = accuracy._head_groups(tuple(range(8)), 4)
    with jax.enable_x64(True):
        out, q0, k0, v0 = (np.asarray(x) for x in accuracy._dense_oracle_f64(
            inp.q, inp.k, inp.v, jax.device_put(np.array([0])), jax.device_put(np.array([64])), batches=(0,),
            rows=((3, 40),), heads=tuple(range(8)), groups=groups, causal=True, scale=float(inp.scale)))
    assert q0.dtype == k0.dtype == v0.dtype == jnp.bfloat16  # the values as stored reach the check
    check = dict(rows=(3, 40), causal=True, scale=float(inp.scale), q_offset=0)
    accuracy._check_dense_oracle(out, q0, k0, v0, **check)
    with pytest.raises(RuntimeError, match="disagrees with attn_core.oracle"):
        accuracy._check_dense_oracle(out + 1e-9, q0, k0, v0, **check)
    bad = out.copy()
    bad[0, 5, 0, 1, 2] = np.nan
    with pytest.raises(RuntimeError, match="NaN at different places"):
        accuracy._check_dense_oracle(bad, q0, k0, v0, **check)


@pytest.mark.parametrize("tail", [False, True])
def test_grad_oracle_matches_the_full_gradient(tail):
    """``accuracy.grad_oracle`` of a causal GQA train workload (numpy on host copies, session 25) equals the float64
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


def test_the_oracle_notes_say_where_the_math_runs():
    gs = accuracy.choose_grad_subset(_wl(family="train", q_len=32, kv_len=32))
    note = gs.describe()["oracle"]
    assert "attention_grad_reference" in note and "numpy" in note
    assert "_dense_oracle_f64" in accuracy.ORACLE_NOTE and "numpy" in accuracy.ORACLE_NOTE


_FEATS = [dict(window=37), dict(softcap=5.0), dict(sinks=True), dict(window=50, softcap=3.0, sinks=True)]


@pytest.mark.parametrize("family,feat", [("prefill", f) for f in _FEATS + [dict(packed=True)]]
                         + [("paged_decode", f) for f in _FEATS])  # packed documents: a prefill / train layout
def test_the_one_program_oracle_takes_every_feature(feat, family):
    """Session 25: window, soft-cap, sinks and packed documents run in ``_dense_oracle_f64`` too (on a dense and on a
    ragged paged cache); the answers are attn_core's full reference on the subset, features passed through."""
    kw = dict(q_len=300, kv_len=330, q_offset=30) if family == "prefill" else dict(
        q_len=4, kv_len=70, q_offset=66, page_size=16, ragged=True)
    if feat.get("packed"):
        kw = dict(q_len=200, kv_len=200, q_offset=0)
    w = _wl(family=family, **kw, **feat)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    extra = {k: v for k, v in dict(window=w.window, softcap=w.softcap).items() if v is not None}
    if w.sinks:
        extra["sinks"] = reference.to_f64(inp.sinks)
    if w.packed:
        extra["q_segments"] = extra["kv_segments"] = np.asarray(inp.segment_ids)
    if family == "paged_decode":
        full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale,
                                                q_offset=inp.kv_lens - w.q_len, kv_len=inp.kv_lens, **extra)
    else:
        full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale,
                                                q_offset=w.q_offset, **extra)
    _assert_same(accuracy.oracle(w, inp, sub), sub.take(full))


def test_the_feature_check_raises_when_the_program_drops_a_feature(monkeypatch):
    """The check on the first KV head runs attn_core's reference with the workload's features: a program that lost
    the soft-cap (a plausible bug) stops the oracle."""
    w = _wl(softcap=5.0)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    real = accuracy._dense_oracle_f64
    monkeypatch.setattr(accuracy, "_dense_oracle_f64", lambda *a, **kw: real(*a, **{**kw, "softcap": None}))
    with pytest.raises(RuntimeError, match="disagrees with attn_core.oracle"):
        accuracy.oracle(w, inp, sub)


@pytest.mark.parametrize("bad", [None, np.nan, np.inf])
def test_the_one_program_check_and_take_equal_the_op_by_op_ones(bad):
    """``Subset.take_checked`` / ``GradSubset.take_checked`` (session 25: one compiled program a shape) give the op by
    op ``all_finite`` and ``take`` answers, a NaN or Inf anywhere in the full array (not only in the subset) found."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 40, 6, 8)).astype(np.float32)
    if bad is not None:
        x[1, 39, 5, 7] = bad  # outside the subset's rows below
    xj = jnp.asarray(x, jnp.bfloat16)
    sub = accuracy.Subset((0, 2), (1, 4), ((0, 3), (10, 12)))
    finite, got = sub.take_checked(xj)
    assert finite == accuracy.all_finite(xj) == (bad is None)
    np.testing.assert_array_equal(got, sub.take(xj))
    gs = accuracy.GradSubset(batch=2, kv_head=1, group=3, rows=(5, 40), keys=(5, 40))
    dk = jnp.asarray(x[:, :, :2], jnp.bfloat16)
    finite_g, got_g = gs.take_checked((xj, dk, dk + 1))
    assert finite_g == {"dq": bad is None, "dk": True, "dv": True}
    want = gs.take((xj, dk, dk + 1))
    for name in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(got_g[name], want[name])


@pytest.mark.parametrize("q_len,causal", [(1, False), (3, True)])
def test_the_one_program_oracle_on_an_mla_latent(q_len, causal):
    """Session 25: a 16-bit MLA workload's oracle is the one program on its dense latent (keys the whole latent, values
    its first kv_lora_rank columns, one latent head for every query head; ragged lengths), after the latent pool is
    proved to hold the same values through the table: attn_core's MLA reference per sequence. A pool that differs in
    one value stops it."""
    import dataclasses

    from compare.workloads import load_config

    w = {x.name: x for x in load_config("mla")}["mla_smoke_ragged_bfloat16"]
    w = dataclasses.replace(w, q_len=q_len, causal=causal, q_offset=w.kv_len - q_len)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    got = accuracy.oracle(w, inp, sub)
    lat = np.asarray(inp.k.astype(jnp.float32)).astype(np.float64)
    for i, b in enumerate(sub.batches):
        n = int(inp.kv_lens[b])
        q = np.asarray(inp.q[b:b + 1].astype(jnp.float32)).astype(np.float64)
        ref, _ = reference.attention_reference(q, lat[b:b + 1, :n], lat[b:b + 1, :n, :, :w.kv_lora_rank],
                                               causal=causal, scale=inp.scale, q_offset=n - q_len)
        rows = np.concatenate([np.arange(r0, r1) for r0, r1 in sub.rows])
        _assert_same(got[i], ref[0][rows][:, list(sub.heads)])
    page = int(np.asarray(inp.block_table)[0, 0])
    inp.latent_pool = inp.latent_pool.at[page, 2, 0, 5].add(1.0)
    with pytest.raises(RuntimeError, match="pools differ from the dense"):
        accuracy.oracle(w, inp, sub)


@pytest.mark.parametrize("feats", [{}, {"window": 40, "softcap": 30.0, "sinks": True}, {"packed": True}])
def test_the_oracles_host_threads_change_nothing_bit_for_bit(feats):
    """``accuracy.threads(n)``: the dense oracle's (batch, KV group) products on n threads (the runner gives a lane of K
    half the host's cores over K) give the one-thread result bit for bit, features included; a bad count is
    refused, and the count is restored after the block."""
    from compare import runner

    kw = dict(batch=3, q_len=200, kv_len=200, q_offset=0) if feats.get("packed") else {}
    w = _wl(**kw, **feats)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w, max_macs=2e6)
    assert len(sub.batches) * len(accuracy._head_groups(tuple(sub.heads), w.heads_q // w.heads_kv)) > 2
    with accuracy.threads(1):
        one = accuracy.oracle(w, inp, sub)
    for n in (2, 5):
        with accuracy.threads(n):
            assert accuracy.host_threads() == n
            np.testing.assert_array_equal(accuracy.oracle(w, inp, sub), one)
    assert accuracy.host_threads() == 1
    with pytest.raises(ValueError, match="threads"):
        accuracy.set_host_threads(0)
    assert runner.oracle_threads(None, 16) == 8 and runner.oracle_threads((0, 6), 16) == 1
    assert runner.oracle_threads((1, 2), 16) == 4 and runner.oracle_threads((0, 1), None) == 1
