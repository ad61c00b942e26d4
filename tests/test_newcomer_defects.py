"""Issue 33's newcomer defects, each pinned on the CPU: jax.grad through the paged / MLA entries, empty sequences and
low-rank input to the drop-in (matched against jax.nn's XLA path), ``compare predict --mla``'s heads, default shape
and engine, and the packaging facts (LICENSE, py.typed, the jax bound, the supported-versions line)."""

from __future__ import annotations

import json
import pathlib
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import paging
from compare.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --- 1. jax.grad through paged_attention / mla_attention -------------------------------------------------------


def _paged_case(seed=0, *, b=2, hkv=2, g=2, d=64, page=16, lens=(20, 9)):
    rng = np.random.default_rng(seed)
    tk = max(lens)
    k = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
    kp, vp, bt = paging.build_paged_kv(k, v, page, seed=seed, kv_lens=np.asarray(lens))
    q = rng.standard_normal((b, 1, hkv * g, d)).astype(np.float32)
    return (jnp.asarray(q, jnp.float16), jnp.asarray(kp, jnp.float16), jnp.asarray(vp, jnp.float16),
            jnp.asarray(bt, jnp.int32), jnp.asarray(lens, jnp.int32))


def _mla_case(seed=0, *, b=2, hq=8, dqk=192, page=16, lens=(40, 17)):
    rng = np.random.default_rng(seed)
    lat = rng.standard_normal((b, max(lens), 1, dqk)).astype(np.float32)
    pool, bt, kl = paging.build_paged_latent(lat, page, seed=seed, kv_lens=list(lens))
    q = rng.standard_normal((b, 1, hq, dqk)).astype(np.float32)
    return (jnp.asarray(q, jnp.float16), jnp.asarray(pool, jnp.float16), jnp.asarray(bt, jnp.int32),
            jnp.asarray(kl, jnp.int32))


def test_grad_through_paged_attention_raises_naming_entry_and_generation():
    q, kp, vp, bt, kl = _paged_case()
    f = lambda q, kp: pallas_attn.paged_attention(q, kp, vp, bt, kl).astype(jnp.float32).sum()
    with pytest.raises(NotImplementedError, match=r"pallas_attn\.paged_attention: generation 'fa_decode' has no "
                                                  r"backward kernel"):
        jax.grad(f)(q, kp)
    with pytest.raises(NotImplementedError, match="paged_attention.*fa_decode"):
        jax.jvp(lambda q: pallas_attn.paged_attention(q, kp, vp, bt, kl), (q,), (jnp.ones_like(q),))
    # the forward is what it was: finite, the same under jit, and a bad table still raises eagerly
    out = pallas_attn.paged_attention(q, kp, vp, bt, kl)
    assert out.shape == q.shape and bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
    jitted = jax.jit(lambda *a: pallas_attn.paged_attention(*a))(q, kp, vp, bt, kl)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(out))
    bad = bt.at[0, 0].set(kp.shape[0] + 5)
    with pytest.raises(ValueError, match="block_table"):
        pallas_attn.paged_attention(q, kp, vp, bad, kl)


def test_grad_through_mla_attention_raises_naming_entry_and_generation():
    q, pool, bt, kl = _mla_case()
    f = lambda q: pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=128).astype(jnp.float32).sum()
    with pytest.raises(NotImplementedError, match=r"pallas_attn\.mla_attention: generation 'fa_mla' has no "
                                                  r"backward kernel"):
        jax.grad(f)(q)
    with pytest.raises(NotImplementedError, match="mla_attention.*v12_mla_tc"):
        jax.grad(lambda q: pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=128, generation="v12_mla_tc")
                 .astype(jnp.float32).sum())(q)
    out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=128, return_lse=True)
    assert out.shape == (2, 1, 8, 128) and lse.shape == (2, 8, 1)
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32))))
    with pytest.raises(ValueError, match="block_table"):
        pallas_attn.mla_attention(q, pool, bt.at[1, 0].set(pool.shape[0] + 3), kl, kv_lora_rank=128)


def test_dense_attention_grad_message_kept():
    q = jnp.ones((1, 4, 2, 64), jnp.float32)
    with pytest.raises(NotImplementedError, match=r"pallas_attn\.attention: generation 'v4_fused' has no backward"):
        jax.grad(lambda q: pallas_attn.attention(q, q, q, generation="v4_fused").sum())(q)


