"""A serving loop over one paged cache: prompts prefilled in chunks, then decoded, with chunks and decodes mixed in
one batch, one jitted step for all of it.

Each step takes up to ``CHUNK`` new tokens per sequence (``q_lens``: a prompt's next chunk, 1 for a decode, 0 for a
finished sequence), writes their K/V into the sequence's pages (a shuffled table over one pool), and runs
``pallas_attn.paged_attention(..., q_lens=q_lens)``: the chunk's queries attend causally to everything cached so far
(chunked prefill: fa_prefill, reading the pages through the table on a Hopper), the decodes go to fa_decode. The
lengths are data, so the step compiles once. Every real row is checked against ``jax.nn.dot_product_attention`` on
the sequence's dense cache. There is no model: the new tokens' q, k, v are random (the attention is what is shown).
With ``--packed`` the step packs the new tokens' queries with no padding (``cu_q_lens``) and runs
``pallas_attn.paged_attention_varlen`` instead (what a scheduler batching many decodes beside a chunk wants: no
chunk-length padding per sequence; docs/serving.md, "Session 34").
Run: ``PYTHONPATH=. python examples/serving_loop.py [--packed]``.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

import pallas_attn

B, HQ, HKV, D, PAGE, PAGES_PER_SEQ, CHUNK = 2, 4, 2, 64, 16, 6, 32
NUM_PAGES = B * PAGES_PER_SEQ + 1  # the last page is scratch: padding rows' K/V land there, no table names it
DT = jnp.bfloat16


@functools.partial(jax.jit, static_argnames=("packed",))
def step(q, k_new, v_new, k_pool, v_pool, block_table, kv_lens, q_lens, packed: bool = False):
    """Write each sequence's ``q_lens`` new tokens at positions ``kv_lens ...``, then attend them to the cache
    (``packed``: through the packed entry, the output unpacked back to ``[B, CHUNK]`` for the caller)."""
    t = jnp.arange(CHUNK, dtype=jnp.int32)
    pos = kv_lens[:, None] + t[None, :]  # [B, CHUNK]
    real = t[None, :] < q_lens[:, None]
    page = jnp.take_along_axis(block_table, jnp.minimum(pos // PAGE, PAGES_PER_SEQ - 1), axis=1)
    page = jnp.where(real, page, NUM_PAGES - 1)
    k_pool = k_pool.at[page, pos % PAGE].set(k_new)
    v_pool = v_pool.at[page, pos % PAGE].set(v_new)
    kv_lens = kv_lens + q_lens
    if not packed:
        out = pallas_attn.paged_attention(q, k_pool, v_pool, block_table, kv_lens, causal=True, q_lens=q_lens,
                                          check_block_table=False)
        return out, k_pool, v_pool, kv_lens
    # packed: sequence b's real rows at cu[b] : cu[b + 1] of a [B * CHUNK] buffer (its tail unused)
    cu = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(q_lens).astype(jnp.int32)])
    dest = jnp.where(real, cu[:-1, None] + t[None, :], B * CHUNK)  # padding rows: dropped
    qp = jnp.zeros((B * CHUNK, HQ, D), q.dtype).at[dest].set(q, mode="drop")
    # this scheduler's decodes are single tokens: the decode part sized for one query a sequence (docs/serving.md)
    op = pallas_attn.paged_attention_varlen(qp, k_pool, v_pool, block_table, kv_lens, cu, check_block_table=False,
                                            decode_max_q=1)
    out = jnp.where(real[:, :, None, None], op[jnp.minimum(dest, B * CHUNK - 1)], jnp.zeros((), q.dtype))
    return out, k_pool, v_pool, kv_lens


def schedule(prompt, generate, done):
    """This step's new tokens per sequence: the prompt's next chunk, else one decode, else none."""
    return np.array([min(CHUNK, p - d) if d < p else (1 if d < p + g else 0)
                     for p, g, d in zip(prompt, generate, done)], np.int32)


def main(prompts=(70, 23), generate=(3, 5), seed: int = 0, packed: bool = False) -> float:
    rng = np.random.default_rng(seed)
    k_pool = jnp.zeros((NUM_PAGES, PAGE, HKV, D), DT)
    v_pool = jnp.zeros((NUM_PAGES, PAGE, HKV, D), DT)
    block_table = jnp.asarray(rng.permutation(NUM_PAGES - 1).reshape(B, PAGES_PER_SEQ).astype(np.int32))
    dense_k = np.zeros((B, PAGE * PAGES_PER_SEQ, HKV, D), np.float32)  # what the cache holds, for the check
    dense_v = np.zeros_like(dense_k)
    done = np.zeros(B, np.int32)
    kv_lens = jnp.zeros((B,), jnp.int32)
    worst, n_step = 0.0, 0
    while True:
        q_lens = schedule(prompts, generate, done)
        if not q_lens.any():
            break
        q, k_new, v_new = (jnp.asarray(rng.standard_normal((B, CHUNK, h, D)), DT) for h in (HQ, HKV, HKV))
        out, k_pool, v_pool, kv_lens = step(q, k_new, v_new, k_pool, v_pool, block_table, kv_lens,
                                            jnp.asarray(q_lens), packed=packed)
        for b in range(B):
            n = int(q_lens[b])
            if n == 0:
                continue
            dense_k[b, done[b]:done[b] + n] = np.asarray(k_new[b, :n], np.float32)
            dense_v[b, done[b]:done[b] + n] = np.asarray(v_new[b, :n], np.float32)
            end = done[b] + n
            # row i sits at position done + i and sees the keys up to it (causal, aligned to the cache's end)
            mask = np.arange(end)[None, :] <= done[b] + np.arange(n)[:, None]
            ref = jax.nn.dot_product_attention(q[b:b + 1, :n].astype(jnp.float32), jnp.asarray(dense_k[b:b + 1, :end]),
                                               jnp.asarray(dense_v[b:b + 1, :end]), mask=jnp.asarray(mask)[None, None])
            worst = max(worst, float(jnp.max(jnp.abs(out[b:b + 1, :n].astype(jnp.float32) - ref))))
            assert not np.asarray(out[b, n:], np.float32).any(), "padding rows must be 0"
        done = done + q_lens
        n_step += 1
        print(f"step {n_step}: new tokens {q_lens.tolist()}, cached {np.asarray(kv_lens).tolist()}, "
              f"max |out - jax.nn| so far {worst:.2e}")
    print(f"compiled the step {step._cache_size()} time(s) for {n_step} steps")
    return worst


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--packed", action="store_true", help="pack the queries (pallas_attn.paged_attention_varlen)")
    args = ap.parse_args()
    main(seed=args.seed, packed=args.packed)
