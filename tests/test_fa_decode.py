"""fa_decode in interpret mode (CPU) against the float64 oracle: dense and paged, ragged, causal, GQA.

Interpret mode fills pallas_call outputs with NaN before the kernel runs, so an element the kernel fails
to write fails the finiteness check (the outputs are poisoned by construction). Shapes are small and
awkward: lengths that are not multiples of the tile or the page, kv_len = 1, empty causal rows, splits
with no key, several row tiles.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle as reference
from attn_core.paging import build_paged_kv
from pallas_attn import registry
from pallas_attn.kernels import fa_decode as fd

TOL = {"float16": 1e-2, "bfloat16": 2e-2}  # relative L2 against float64, by operand precision


def _arr(rng, shape, dtype):
    return jnp.asarray(rng.standard_normal(shape), dtype=jnp.dtype(dtype))


def _qkv(rng, b, tq, hq, hkv, d, tk, dtype):
    return _arr(rng, (b, tq, hq, d), dtype), _arr(rng, (b, tk, hkv, d), dtype), _arr(rng, (b, tk, hkv, d), dtype)


def _rel(out, ref):
    out = np.asarray(jnp.asarray(out, jnp.float32), dtype=np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "non-finite output (unwritten element or NaN)"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


# ------------------------------------------------------------------------------------------------ dense

DENSE = [
    # (B, Tq, Hq, Hkv, D, Tk, dtype, causal, q_offset, config)
    (2, 1, 2, 2, 128, 77, "float16", False, 0, fd.DecodeConfig(block_k=32)),  # G=1, MHA
    (1, 1, 4, 2, 128, 100, "bfloat16", True, 99, fd.DecodeConfig(block_k=16, splits=3)),  # G=2
    (2, 1, 8, 2, 128, 130, "float16", False, 0, fd.DecodeConfig(block_k=32, splits=1)),  # G=4, no merge
    (1, 1, 8, 1, 64, 200, "bfloat16", False, 0, fd.DecodeConfig(block_k=64)),  # G=8, MQA
    (1, 1, 16, 1, 128, 33, "float16", False, 0, fd.DecodeConfig(block_k=16)),  # G=16
    (1, 4, 8, 2, 64, 50, "float16", True, 46, fd.DecodeConfig(block_k=16)),  # Tq=4 causal, decode offset
    (1, 4, 4, 1, 256, 40, "bfloat16", True, 3, fd.DecodeConfig(block_k=16)),  # rows see few keys
    (1, 4, 4, 2, 64, 24, "float16", True, 100, fd.DecodeConfig(block_k=16)),  # offset past the end
    (2, 1, 4, 1, 64, 1, "float16", False, 0, fd.DecodeConfig(block_k=16)),  # Tk = 1
    (1, 4, 16, 1, 128, 70, "bfloat16", True, 66, fd.DecodeConfig(block_k=32, block_m_max=16)),  # 4 row tiles
    (1, 1, 4, 2, 256, 300, "float16", False, 0, fd.CONFIGS["default"]),  # heuristic plan (132 SMs)
    # D 96 (Phi-3; session 16): 128-column tiles, the last 32 masked to zero; MHA with a merge, GQA without one
    (2, 1, 4, 4, 96, 300, "bfloat16", True, 299, fd.DecodeConfig(block_k=32, splits=3)),
    (1, 4, 8, 2, 96, 90, "float16", True, 86, fd.DecodeConfig(block_k=16, splits=1)),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", DENSE, ids=lambda c: f"B{c[0]}Tq{c[1]}G{c[2] // c[3]}D{c[4]}Tk{c[5]}{c[6][:2]}"
                         f"{'c' if c[7] else ''}")
def test_dense_matches_oracle(rng, case):
    b, tq, hq, hkv, d, tk, dtype, causal, q_offset, cfg = case
    q, k, v = _arr(rng, (b, tq, hq, d), dtype), _arr(rng, (b, tk, hkv, d), dtype), _arr(rng, (b, tk, hkv, d), dtype)
    out = pallas_attn.attention(q, k, v, causal=causal, q_offset=q_offset, generation="fa_decode", interpret=True,
                                config=cfg)
    assert out.dtype == q.dtype and out.shape == q.shape
    ref, _ = reference.attention_reference(q, k, v, causal=causal, q_offset=q_offset)
    assert _rel(out, ref) < TOL[dtype]


def test_dense_causal_first_row_sees_only_key_0(rng):
    # Top-left causal with q_offset = 0: query 0 sees key 0 only, so its output is v[0] exactly (any scale).
    b, tq, hq, hkv, d, tk = 1, 4, 2, 1, 64, 16
    q, k, v = _qkv(rng, b, tq, hq, hkv, d, tk, "float16")
    out = pallas_attn.attention(q, k, v, causal=True, scale=0.3, generation="fa_decode", interpret=True,
                                config=fd.DecodeConfig(block_k=16))
    np.testing.assert_allclose(np.asarray(out[0, 0, :, :], np.float32), np.asarray(v[0, 0, [0, 0], :], np.float32))
    ref, _ = reference.attention_reference(q, k, v, causal=True, scale=0.3, q_offset=0)
    assert _rel(out, ref) < 1e-2


# ------------------------------------------------------------------------------------------------ paged

PAGED = [
    # (B, Tq, Hq, Hkv, D, kv_lens, page, dtype, causal, config)  block_k > page: per-key gather path
    (3, 1, 8, 2, 128, [37, 1, 64], 8, "float16", False, fd.DecodeConfig(block_k=32)),
    (2, 1, 16, 1, 64, [100, 17], 16, "bfloat16", False, fd.DecodeConfig(block_k=64, splits=2)),
    (2, 4, 8, 2, 64, [1, 23], 16, "float16", True, fd.DecodeConfig(block_k=16)),  # kv_len < Tq: empty rows
    (2, 1, 4, 4, 256, [130, 64], 64, "bfloat16", True, fd.DecodeConfig(block_k=32)),  # G=1, page >= tile
    (2, 4, 16, 2, 128, [300, 257], 256, "float16", True, fd.DecodeConfig(block_k=64)),  # G=8, heuristic split
    (1, 1, 4, 2, 128, [5], 256, "float16", False, fd.CONFIGS["default"]),
    (2, 1, 4, 2, 64, [0, 9], 8, "float16", False, fd.DecodeConfig(block_k=16)),  # kv_len = 0: output 0
    (2, 1, 4, 4, 96, [70, 33], 16, "bfloat16", True, fd.DecodeConfig(block_k=32)),  # D 96, per-key gather
    (2, 1, 8, 2, 96, [130, 64], 64, "float16", False, fd.DecodeConfig(block_k=64, splits=2)),  # D 96, page = tile
]


@pytest.mark.slow
@pytest.mark.parametrize("case", PAGED, ids=lambda c: f"B{c[0]}Tq{c[1]}G{c[2] // c[3]}D{c[4]}p{c[6]}{c[7][:2]}"
                         f"{'c' if c[8] else ''}")
def test_paged_matches_oracle(rng, case):
    b, tq, hq, hkv, d, lens, page, dtype, causal, cfg = case
    tk = max(lens)
    q, k, v = _arr(rng, (b, tq, hq, d), dtype), _arr(rng, (b, tk, hkv, d), dtype), _arr(rng, (b, tk, hkv, d), dtype)
    kp, vp, bt = build_paged_kv(k, v, page, seed=int(rng.integers(1 << 30)), kv_lens=lens)
    lens = np.asarray(lens, np.int32)
    out = pallas_attn.paged_attention(q, jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt), jnp.asarray(lens),
                                      causal=causal, interpret=True, config=cfg)
    assert out.dtype == q.dtype and out.shape == q.shape
    live = np.nonzero(lens > 0)[0]  # the oracle takes no empty sequence; its convention for one is 0
    ref, _ = reference.paged_attention_reference(q[live], kp, vp, bt[live], lens[live], causal=causal)
    assert _rel(out[live], ref) < TOL[dtype]
    for bi in np.nonzero(lens == 0)[0]:  # a sequence with no key outputs exact zeros (never NaN)
        assert not np.any(np.asarray(out[bi], np.float32))


def test_paged_equals_dense_on_same_data(rng):
    b, hq, hkv, d, tk = 2, 8, 2, 64, 96
    q, k, v = _qkv(rng, b, 1, hq, hkv, d, tk, "float16")
    cfg = fd.DecodeConfig(block_k=32, splits=2)
    dense = pallas_attn.attention(q, k, v, generation="fa_decode", interpret=True, config=cfg)
    kp, vp, bt = build_paged_kv(k, v, 32, seed=3)
    paged = pallas_attn.paged_attention(q, jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt),
                                        jnp.full((b,), tk, jnp.int32), interpret=True, config=cfg)
    # Same tiles, same order of accumulation: identical up to nothing.
    np.testing.assert_array_equal(np.asarray(dense, np.float32), np.asarray(paged, np.float32))


def test_keys_past_kv_len_are_never_used(rng):
    # NaN in every pool slot a sequence does not own: a kernel that loads past kv_len (unmasked) or follows a
    # table entry it should not need turns the output NaN.
    b, hq, hkv, d, page = 2, 4, 2, 64, 8
    lens = [13, 3]
    k, v = _arr(rng, (b, 16, hkv, d), "float16"), _arr(rng, (b, 16, hkv, d), "float16")
    q = _arr(rng, (b, 1, hq, d), "float16")
    kp, vp, bt = build_paged_kv(k, v, page, kv_lens=lens)
    ref, _ = reference.paged_attention_reference(q, kp, vp, bt, np.asarray(lens), causal=False)
    for bi, n in enumerate(lens):  # poison the tail of each last page
        last = bt[bi, (n - 1) // page]
        kp[last, n % page or page:] = np.nan
        vp[last, n % page or page:] = np.nan
    bt[1, 1] = 10**6  # an unused table entry: never followed, never checked
    for block_k in (16, 32):  # gather path (page < tile) and contiguous path with a short last tile
        out = pallas_attn.paged_attention(q, jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt),
                                          jnp.asarray(lens, jnp.int32), interpret=True,
                                          config=fd.DecodeConfig(block_k=block_k))
        assert _rel(out, ref) < 1e-2


# ---------------------------------------------------------------------------------------- block table check


def _paged_inputs(rng, b=2, page=8, tk=20):
    k, v = _arr(rng, (b, tk, 2, 64), "float16"), _arr(rng, (b, tk, 2, 64), "float16")
    kp, vp, bt = build_paged_kv(k, v, page)
    q = _arr(rng, (b, 1, 4, 64), "float16")
    return q, jnp.asarray(kp), jnp.asarray(vp), bt, np.full((b,), tk, np.int32)


@pytest.mark.parametrize("bad", ["too_big", "negative", "len_past_table"])
def test_bad_block_table_raises_eagerly(rng, bad):
    q, kp, vp, bt, lens = _paged_inputs(rng)
    if bad == "too_big":
        bt[1, 0] = kp.shape[0]
    elif bad == "negative":
        bt[0, 2] = -1
    else:
        lens[0] = bt.shape[1] * kp.shape[1] + 1
    with pytest.raises(ValueError, match="block_table|kv_lens"):
        pallas_attn.paged_attention(q, kp, vp, jnp.asarray(bt), jnp.asarray(lens), generation="fa_decode",
                                    interpret=True)


def test_bad_block_table_under_jit_poisons_only_that_sequence(rng):
    q, kp, vp, bt, lens = _paged_inputs(rng, b=3)
    ref, _ = reference.paged_attention_reference(q, kp, vp, bt, lens)
    bt[1, 1] = kp.shape[0] + 5  # sequence 1 is bad, 0 and 2 are fine

    def run(check):
        f = jax.jit(lambda *a: pallas_attn.paged_attention(*a, generation="fa_decode", interpret=True,
                                                           check_block_table=check))
        return np.asarray(f(q, kp, vp, jnp.asarray(bt), jnp.asarray(lens)), np.float32)

    out = run(True)
    assert np.all(np.isnan(out[1]))
    assert _rel(out[[0, 2]], ref[[0, 2]]) < 1e-2
    # Check off: no NaN, no out-of-bounds read (the index is clamped in-kernel); the good rows stay right.
    out = run(False)
    assert np.all(np.isfinite(out))
    assert _rel(out[[0, 2]], ref[[0, 2]]) < 1e-2


@pytest.mark.parametrize("one_load", [256, 1])
def test_bad_page_in_a_later_split_poisons_its_sequence_only(rng, monkeypatch, request, one_load):
    """The check of gathered pages (page 8 < 16-key tiles) runs once a program over the pages its keys span (session
    38): a bad entry that only the second split's keys reach poisons that sequence; a bad entry past a sequence's
    length is never checked (nor followed); the other sequences stay right. Both ways of checking: one load before
    the key loop (``PAGES_ONE_LOAD`` 256, session 39) and the loop after it (``kv_source.pages_bad``, forced by 1)."""
    monkeypatch.setattr(fd, "PAGES_ONE_LOAD", one_load)
    jax.clear_caches()  # the knob is read while tracing: no program traced under the other value, before or after
    request.addfinalizer(jax.clear_caches)
    b, page, tk = 3, 8, 60
    k, v = _arr(rng, (b, tk, 2, 64), "float16"), _arr(rng, (b, tk, 2, 64), "float16")
    q = _arr(rng, (b, 1, 4, 64), "float16")
    lens = np.array([60, 20, 60], np.int32)
    kp, vp, bt = build_paged_kv(k, v, page, kv_lens=lens)
    ref, _ = reference.paged_attention_reference(q, kp, vp, bt, lens)
    bt[0, 6] = kp.shape[0] + 3  # keys 48-55 of sequence 0: the second of the 32-key splits
    bt[1, 5] = -7  # past sequence 1's 20 keys (pages 0-2)
    cfg = fd.DecodeConfig(block_k=16, splits=3)
    f = jax.jit(lambda *a: pallas_attn.paged_attention(*a, generation="fa_decode", interpret=True, config=cfg))
    out = np.asarray(f(q, jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt), jnp.asarray(lens)), np.float32)
    assert np.all(np.isnan(out[0]))
    assert _rel(out[[1, 2]], ref[[1, 2]]) < 1e-2


# ------------------------------------------------------------------------------------------- API, jit, errors


def test_public_api_dense_and_paged_under_jit(rng):
    b, hq, hkv, d, tk = 2, 8, 2, 128, 50
    q, k, v = _qkv(rng, b, 1, hq, hkv, d, tk, "bfloat16")
    dense = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, causal=True, q_offset=tk - 1,
                                                          generation="fa_decode", interpret=True))(q, k, v)
    ref, _ = reference.attention_reference(q, k, v, causal=True, q_offset=tk - 1)
    assert _rel(dense, ref) < 2e-2
    kp, vp, bt = build_paged_kv(k, v, 16, seed=1)
    lens = jnp.asarray([tk, 31], jnp.int32)
    paged = jax.jit(lambda *a: pallas_attn.paged_attention(*a, causal=True, interpret=True))(
        q, jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt), lens)
    ref, _ = reference.paged_attention_reference(q, kp, vp, bt, np.asarray(lens), causal=True)
    assert _rel(paged, ref) < 2e-2


def test_registry_row_is_built_and_declares_its_dataflow():
    k = registry.kernel("fa_decode")
    assert k is fd.KERNEL and k.gqa and k.max_q_len == 16 and set(k.head_dims) == {64, 96, 128, 256}
    assert k.lowering == "triton" and k.entries == {"dense", "paged", "quantized"}  # tests/test_fa_decode_quant.py
    assert k.passes == ("pallas_attn_fa_decode_partial", "pallas_attn_fa_decode_merge")


def _pallas_call_names(fn, *args):
    import re

    return set(re.findall(r"pallas_attn_\w+", str(jax.make_jaxpr(fn)(*args))))


def test_passes_are_the_declared_ones(rng):
    # One split: the partial kernel writes the output (no merge); several: partial + the shared merge.
    q, k, v = _qkv(rng, 1, 1, 4, 2, 64, 96, "float16")
    for splits, want in ((1, {"pallas_attn_fa_decode_partial"}), (3, set(fd.KERNEL.passes))):
        cfg = fd.DecodeConfig(block_k=16, splits=splits)
        got = _pallas_call_names(lambda q, k, v, c=cfg: pallas_attn.attention(
            q, k, v, generation="fa_decode", interpret=True, config=c), q, k, v)
        assert got == want, (splits, got)


@pytest.mark.parametrize("kw", [dict(block_k=48), dict(block_k=8), dict(num_warps=3), dict(num_stages=0),
                                dict(splits=0), dict(block_m_max=8), dict(occupancy=0), dict(merge_block=3)])
def test_config_validation(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        fd.DecodeConfig(**kw)


def test_unsupported_inputs_name_what_is_supported(rng):
    q, k = _arr(rng, (1, 1, 4, 80), "float16"), _arr(rng, (1, 8, 2, 80), "float16")  # D 96 is taken (session 16)
    with pytest.raises(NotImplementedError, match="64, 96, 128, 256"):
        pallas_attn.attention(q, k, k, generation="fa_decode", interpret=True)
    q, k = _arr(rng, (1, 17, 4, 64), "float16"), _arr(rng, (1, 32, 2, 64), "float16")
    with pytest.raises(NotImplementedError, match="Tq <= 16"):
        pallas_attn.attention(q, k, k, generation="fa_decode", interpret=True)
    q, k = _arr(rng, (1, 1, 4, 64), "float32"), _arr(rng, (1, 32, 2, 64), "float32")
    with pytest.raises(NotImplementedError, match="float16"):
        pallas_attn.attention(q, k, k, generation="fa_decode", interpret=True)


# ------------------------------------------------------------------------------------------- plan heuristic


def test_plan_for_the_target_shapes():
    cfg = fd.CONFIGS["default"]
    p32 = fd.plan(batch=32, hkv=8, rows=4, d=128, max_kv=8192, config=cfg, sm_count=132)
    p64 = fd.plan(batch=64, hkv=8, rows=4, d=128, max_kv=4096, config=cfg, sm_count=132)
    p1 = fd.plan(batch=1, hkv=8, rows=4, d=128, max_kv=131072, config=cfg, sm_count=132)
    assert p32.splits == 1 and p64.splits == 1  # B·Hkv already fills the chip: no merge pass
    assert 16 <= p1.splits <= 128 and p1.chunk_blocks * p1.splits * p1.block_k >= 131072
    assert p1.block_m == 16 and p1.row_tiles == 1
    # Forced splits never exceed the tile count; rows beyond the cap become row tiles.
    p = fd.plan(batch=1, hkv=1, rows=256, d=256, max_kv=40, config=fd.DecodeConfig(block_k=16, splits=9), sm_count=132)
    assert p.splits == 3 and p.block_m == 32 and p.row_tiles == 8
    assert fd.plan(batch=1, hkv=1, rows=1, d=64, max_kv=64, config=cfg, page_size=8, sm_count=132).paged_gather


# ------------------------------------------------------------------------------------------------- paging


def test_build_paged_kv_layout(rng):
    b, tk, hkv, d, page = 3, 21, 2, 8, 8
    k = rng.standard_normal((b, tk, hkv, d)).astype(np.float16)
    v = rng.standard_normal((b, tk, hkv, d)).astype(np.float16)
    kp, vp, bt = build_paged_kv(k, v, page, seed=7)
    assert bt.dtype == np.int32 and bt.shape == (b, 3) and kp.shape == (9, page, hkv, d) and kp.dtype == k.dtype
    assert sorted(bt.ravel().tolist()) == list(range(9))
    assert not np.array_equal(bt.ravel(), np.arange(9))  # shuffled (seed 7)
    for bi in range(b):
        np.testing.assert_array_equal(reference.gather_paged_kv(kp, bt[bi], tk), k[bi].astype(np.float64))
        np.testing.assert_array_equal(reference.gather_paged_kv(vp, bt[bi], tk), v[bi].astype(np.float64))
    kp2, _, bt2 = build_paged_kv(k, v, page, seed=7)
    np.testing.assert_array_equal(bt, bt2)
    np.testing.assert_array_equal(kp, kp2)
    _, _, bt3 = build_paged_kv(k, v, page, shuffle=False)
    np.testing.assert_array_equal(bt3.ravel(), np.arange(9))
    kpr, _, btr = build_paged_kv(k, v, page, kv_lens=[21, 1, 0])
    assert kpr.shape[0] == 3 + 1 + 0 and btr.shape == (b, 3)
    np.testing.assert_array_equal(reference.gather_paged_kv(kpr, btr[1], 1), k[1, :1].astype(np.float64))


def test_build_paged_kv_jax_bf16_input(rng):
    k = _arr(rng, (1, 10, 1, 16), "bfloat16")
    kp, vp, bt = build_paged_kv(k, k, 16)
    assert kp.dtype == np.dtype(jnp.bfloat16) and kp.shape == (1, 16, 1, 16)
    np.testing.assert_array_equal(np.asarray(kp[0, :10], np.float32), np.asarray(k[0], np.float32))
    assert not np.any(np.asarray(kp[0, 10:], np.float32))


@pytest.mark.parametrize("kw, match", [(dict(page_size=12), "page_size"),
                                       (dict(page_size=8, kv_lens=[3, 99]), "kv_lens")])
def test_build_paged_kv_errors(kw, match):
    k = np.zeros((2, 10, 1, 8), np.float16)
    with pytest.raises(ValueError, match=match):
        build_paged_kv(k, k, **kw)


@pytest.mark.parametrize("hq,hkv,tq", [(4, 4, 1), (8, 2, 4)])
def test_default_decode_routes_to_fa_decode_and_keeps_its_gradient(hq, hkv, tq):
    """``attention(generation=None)`` on a decode shape runs fa_decode, MHA included (session 16: MHA decode had gone to
    fa_train, one CTA per (batch, head) at Tq 1), and ``jax.grad`` through it still works: the VJP recomputes the
    attention through fa_train's backward. The lowered programs name the kernels; the gradients match the float64
    oracle at bf16 rounding. Naming fa_decode explicitly keeps its refusal."""
    import re

    rng = np.random.default_rng(7)
    b, tk, d = 2, 300, 64
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float32).astype(jnp.bfloat16)
               for s in ((b, tq, hq, d), (b, tk, hkv, d), (b, tk, hkv, d)))
    w = jnp.asarray(rng.standard_normal((b, tq, hq, d)), jnp.float32)
    off = tk - tq

    def loss(interpret):
        return lambda q, k, v: jnp.sum(pallas_attn.attention(q, k, v, causal=True, q_offset=off,
                                                             interpret=interpret).astype(jnp.float32) * w)

    def names(fn):
        text = jax.jit(fn).trace(q, k, v).lower(lowering_platforms=("cuda",)).as_text()
        return set(re.findall(r"pallas_attn_(\w+?)(?:_\d+)?\b", text))

    assert {"fa_decode_partial"} <= names(loss(False)) and not any("fa_train" in n for n in names(loss(False)))
    grad_names = names(jax.grad(loss(False), argnums=(0, 1, 2)))  # the forward's value unused: only fa_train's
    assert {"fa_train_fwd", "fa_train_dkdv", "fa_train_dq"} <= grad_names and "fa_decode_partial" not in grad_names
    both = names(jax.value_and_grad(loss(False), argnums=(0, 1, 2)))  # the value from fa_decode, the grads recomputed
    assert {"fa_decode_partial", "fa_train_fwd", "fa_train_dkdv", "fa_train_dq"} <= both, both
    grads = jax.grad(loss(True), argnums=(0, 1, 2))(q, k, v)
    ref = reference.attention_grad_reference(q, k, v, w, causal=True, q_offset=off)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert g.shape == ref[name].shape and _rel(g.astype(jnp.float32), ref[name]) < 1e-2, name
    with pytest.raises(NotImplementedError, match="'fa_decode' has no backward"):
        jax.grad(lambda q: jnp.sum(pallas_attn.attention(q, k, v, causal=True, q_offset=off, interpret=True,
                                                         generation="fa_decode").astype(jnp.float32)))(q)


def test_head_dim_96_tiles_pad_to_128_and_quantized_refuses(rng):
    """D 96 (Phi-3-mini: 32 heads, MHA): fa_decode loads 128-column tiles with the 32 columns past D masked to zero,
    and cuts the output back to 96; the LSE is the oracle's. It lowers to Triton for CUDA (power-of-two tiles); the
    default routes Phi-3's decode to it; a quantized cache at D 96 is refused by name, in ``supports`` too."""
    from pallas_attn import api, quant
    from pallas_attn.kernels.contract import Problem

    b, tq, hq, hkv, d, tk = 1, 1, 8, 8, 96, 200
    q, k, v = _qkv(rng, b, tq, hq, hkv, d, tk, "bfloat16")
    out, lse = pallas_attn.attention(q, k, v, causal=True, q_offset=tk - 1, interpret=True, return_lse=True)
    ref, ref_lse = reference.attention_reference(q, k, v, causal=True, q_offset=tk - 1)
    assert out.shape == (b, tq, hq, d) and _rel(out, ref) < TOL["bfloat16"]
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=0, atol=1e-4)
    assert api.default_generation(api.problem_dense(q, k, causal=True)) == "fa_decode"
    text = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, causal=True, q_offset=tk - 1, interpret=False)).trace(
        q, k, v).lower(lowering_platforms=("cuda",)).as_text()
    assert "pallas_attn_fa_decode_partial" in text
    assert fd.tile_width(96) == 128 and [fd.tile_width(x) for x in (64, 128, 256)] == [64, 128, 256]
    ok, why = fd.KERNEL.supports(Problem(entry="quantized", dtype="float16", batch=1, q_len=1, kv_len=64, heads_q=8,
                                         heads_kv=8, head_dim=96, kv_dtype="fp8_e4m3"))
    assert not ok and "quantized KV at head dims (64, 128, 256); got D=96" in why
    kq, vq = quant.quantize_fp8_e4m3(k.astype(jnp.float16)), quant.quantize_fp8_e4m3(v.astype(jnp.float16))
    with pytest.raises(NotImplementedError, match="quantized KV at head dims"):
        pallas_attn.attention(q.astype(jnp.float16), kq, vq, causal=True, q_offset=tk - 1, generation="fa_decode",
                              interpret=True)