# --- 2. empty sequences and low-rank input: jax.nn's XLA path is the judge ---------------------------------------


def _qkv(bq, t, s, n=4, k=2, h=16, seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    mk = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
    return mk(bq, t, n, h), mk(bq, s, k, h), mk(bq, s, k, h)


def _same(got, want):
    """Same structure, shapes, dtypes and values (NaN where jax.nn has NaN) as jax.nn's answer."""
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


_EMPTY = [  # (B, T, S, kwargs)
    (2, 0, 5, {}),
    (2, 0, 5, {"is_causal": True}),
    (2, 3, 0, {}),
    (2, 3, 0, {"is_causal": True}),
    (2, 3, 0, {"key_value_seq_lengths": jnp.zeros((2,), jnp.int32)}),
    (2, 3, 0, {"local_window_size": (1, 1)}),
    (2, 0, 0, {}),
    (0, 3, 5, {}),
]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("b", "t", "s", "kw"), _EMPTY)
def test_dropin_empty_sequences_match_jax_nn(b, t, s, kw, residual):
    q, k, v = _qkv(b, t, s)
    want = jax.nn.dot_product_attention(q, k, v, implementation="xla", return_residual=residual, **kw)
    _same(pallas_attn.dot_product_attention(q, k, v, return_residual=residual, **kw), want)
    jitted = jax.jit(lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, return_residual=residual, **kw))
    _same(jitted(q, k, v), want)
    impl, why = pallas_attn.which_implementation(q, k, v, **kw)
    assert impl == "xla" and "0" in why


def test_dropin_empty_key_values_and_gradients():
    q, k, v = _qkv(2, 3, 0)
    out, res = pallas_attn.dot_product_attention(q, k, v, return_residual=True)
    assert out.shape == q.shape and not bool(jnp.any(out))  # a sum over no key: zeros, as jax.nn's
    assert bool(jnp.all(jnp.isneginf(res)))  # the logsumexp over no key
    loss = lambda f: (lambda q, k, v: (f(q, k, v) * jnp.arange(16.0)).sum())
    ours = jax.grad(loss(pallas_attn.dot_product_attention), (0, 1, 2))(q, k, v)
    ref = jax.grad(loss(lambda *a: jax.nn.dot_product_attention(*a, implementation="xla")), (0, 1, 2))(q, k, v)
    _same(ours, ref)
    q0, k0, v0 = _qkv(2, 0, 5)
    _same(jax.grad(loss(pallas_attn.dot_product_attention), (0, 1, 2))(q0, k0, v0),
          jax.grad(loss(lambda *a: jax.nn.dot_product_attention(*a, implementation="xla")), (0, 1, 2))(q0, k0, v0))


@pytest.mark.parametrize("impl", ["pallas", "pallas:fa_train"])
def test_dropin_forced_pallas_refuses_empty_naming_the_argument(impl):
    q, k, v = _qkv(2, 0, 5)
    with pytest.raises(NotImplementedError, match=r"query has sequence length T 0"):
        pallas_attn.dot_product_attention(q, k, v, implementation=impl)
    q, k, v = _qkv(2, 3, 0)
    with pytest.raises(NotImplementedError, match=r"key has sequence length S 0"):
        pallas_attn.dot_product_attention(q, k, v, implementation=impl)


def test_dropin_key_without_heads_names_key():
    q, _, _ = _qkv(1, 3, 5)
    k = jnp.zeros((1, 5, 0, 16), jnp.float32)
    with pytest.raises(ValueError, match="key and value must have at least one head"):
        pallas_attn.dot_product_attention(q, k, k)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("qs", "ks"), [((3, 4, 16), (5, 2, 16)),  # TNH
                                        ((4, 16), (2, 16)),  # NH: jax.nn reads it as B 1, T 1
                                        ((16,), (16,)),  # H
                                        ((0, 4, 16), (5, 2, 16)),  # TNH, empty query
                                        ((3, 4, 16), (0, 2, 16))])  # TNH, empty key
