"""``python -m compare predict``: the README's example and the reference's flags."""

import subprocess
import sys

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
