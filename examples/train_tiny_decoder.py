"""Train a tiny decoder block for a few steps with pallas_attn.dot_product_attention (CPU: seconds).

One pre-norm block (GQA attention with 4 query heads sharing 2 KV heads, causal, then an MLP) on a
next-token task over random sequences that repeat with period 4, trained by plain gradient descent.
The attention is a drop-in for ``jax.nn.dot_product_attention``: forward and backward run as Pallas
kernels (interpret mode when no GPU is present). Run: ``PYTHONPATH=. python examples/train_tiny_decoder.py``.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import pallas_attn

VOCAB, D_MODEL, HEADS, KV_HEADS, HEAD_DIM, SEQ = 16, 64, 4, 2, 16, 16


def init(key):
    ks = jax.random.split(key, 6)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[0])

    return {"emb": w(ks[0], (VOCAB, D_MODEL)), "wq": w(ks[1], (D_MODEL, HEADS * HEAD_DIM)),
            "wkv": w(ks[2], (D_MODEL, 2 * KV_HEADS * HEAD_DIM)), "wo": w(ks[3], (HEADS * HEAD_DIM, D_MODEL)),
            "w1": w(ks[4], (D_MODEL, 4 * D_MODEL)), "w2": w(ks[5], (4 * D_MODEL, D_MODEL))}


def _norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def forward(params, tokens):
    b, t = tokens.shape
    x = params["emb"][tokens]
    h = _norm(x)
    q = (h @ params["wq"]).reshape(b, t, HEADS, HEAD_DIM)
    k, v = jnp.split((h @ params["wkv"]).reshape(b, t, 2 * KV_HEADS, HEAD_DIM), 2, axis=2)
    att = pallas_attn.dot_product_attention(q, k, v, is_causal=True)  # GQA by head count, as jax.nn
    x = x + att.reshape(b, t, HEADS * HEAD_DIM) @ params["wo"]
    x = x + jax.nn.gelu(_norm(x) @ params["w1"]) @ params["w2"]
    return _norm(x) @ params["emb"].T / jnp.sqrt(D_MODEL)  # tied output embedding


def loss_fn(params, tokens):
    logits = forward(params, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def main(steps: int = 8, lr: float = 1.0, seed: int = 0) -> list[float]:
    key = jax.random.key(seed)
    params = init(key)
    motif = jax.random.randint(jax.random.fold_in(key, 1), (8, 4), 0, VOCAB)
    tokens = jnp.tile(motif, (1, SEQ // 4 + 1))[:, : SEQ + 1]  # each sequence repeats its 4-token motif

    @jax.jit
    def step(params):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

    print("attention runs:", pallas_attn.which_implementation(
        jnp.zeros((8, SEQ, HEADS, HEAD_DIM)), jnp.zeros((8, SEQ, KV_HEADS, HEAD_DIM)),
        jnp.zeros((8, SEQ, KV_HEADS, HEAD_DIM)), is_causal=True))
    losses = []
    for i in range(steps):
        params, loss = step(params)
        losses.append(float(loss))
        print(f"step {i}: loss {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    main(args.steps)
