"""cuda_ref's quantized paged twins v9_fp8 (E4M3 pools) and v10_nvfp4 (NVFP4 pools) on the GPU, against
attn_core.oracle.quantized_attention_reference on the same quantized operands.

How "the same operands" holds exactly: each case's pool holds every block of a dense cache K [B, C, H_kv, D]
(C = pages_per_seq * page_size) exactly once, shuffled; the pool is quantized as ONE tensor with cuda_ref.quant
and the oracle quantizes the dense cache as one tensor with attn_core.formats, so both see the same amax, the
same per-tensor scale and the same micro-blocks (each along one row's D). A test checks this (the gathered
dequantized pool equals the oracle's dequantized cache, bit for bit). Table entries past a sequence's used pages
are -1 (never read). q stays unquantized; the kernel reads it as fp16, so the oracle gets fp16-rounded q.

Two tolerances (atol = rtol):
  * 2e-4 (v8_gqa_ss's) against the float64 oracle on the kernel's exact operands: the dequantized values rounded
    to fp16, which is what the staged tile holds (docs/cuda_ref.md, "Quantized KV");
  * 2e-3 against quantized_attention_reference itself (dequantized values in fp32): the tile's fp16 rounding
    (<= 2^-11 relative per element) on top of the arithmetic.
Covered: G 1 / 4 / 16, D 64 / 128, ragged lengths (1, a page, not a page multiple), pages 16 / 64, causal with the
default, an int and a per-sequence q_offset at N_q 1 / 5, every split plan (num_sm device / 40 / 1), the
log-sum-exp, NaN in a pool -> NaN out, and a bad block-table entry (ValueError in debug mode).
Runs with CUDA_REF_DEBUG=1. Expected time: under a minute on an H100 after the build.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuda_ref  # noqa: E402
from attn_core.oracle import attention_reference, gather_paged_kv, quantized_attention_reference  # noqa: E402
from cuda_ref import api  # noqa: E402
from cuda_ref import quant as cq  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GEN = {"fp8": "v9_fp8", "nvfp4": "v10_nvfp4"}
TOL_EXACT = 2e-4
TOL_JUDGE = 2e-3
LSE_TOL = 1e-4


@pytest.fixture(autouse=True)
def _debug_mode(monkeypatch):
    monkeypatch.setenv(api.DEBUG_ENV, "1")
    monkeypatch.delenv(api.NUM_SM_ENV, raising=False)


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


class QCase:
    def __init__(self, fmt, *, b, hq, hkv, nq, d, lens, page, pages=None, seed=0):
        rng = np.random.default_rng(seed)
        pages = pages or max(-(-n // page) for n in lens)
        cap = pages * page
        self.fmt, self.page, self.lens = fmt, page, np.array(lens, dtype=np.int32)
        self.q = rng.standard_normal((b, hq, nq, d), dtype=np.float32)  # BHND
        self.k = (rng.standard_normal((b, cap, hkv, d)) * 2.0).astype(np.float32)  # the dense cache, BTHD
        self.v = rng.standard_normal((b, cap, hkv, d), dtype=np.float32)
        # logical block i (= b * pages + p) lives in physical block perm[i]
        self.perm = perm = rng.permutation(b * pages)
        self.k_pool = np.empty((b * pages, page, hkv, d), np.float32)
        self.v_pool = np.empty_like(self.k_pool)
        self.k_pool[perm] = self.k.reshape(b * pages, page, hkv, d)
        self.v_pool[perm] = self.v.reshape(b * pages, page, hkv, d)
        self.table = perm.reshape(b, pages).astype(np.int32)
        for i, n in enumerate(lens):
            self.table[i, -(-n // page):] = -1

    def pools(self):
        quantize = cq.quantize_fp8_e4m3 if self.fmt == "fp8" else cq.quantize_nvfp4
        kq, vq = quantize(torch.from_numpy(self.k_pool)), quantize(torch.from_numpy(self.v_pool))
        return type(kq)(*(f.cuda() for f in kq)), type(vq)(*(f.cuda() for f in vq))

    def run(self, gen=None, **kw):
        kq, vq = self.pools()
        if isinstance(kw.get("q_offset"), np.ndarray):
            kw["q_offset"] = torch.from_numpy(kw["q_offset"].astype(np.int32)).cuda()
        t = torch.from_numpy
        return cuda_ref.paged_attention(t(self.q).cuda(), kq, vq, t(self.table).cuda(), t(self.lens).cuda(),
                                        generation=gen or GEN[self.fmt], **kw)

    def _offsets(self, q_offset):
        nq = self.q.shape[2]
        if q_offset is None:
            return self.lens.astype(np.int64) - nq
        return np.broadcast_to(np.asarray(q_offset, dtype=np.int64), self.lens.shape)

    def judge(self, *, causal=False, scale=None, q_offset=None):
        """quantized_attention_reference on the dense cache (same scale as the pool), fp16-rounded q; BHND out."""
        q = _f16(self.q).transpose(0, 2, 1, 3)
        o, lse = quantized_attention_reference(q, self.k, self.v, kv_format=self.fmt, causal=causal, scale=scale,
                                               q_offset=self._offsets(q_offset), kv_len=self.lens)
        return o.transpose(0, 2, 1, 3), lse

    def exact(self, *, causal=False, scale=None, q_offset=None):
        """The float64 oracle on what the tile holds: cuda_ref.quant's dequantized pools rounded to fp16."""
        kq, vq = self.pools()
        deq = cq.dequantize_fp8_e4m3 if self.fmt == "fp8" else cq.dequantize_nvfp4
        kp, vp = (_f16(deq(type(t)(*(f.cpu() for f in t))).numpy()) for t in (kq, vq))
        q = _f16(self.q).transpose(0, 2, 1, 3)
        offs = self._offsets(q_offset)
        outs, lses = [], []
        for i, n in enumerate(self.lens.tolist()):
            kb = gather_paged_kv(kp, self.table[i], n)[None]
            vb = gather_paged_kv(vp, self.table[i], n)[None]
            o, lse = attention_reference(q[i:i + 1], kb, vb, causal=causal, scale=scale, q_offset=int(offs[i]))
            outs.append(o.transpose(0, 2, 1, 3))
            lses.append(lse)
        return np.concatenate(outs), np.concatenate(lses)


