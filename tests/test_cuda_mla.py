"""cuda_ref's MLA entry (``cuda_ref.mla_attention``: v11_mla, v12_mla_tc) on a machine without a GPU.

* the two table rows (generations.def) and what they mean (entry, operand, tiles, split plan);
* every argument check of ``validate_mla`` in pure Python, in its documented order: ValueError naming the argument
  (shapes, dtypes, devices, the quantized latent's fields, the metadata's values on the CPU), then the generation
  (ValueError for an unknown id or a row of another entry, NotImplementedError for a frontier id), then what the
  generation does not do (NotImplementedError: the (DQK, kv_lora_rank) template, the latent format); also on meta
  tensors;
* the call raises RuntimeError (no GPU) only after validation;
* nvcc compiles v11_mla.cu and v12_mla_tc.cu for sm_90a with ``-Xptxas -v`` (skipped without nvcc): no spills or
  stack, v11's static shared memory as docs/reference.md §2.16 gives it (7,872 / 13,120 / 47,232 B), v12 within one
  SM's registers; the report goes to results/ptxas/ptxas_mla_sm90a.txt (registers, spills, static smem, and v12's
  dynamic shared-memory plan, which the source static_asserts).
The numbers are checked on the GPU by tests/gpu/test_cuda_mla_gpu.py.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import cuda_ref
from cuda_ref import api, build

torch = pytest.importorskip("torch")

from cuda_ref import quant as cq  # noqa: E402

cuda_table = importlib.import_module("cuda_ref.table")
ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "results" / "ptxas" / "ptxas_mla_sm90a.txt"
_I32 = torch.int32


# --- the table ------------------------------------------------------------------------------------------------


def test_mla_rows():
    rows = {g.id: g for g in cuda_ref.table() if g.entry == "mla"}
    assert list(rows) == ["v11_mla", "v12_mla_tc"]
    v11, v12 = rows["v11_mla"], rows["v12_mla_tc"]
    assert (v11.number, v11.operand, v11.tile_d64, v11.tile_d128) == (16, "fp16", (8, 32), (8, 32))
    assert (v12.number, v12.operand, v12.tile_d64, v12.tile_d128) == (17, "native", (64, 32), (64, 32))
    for g in (v11, v12):
        assert g.gqa and g.split_kv and g.writes_lse and g.workspace == "split_partials" and not g.materializes_s
    assert v11.operand_precision("bfloat16") == "fp16"  # host cast, as the reference
    assert (v12.operand_precision(torch.float16), v12.operand_precision(torch.bfloat16)) == ("fp16", "bf16")
    with pytest.raises(NotImplementedError, match="float16 or bfloat16"):
        v12.operand_precision(torch.float32)


def test_mla_split_plans():
    # H_kv = 1, G = h_q: the heuristic counts ceil(h_q * n_q / rows) row tiles per sequence (rows 8 / 64).
    assert api.split_plan("v11_mla", batch=1, h_q=128, h_kv=1, n_q=1, n_k=8192, head_dim=512, num_sm=40) == (5, 1639)
    assert api.split_plan("v12_mla_tc", batch=1, h_q=128, h_kv=1, n_q=1, n_k=8192, head_dim=512,
                          num_sm=132) == (32, 256)
    assert api.split_plan("v12_mla_tc", batch=64, h_q=128, h_kv=1, n_q=1, n_k=8192, head_dim=512,
                          num_sm=132) == (3, 2731)


# --- validation -----------------------------------------------------------------------------------------------


def _mla(b=2, hq=16, nq=1, dqk=576, num_blocks=12, page=16, pages=4, dtype=torch.bfloat16, fmt=None,
         device="cpu"):
    """Valid arguments: q [B, H_q, N_q, DQK], latent pool [num_blocks, page, 1, DQK] (or its fp8 / NVFP4 form)."""
    q = torch.randn(b, hq, nq, dqk, dtype=dtype, device=device)
    lat = torch.randn(num_blocks, page, 1, dqk, device="cpu" if fmt else device)
    if fmt == "fp8":
        lat = cq.Fp8Tensor(*(x.to(device) for x in cq.quantize_fp8_e4m3(lat)))
    elif fmt == "nvfp4":
        lat = cq.Nvfp4Tensor(*(x.to(device) for x in cq.quantize_nvfp4(lat)))
    else:
        lat = lat.to(dtype)
    table = (torch.arange(b * pages, dtype=_I32) % num_blocks).reshape(b, pages).to(device)
    lens = torch.tensor([min(20 + 13 * i, pages * page) for i in range(b)], dtype=_I32, device=device)
    return {"q": q, "latent_pool": lat, "block_table": table, "kv_lens": lens}


_RANK = {96: 64, 160: 128, 576: 512}


def _validate(args, **kw):
    dqk = args["q"].shape[-1] if hasattr(args["q"], "shape") else 576
    kw = {"kv_lora_rank": _RANK.get(dqk, 64), **kw}
    return api.validate_mla(args["q"], args["latent_pool"], args["block_table"], args["kv_lens"], **kw)


@pytest.mark.parametrize(("gen", "fmt", "dtype"), [
    ("v11_mla", None, torch.float16), ("v11_mla", None, torch.bfloat16), ("v11_mla", "nvfp4", torch.bfloat16),
    ("v12_mla_tc", None, torch.float16), ("v12_mla_tc", None, torch.bfloat16), ("v12_mla_tc", "fp8", torch.float16),
])
def test_valid_calls_resolve(gen, fmt, dtype):
    call = _validate(_mla(dtype=dtype, fmt=fmt), generation=gen, causal=True, return_lse=True)
    assert call == api.MlaCall(cuda_ref.table()[[g.id for g in cuda_ref.table()].index(gen)].number,
                               pytest.approx(576**-0.5), 0, None, fmt or str(dtype).removeprefix("torch."))


@pytest.mark.parametrize(("dqk", "rank"), [(96, 64), (160, 128), (576, 512)])
def test_templates_and_defaults(dqk, rank):
    call = _validate(_mla(dqk=dqk), kv_lora_rank=rank, scale=0.1, q_offset=3, num_sm=40)
    assert (call.gen_id, call.scale, call.num_sm, call.q_offset) == (16, pytest.approx(0.1), 40, 3)
    assert _validate(_mla(dqk=dqk), kv_lora_rank=rank).scale == pytest.approx(dqk**-0.5)  # 1/sqrt(DQK)


def test_validation_runs_on_meta_tensors():
    assert _validate(_mla(device="meta"), causal=True, generation="v12_mla_tc").gen_id == 17
    with pytest.raises(ValueError, match="page_size"):
        _validate(_mla(device="meta", page=12))


def _set(key, value):
    def mutate(a):
        a[key] = value(a) if callable(value) else value
    return mutate


@pytest.mark.parametrize(("mutate", "kw", "match"), [
    (_set("q", lambda a: a["q"][0]), {}, r"q must be rank 4 \[B, H_q, N_q, DQK\]"),
    (_set("q", lambda a: a["q"].float()), {}, "q must be float16 or bfloat16"),
    (_set("q", [1.0]), {}, "q must be a torch.Tensor"),
    (_set("latent_pool", lambda a: a["latent_pool"].half()), {}, "latent_pool must have q's dtype"),
    (_set("latent_pool", lambda a: a["latent_pool"].float()), {}, "latent_pool must be float16 or bfloat16"),
    (_set("latent_pool", lambda a: a["latent_pool"][0]), {}, "latent_pool must be rank 4"),
    (_set("latent_pool", lambda a: a["latent_pool"].expand(-1, -1, 2, -1)), {}, "one latent head"),
    (_set("latent_pool", lambda a: a["latent_pool"][..., :160]), {}, "share DQK"),
    (_set("latent_pool", lambda a: a["latent_pool"][:, :12]), {}, "page_size"),
    (_set("latent_pool", "pool"), {}, "latent_pool must be a torch.Tensor or a cuda_ref.quant"),
    (None, {"kv_lora_rank": 0}, "kv_lora_rank"),
    (None, {"kv_lora_rank": 577}, "kv_lora_rank"),
    (None, {"kv_lora_rank": 512.0}, "kv_lora_rank"),
    (_set("block_table", lambda a: a["block_table"].long()), {}, "block_table must be int32"),
    (_set("block_table", lambda a: a["block_table"][:1]), {}, r"block_table must be int32 \[B, pages_per_seq\]"),
    (_set("kv_lens", lambda a: a["kv_lens"][:1]), {}, r"kv_lens must be int32 \[B\]"),
    (_set("kv_lens", lambda a: a["kv_lens"].long()), {}, "kv_lens must be int32"),
    (_set("kv_lens", lambda a: torch.tensor([65, 1], dtype=_I32)), {}, r"kv_lens must lie in \[0, pages_per_seq"),
    (_set("block_table", lambda a: torch.tensor([[0, 99, 2, 3], [4, 5, 6, 7]], dtype=_I32)), {},
     "block_table entries of used pages"),
    (_set("kv_lens", lambda a: torch.tensor([1, 2], dtype=_I32)), {"causal": True}, "kv_len >= N_q"),
    (None, {"q_offset": -1}, "q_offset must be None"),
    (None, {"q_offset": torch.zeros(2, dtype=torch.int64)}, "q_offset as a tensor must be int32"),
    (None, {"q_offset": torch.tensor([0, -2], dtype=_I32)}, "q_offset must be >= 0"),
    (None, {"scale": float("inf")}, "scale must be finite"),
    (None, {"causal": 1}, "causal must be a bool"),
    (None, {"return_lse": "yes"}, "return_lse must be a bool"),
    (None, {"num_sm": 0}, "num_sm must be an int >= 1"),
    (None, {"generation": 11}, "generation must be a string"),
    (None, {"generation": "v99_mla"}, "unknown generation"),
    (None, {"generation": "v10_nvfp4"}, "v10_nvfp4 is a quantized generation"),
    (None, {"generation": "v8_gqa_ss"}, r"v8_gqa_ss is a paged generation: call cuda_ref.paged_attention"),
])
def test_bad_argument_is_value_error(mutate, kw, match):
    args = _mla(b=2, nq=2, pages=4, page=16)
    if mutate is not None:
        mutate(args)
    with pytest.raises(ValueError, match=match):
        _validate(args, **kw)


@pytest.mark.parametrize(("fmt", "mutate", "match"), [
    ("fp8", lambda p: cq.Fp8Tensor(p.data.to(torch.int8), p.scale), "latent_pool.data must be uint8"),
    ("fp8", lambda p: cq.Fp8Tensor(p.data, p.scale.reshape(1)), "latent_pool.scale must be a 0-d float32"),
    ("nvfp4", lambda p: cq.Nvfp4Tensor(p.packed, p.micro[..., :8], p.scale), "NVFP4 needs packed"),
    ("nvfp4", lambda p: cq.Nvfp4Tensor(p.packed[0], p.micro, p.scale), "latent_pool.packed must be rank 4"),
])
def test_bad_quantized_latent_is_value_error(fmt, mutate, match):
    args = _mla(fmt=fmt, dtype=torch.float16)
    args["latent_pool"] = mutate(args["latent_pool"])
    with pytest.raises(ValueError, match=match):
        _validate(args, generation="v12_mla_tc" if fmt == "fp8" else "v11_mla")


@pytest.mark.parametrize(("gen", "fmt", "match"), [
    ("v12_mla_tc", "nvfp4", "v12_mla_tc reads float16, bfloat16, fp8 latents; a nvfp4 latent is read by v11_mla"),
    ("v11_mla", "fp8", "v11_mla reads float16, bfloat16, nvfp4 latents; a fp8 latent is read by v12_mla_tc"),
    ("fa_mla", None, "'fa_mla' has no CUDA twin: frontier kernels are Pallas-only by design"),
])
def test_unsupported_is_not_implemented(gen, fmt, match):
    with pytest.raises(NotImplementedError, match=match):
        _validate(_mla(fmt=fmt, dtype=torch.float16), generation=gen)


@pytest.mark.parametrize(("dqk", "rank"), [(576, 64), (128, 64), (96, 96)])
def test_untemplated_widths_are_not_implemented(dqk, rank):
    with pytest.raises(NotImplementedError, match=r"instantiates \(DQK, kv_lora_rank\)"):
        _validate(_mla(dqk=dqk), kv_lora_rank=rank)


def test_argument_errors_come_before_generation_errors():
    args = _mla()
    args["kv_lens"] = args["kv_lens"].long()
    with pytest.raises(ValueError, match="kv_lens"):
        _validate(args, generation="no_such_generation")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_call_without_gpu_raises_after_validation():
    args = _mla()
    with pytest.raises(ValueError, match="kv_lora_rank"):
        cuda_ref.mla_attention(**args, kv_lora_rank=1000)
    with pytest.raises(RuntimeError, match="CUDA"):
        cuda_ref.mla_attention(**args, kv_lora_rank=512)


# --- compile for sm_90a, ptxas report -----------------------------------------------------------------------------

_SOURCES = ("v11_mla.cu", "v12_mla_tc.cu")
_ENTRY = re.compile(r"Compiling entry function '(\S+)' for 'sm_90a'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:.*?, (\d+) bytes smem)?")
# v12_mla_tc's dynamic shared memory per (DQK, operand tile kind): the plan static_asserted in v12_mla_tc.cu.
V12_DYNAMIC_SMEM = {(96, "T"): 39424, (96, "fp8"): 35328, (160, "T"): 59904, (160, "fp8"): 53760,
                    (576, "T"): 193024, (576, "fp8"): 173568}


@pytest.fixture(scope="module")
def ptxas(nvcc_sm90a):
    """The two MLA sources' ptxas reports, from conftest's session-wide nvcc run (the flags of every cuda_ref
    source: sm_90a, -Xptxas -v and torch's fp16 defines)."""
    results = {src: nvcc_sm90a.results[src] for src in _SOURCES}
    kernels = []
    for src, res in results.items():
        assert res.returncode == 0, f"nvcc failed on {src}:\n{res.stderr[-4000:]}"
        warnings = [ln for ln in (res.stdout + res.stderr).splitlines() if "warning" in ln.lower()]
        assert not warnings, f"{src} compiles with warnings:\n" + "\n".join(warnings)
        cur = None
        for line in (res.stdout + res.stderr).splitlines():
            if m := _ENTRY.search(line):
                cur = {"source": src, "mangled": m.group(1)}
            elif cur is not None and (m := _PROPS.search(line)):
                cur.update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
            elif cur is not None and (m := _USED.search(line)):
                cur.update(regs=int(m.group(1)), smem=int(m.group(2) or 0))
                kernels.append(cur)
                cur = None
    cxxfilt = shutil.which("c++filt")
    if cxxfilt:
        out = subprocess.run([cxxfilt], input="\n".join(k["mangled"] for k in kernels), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        for k, name in zip(kernels, out):
            k["name"] = name.replace("(anonymous namespace)::", "").removeprefix("void ").split("(")[0]
            k["name"] = k["name"].removeprefix("cuda_ref::")
    else:
        for k in kernels:
            k["name"] = k["mangled"]
    return sorted(kernels, key=lambda k: (k["source"], k["name"]))


def _template(name: str):
    m = re.search(r"<(\d+), (\d+), (?:(\w+), )?(\d+)>", name)
    return (int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4))) if m else None


