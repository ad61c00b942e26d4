"""cuda_ref's quantized-KV twins v9_fp8 / v10_nvfp4 on a machine without a GPU (docs/cuda_ref.md, "Quantized KV").

* the table rows (number, entry, tiles: v8_gqa_ss's) and the binding entry that serves them;
* the dequantizers of common/paged_quant.cuh, compiled by nvcc as host code and run here: every E4M3 byte, every
  E2M1 nibble, and the per-element tile load of both formats against ``cuda_ref.quant``'s dequantization rounded
  to fp16 (bit for bit, bad rows NaN), on random, signed-zero, tiny and saturating pools;
* ``cuda_ref.paged_attention``'s validation of quantized pools (pure Python, meta tensors included).

The kernels' sm_90a compile, register and smem report come from tests/test_cuda_ref_cpu.py (EXPECTED_SMEM), which
compiles every kernel source; the numerics on a GPU are tests/gpu/test_cuda_quant_gpu.py.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuda_ref  # noqa: E402
from attn_core import formats  # noqa: E402
from cuda_ref import api, build  # noqa: E402
from cuda_ref import quant as cq  # noqa: E402

_I32 = torch.int32


# --- the table and the binding entry ----------------------------------------------------------------------


def test_quantized_rows():
    t = {g.id: g for g in cuda_ref.table()}
    ss = t["v8_gqa_ss"]
    for gid, number in (("v9_fp8", 14), ("v10_nvfp4", 15)):
        g = t[gid]
        assert (g.number, g.entry, g.operand, g.head_dims) == (number, "quantized", "fp16", (64, 128))
        assert g.gqa and g.split_kv and g.writes_lse and not g.materializes_s
        assert (g.tile_d64, g.tile_d128, g.workspace) == (ss.tile_d64, ss.tile_d128, ss.workspace)
    assert api.GENERATION_IDS["v9_fp8"] == 14 and api.GENERATION_IDS["v10_nvfp4"] == 15
    binding = (build.CSRC / "binding.cpp").read_text()
    assert "row_for(gen_id, Entry::kQuantized)" in binding and '"forward_paged_quant"' in binding
    for gid in ("v9_fp8", "v10_nvfp4"):  # each kernel takes the shared quantized body, not a copy
        src = (build.CSRC / "kernels" / f"{gid}.cu").read_text()
        assert "quant_ss_partial<D, " in src and "common/paged_quant.cuh" in src


# --- the dequantizers, run on the host --------------------------------------------------------------------

_HOST_PROG = r"""
#include <cstdio>
#include <cstring>
#include <vector>
#include "common/paged_quant.cuh"
using namespace cuda_ref;
static unsigned bits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static unsigned hbits(__half h) { unsigned short u; std::memcpy(&u, &h, 2); return u; }
int main(int argc, char** argv) {
  if (argc == 1) {
    for (unsigned b = 0; b < 256; ++b) std::printf("%u ", bits(e4m3_to_float(b)));
    std::printf("\n");
    for (unsigned n = 0; n < 16; ++n) std::printf("%u ", bits(e2m1_to_float(n)));
    std::printf("\n");
    return 0;
  }
  // argv[1]: file of int32 mode (0 fp8, 1 nvfp4), rows, D, float scale, then data bytes, then micro bytes.
  FILE* f = std::fopen(argv[1], "rb");
  int mode, rows, d; float scale;
  if (std::fread(&mode, 4, 1, f) != 1 || std::fread(&rows, 4, 1, f) != 1 || std::fread(&d, 4, 1, f) != 1 ||
      std::fread(&scale, 4, 1, f) != 1) return 2;
  const int w = mode ? d / 2 : d;
  std::vector<unsigned char> data(static_cast<size_t>(rows) * w), micro(static_cast<size_t>(rows) * d / 16);
  if (std::fread(data.data(), 1, data.size(), f) != data.size()) return 3;
  if (mode && std::fread(micro.data(), 1, micro.size(), f) != micro.size()) return 4;
  for (int r = -1; r < rows; ++r) {  // row -1: a bad block-table entry
    for (int t = 0; t < d; ++t) {
      const int64_t row = r < 0 ? -1 : static_cast<int64_t>(r) * w;
      const __half h = mode ? Nvfp4Source::load(data.data(), micro.data(), scale, row, t)
                            : Fp8Source::load(data.data(), nullptr, scale, row, t);
      std::printf("%u ", hbits(h));
    }
  }
  std::printf("\n");
  return 0;
}
"""


def _nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), "/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    return None


@pytest.fixture(scope="module")
def host_dequant(tmp_path_factory):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    tmp = tmp_path_factory.mktemp("cuda_quant_host")
    (tmp / "prog.cu").write_text(_HOST_PROG)
    inc = [f"-I{p}" for p in build.include_dirs(build.write_generated(tmp / "generated"))]  # generations.def first
    res = subprocess.run([nvcc, "-std=c++17", "-O1", *inc, str(tmp / "prog.cu"), "-o",
                          str(tmp / "prog")], capture_output=True, text=True)
    assert res.returncode == 0, f"common/paged_quant.cuh does not compile as host code:\n{res.stderr[-3000:]}"
    return tmp / "prog", tmp


def _f32(bits: list[int]) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_decoders_exact_on_every_code(host_dequant):
    prog, _ = host_dequant
    out = subprocess.run([str(prog)], capture_output=True, text=True, check=True).stdout.split("\n")
    e4m3 = _f32([int(x) for x in out[0].split()])
    want = formats.e4m3_to_float(np.arange(256, dtype=np.uint8)).astype(np.float32)
    assert np.array_equal(np.isnan(e4m3), np.isnan(want)) and np.isnan(want).sum() == 2
    ok = ~np.isnan(want)
    assert np.array_equal(e4m3[ok].view(np.uint32), want[ok].view(np.uint32))  # -0.0 included
    e2m1 = _f32([int(x) for x in out[1].split()])
    levels = formats.NVFP4_LEVELS.astype(np.float32)
    assert np.array_equal(e2m1[:8], levels) and np.array_equal(e2m1[8:], -levels)
    assert np.signbit(e2m1[8])  # nibble 8 is -0


def _pool_values(rows: int, d: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(12)
    x = torch.randn(rows, d, generator=g) * 3.0
    x[0, :16] = 0.0
    x[0, 16:32] = -0.0
    x[1, :16] = 1e-6 * torch.randn(16, generator=g)  # tiny block next to large ones: micro-scale underflow
    x[2, 5] = 250.0  # the amax: saturating codes elsewhere stay in range
    x[3, ::2] = -x[3, 1::2]  # exact negatives
    return x


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("d", [64, 128])
def test_tile_load_matches_torch_dequant_in_fp16(host_dequant, fmt, d):
    prog, tmp = host_dequant
    rows = 6
    x = _pool_values(rows, d)
    if fmt == "fp8":
        t = cq.quantize_fp8_e4m3(x)
        data, micro, deq = t.data, None, cq.dequantize_fp8_e4m3(t)
    else:
        t = cq.quantize_nvfp4(x)
        data, micro, deq = t.packed, t.micro, cq.dequantize_nvfp4(t)
    blob = struct.pack("<iiif", int(fmt == "nvfp4"), rows, d, float(t.scale)) + data.numpy().tobytes()
    if micro is not None:
        blob += micro.numpy().tobytes()
    path = tmp / f"pool_{fmt}_{d}.bin"
    path.write_bytes(blob)
    out = subprocess.run([str(prog), str(path)], capture_output=True, text=True, check=True).stdout.split()
    got = np.array([int(v) for v in out], dtype=np.uint16).view(np.float16).reshape(rows + 1, d)
    assert np.isnan(got[0]).all(), "a bad row must load as NaN"
    want = deq.to(torch.float16).numpy()
    assert np.array_equal(got[1:].view(np.uint16), want.view(np.uint16))
    assert np.count_nonzero(want) > rows * d // 2  # the comparison saw real values, not a zero pool


# --- validation of quantized pools (pure Python) ----------------------------------------------------------


def _qpaged(fmt="fp8", b=2, hq=4, hkv=2, nq=1, d=64, num_blocks=8, page=16, pages=4, device="cpu"):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, hq, nq, d, generator=g).to(device)
    kv = [torch.randn(num_blocks, page, hkv, d, generator=g) for _ in range(2)]
    quantize = cq.quantize_fp8_e4m3 if fmt == "fp8" else cq.quantize_nvfp4
    k_pool, v_pool = (type(t)(*(f.to(device) for f in t)) for t in map(quantize, kv))
    block_table = (torch.arange(b * pages, dtype=_I32) % num_blocks).reshape(b, pages).to(device)
    kv_lens = torch.tensor([min(20 + 13 * i, pages * page) for i in range(b)], dtype=_I32, device=device)
    return {"q": q, "k_pool": k_pool, "v_pool": v_pool, "block_table": block_table, "kv_lens": kv_lens}


def _validate(args, **kw):
    kw = {"generation": None, "causal": False, "scale": None, "q_offset": None, "return_lse": False, **kw}
    return api.validate_paged(args["q"], args["k_pool"], args["v_pool"], args["block_table"], args["kv_lens"], **kw)


@pytest.mark.parametrize(("fmt", "gen_id"), [("fp8", 14), ("nvfp4", 15)])
def test_quantized_pools_resolve_their_generation(fmt, gen_id):
    call = _validate(_qpaged(fmt))
    assert (call.gen_id, call.kv_format, call.scale) == (gen_id, fmt, pytest.approx(0.125))
    gen = api._QUANT_GENERATION[fmt]
    for kw in ({"causal": True}, {"return_lse": True, "scale": 0.5}, {"q_offset": 3, "num_sm": 40}):
        assert _validate(_qpaged(fmt, d=128, hq=16, hkv=1), generation=gen, **kw).gen_id == gen_id
    assert _validate(_qpaged(fmt, device="meta"), causal=True).gen_id == gen_id  # shapes only
    # Float pools keep their default and entry.
    f = _qpaged(fmt)
    f["k_pool"] = f["v_pool"] = torch.randn(8, 16, 4, 64)
    f["q"] = torch.randn(2, 4, 1, 64)
    assert _validate(f) == api.PagedCall(7, pytest.approx(0.125), 0, None)


def _replace(args, pool, **fields):
    return {**args, pool: args[pool]._replace(**fields)}


@pytest.mark.parametrize(
    ("fmt", "mutate", "kw", "match"),
    [
        ("fp8", lambda a: {**a, "v_pool": cq.quantize_nvfp4(torch.randn(8, 16, 2, 64))}, {}, "same format"),
        ("fp8", lambda a: {**a, "v_pool": torch.randn(8, 16, 2, 64)}, {}, "same format"),
        ("fp8", lambda a: a, {"generation": "v10_nvfp4"}, "v10_nvfp4 does not read fp8 pools.*v9_fp8"),
        ("nvfp4", lambda a: a, {"generation": "v9_fp8"}, "v9_fp8 does not read nvfp4 pools.*v10_nvfp4"),
        ("fp8", lambda a: a, {"generation": "v8_gqa_ss"}, "v8_gqa_ss reads float pools.*v9_fp8"),
        ("fp8", lambda a: _replace(a, "k_pool", data=a["k_pool"].data.to(torch.int8)), {}, "k_pool.data must be uint8"),
        ("fp8", lambda a: _replace(a, "v_pool", data=a["v_pool"].data[0]), {}, "v_pool.data must be rank 4"),
        ("fp8", lambda a: _replace(a, "v_pool", data=a["v_pool"].data[:4]), {}, "k_pool and v_pool must have the same"),
        ("fp8", lambda a: _replace(a, "k_pool", scale=a["k_pool"].scale.reshape(1)), {}, "k_pool.scale must be a 0-d"),
        ("fp8", lambda a: _replace(a, "k_pool", scale=a["k_pool"].scale.double()), {}, "k_pool.scale must be a 0-d"),
        ("fp8", lambda a: _replace(a, "k_pool", data=a["k_pool"].data.to("meta")), {}, "k_pool.data must be on q's"),
        ("fp8", lambda a: {**a, "q": a["q"][..., :32]}, {}, "head dim D"),
        ("fp8", lambda a: {**a, "q": a["q"][:, :3]}, {}, "H_q must be a multiple of H_kv"),
        ("fp8", lambda a: {**a, "kv_lens": torch.tensor([20, 65], dtype=_I32)}, {}, "kv_lens must lie in"),
        ("nvfp4", lambda a: _replace(a, "k_pool", micro=a["k_pool"].micro[..., :2]), {}, "micro"),
        ("nvfp4", lambda a: _replace(a, "v_pool", micro=a["v_pool"].micro.float()), {}, "v_pool.micro must be uint8"),
        ("nvfp4", lambda a: _replace(a, "k_pool", packed=a["k_pool"].packed[..., :8],
                                     micro=a["k_pool"].micro[..., :1]), {}, "D a multiple of 32"),
    ],
)
def test_quantized_bad_argument_is_value_error(fmt, mutate, kw, match):
    with pytest.raises(ValueError, match=match):
        _validate(mutate(_qpaged(fmt)), **kw)


def test_float_pools_to_a_quantized_generation_say_how_to_quantize():
    for gen, fn in (("v9_fp8", "quantize_fp8_e4m3"), ("v10_nvfp4", "quantize_nvfp4")):
        f = {**_qpaged(), "k_pool": torch.randn(8, 16, 2, 64), "v_pool": torch.randn(8, 16, 2, 64)}
        with pytest.raises(ValueError, match=re.escape(f"cuda_ref.quant.{fn}(pool)")):
            _validate(f, generation=gen)


def test_quantized_unsupported_is_not_implemented():
    with pytest.raises(NotImplementedError, match="head dims"):
        _validate(_qpaged("fp8", d=96))
    with pytest.raises(NotImplementedError, match="Pallas-only"):
        _validate(_qpaged("fp8"), generation="fa_decode")


def test_quantized_call_without_gpu_raises_after_validation():
    with pytest.raises(ValueError, match="k_pool.data must be uint8"):
        cuda_ref.paged_attention(**_replace(_qpaged(), "k_pool", data=_qpaged()["k_pool"].data.float()))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            cuda_ref.paged_attention(**_qpaged("nvfp4"))
