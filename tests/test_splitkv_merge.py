"""splitkv.merge_jnp: the one-state fast path equals the general merge (checked by adding an empty state, which the
general formula weights by exp(-inf) = 0): finite, empty (-inf) and NaN rows, fp32 and bf16 states, both axes."""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_attn.kernels import splitkv


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("axis", [0, 1])
def test_one_state_fast_path_equals_general_merge(dtype, axis):
    rng = np.random.default_rng(0)
    r, d = 6, 8
    o = rng.standard_normal((r, d)).astype(np.float32)
    lse = rng.standard_normal(r).astype(np.float32)
    lse[1], lse[2] = -np.inf, np.nan  # a row that saw no key, a NaN row
    o[3, 0] = np.nan  # NaN inside a finite row's output stays there
    o1, l1 = jnp.asarray(np.expand_dims(o, axis), dtype), jnp.asarray(np.expand_dims(lse, axis))
    empty_o = jnp.zeros_like(o1)
    empty_l = jnp.full_like(l1, -jnp.inf)
    fast_o, fast_l = splitkv.merge_jnp(o1, l1, axis=axis)
    gen_o, gen_l = splitkv.merge_jnp(jnp.concatenate([o1, empty_o], axis), jnp.concatenate([l1, empty_l], axis),
                                     axis=axis)
    assert fast_o.dtype == gen_o.dtype == dtype and fast_o.shape == gen_o.shape == (r, d)
    np.testing.assert_array_equal(np.asarray(fast_o, np.float32), np.asarray(gen_o, np.float32))
    np.testing.assert_array_equal(np.asarray(fast_l), np.asarray(gen_l))
    assert np.isnan(np.asarray(fast_o, np.float32)[2]).all() and (np.asarray(fast_o, np.float32)[1] == 0).all()
    assert np.isneginf(np.asarray(fast_l)[1]) and np.isnan(np.asarray(fast_l)[2])
