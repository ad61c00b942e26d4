"""cuda_ref's MLA twins on the GPU: v11_mla (CUDA cores, §2.16) and v12_mla_tc (mma.sync tensor cores, §2.17)
against attn_core.oracle.mla_attention_reference (float64), and against pallas_attn.mla_attention where both run.

Operands. The oracle gets exactly what each kernel multiplies: q and the latent as the kernel reads them —
v11_mla: q cast to fp16 and every latent element rounded to fp16 in its tile (fp16 / bf16 pools; NVFP4 pools
dequantized by attn_core.formats, then rounded to fp16); v12_mla_tc: q and the latent at q's dtype (fp8 pools
dequantized by attn_core.formats, then rounded to q's dtype, as its shared-memory tile holds them). The quantized
pools are quantized as one tensor (cuda_ref.quant, byte-identical to attn_core.formats); the quantization error
against the unquantized latent is measured separately and printed (run with -s to see it), with a loose bound.

Tolerances (atol = rtol) on those exact operands:
  * v11_mla 2e-4 (v8_gqa_ss's: fp32 dots and softmax, fp32 P);
  * v12_mla_tc 2e-3 with fp16 operands, 1e-2 with bf16: its P is rounded to the operand type before the PV MMA
    (relative 2^-11 / 2^-8 per weight), the documented precision of the kernel (docs/mla.md);
  * lse 1e-3 (both: fp32 statistics).
Covered: the three templates (96/64, 160/128, 576/512) on both generations at fp16 and bf16; pages 16 / 64 / 256;
ragged lengths (1, a page, not a page multiple, one sequence of 0 keys); causal with the default, an int and a
per-sequence q_offset at N_q 1 and 5 (packed rows h·N_q + i); h_q 16 / 128 (v12: 1 or 2 CTAs of 64 heads and
inactive rows); split plans (device SMs, 40, 1); the DeepSeek-V3 shape (h_q 128, 576/512, page 64, N_k 8192);
NVFP4 (v11) and fp8 (v12) latents; NaN in the latent -> NaN out; a bad block-table entry -> ValueError (debug
mode); twin agreement with the Pallas kernels. Runs with CUDA_REF_DEBUG=1. Expected: about a minute after the build.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuda_ref  # noqa: E402
from attn_core import formats  # noqa: E402
from attn_core.generations import MLA_TEMPLATES  # noqa: E402
from attn_core.oracle import gather_paged_kv, mla_attention_reference  # noqa: E402
from attn_core.paging import build_paged_latent  # noqa: E402
from cuda_ref import api  # noqa: E402
from cuda_ref import quant as cq  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOL = {("v11_mla", "float16"): 2e-4, ("v11_mla", "bfloat16"): 2e-4,
       ("v12_mla_tc", "float16"): 2e-3, ("v12_mla_tc", "bfloat16"): 1e-2}
LSE_TOL = 1e-3
TEMPLATES = MLA_TEMPLATES
_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _debug_mode(monkeypatch):
    monkeypatch.setenv(api.DEBUG_ENV, "1")
    monkeypatch.delenv(api.NUM_SM_ENV, raising=False)


def _round(x, dtype: str) -> np.ndarray:
    """float64 values of x rounded to dtype (through torch, round to nearest even)."""
    return torch.from_numpy(np.asarray(x, np.float32)).to(_TORCH[dtype]).double().numpy()


class Case:
    """A paged latent cache and queries: q BHND [B, H_q, N_q, DQK], latent [B, C, 1, DQK] paged and shuffled."""

    def __init__(self, *, b=2, hq=16, nq=1, dqk=576, rank=512, lens=(37, 300), page=16, dtype="bfloat16", seed=0):
        rng = np.random.default_rng(seed)
        cap = max(max(lens), 1)
        self.dqk, self.rank, self.dtype, self.page = dqk, rank, dtype, page
        self.lens = np.asarray(lens, np.int32)
        self.q = rng.standard_normal((b, hq, nq, dqk)).astype(np.float32)
        latent = rng.standard_normal((b, cap, 1, dqk)).astype(np.float32)
        latent[..., : self.rank] *= 1.5  # values and rope part on different scales
        self.pool, self.table, _ = build_paged_latent(latent, page, seed=seed, kv_lens=self.lens)
        self.latent = latent

    # -- what the kernel reads ----------------------------------------------------------------------------------
    def torch_args(self, fmt=None):
        dev = "cuda"
        q = torch.from_numpy(self.q).to(_TORCH[self.dtype]).to(dev)
        pool32 = torch.from_numpy(np.ascontiguousarray(self.pool, np.float32))
        if fmt == "fp8":
            lat = cq.Fp8Tensor(*(x.to(dev) for x in cq.quantize_fp8_e4m3(pool32)))
        elif fmt == "nvfp4":
            lat = cq.Nvfp4Tensor(*(x.to(dev) for x in cq.quantize_nvfp4(pool32)))
        else:
            lat = pool32.to(_TORCH[self.dtype]).to(dev)
        return q, lat, torch.from_numpy(self.table).to(dev), torch.from_numpy(self.lens).to(dev)

    def operand_pool(self, gen, fmt=None) -> np.ndarray:
        """The latent pool values the kernel's tile holds (float64)."""
        pool = np.asarray(self.pool, np.float32)
        if fmt == "fp8":
            pool = formats.dequantize_fp8_e4m3(formats.quantize_fp8_e4m3(pool))
        elif fmt == "nvfp4":
            pool = formats.dequantize_nvfp4(formats.quantize_nvfp4(pool))
        else:
            pool = _round(pool, self.dtype)
        return _round(pool, "float16" if gen == "v11_mla" else self.dtype)

    def operand_q(self, gen) -> np.ndarray:
        q = _round(self.q, self.dtype)
        return _round(q, "float16") if gen == "v11_mla" else q

    def oracle(self, gen, fmt=None, *, pool=None, q=None, causal=False, q_offset=None, scale=None):
        pool = self.operand_pool(gen, fmt) if pool is None else pool
        q = self.operand_q(gen) if q is None else q
        b, nq = q.shape[0], q.shape[2]
        cap = max(int(self.lens.max()), 1)
        dense = np.zeros((b, cap, 1, self.dqk))
        for i, n in enumerate(self.lens):
            dense[i, :n] = gather_paged_kv(pool, self.table[i], int(n))
        offs = self.lens - nq if q_offset is None else np.broadcast_to(np.asarray(q_offset), (b,))
        out, lse = mla_attention_reference(q.transpose(0, 2, 1, 3), dense, kv_lora_rank=self.rank, scale=scale,
                                           causal=causal, q_offset=np.asarray(offs, np.int64), kv_len=self.lens)
        return out.transpose(0, 2, 1, 3), lse  # BHND, [B, H_q, N_q]

    def run(self, gen, fmt=None, **kw):
        q, lat, table, lens = self.torch_args(fmt)
        if isinstance(kw.get("q_offset"), np.ndarray):
            kw["q_offset"] = torch.from_numpy(kw["q_offset"].astype(np.int32)).cuda()
        res = cuda_ref.mla_attention(q, lat, table, lens, kv_lora_rank=self.rank, generation=gen,
                                     return_lse=True, **kw)
        torch.cuda.synchronize()
        return res[0].cpu().double().numpy(), res[1].cpu().double().numpy()


