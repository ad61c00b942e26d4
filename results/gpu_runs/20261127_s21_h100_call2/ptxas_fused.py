import sys, jax, jax.numpy as jnp, numpy as np
from pallas_attn.kernels import fa_prefill_bwd as fb
d = int(sys.argv[1]); cfg = sys.argv[2]
q = jnp.ones((1, 1024, 8, d), jnp.bfloat16); k = jnp.ones((1, 1024, 2, d), jnp.bfloat16)
lse = jnp.zeros((1, 8, 1024), jnp.float32)
f = jax.jit(lambda q, k, v, o, lse, do: fb.backward(q, k, v, o, lse, do, causal=True, scale=0.1, config=fb.CONFIGS[cfg]))
jax.block_until_ready(f(q, k, k, q, lse, q))
