"""A paged-KV decode loop: one jitted step per token, the cache position passed as a traced value.

Two sequences of different lengths are prefilled into a shuffled pool of fixed-size pages
(``attn_core.paging.build_paged_kv``); each step appends one token's K/V to its page and runs
``pallas_attn.paged_attention`` (fa_decode: GQA heads packed on tensor cores, split-KV). ``kv_lens`` (the
cache position) is data, so the step compiles once for every length. Each output is checked against
``jax.nn.dot_product_attention`` on the dense cache. Run: ``PYTHONPATH=. python examples/paged_decode_loop.py``.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import pallas_attn
from attn_core.paging import build_paged_kv

B, HQ, HKV, D, PAGE, MAX_LEN = 2, 4, 2, 64, 8, 32


@jax.jit
def step(q, k_new, v_new, k_pool, v_pool, block_table, kv_lens):
    """Write token ``kv_lens[b]``'s K/V into its page, then attend over ``kv_lens + 1`` keys."""
    pos = kv_lens  # traced int32 [B]: no recompilation as the cache grows
    page = jnp.take_along_axis(block_table, (pos // PAGE)[:, None], axis=1)[:, 0]
    slot = pos % PAGE
    k_pool = k_pool.at[page, slot].set(k_new[:, 0])
    v_pool = v_pool.at[page, slot].set(v_new[:, 0])
    out = pallas_attn.paged_attention(q, k_pool, v_pool, block_table, kv_lens + 1, causal=True,
                                      check_block_table=False)
    return out, k_pool, v_pool, kv_lens + 1


def main(steps: int = 3, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    lens = np.array([5, 11], np.int32)
    dense_k = rng.standard_normal((B, MAX_LEN, HKV, D)).astype(np.float16)
    dense_v = rng.standard_normal((B, MAX_LEN, HKV, D)).astype(np.float16)
    # pages for the whole capacity; only the first `lens` keys count as prefilled
    k_pool, v_pool, block_table = (jnp.asarray(x) for x in build_paged_kv(dense_k, dense_v, PAGE, seed=seed))
    kv_lens = jnp.asarray(lens)
    worst = 0.0
    for t in range(steps):
        q = jnp.asarray(rng.standard_normal((B, 1, HQ, D)), jnp.float16)
        k_new = jnp.asarray(rng.standard_normal((B, 1, HKV, D)), jnp.float16)
        v_new = jnp.asarray(rng.standard_normal((B, 1, HKV, D)), jnp.float16)
        out, k_pool, v_pool, kv_lens = step(q, k_new, v_new, k_pool, v_pool, block_table, kv_lens)
        for b in range(B):  # the same token against jax.nn on the dense cache
            n = int(lens[b]) + t
            dense_k[b, n], dense_v[b, n] = np.asarray(k_new[b, 0]), np.asarray(v_new[b, 0])
            ref = jax.nn.dot_product_attention(q[b:b + 1].astype(jnp.float32),
                                               jnp.asarray(dense_k[b:b + 1, : n + 1], jnp.float32),
                                               jnp.asarray(dense_v[b:b + 1, : n + 1], jnp.float32))
            worst = max(worst, float(jnp.max(jnp.abs(out[b:b + 1].astype(jnp.float32) - ref))))
        print(f"step {t}: kv_lens {np.asarray(kv_lens).tolist()}, max |out - jax.nn| so far {worst:.2e}")
    print(f"compiled the step {step._cache_size()} time(s) for {steps} positions")
    return worst


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    main(ap.parse_args().steps)