def test_split1_fill_is_one_split_only_where_the_programs_fill_the_sms():
    """``split1_fill`` (session 23): one split where ``B * Hkv * row_tiles`` reaches the fraction of the SMs, else the
    wave model's plan. The default takes 0.9 on a dense 16-bit cache (and 4 warps for a 64-row program at D 128);
    ``waves`` is the wave model alone (the plan before); paged and quantized caches keep the wave model; a smaller
    batch keeps its splits; exclusive with a forced ``splits``."""
    default, waves, spec = fd.CONFIGS["default"], fd.CONFIGS["waves"], fd.CONFIGS["spec_split1"]
    full = dict(batch=16, hkv=8, rows=64, d=128, max_kv=8192, sm_count=132)  # Llama-70B Tq 8: 128 programs
    p = fd.plan(**full, config=default)
    assert (p.splits, p.num_warps) == (1, 4)
    old = fd.plan(**full, config=waves)
    assert (old.splits, old.num_warps) == (2, 4)  # the warps rule is the default's own, splits the wave model's
    assert fd.plan(**full, config=spec) == p
    tq1 = dict(full, rows=4)  # Llama-8B-like Tq 1 at B 16: 128 programs of 16 rows
    assert fd.plan(**tq1, config=default).splits == 1 and fd.plan(**tq1, config=waves).splits == 2
    assert fd.plan(**tq1, config=default).num_warps == fd.plan(**tq1, config=waves).num_warps == 4
    for small in (dict(full, batch=4), dict(full, hkv=4), dict(full, batch=1, max_kv=32768)):
        assert fd.plan(**small, config=default).splits == fd.plan(**small, config=waves).splits > 1
    paged = fd.plan(**full, config=default, page_size=64)
    assert paged.splits == fd.plan(**full, config=waves, page_size=64).splits > 1 and paged.num_warps == 8
    assert fd.plan(**full, config=default, kv_format="fp8_e4m3").num_warps == 8
    with pytest.raises(ValueError, match="exclusive"):
        fd.DecodeConfig(split1_fill=0.9, splits=2)
    with pytest.raises(ValueError, match="split1_fill"):
        fd.DecodeConfig(split1_fill=0)


