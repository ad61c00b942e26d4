import time, numpy as np, jax, jax.numpy as jnp
from compare import accuracy, interop
from compare.workloads import Workload, load_config

def dense_np(q, k, v, q_offs, kv_valid, *, batches, rows, heads, groups, causal, scale):
    ridx = np.concatenate([np.arange(r0, r1) for r0, r1 in rows])
    us = [u for u, _ in groups]
    hs = np.array([[heads[i] for i in pos] for _, pos in groups])
    tk = k.shape[1]
    G, m = hs.shape
    out = np.empty((len(batches), len(ridx), G, m, v.shape[-1]))
    kid = np.arange(tk)
    for i, b in enumerate(batches):
        n = int(kv_valid[i]); off = int(q_offs[i])
        qb = q[b][ridx][:, hs].astype(np.float64)  # [R, G, m, D]
        for gi, u in enumerate(us):
            ku = k[b, :n, u].astype(np.float64); vu = v[b, :n, u].astype(np.float64)
            qq = qb[:, gi].transpose(1, 0, 2).reshape(m * len(ridx), -1)  # [m*R, D]
            s = (qq @ ku.T) * scale  # [m*R, n]
            s = s.reshape(m, len(ridx), n)
            if causal:
                s = np.where(kid[None, None, :n] <= (off + ridx)[None, :, None], s, -np.inf)
            mx = s.max(axis=-1, keepdims=True)
            ms = np.where(np.isfinite(mx), mx, 0.0)
            p = np.exp(s - ms)
            l = p.sum(axis=-1, keepdims=True)
            p = p / np.where(l > 0, l, 1.0)
            o = (p.reshape(m * len(ridx), n) @ vu).reshape(m, len(ridx), -1)
            out[i, :, gi] = o.transpose(1, 0, 2)
    return out

ws = {w.name: w for w in load_config("sweep")}
for name in ["sweep_prefill_llama-3.1-8b_n2048", "sweep_decode_llama-3.1-8b_b32_s8192", "sweep_prefill_llama-3.1-8b_n16384"]:
    w = ws[name]; inp = interop.make_inputs(w); sub = accuracy.choose_subset(w)
    t = time.perf_counter(); ref = accuracy.oracle(w, inp, sub); t1 = time.perf_counter() - t
    t = time.perf_counter(); ref2 = accuracy.oracle(w, inp, sub); t1b = time.perf_counter() - t
    groups = accuracy._head_groups(tuple(sub.heads), w.heads_q // w.heads_kv)
    t = time.perf_counter()
    qh, kh, vh = np.asarray(inp.q), np.asarray(inp.k), np.asarray(inp.v)
    nb = len(sub.batches)
    o = dense_np(qh, kh, vh, np.full(nb, w.q_offset), np.full(nb, w.kv_len), batches=tuple(sub.batches), rows=sub.rows, heads=tuple(sub.heads), groups=groups, causal=w.causal, scale=inp.scale)
    t2 = time.perf_counter() - t
    res = np.empty_like(ref)
    for gi, (_, pos) in enumerate(groups):
        for j, i in enumerate(pos): res[:, :, i] = o[:, :, gi, j]
    print(f"{name}: xla-cpu first {t1:.2f} s, again {t1b:.2f} s; numpy {t2:.2f} s; maxdiff {np.nanmax(np.abs(res-ref)):.2e}", flush=True)
