import time, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
G,m,R,D,Tk = 8,4,1,128,8192
q = jnp.asarray(np.random.randn(R,G,m,D)); k = jnp.asarray(np.random.randn(Tk,G,D))
f1 = jax.jit(lambda q,k: jnp.einsum("rumd,tud->umrt", q, k))
f2 = jax.jit(lambda q,k: jnp.einsum("umxd,utd->umxt", q.transpose(1,2,0,3), k.transpose(1,0,2)))  # batch-major layout
def f3_(q,k):  # explicit per-group 2D dots via vmap
    qq = q.transpose(1,2,0,3).reshape(G, m*R, D); kk = k.transpose(1,0,2)
    return jax.vmap(lambda a,b: a @ b.T)(qq, kk)
f3 = jax.jit(f3_)
for name,f in (("einsum",f1),("einsum-batchmajor",f2),("vmap 2d",f3)):
    f(q,k).block_until_ready(); t=time.perf_counter()
    for _ in range(5): f(q,k).block_until_ready()
    dt=(time.perf_counter()-t)/5; print(f"{name}: {dt*1e3:.1f} ms, {2*G*m*R*D*Tk/dt/1e9:.2f} GFLOP/s")
qn=np.asarray(q); kn=np.asarray(k)
t=time.perf_counter()
for _ in range(5): np.einsum("rumd,tud->umrt", qn, kn, optimize=True)
dt=(time.perf_counter()-t)/5; print(f"numpy einsum: {dt*1e3:.1f} ms, {2*G*m*R*D*Tk/dt/1e9:.2f} GFLOP/s")