@pytest.mark.slow
def test_mla_kernels_compile_without_spills(ptxas, nvcc_sm90a):
    if not shutil.which("c++filt"):
        pytest.skip("c++filt not found (names stay mangled)")
    names = {k["name"] for k in ptxas}
    want = {f"v11_mla_partial_kernel<{d}, {v}, {f}>" for d, v in ((96, 64), (160, 128), (576, 512)) for f in (0, 1, 3)}
    want |= {f"v12_mla_tc_partial_kernel<{d}, {v}, {t}, {f}>" for d, v in ((96, 64), (160, 128), (576, 512))
             for t, f in (("__half", 0), ("__half", 2), ("__nv_bfloat16", 1), ("__nv_bfloat16", 2))}
    assert names == want
    spilled = [k for k in ptxas if k["stack"] or k["spill_st"] or k["spill_ld"]]
    assert not spilled, spilled
    for k in ptxas:
        dqk, dv, t, fmt = _template(k["name"])
        if k["source"] == "v11_mla.cu":
            assert k["smem"] == 2 * (8 * dqk + dqk * 33)  # sQ [8][DQK] + sKt [DQK][33], fp16 (§2.16)
            assert k["regs"] <= 128
        else:
            assert k["smem"] == 0  # the plan is dynamic
            assert k["regs"] <= 255  # 256 threads x 1 CTA: the 64 K-register file holds it
    _write_report(ptxas, nvcc_sm90a)