def test_the_h100_table_leaves_speculative_decode_to_the_default_rule():
    """Session 23: the H100 table's spec rows (rebuilt from the run after the default took one split where the
    programs fill the SMs) name ``default``, whose plan at Llama-70B Tq 8 B 16 is one split and 4 warps; a smaller
    batch that the nearest-row rule sends to the same row keeps the wave model's splits."""
    from pallas_attn import tuning
    from pallas_attn.kernels.contract import Problem

    def prob(batch, q_len):
        return Problem(entry="dense", dtype="bfloat16", batch=batch, q_len=q_len, kv_len=8192, heads_q=64, heads_kv=8,
                       head_dim=128, causal=True)

    with tuning.use_chip("h100"):
        cfg = fd.KERNEL.heuristic(prob(16, 8))
        small = fd.KERNEL.heuristic(prob(4, 8))
    assert cfg == fd.CONFIGS["default"]
    p = fd.plan(batch=16, hkv=8, rows=64, d=128, max_kv=8192, config=cfg, sm_count=132)
    assert (p.splits, p.num_warps) == (1, 4)
    assert fd.plan(batch=4, hkv=8, rows=64, d=128, max_kv=8192, config=small, sm_count=132).splits > 1


def test_the_h200_table_takes_what_each_spec_and_decode_row_measured():
    """The H200's fa_decode rows: Qwen2.5-7B decode B 32 S 32k keeps ``waves`` (session 23, call 6: one split lost
    there, 512.1 against 490.2 us); session 36's grid (call 3, every named config; call 4 through auto) put 128-key
    tiles at Llama-8B spec Tq 2 / 4 and 4 stages at Tq 8 (Llama-70B too) and at Qwen decode B 32 S 8k; Qwen B 128 S 8k
    has a row of its own (default: it had taken B 32's ``spec_st4`` by nearest bucket and lost 3%), and so do the spec
    shapes at B 1 / 8 / 32 / 64 (calls 6-7, ``configs/spec_extrapolation.toml``)."""
    from pallas_attn import tuning
    from pallas_attn.kernels.contract import Problem

    def prob(batch, q_len, kv_len, hq, hkv):
        return Problem(entry="dense", dtype="bfloat16", batch=batch, q_len=q_len, kv_len=kv_len, heads_q=hq,
                       heads_kv=hkv, head_dim=128, causal=True)

    with tuning.use_chip("h200"):
        assert fd.KERNEL.heuristic(prob(32, 1, 32768, 28, 4)) == fd.CONFIGS["waves"]
        assert fd.KERNEL.heuristic(prob(16, 4, 8192, 32, 8)) == fd.CONFIGS["spec_bk128"]
        assert fd.KERNEL.heuristic(prob(16, 8, 8192, 64, 8)) == fd.CONFIGS["spec_st4"]
        assert fd.KERNEL.heuristic(prob(32, 1, 8192, 28, 4)) == fd.CONFIGS["spec_st4"]
        assert fd.KERNEL.heuristic(prob(128, 1, 8192, 28, 4)) == fd.CONFIGS["default"]
        # calls 6-7: away from B 16 the two configs lost (B 1 Tq 2 128-key tiles 1.08-1.24x, B 8 Tq 8 4 stages up to
        # 1.04x); those batches have default rows, so only the batches nearest 16 take them
        for b in (1, 8, 32, 64):
            assert fd.KERNEL.heuristic(prob(b, 2, 8192, 32, 8)) == fd.CONFIGS["default"], b
            assert fd.KERNEL.heuristic(prob(b, 8, 8192, 64, 8)) == fd.CONFIGS["default"], b


