"""NaN and Inf in q or k reach the output as they do in jax.nn, in every built generation and entry.

For each row of the table (dense and paged entries, the kernel's first dtype), one call with a NaN and a
+Inf in q and a NaN and a +Inf in k, each in its own head. The reference is ``jax.nn.dot_product_attention``
(XLA, float32, on the same values): a NaN score poisons its row; a +Inf score poisons its row (Inf - Inf);
a -Inf score only removes its key (exp(-Inf) = 0). A kernel that turns NaN into 0 (``where(l > 0, ...)``)
or lets NaN leak into rows that never saw it fails. Shapes are tiny (interpret mode).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core.paging import build_paged_kv
from pallas_attn import api, registry

B, TQ, H, D, TK = 1, 4, 4, 64, 24


def _cases():
    out = []
    for r in registry.rows():
        for entry in sorted(registry.get(r.generation).entries & {"dense", "paged"}):
            out.append(pytest.param(r.generation, entry, id=f"{r.generation}-{entry}"))
    return out


def _poisoned(rng, dtype):
    """Head 0: NaN in query row 1; head 1: +Inf in query row 2; head 2: NaN in key 7; head 3: +Inf in key 9
    (rows whose query is positive on that coordinate get a +Inf score, the others -Inf)."""
    q = rng.standard_normal((B, TQ, H, D)).astype(np.float32)
    k = rng.standard_normal((B, TK, H, D)).astype(np.float32)
    v = rng.standard_normal((B, TK, H, D)).astype(np.float32)
    q[0, 1, 0, 5] = np.nan
    q[0, 2, 1, 3] = np.inf
    k[0, 7, 2, 2] = np.nan
    k[0, 9, 3, 4] = np.inf
    q[0, :2, 3, 4], q[0, 2:, 3, 4] = 1.0, -1.0  # head 3: rows 0-1 see +Inf, rows 2-3 -Inf (stay finite)
    return tuple(jnp.asarray(x).astype(dtype) for x in (q, k, v))


@pytest.mark.slow
@pytest.mark.parametrize("gen,entry", _cases())
def test_nan_and_inf_in_give_nan_out_like_jax_nn(rng, gen, entry):
    kern = registry.kernel(gen)
    dtype = kern.dtypes[0]
    q, k, v = _poisoned(rng, dtype)
    if entry == "dense":
        if not kern.supports(api.problem_dense(q, k, causal=False))[0]:
            pytest.skip(f"{gen} does not take the dense test shape")
        out = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, generation=gen, interpret=True))(q, k, v)
    else:
        kp, vp, bt = (jnp.asarray(x) for x in build_paged_kv(k, v, 8, seed=1))
        if not kern.supports(api.problem_paged(q, kp, bt, causal=False))[0]:
            pytest.skip(f"{gen} does not take the paged test shape")
        lens = jnp.full((B,), TK, jnp.int32)
        out = jax.jit(lambda q, kp, vp, bt, lens: pallas_attn.paged_attention(
            q, kp, vp, bt, lens, generation=gen, interpret=True, check_block_table=False))(q, kp, vp, bt, lens)
    ref = jax.nn.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), implementation="xla")
    want = np.isnan(np.asarray(ref)).any(-1)  # [B, TQ, H]
    assert want[0, :, 0].tolist() == [False, True, False, False] and want[0, :, 1].tolist() == [0, 0, 1, 0]
    assert want[0, :, 2].all() and want[0, :, 3].tolist() == [True, True, False, False]  # the premise
    got = np.isnan(np.asarray(out.astype(jnp.float32))).any(-1)
    np.testing.assert_array_equal(got, want, err_msg=f"{gen} {entry}: NaN rows differ from jax.nn's")
    assert np.isfinite(np.asarray(out.astype(jnp.float32))[~want]).all()