def test_dropin_low_rank_comes_back_in_query_shape(qs, ks, residual):
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal(qs), jnp.float32)
    k = jnp.asarray(rng.standard_normal(ks), jnp.float32)
    v = jnp.asarray(rng.standard_normal(ks), jnp.float32)
    want = jax.nn.dot_product_attention(q, k, v, implementation="xla", return_residual=residual)
    got = pallas_attn.dot_product_attention(q, k, v, return_residual=residual)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=2e-5)


def test_dropin_low_rank_nan_in_nan_out():
    q = jnp.ones((3, 4, 16), jnp.float32).at[1, 2, 5].set(jnp.nan)
    k = jnp.ones((5, 2, 16), jnp.float32)
    out = pallas_attn.dot_product_attention(q, k, k)
    assert out.shape == (3, 4, 16)
    assert bool(jnp.all(jnp.isnan(out[1, 2]))) and bool(jnp.all(jnp.isfinite(out[0])))


@pytest.mark.parametrize(("qshape", "kshape", "match"), [
    ((2, 0, 4, 16), (2, 5, 4, 16), r"q\.shape\[1\] \(Tq\) is 0"),
    ((2, 3, 4, 16), (2, 0, 4, 16), r"k\.shape\[1\] \(Tk\) is 0"),
    ((0, 3, 4, 16), (0, 5, 4, 16), r"q\.shape\[0\] \(B\) is 0"),
])
def test_attention_empty_raises_naming_the_argument(qshape, kshape, match):
    q, k = jnp.ones(qshape, jnp.float32), jnp.ones(kshape, jnp.float32)
    with pytest.raises(ValueError, match=match):
        pallas_attn.attention(q, k, k)


# --- 3. compare predict --mla ----------------------------------------------------------------------------------