def test_one_query_and_several_never_share_a_table_row():
    """``tuning.DERIVED`` (session 36): fa_decode's query regime is an exact key, so a Tq 1 shape the table has no row
    for never takes a speculative row by nearest bucket (Llama-3.1-70B B 16 S 8k would have taken the Tq 2 row's
    128-key tiles), and a speculative shape never takes a Tq 1 row (GPT-2's D 64 spec shapes had taken Tq 1 rows)."""
    from pallas_attn import tuning
    from pallas_attn.kernels.contract import Problem

    def prob(q_len, hq=64, hkv=8, d=128, batch=16):
        return Problem(entry="dense", dtype="bfloat16", batch=batch, q_len=q_len, kv_len=8192, heads_q=hq,
                       heads_kv=hkv, head_dim=d, causal=True)

    tbl = {"min_gain": 0.02, "kernels": {"fa_decode": {"rows": [
        {"key": tuning.bucket("fa_decode", prob(2)), "config": "spec_bk128"},
        {"key": tuning.bucket("fa_decode", prob(1, batch=128)), "config": "waves"}]}}}
    assert tuning.choose("fa_decode", prob(1), tbl=tbl) == "waves"  # the Tq 2 row is nearer, and not eligible
    assert tuning.choose("fa_decode", prob(4), tbl=tbl) == "spec_bk128"
    assert tuning.choose("fa_decode", prob(2, hq=12, hkv=12, d=64), tbl=tbl) is None  # no row of its kind
    with tuning.use_chip("h200"):
        assert fd.KERNEL.heuristic(prob(1)) == fd.CONFIGS["default"]
        assert fd.KERNEL.heuristic(prob(8, hq=12, hkv=12, d=64)) == fd.CONFIGS["default"]


