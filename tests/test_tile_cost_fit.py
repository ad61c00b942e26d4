"""scripts/tile_cost_fit.py: the two-length split of a causal prefill time into a cost per key block and a fixed cost
per row tile, on hand-made records with known constants."""

import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("tile_cost_fit",
                                               Path(__file__).parents[1] / "scripts" / "tile_cost_fit.py")
fit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fit)


def _rec(name, impl, q_len, batch, us, run="r1"):
    return {"type": "result", "status": "ok", "run_id": run, "impl": {"name": impl},
            "workload": {"name": name, "causal": True, "q_len": q_len, "kv_len": q_len, "batch": batch, "heads_q": 2},
            "metrics": {"time_us_p50": us}}


def test_blocks_count_the_causal_pairs():
    # 512 rows in 128-row tiles over 128-key blocks: 1 + 2 + 3 + 4 pairs; a ragged length rounds the blocks up
    assert fit._blocks(512, 128, 128) == (4, 10)
    assert fit._blocks(200, 128, 128) == (2, 3)


def test_recovers_known_constants_and_refuses_two_runs(tmp_path, capsys):
    a, b, sms = 1.5, 4.0, 10  # SM-us per pair, per row tile; SMs
    recs = []
    for name, n, batch in (("s", 512, 8), ("l", 2048, 2)):
        tiles, pairs = fit._blocks(n, 128, 128)
        heads = batch * 2
        recs.append(_rec(name, "ours", n, batch, (a * heads * pairs + b * heads * tiles) / sms))
    recs.append(_rec("s", "peer", 512, 8, 100.0, run="r1"))
    recs.append(_rec("l", "peer", 2048, 2, 300.0, run="r2"))
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    assert fit.main([str(f), "--short", "s", "--long", "l", "--ours", "ours", "--peer", "peer", "--sms", str(sms)]) == 0
    out = capsys.readouterr().out
    assert "ours: a = 1.500 SM-us per key block, b = 4.000 SM-us per row tile" in out
    assert "peer: the two records come from different runs" in out
