import sys, jax, jax.numpy as jnp
from pallas_attn.kernels import fa_prefill as fp
d = int(sys.argv[1]); cfg = fp.fit(fp.CONFIGS[sys.argv[2]], d)
q = jnp.ones((1, 2048, 12, d), jnp.bfloat16)
f = jax.jit(lambda q, k, v: fp.forward(q, k, v, causal=True, scale=0.1, q_offset=0, interpret=False, config=cfg))
jax.block_until_ready(f(q, q, q))