def _check(case, gen, fmt=None, *, tol=None, **kw):
    out, lse = case.run(gen, fmt, **kw)
    oracle_kw = {k: v for k, v in kw.items() if k in ("causal", "q_offset", "scale")}
    ref, ref_lse = case.oracle(gen, fmt, **oracle_kw)
    tol = tol or TOL[(gen, case.dtype)]
    assert out.shape == ref.shape and out.dtype == np.float64
    np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse, ref_lse, atol=LSE_TOL, rtol=LSE_TOL)
    return out


# --- templates x generations x dtypes ---------------------------------------------------------------------------


@pytest.mark.parametrize("gen", ["v11_mla", "v12_mla_tc"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("dqk", "rank"), TEMPLATES)
def test_templates(gen, dtype, dqk, rank):
    _check(Case(dqk=dqk, rank=rank, dtype=dtype, lens=(37, 300), seed=dqk), gen)


@pytest.mark.parametrize("gen", ["v11_mla", "v12_mla_tc"])
@pytest.mark.parametrize("page", [16, 64, 256])
def test_page_sizes_and_ragged_lengths(gen, page):
    lens = (1, page, 3 * page + 5, 0)  # one key, exactly a page, not a page multiple, an empty sequence
    case = Case(b=4, hq=16, lens=lens, page=page, seed=page)
    out = _check(case, gen)
    assert np.all(out[3] == 0)  # no key: zeros, never NaN


@pytest.mark.parametrize("gen", ["v11_mla", "v12_mla_tc"])
@pytest.mark.parametrize("nq", [1, 5])
@pytest.mark.parametrize("offset", ["default", "int", "per_sequence"])
def test_causal_with_offsets(gen, nq, offset):
    case = Case(b=2, hq=16, nq=nq, lens=(70, 333), page=16, seed=nq)
    kw = {"causal": True}
    if offset == "int":
        kw["q_offset"] = 40
    elif offset == "per_sequence":
        kw["q_offset"] = np.array([3, 200])
    _check(case, gen, **kw)


@pytest.mark.parametrize("gen", ["v11_mla", "v12_mla_tc"])
@pytest.mark.parametrize("num_sm", [None, 40, 1])
def test_split_plans_and_128_heads(gen, num_sm):
    case = Case(b=2, hq=128, lens=(1000, 4097), page=64, seed=7)
    _check(case, gen, num_sm=num_sm, scale=0.07)


@pytest.mark.parametrize("gen", ["v11_mla", "v12_mla_tc"])
def test_deepseek_v3_shape(gen):
    # h_q 128, kv_lora_rank 512 + rope 64, page 64, N_k 8192 (the mla_b*_s8192 shape at B = 2), bf16.
    case = Case(b=2, hq=128, dqk=576, rank=512, lens=(8192, 8192), page=64, seed=13)
    _check(case, gen, scale=(128 + 64) ** -0.5)


# --- quantized latents ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("gen", "fmt", "dtype"), [("v11_mla", "nvfp4", "float16"), ("v11_mla", "nvfp4", "bfloat16"),
                                                   ("v12_mla_tc", "fp8", "float16"), ("v12_mla_tc", "fp8", "bfloat16")])
