"""``python -m compare predict``: the README's example and the reference's flags."""

import json
import subprocess
import sys

import pytest

from compare.cli import main


def test_decode_example_names_hbm_and_tc_ceiling(capsys):
    assert main(["predict", "--arch", "h100", "--shape", "1x32x1x128", "--kv-len", "8192", "--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "LIMITER   : HBM" in out
    assert "0.34% of the fp16 tensor-core peak" in out


def test_v1_flags(capsys):
    main(["predict", "--shape", "1x8x512x64", "--precision", "fp32", "--materialize-s", "--tile", "1x1"])
    out = capsys.readouterr().out
    assert "6.819 ms" in out and "0.25 FLOP/byte" in out


def test_mla_flags(capsys):
    main(["predict", "--arch", "sm_103", "--shape", "1x128x1x512", "--kv-len", "8192", "--mla", "--h-q", "128",
          "--precision", "nvfp4", "--mma-engine", "fp8", "--reference-conventions"])
    assert "835.01 FLOP/byte" in capsys.readouterr().out


def test_module_entry_point_and_bad_shape():
    r = subprocess.run([sys.executable, "-m", "compare", "predict", "--shape", "1x8"], capture_output=True, text=True)
    assert r.returncode == 2 and "BxHxNxd" in r.stderr


# ``--generation``: precision, S materialization and tile from the generation's declaration. The flags each
# generation was predicted with before the contract existed (the reference's harness: v1/v2 fp32 with S in
# HBM, tiles 1x1 and 64x64 (D=64) / 32x32 (D=128); v3/v4 fp32; fp16 operands for fp32 input from v5 on;
# v9 fp8; v10-v12 NVFP4).
_BEFORE = {
    "v1_naive": ["--precision", "fp32", "--materialize-s", "--tile", "1x1"],
    "v2_tiled": ["--precision", "fp32", "--materialize-s", "--tile", "{t}x{t}"],
    "v3_online": ["--precision", "fp32"], "v4_fused": ["--precision", "fp32"],
    "v5_wmma": ["--precision", "fp16"], "v6_splitkv": ["--precision", "fp16"],
    "v7_paged": ["--precision", "fp16"], "v8_gqa_ss": ["--precision", "fp16"], "v9_fp8": ["--precision", "fp8"],
}


def _json(capsys, argv):
    assert main(["predict", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("gen", list(_BEFORE))
@pytest.mark.parametrize("shape,arch", [("1x8x2048x64", "t4"), ("1x8x512x128", "h100"), ("4x32x1x128", "a100")])
def test_generation_predicts_what_the_explicit_flags_did(capsys, gen, shape, arch):
    t = 64 if shape.endswith("x64") else 32
    flags = [f.format(t=t) for f in _BEFORE[gen]]
    kv = ["--kv-len", "4096"] if shape.startswith("4x") else []
    got = _json(capsys, ["--arch", arch, "--shape", shape, *kv, "--generation", gen])
    want = _json(capsys, ["--arch", arch, "--shape", shape, *kv, *flags])
    assert got["estimate"] == want["estimate"], (gen, got["contract"])
    assert got["contract"].startswith(gen)


def test_generation_reproduces_the_published_figures(capsys):
    e = _json(capsys, ["--shape", "1x8x512x64", "--generation", "v1_naive"])["estimate"]
    assert round(e["ai"], 2) == 0.25 and round(e["floor_s"] * 1e3, 2) == 6.82
    for n, d, ms in ((2048, 64, 109.1), (2048, 128, 216.5)):
        e = _json(capsys, ["--shape", f"1x8x{n}x{d}", "--generation", "v1_naive"])["estimate"]
        assert round(e["floor_s"] * 1e3, 1) == ms
    for d, ai in ((64, 8.0), (128, 6.4)):
        assert round(_json(capsys, ["--shape", f"1x8x2048x{d}", "--generation", "v2_tiled"])["estimate"]["ai"], 1) == ai
    for gen in ("v3_online", "v4_fused"):
        e = _json(capsys, ["--shape", "1x8x2048x64", "--generation", gen])["estimate"]
        assert e["ai"] == pytest.approx(2048 / 4, rel=1e-12)
    main(["predict", "--arch", "h100", "--shape", "1x32x1x128", "--kv-len", "8192", "--generation", "fa_decode"])
    assert "0.34% of the fp16 tensor-core peak" in capsys.readouterr().out
    e = _json(capsys, ["--arch", "sm_103", "--shape", "1x128x1x512", "--kv-len", "8192", "--h-q", "128",
                       "--generation", "v11_mla", "--mma-engine", "fp8", "--reference-conventions"])["estimate"]
    assert round(e["ai"], 2) == 835.01


def test_reference_storage_is_only_for_unbuilt_generations(capsys, monkeypatch):
    from attn_core import generations as core
    from compare import predict
    from pallas_attn import registry

    unbuilt = {g for g in core.REFERENCE_IDS if not registry.built(g)}
    assert unbuilt <= set(predict.REFERENCE_STORAGE) <= set(core.REFERENCE_IDS)
    monkeypatch.setattr(predict, "REFERENCE_STORAGE", {})  # a built kernel never reads it
    for gen in (r.generation for r in registry.rows()):
        out = _json(capsys, ["--shape", "1x8x64x64", "--q-len", "1", "--generation", gen])
        assert out["contract"].startswith(f"{gen} (Pallas kernel")
    with pytest.raises(KeyError, match="no reference storage convention"):
        predict.reference_storage("v7_paged")


def test_generation_refuses_explicit_precision_flags():
    with pytest.raises(SystemExit, match="drop --precision"):
        main(["predict", "--generation", "v4_fused", "--precision", "fp16"])
    with pytest.raises(SystemExit, match="only apply with --generation"):
        main(["predict", "--config", "faithful"])