def test_stages_are_fitted_to_the_shared_memory_a_cta_may_use():
    """``fit_stages`` (session 36; the buffers a stage count takes, ``stage_buffers``, session 37): `spec_st4`'s 4
    stages of the doubled 128-key tile at Llama-3.1-70B Tq 8 B 64 asked the H200 for 278,528 bytes of shared memory
    (its launch refused); the plan now lowers the stages to what fits beside the q tile, leaves every plan that fits
    as it was (all of the default's), and refuses a tile of which not even one stage fits."""
    import itertools

    p = fd.plan(batch=64, hkv=8, rows=64, d=128, max_kv=8192, config=fd.CONFIGS["spec_st4"], sm_count=132)
    assert (p.block_m, p.block_k, p.num_stages) == (64, 128, 3)
    assert 4 * fd.stage_bytes(128, 128, None) + 64 * 128 * 2 == 278528 > fd.SMEM_LIMIT  # what the launch asked for
    assert p == fd.plan(batch=64, hkv=8, rows=64, d=128, max_kv=8192, config=fd.CONFIGS["default"], sm_count=132)
    # the mma.sync path (block_m 16 / 32) keeps one buffer fewer: its 4 stages of 128-key tiles ran at Llama-3.1-8B
    # B 128 (16 rows) and Tq 8 B 64 (32 rows), and are kept
    for b, rows, bm in ((128, 4, 16), (64, 32, 32)):
        p = fd.plan(batch=b, hkv=8, rows=rows, d=128, max_kv=8192, config=fd.CONFIGS["spec_st4"], sm_count=132)
        assert (p.block_m, p.block_k, p.num_stages) == (bm, 128, 4), (b, rows)
        assert fd.stage_buffers(bm, 4) == 3
    for name, d, fmt, b, rows in itertools.product(fd.CONFIGS, (64, 128, 256), (None, "fp8_e4m3", "nvfp4"),
                                                   (1, 16, 64), (4, 64)):
        kw = dict(batch=b, hkv=8, rows=rows, d=d, max_kv=32768, sm_count=132, kv_format=fmt)
        got = fd.plan(config=fd.CONFIGS[name], **kw)
        buffers = fd.stage_buffers(got.block_m, got.num_stages)
        assert buffers * fd.stage_bytes(got.block_k, d, fmt) + got.block_m * d * 2 <= fd.SMEM_LIMIT, (name, kw)
        asked = fd.CONFIGS[name].num_stages
        assert asked is None or got.num_stages == asked or (  # lowered only as far as needed
            fd.stage_buffers(got.block_m, got.num_stages + 1) * fd.stage_bytes(got.block_k, d, fmt)
            + got.block_m * d * 2 > fd.SMEM_LIMIT), (name, kw)
        if name == "default":
            assert got.num_stages == 3, kw  # never lowered
    with pytest.raises(ValueError, match="does not fit"):
        fd.plan(batch=1, hkv=8, rows=4, d=256, max_kv=8192, config=fd.DecodeConfig(block_k=512), sm_count=132)