def _predict_json(capsys, argv):
    assert main(["predict", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_mla_takes_heads_from_shape(capsys):
    p16 = _predict_json(capsys, ["--arch", "h100", "--mla", "--shape", "1x16x1x576", "--kv-len", "4096",
                                 "--precision", "bf16"])
    p128 = _predict_json(capsys, ["--arch", "h100", "--mla", "--shape", "1x128x1x576", "--kv-len", "4096",
                                  "--precision", "bf16"])
    assert p16["problem"]["heads_q"] == 16 and p128["problem"]["heads_q"] == 128
    assert p16["estimate"]["flops"] * 8 == pytest.approx(p128["estimate"]["flops"], rel=1e-12)
    # an MLA --generation reads the same heads
    g = _predict_json(capsys, ["--arch", "h100", "--generation", "fa_mla", "--dtype", "bfloat16",
                               "--shape", "1x16x1x576", "--kv-len", "4096"])
    assert g["problem"]["heads_q"] == 16


def test_predict_mla_heads_flag_must_agree_with_shape(capsys):
    got = _predict_json(capsys, ["--mla", "--shape", "2x32x1x576", "--kv-len", "1024", "--h-q", "32"])
    assert got["problem"]["heads_q"] == 32
    assert main(["predict", "--mla", "--shape", "1x16x1x576", "--h-q", "128"]) == 2  # a usage error: exit 2
    assert "--h-q 128 disagrees with the query heads H=16" in capsys.readouterr().err


def test_predict_mla_default_is_a_decode(capsys):
    p = _predict_json(capsys, ["--arch", "h100", "--mla", "--precision", "bf16"])["problem"]
    assert (p["batch"], p["heads_q"], p["q_len"], p["kv_len"]) == (1, 128, 1, 8192)
    assert (p["kv_lora_rank"], p["rope_dim"]) == (512, 64)
    # --h-q alone sets the heads of the default decode
    assert _predict_json(capsys, ["--mla", "--h-q", "16"])["problem"]["heads_q"] == 16
    # the dense default is still the reference's 1x8x2048x64 prefill
    d = _predict_json(capsys, [])["problem"]
    assert (d["batch"], d["heads_q"], d["q_len"], d["kv_len"], d["head_dim"]) == (1, 8, 2048, 2048, 64)


@pytest.mark.parametrize("argv", [
    ["--mla", "--precision", "bf16"],
    ["--mla", "--shape", "1x16x1x576", "--kv-len", "4096", "--precision", "bf16"],
    ["--generation", "fa_mla", "--dtype", "bfloat16", "--shape", "1x16x1x576", "--kv-len", "4096"],
    ["--shape", "1x32x1x128", "--kv-len", "8192", "--precision", "bf16"],
])
def test_predict_bf16_prints_the_bf16_peak(capsys, argv):
    assert main(["predict", "--arch", "h100", *argv]) == 0
    out = capsys.readouterr().out
    assert "bf16 peak" in out and "fp16 peak" not in out
    assert "of the bf16 tensor-core peak" in out


def test_predict_mla_engine_flag_and_reference_conventions_kept(capsys):
    main(["predict", "--arch", "h100", "--mla", "--precision", "bf16", "--mma-engine", "fp8"])
    assert "fp8 peak" in capsys.readouterr().out
    main(["predict", "--arch", "h100", "--mla", "--precision", "bf16", "--reference-conventions"])
    assert "fp16 peak" in capsys.readouterr().out
    main(["predict", "--arch", "h100", "--mla", "--precision", "fp16"])
    assert "fp16 peak" in capsys.readouterr().out


# --- 4. packaging ----------------------------------------------------------------------------------------------


def test_license_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == {"text": "Apache-2.0"}


def test_py_typed_is_shipped():
    assert (ROOT / "pallas_attn" / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["pallas_attn"]


@pytest.mark.slow
def test_the_wheel_has_no_generic_top_level_package(tmp_path):
    """The built wheel installs pallas_attn, attn_core, cuda_ref and the harness as pallas_attn_compare (its configs
    as package data, its script pointing there): no top-level `compare` to collide in a user's environment."""
    import subprocess
    import sys
    import zipfile

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"pallas_attn", "attn_core", "cuda_ref", "pallas_attn_compare"}, tops
    assert "pallas_attn_compare/configs/smoke.toml" in names and "pallas_attn_compare/__main__.py" in names
    assert "pallas_attn_compare/configs/default.toml" in names and "pallas_attn_compare/configs/headline.toml" in names
    assert "cuda_ref/resources/ptxas_sm90a.txt" in names  # layer 2 prices the CUDA rows from it, installed too
    assert "pallas_attn/tuning/h100.json" in names and "pallas_attn/py.typed" in names
    assert any(n.startswith("cuda_ref/csrc/") and n.endswith(".cu") for n in names)  # the twins' sources
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "pallas-attn-compare = pallas_attn_compare.cli:main" in zipfile.ZipFile(whl).read(entry).decode()


def test_jax_bound_and_supported_versions_line():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    jax_dep = [d for d in deps if d.split(">")[0].split("<")[0].split("=")[0].strip() == "jax"]
    assert jax_dep == ["jax>=0.10.2,<0.12"]
    major, minor = (int(x) for x in jax.__version__.split(".")[:2])
    assert (0, 10) <= (major, minor) < (0, 12)  # the environment running this test is inside the bound
    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("**Supported versions:**"))
    assert "jax 0.10.2 (CPU, Python 3.11)" in line and "jax 0.11.2 (GPU, Python 3.12)" in line


def test_harness_extra_missing_is_one_clear_line(monkeypatch, capsys):
    """rich / matplotlib are the `harness` extra, not library dependencies: without them `python -m compare` exits 2
    with one line naming the extra; the library itself imports neither."""
    import importlib.util
    import subprocess
    import sys

    from compare import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a))
    assert cli.main(["report", "nothing.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "rich" in err and "pallas-attn[harness]" in err and len(err.strip().splitlines()) == 1
    code = ("import sys, pallas_attn, attn_core, pallas_attn.dropin, pallas_attn.kernels.fa_prefill; "
            "print(sorted(m for m in ('rich', 'matplotlib') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stderr[-2000:]


def test_mgpu_load_passes_the_index_only_where_the_signature_requires_it(monkeypatch):
    """_compat.mgpu_load: jax 0.10.2's plgpu.load needs the separate index ``()``; a jax whose signature gives the
    index a default (where passing it is deprecated) gets the pre-indexed ref alone."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from pallas_attn import _compat

    calls = []

    def required(src, idx, *, layout=None):
        calls.append(("required", idx))

    def optional(src, idx=None, *, layout=None):
        calls.append(("optional", idx))

    for fn in (required, optional):
        monkeypatch.setattr(plgpu, "load", fn)
        _compat.mgpu_load("ref", layout="L")
    assert calls == [("required", ()), ("optional", None)]
