"""Run every cuda_ref generation once at small shapes and check the results, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/cuda_sanitize.py

Shapes are small and awkward on purpose (N=100 is not a multiple of any tile; a decode shape with an
uneven last split; causal with a q_offset), so every tail and guard path is executed under memcheck. The paged
generations (v7_paged, the v8 family) run on shuffled pools with spare blocks, ragged lengths (a single key, not a
page multiple), unused table entries -1, N_q = 17 with per-sequence offsets, and once with a block-table entry past
the pool outside debug mode: the kernels must load it as NaN (that sequence NaN, the other exact), never read it.
Build the extension first (any cuda_ref call, e.g. scripts/build_cuda_ref.py) so that the sanitizer does
not watch the compiler. Exits 1 if a result is wrong.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CUDA_REF_DEBUG", "1")  # NaN-poisoned outputs, a sync after every call
# One cudaMalloc per tensor, so memcheck sees the true end of every buffer (the caching allocator hides
# overruns into pool slack).
os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cuda_ref  # noqa: E402
from attn_core.oracle import attention_reference  # noqa: E402

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

# Output tolerance per generation from its operand column (the reference's: fp32 1e-4, fp16 operands 2e-2);
# the log-sum-exp against the oracle on the operands the kernel reads: 1e-4 / 1e-3.
ROWS = {g.id: g for g in cuda_ref.table() if g.entry == "dense"}
TOL = {i: 1e-4 if g.operand == "fp32" else 2e-2 for i, g in ROWS.items()}
LSE_TOL = {i: 1e-4 if g.operand == "fp32" else 1e-3 for i, g in ROWS.items()}

# (label, B, H, Nq, Nk, D, causal, q_offset) for the dense generations
CASES = [
    ("prefill", 1, 2, 100, 100, 64, False, 0),
    ("prefill-causal", 1, 2, 100, 100, 128, True, 0),
    ("rect-offset", 1, 2, 37, 300, 64, True, 250),
    ("decode", 1, 2, 1, 1000, 128, True, 999),
]


PAGED_ROWS = {g.id: g for g in cuda_ref.table() if g.entry == "paged"}
PAGED_TOL = {i: 3e-3 if i == "v8_gqa_tc" else 2e-4 for i in PAGED_ROWS}  # vs the fp16-operand oracle
# (label, B, G, H_kv, Nq, kv_lens, page, D, causal, q_offset: None = kv_len - Nq | int | per-sequence list)
PAGED_CASES = [
    ("decode-ragged", 3, 4, 2, 1, [300, 1, 517], 16, 64, True, None),
    ("multi-q-offsets", 2, 4, 1, 17, [130, 40], 8, 128, True, [100, 3]),
    ("long-pages", 2, 8, 1, 1, [1000, 257], 256, 128, False, None),
]


def _paged_case(b, g, hkv, nq, lens, page, d, seed):
    """Shuffled pools with 2 spare NaN blocks, unused entries -1; numpy float32 + the fp16-rounded float64 copy."""
    from attn_core.paging import build_paged_kv

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, g * hkv, nq, d), dtype=np.float32)
    k = rng.standard_normal((b, max(lens), hkv, d), dtype=np.float32)
    v = rng.standard_normal((b, max(lens), hkv, d), dtype=np.float32)
    kp, vp, table = build_paged_kv(k, v, page, seed=seed, kv_lens=np.array(lens))
    n, spare = kp.shape[0], 2
    pos = rng.permutation(n + spare)[:n]
    big_k = np.full((n + spare, *kp.shape[1:]), np.nan, np.float32)
    big_v = big_k.copy()
    big_k[pos], big_v[pos] = kp, vp
    table = pos[table].astype(np.int32)
    for i, n_i in enumerate(lens):
        table[i, -(-n_i // page):] = -1
    return q, big_k, big_v, table


def _paged_oracle(q, kp, vp, table, lens, causal, offs):
    from attn_core.oracle import gather_paged_kv

    f16 = [x.astype(np.float16).astype(np.float64) for x in (q, kp, vp)]
    outs, lses = [], []
    for i, n in enumerate(lens):
        kb = gather_paged_kv(f16[1], table[i], n)[None]
        vb = gather_paged_kv(f16[2], table[i], n)[None]
        o, lse = attention_reference(f16[0][i:i + 1].transpose(0, 2, 1, 3), kb, vb, causal=causal, q_offset=offs[i])
        outs.append(o.transpose(0, 2, 1, 3))
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


def paged_main() -> int:
    failures = 0
    for gen, row in PAGED_ROWS.items():
        for n_case, (label, b, g, hkv, nq, lens, page, d, causal, q_offset) in enumerate(PAGED_CASES):
            g = g if row.gqa else 1
            q, kp, vp, table = _paged_case(b, g, hkv, nq, lens, page, d, seed=n_case)
            t = [torch.from_numpy(x).cuda() for x in (q, kp, vp, table, np.array(lens, np.int32))]
            offs = [n - nq for n in lens] if q_offset is None else q_offset
            kw = {"q_offset": torch.tensor(offs, dtype=torch.int32, device="cuda")} if isinstance(q_offset, list) \
                else {"q_offset": q_offset}
            out, lse = cuda_ref.paged_attention(*t, generation=gen, causal=causal, return_lse=True,
                                                num_sm=cuda_ref.REFERENCE_NUM_SM, **kw)
            torch.cuda.synchronize()
            ref, ref_lse = _paged_oracle(q, kp, vp, table, lens, causal, offs)
            o, ls = out.cpu().numpy(), lse.cpu().numpy()
            err = float(np.max(np.abs(o - ref)))
            lse_err = float(np.max(np.abs(ls - ref_lse)))
            ok = (bool(np.isfinite(o).all()) and bool(np.isfinite(ls).all())
                  and np.allclose(o, ref, atol=PAGED_TOL[gen], rtol=PAGED_TOL[gen])
                  and np.allclose(ls, ref_lse, atol=1e-4, rtol=0))
            failures += not ok
            print(f"{gen:<11} {label:<15} B={b} G={g} H_kv={hkv} Nq={nq} lens={lens} page={page} D={d} "
                  f"causal={causal}: max|err|={err:.2e} lse {lse_err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
        # A used block-table entry past the pool, outside debug mode: NaN for that sequence, never a read.
        q, kp, vp, table = _paged_case(2, 2 if row.gqa else 1, 2, 1, [100, 100], 16, 64, seed=7)
        table[1, 2] = kp.shape[0] + 5
        t = [torch.from_numpy(x).cuda() for x in (q, kp, vp, table, np.array([100, 100], np.int32))]
        os.environ.pop("CUDA_REF_DEBUG", None)
        try:
            out = cuda_ref.paged_attention(*t, generation=gen).cpu().numpy()
        finally:
            os.environ["CUDA_REF_DEBUG"] = "1"
        table[1, 2] = table[1, 1]  # the oracle for sequence 0 only (sequence 1 must be all NaN)
        ref, _ = _paged_oracle(q, kp, vp, table, [100, 100], False, [99, 99])
        ok = bool(np.isnan(out[1]).all()) and np.allclose(out[0], ref[0], atol=PAGED_TOL[gen], rtol=PAGED_TOL[gen])
        failures += not ok
        print(f"{gen:<11} {'bad-table':<15} seq 1 all NaN: {bool(np.isnan(out[1]).all())}, seq 0 "
              f"max|err|={float(np.max(np.abs(out[0] - ref[0]))):.2e} {'ok' if ok else 'WRONG'}", flush=True)
    return failures


def main() -> int:
    torch.manual_seed(0)
    failures = paged_main()
    for gen, row in ROWS.items():
        for label, b, h, nq, nk, d, causal, q_offset in CASES:
            q = torch.randn(b, h, nq, d, device="cuda")
            k = torch.randn(b, h, nk, d, device="cuda")
            v = torch.randn(b, h, nk, d, device="cuda")
            kw = {"num_sm": cuda_ref.REFERENCE_NUM_SM} if row.split_kv else {}
            # return_lse=True so that every kernel's LSE store runs under memcheck too.
            out, lse = cuda_ref.attention(q, k, v, causal=causal, q_offset=q_offset, generation=gen,
                                          return_lse=True, **kw)
            torch.cuda.synchronize()
            operands = [x.half() if row.operand == "fp16" else x for x in (q, k, v)]  # what the kernel reads
            bt = [x.cpu().transpose(1, 2) for x in operands]
            ref, ref_lse = attention_reference(*bt, causal=causal, q_offset=q_offset)
            o, ls = out.cpu().numpy(), lse.cpu().numpy()
            err = float(np.max(np.abs(o - ref.transpose(0, 2, 1, 3))))
            lse_err = float(np.max(np.abs(ls - ref_lse)))
            ok = (bool(np.isfinite(o).all()) and bool(np.isfinite(ls).all())
                  and np.allclose(o, ref.transpose(0, 2, 1, 3), atol=TOL[gen], rtol=TOL[gen])
                  and np.allclose(ls, ref_lse, atol=LSE_TOL[gen], rtol=0))
            failures += not ok
            print(f"{gen:<11} {label:<15} B={b} H={h} Nq={nq} Nk={nk} D={d} causal={causal} "
                  f"q_offset={q_offset}: max|err|={err:.2e} lse {lse_err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    print(f"{failures} wrong result(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
