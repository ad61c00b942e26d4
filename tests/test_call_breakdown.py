"""scripts/call_breakdown.py's arithmetic (CPU): the per-launch medians and the per-repetition total it prints."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _module():
    path = Path(__file__).resolve().parents[1] / "scripts" / "call_breakdown.py"
    spec = importlib.util.spec_from_file_location("call_breakdown", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summarize_medians_per_launch_position_and_the_total():
    """Three repetitions of the same two launches (ms): each launch's median in µs, in launch order, and the median
    of the per-repetition sums (not the sum of the medians); a repetition with other names counts in the total only."""
    cb = _module()
    per = [[("partial", 0.010), ("merge", 0.002)],
           [("partial", 0.012), ("merge", 0.001)],
           [("partial", 0.011), ("merge", 0.004)],
           [("other", 0.100)]]
    ks, tot = cb.summarize(per)
    assert [n for n, _ in ks] == ["partial", "merge"]
    assert ks[0][1] == pytest.approx(11.0) and ks[1][1] == pytest.approx(2.0)
    # per-repetition sums 12, 13, 15, 100 us: the median is 14
    assert tot == pytest.approx(14.0)