@pytest.mark.parametrize(("dqk", "rank"), [(96, 64), (576, 512)])
def test_quantized_latent(gen, fmt, dtype, dqk, rank):
    case = Case(b=2, hq=16, dqk=dqk, rank=rank, lens=(100, 513), page=64, dtype=dtype, seed=3)
    out = _check(case, gen, fmt, causal=True)
    # Quantization error, reported separately: against the oracle on the unquantized latent (at the input dtype).
    ref, _ = case.oracle(gen, None, pool=_round(case.pool, dtype), q=_round(case.q, dtype), causal=True)
    rmse = float(np.sqrt(np.mean((out - ref) ** 2)))
    print(f"\n{gen} {fmt} latent ({dqk}/{rank}, {dtype} q): quantization RMSE vs the unquantized oracle {rmse:.2e}")
    assert rmse < (2e-2 if fmt == "fp8" else 8e-2)  # fp8 ~1e-3, NVFP4 ~3e-3 (§2.14-§2.16); a wrong scale is O(1)


# --- errors -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gen", ["v11_mla", "v12_mla_tc"])
def test_nan_in_latent_gives_nan_out(gen):
    case = Case(b=1, hq=16, lens=(100,), page=16, seed=5)
    blk = case.table[0, 2]  # key 32 + 3 of sequence 0
    case.pool[blk, 3, 0, 7] = np.nan
    out, _ = case.run(gen)
    assert np.all(np.isnan(out))  # every head sees key 35 (decode, no mask)
    out, _ = case.run(gen, causal=True, q_offset=10)  # key 35 hidden from the only query row
    assert not np.any(np.isnan(out))


