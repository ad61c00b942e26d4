"""compare's workload inputs built on the device (session 25) hold exactly what the host builders made before: the
paged pools of ``interop._page_field`` are ``attn_core.paging.build_paged_kv``'s, byte for byte, with the same
block table, for ragged and full lengths, pages 16 and 64, 16- and 32-bit caches."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from attn_core import paging
from compare import interop
from compare.workloads import Workload


@pytest.mark.parametrize("b,tk,h,d,page,dt,ragged", [(3, 70, 2, 16, 16, "bfloat16", True),
                                                      (2, 64, 1, 8, 64, "float16", False),
                                                      (4, 33, 2, 8, 16, "float32", True)])
def test_paged_pools_on_the_device_are_the_host_builders(b, tk, h, d, page, dt, ragged):
    w = Workload(name="t_pool", family="paged_decode", batch=b, heads_q=2 * h, heads_kv=h, q_len=1, kv_len=tk,
                 head_dim=d, dtype=dt, causal=True, q_offset=tk - 1, page_size=page, ragged=ragged, seed=3)
    inp = interop.make_inputs(w)
    kp, vp, table = paging.build_paged_kv(np.asarray(inp.k.astype(jnp.float32)), np.asarray(inp.v.astype(jnp.float32)),
                                          page, seed=w.seed, shuffle=True, kv_lens=inp.kv_lens)
    assert inp.k_pool.dtype == jnp.dtype(dt) and inp.block_table.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(inp.k_pool.astype(jnp.float32)), kp)
    np.testing.assert_array_equal(np.asarray(inp.v_pool.astype(jnp.float32)), vp)
    np.testing.assert_array_equal(np.asarray(inp.block_table), table)


def test_the_layout_is_the_builders():
    lens = np.array([5, 0, 17])
    lay = paging.paged_layout(3, 20, 8, seed=1, kv_lens=lens)
    k = np.arange(3 * 20 * 1 * 2, dtype=np.float32).reshape(3, 20, 1, 2) + 1
    kp, _, table = paging.build_paged_kv(k, k, 8, seed=1, kv_lens=lens)
    np.testing.assert_array_equal(lay.table, table)
    assert lay.n_pages == kp.shape[0] == 1 + 3 and sorted(lay.slots.tolist()) == [0, 1, 2, 3]
    for i, (b, p, s) in enumerate(zip(lay.batch, lay.page, lay.slots, strict=True)):
        np.testing.assert_array_equal(kp[s], np.pad(k[b], ((0, 4), (0, 0), (0, 0)))[p * 8:(p + 1) * 8], err_msg=str(i))


def test_mla_draws_in_one_program_equal_the_draws_one_by_one():
    """``interop._draw_mla`` (session 25) gives bitwise the q and latent the two draws and casts gave one by one."""
    import jax

    root = jax.random.key(11)
    kq, kl = jax.random.split(root, 2)
    sq, sl = (2, 1, 16, 96), (2, 200, 1, 96)
    q, lat = interop._draw_mla(root, sq, sl, jnp.dtype(jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(q.astype(jnp.float32)),
                                  np.asarray(jax.random.normal(kq, sq, jnp.float32).astype(jnp.bfloat16)
                                             .astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(lat.astype(jnp.float32)),
                                  np.asarray(jax.random.normal(kl, sl, jnp.float32).astype(jnp.bfloat16)
                                             .astype(jnp.float32)))


def test_a_16bit_latent_pool_is_the_builders():
    """``page_latent`` (its fields paged by one compiled program, session 25) holds what
    ``attn_core.paging.build_paged_latent`` places, spare blocks and their fill included (the largest magnitude of
    the placed pages: before session 25's review it took the whole latent's, tokens past a length included, and
    differed from the builder in 11 of 20 ragged draws), with its table."""
    for seed in range(6):  # ragged: the largest value often sits past a sequence's length (seeds 0-5 hold such cases)
        lens = np.array([200, 30])
        lat = jnp.asarray(np.random.default_rng(seed).standard_normal((2, 200, 1, 24)), jnp.bfloat16)
        pool, table = interop.page_latent(lat, 16, seed=4, kv_lens=lens)
        want_pool, want_table, _ = paging.build_paged_latent(np.asarray(lat.astype(jnp.float32)), 16, seed=4,
                                                              kv_lens=lens)
        np.testing.assert_array_equal(np.asarray(pool.astype(jnp.float32)), want_pool, err_msg=f"seed {seed}")
        np.testing.assert_array_equal(np.asarray(table), want_table)
