"""fa_prefill's Mosaic GPU kernel on an H100/H200, against the float64 oracle.

Every named config (pipelined, serial, ping-pong) x causal or not x fp16/bf16 x D 64/128/256 on shapes that
exercise the edges: GQA, Tq != Tk, ragged lengths (not multiples of the tiles), per-sequence and negative
causal offsets (rows that see no key: zero output, LSE -inf), LSE on and off, NaN in a row. The oracle
runs on the host in float64, so shapes stay small; the kernel is the compiled one (``interpret=False``).
Budget: about a minute (``-m gpu``).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import oracle  # noqa: E402
from pallas_attn.kernels import fa_prefill as fp  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {"float16": 4e-3, "bfloat16": 2e-2}

# b, tq, tk, hq, hkv, causal, offsets
_SHAPES = [
    (2, 256, 256, 4, 4, False, (0, 0)),
    (2, 256, 256, 4, 4, True, (0, 0)),
    (2, 200, 333, 4, 2, True, (133, 40)),
    (1, 130, 517, 8, 2, False, (0,)),
    (2, 64, 300, 4, 1, True, (-20, 250)),
]


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _cfg(name, d):
    # the named config object: at D 256 fa_prefill.fit gives it 64-key tiles and two stages inside the kernel
    return fp.CONFIGS[name]


# every config on fp16 D 64/128/256; the heuristic's configs also on bf16
_MATRIX = [("default", dt, d) for dt in ("float16", "bfloat16") for d in (64, 128, 256)]
_MATRIX += [("serial", dt, d) for dt in ("float16", "bfloat16") for d in (64, 128)] + [("serial", "float16", 256)]
_MATRIX += [("pingpong", "float16", d) for d in (64, 128, 256)]


@pytest.mark.parametrize("cfg,dtype,d", _MATRIX)
def test_matches_oracle(cfg, dtype, d):
    key = jax.random.PRNGKey(d)
    for i, (b, tq, tk, hq, hkv, causal, offs) in enumerate(_SHAPES):
        kq, kk, kv = jax.random.split(jax.random.fold_in(key, i), 3)
        q, k, v = _rand(kq, (b, tq, hq, d), dtype), _rand(kk, (b, tk, hkv, d), dtype), _rand(kv, (b, tk, hkv, d), dtype)
        off = jnp.asarray(offs, jnp.int32)
        o, lse = pallas_attn.attention(q, k, v, causal=causal, q_offset=off, generation="fa_prefill",
                                       config=_cfg(cfg, d), interpret=False, return_lse=True)
        ro, rl = oracle.attention_reference(q, k, v, causal=causal, q_offset=np.asarray(offs))
        o64 = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
        tag = (cfg, dtype, d, b, tq, tk, hq, hkv, causal, offs)
        assert o.dtype == q.dtype and np.all(np.isfinite(o64)), tag
        assert np.linalg.norm(o64 - ro) / np.linalg.norm(ro) < TOL[dtype], tag
        if i == 2:  # LSE on or off: the same output
            o_only = pallas_attn.attention(q, k, v, causal=causal, q_offset=off, generation="fa_prefill",
                                           config=_cfg(cfg, d), interpret=False)
            np.testing.assert_array_equal(np.asarray(o_only), np.asarray(o))
        lse = np.asarray(lse, np.float64)
        fin = np.isfinite(rl)
        assert np.array_equal(np.isfinite(lse), fin), tag
        assert np.abs(lse[fin] - rl[fin]).max() < 1e-2, tag
        if not fin.all():
            assert np.all(o64[~fin.transpose(0, 2, 1)] == 0.0), tag


def test_nan_row_stays_in_its_row():
    q = _rand(jax.random.PRNGKey(3), (1, 128, 2, 128), "float16")
    k = _rand(jax.random.PRNGKey(4), (1, 256, 1, 128), "float16")
    q = q.at[0, 77, 1, 5].set(jnp.nan)
    o = np.asarray(jnp.asarray(pallas_attn.attention(q, k, k, generation="fa_prefill", interpret=False), jnp.float32))
    assert np.all(np.isnan(o[0, 77, 1]))
    mask = np.ones(o.shape[:3], bool)
    mask[0, 77, 1] = False
    assert np.all(np.isfinite(o[mask]))


def test_large_shape_matches_cudnn():
    """At the benchmark shape the kernel agrees with jax.nn's cuDNN attention (fp16, causal and not)."""
    b, n, h, d = 2, 2048, 8, 128
    ks = jax.random.split(jax.random.PRNGKey(5), 3)
    q, k, v = (_rand(kk, (b, n, h, d), "float16") for kk in ks)
    for causal in (False, True):
        ours = pallas_attn.attention(q, k, v, causal=causal, generation="fa_prefill", interpret=False)
        ref = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
        err = float(jnp.max(jnp.abs(ours.astype(jnp.float32) - ref.astype(jnp.float32))))
        assert err < 2e-3, (causal, err)