@pytest.mark.parametrize("gen", ["v11_mla", "v12_mla_tc"])
def test_bad_block_table_entry_in_debug_mode(gen, monkeypatch):
    case = Case(b=1, hq=16, lens=(100,), page=16, seed=6)
    q, lat, table, lens = case.torch_args()
    table[0, 1] = 10**6
    monkeypatch.setenv(api.DEBUG_ENV, "0")  # validation on a CUDA table reads values only in debug mode
    out = cuda_ref.mla_attention(q, lat, table, lens, kv_lora_rank=case.rank, generation=gen)
    assert torch.isnan(out).all()  # the bad page's keys load as NaN, never a read outside the pool
    monkeypatch.setenv(api.DEBUG_ENV, "1")
    with pytest.raises(ValueError, match="block_table"):
        cuda_ref.mla_attention(q, lat, table, lens, kv_lora_rank=case.rank, generation=gen)


def test_binding_table_has_the_mla_rows():
    from cuda_ref import build

    rows = {name: (num, entry) for num, name, entry in build.load().table()}
    assert rows["v11_mla"] == (16, "mla") and rows["v12_mla_tc"] == (17, "mla")


# --- twin agreement ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cuda_gen", "pallas_gen", "fmt", "dtype"), [
    ("v11_mla", "v11_mla", "nvfp4", "float16"),
    ("v12_mla_tc", "v12_mla_tc", None, "bfloat16"),
    ("v12_mla_tc", "fa_mla", None, "bfloat16"),
    ("v12_mla_tc", "v12_mla_tc", "fp8", "bfloat16"),
])
def test_twin_agreement_with_pallas(cuda_gen, pallas_gen, fmt, dtype):
    pallas_attn = pytest.importorskip("pallas_attn")
    if not hasattr(pallas_attn, "mla_attention"):
        pytest.skip("pallas_attn.mla_attention not built")
    import jax
    import jax.numpy as jnp

    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    from pallas_attn import quant as pq

    case = Case(b=2, hq=128, dqk=576, rank=512, lens=(700, 2049), page=64, dtype=dtype, seed=11)
    ours, _ = case.run(cuda_gen, fmt)
    jdt = jnp.float16 if dtype == "float16" else jnp.bfloat16
    q = jnp.asarray(case.q.transpose(0, 2, 1, 3)).astype(jdt)  # BTHD
    pool = jnp.asarray(np.asarray(case.pool, np.float32))
    if fmt == "fp8":
        lat = pq.quantize_fp8_e4m3(pool)
    elif fmt == "nvfp4":
        lat = pq.quantize_nvfp4(pool)
    else:
        lat = pool.astype(jdt)
    try:
        theirs = pallas_attn.mla_attention(q, lat, jnp.asarray(case.table), jnp.asarray(case.lens),
                                           kv_lora_rank=case.rank, generation=pallas_gen)
    except NotImplementedError as e:
        pytest.skip(f"pallas {pallas_gen} does not run this case: {e}")
    theirs = np.asarray(jnp.asarray(theirs, jnp.float32), np.float64).transpose(0, 2, 1, 3)
    # Pallas returns q's dtype: the comparison carries one rounding of the output to it, plus both kernels' own.
    tol = 2e-2 if dtype == "bfloat16" else 5e-3
    np.testing.assert_allclose(ours, theirs, atol=tol, rtol=tol)