def check(out, ref, tol):
    assert out.dtype == torch.float32 and out.is_cuda
    o = out.detach().cpu().numpy().astype(np.float64)
    assert np.isfinite(o).all(), "NaN/inf in the output (a poisoned element never written?)"
    assert o.shape == ref.shape
    np.testing.assert_allclose(o, ref, atol=tol, rtol=tol)


def check_both(case, out, **kw):
    check(out, case.exact(**kw)[0], TOL_EXACT)
    check(out, case.judge(**kw)[0], TOL_JUDGE)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_pool_operands_are_the_judges(fmt):
    # The premise of every comparison here: the kernel's pool and the judge's cache dequantize identically.
    from attn_core import formats

    case = QCase(fmt, b=2, hq=2, hkv=2, nq=1, d=64, lens=[100, 40], page=16, seed=1)
    for pool, dense in ((case.pools()[0], case.k), (case.pools()[1], case.v)):
        deq = cq.dequantize_fp8_e4m3 if fmt == "fp8" else cq.dequantize_nvfp4
        got = deq(type(pool)(*(f.cpu() for f in pool))).numpy()
        judge = (formats.dequantize_fp8_e4m3(formats.quantize_fp8_e4m3(dense)) if fmt == "fp8"
                 else formats.dequantize_nvfp4(formats.quantize_nvfp4(dense)))
        want = judge.reshape(got.shape)  # logical blocks, in order
        assert np.array_equal(got[case.perm].view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("g", [1, 4, 16])
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_paged_ragged_every_group(fmt, g, d):
    hkv = 2 if g < 16 else 1
    case = QCase(fmt, b=4, hq=g * hkv, hkv=hkv, nq=1, d=d, lens=[1000, 1, 64, 517], page=64, seed=g + d)
    check_both(case, case.run())
    check_both(case, case.run(causal=True), causal=True)  # decode: q_offset = kv_len - 1


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_causal_q_offsets_nq5(fmt):
    case = QCase(fmt, b=3, hq=8, hkv=2, nq=5, d=64, lens=[400, 77, 130], page=16, seed=7)
    per_seq = np.array([383, 0, 20])
    for kw in ({"causal": True}, {"causal": True, "q_offset": 50}, {"causal": True, "q_offset": per_seq},
               {"causal": False, "q_offset": per_seq}):
        check_both(case, case.run(**kw), **{k: v for k, v in kw.items()})


@pytest.mark.parametrize("num_sm", [None, 40, 1])
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_every_split_plan_and_lse(fmt, num_sm):
    case = QCase(fmt, b=2, hq=8, hkv=1, nq=1, d=128, lens=[8190, 300], page=64, seed=5)
    out, lse = case.run(causal=True, num_sm=num_sm, return_lse=True, scale=0.1)
    ref, ref_lse = case.exact(causal=True, scale=0.1)
    check(out, ref, TOL_EXACT)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=LSE_TOL, rtol=0)
    check(out, case.judge(causal=True, scale=0.1)[0], TOL_JUDGE)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_nan_in_pool_is_nan_out(fmt):
    case = QCase(fmt, b=1, hq=2, hkv=2, nq=1, d=64, lens=[50], page=16, seed=2)
    case.v_pool[case.table[0, 0], 3, 0, 7] = np.nan  # the per-tensor scale becomes NaN: every V value is NaN
    out = case.run().cpu().numpy()
    assert np.isnan(out).all()


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_bad_table_entry_raises_in_debug_and_is_nan_without(fmt, monkeypatch):
    case = QCase(fmt, b=2, hq=4, hkv=2, nq=1, d=64, lens=[40, 20], page=16, seed=3)
    kq, vq = case.pools()
    bad = torch.from_numpy(case.table).cuda()
    bad[1, 0] = 999
    args = (torch.from_numpy(case.q).cuda(), kq, vq, bad, torch.from_numpy(case.lens).cuda())
    with pytest.raises(ValueError, match="999"):  # the Python check reads the table in debug mode
        cuda_ref.paged_attention(*args, generation=GEN[fmt])
    monkeypatch.setenv(api.DEBUG_ENV, "0")
    out = cuda_ref.paged_attention(*args, generation=GEN[fmt]).cpu().numpy()
    assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()