def _write_report(kernels, nvcc) -> None:
    lines = [
        "# cuda_ref MLA kernels, ptxas resources on sm_90a (written by tests/test_cuda_mla.py; do not edit)",
        f"# nvcc {nvcc.version()}",
        "# flags: nvcc -c " + " ".join(nvcc.flags),
        "# template: <DQK, DV, [operand type,] latent format (0 fp16, 1 bf16, 2 fp8, 3 NVFP4)>; v12's shared memory",
        "# is dynamic (dyn_smem_B: its plan, static_asserted in v12_mla_tc.cu); 256 threads per CTA in both",
        "#",
        f"{'source':<14} {'kernel':<52} {'regs':>4} {'spill':>5} {'stack':>5} {'smem_B':>7} {'dyn_smem_B':>10}",
    ]
    for k in kernels:
        dqk, _, t, fmt = _template(k["name"])
        dyn = V12_DYNAMIC_SMEM[(dqk, "fp8" if fmt == 2 else "T")] if t else 0
        lines.append(f"{k['source']:<14} {k['name']:<52} {k['regs']:>4} {k['spill_st'] + k['spill_ld']:>5} "
                     f"{k['stack']:>5} {k['smem']:>7} {dyn:>10}")
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines) + "\n")


def test_v12_shared_memory_plan_matches_the_source():
    src = (build.CSRC / "kernels" / "v12_mla_tc.cu").read_text()
    m = re.search(r"static_assert\(V12Layout<576, __half, false>::kBytes == (\d+) && V12Layout<576, __half, "
                  r"true>::kBytes == (\d+) &&\s*V12Layout<160, __half, false>::kBytes == (\d+) && "
                  r"V12Layout<96, __half, false>::kBytes == (\d+)", src)
    assert m, "v12_mla_tc.cu's shared-memory static_assert changed: update V12_DYNAMIC_SMEM"
    assert tuple(int(x) for x in m.groups()) == (V12_DYNAMIC_SMEM[(576, "T")], V12_DYNAMIC_SMEM[(576, "fp8")],
                                                  V12_DYNAMIC_SMEM[(160, "T")], V12_DYNAMIC_SMEM[(96, "T")])
    assert max(V12_DYNAMIC_SMEM.values()) <= 227 * 1024  # sm_90's opt-in limit per CTA
