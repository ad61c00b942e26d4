"""pallas_attn's drop-in as the attention function of a Flax NNX model (CPU: seconds).

``flax.nnx.MultiHeadAttention(attention_fn=...)`` takes any function with ``flax.nnx.dot_product_attention``'s
signature; ``pallas_attention_fn`` below maps it onto ``pallas_attn.dot_product_attention`` (the same BTNH layout as
jax.nn). Causal self-attention is passed as ``is_causal=True`` (not as a mask): a mask array would send the call to
jax.nn's XLA path, because the Pallas kernels take the causal structure, not an arbitrary mask. Dropout on the
attention weights is not a kernel feature: the adapter refuses it rather than silently dropping it.

The model: one pre-norm decoder block (4 query heads sharing 2 KV heads, causal, then an MLP) trained with optax's
Adam on sequences that repeat a 4-token motif; the loss falls, and the block's output equals the same module with
Flax's own attention function. Run: ``PYTHONPATH=. python examples/flax_nnx_attention.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import pallas_attn

VOCAB, D_MODEL, HEADS, KV_HEADS, SEQ = 16, 64, 4, 2, 16


def pallas_attention_fn(query, key, value, bias=None, mask=None, broadcast_dropout=True, dropout_rng=None,
                        dropout_rate=0.0, deterministic=False, dtype=None, precision=None, module=None,
                        promote_dtype=None, is_causal=False):
    """``flax.nnx.dot_product_attention``'s signature on ``pallas_attn.dot_product_attention``."""
    del broadcast_dropout, dropout_rng, precision, module, promote_dtype
    if dropout_rate > 0.0 and not deterministic:
        raise NotImplementedError("attention-weight dropout is not a pallas_attn kernel feature; use dropout_rate=0 "
                                  "(or deterministic=True) with this attention_fn")
    if dtype is not None:
        query, key, value = (x.astype(dtype) for x in (query, key, value))
    return pallas_attn.dot_product_attention(query, key, value, bias=bias, mask=mask, is_causal=is_causal)


class Block(nnx.Module):
    def __init__(self, attention_fn, *, rngs: nnx.Rngs):
        self.emb = nnx.Embed(VOCAB, D_MODEL, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(HEADS, D_MODEL, num_kv_heads=KV_HEADS, attention_fn=attention_fn,
                                           decode=False, rngs=rngs)
        self.norm1, self.norm2 = nnx.RMSNorm(D_MODEL, rngs=rngs), nnx.RMSNorm(D_MODEL, rngs=rngs)
        self.mlp1, self.mlp2 = nnx.Linear(D_MODEL, 4 * D_MODEL, rngs=rngs), nnx.Linear(4 * D_MODEL, D_MODEL, rngs=rngs)

    def __call__(self, tokens):
        x = self.emb(tokens)
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp2(jax.nn.gelu(self.mlp1(self.norm2(x))))
        return self.emb.attend(x) / jnp.sqrt(D_MODEL)  # tied output embedding


def causal(fn):
    return functools.partial(fn, is_causal=True)


def data(seed: int = 0):
    motif = jax.random.randint(jax.random.key(seed + 1), (8, 4), 0, VOCAB)
    return jnp.tile(motif, (1, SEQ // 4 + 1))[:, : SEQ + 1]  # each sequence repeats its 4-token motif


def main(steps: int = 6, seed: int = 0) -> list[float]:
    model = Block(causal(pallas_attention_fn), rngs=nnx.Rngs(seed))
    opt = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
    tokens = data(seed)

    def loss_fn(m):
        logp = jax.nn.log_softmax(m(tokens[:, :-1]), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    @nnx.jit
    def step(m, o):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        o.update(m, grads)
        return loss

    losses = []
    for i in range(steps):
        losses.append(float(step(model, opt)))
        print(f"step {i}: loss {losses[-1]:.4f}", flush=True)
    return losses


if __name__ == "__main__":
    main()
