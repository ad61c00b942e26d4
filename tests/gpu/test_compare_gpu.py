"""compare's method on the device: the three read-ceiling methods, and the one CUPTI collector timing torch
and then JAX in the same process without either falling back (the kineto regression)."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

from compare import ceilings, timing  # noqa: E402

pytestmark = pytest.mark.gpu


def test_read_ceiling_methods_all_measure_and_the_best_is_quoted():
    meas, reason = ceilings.measure(read_gib=1.0, reps=5)
    assert reason is None, reason
    reads = meas["hbm_read_methods"]
    assert set(reads) == {"torch_sum", "jnp_sum", "pallas_stream"}, meas["errors"]
    assert meas["hbm_read_Bps"] == max(r["Bps"] for r in reads.values())
    for name, r in reads.items():  # plausible HBM rates on an H100/H200 (datasheet 3.35 / 4.8 TB/s)
        assert 1.5e12 < r["Bps"] < 5.5e12, (name, r)
    assert reads["pallas_stream"]["tried"] and "config" in reads["pallas_stream"]


def test_torch_then_jax_both_timed_by_the_collector():
    torch = pytest.importorskip("torch")
    flush = 100 << 20
    x = torch.randn(1 << 26, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    tt = timing.time_kernels(lambda a: torch.neg(a, out=y), (x,), framework="torch", reps=5, flush_bytes=flush)
    assert tt.clock == "cupti:mosaic" and not tt.fallback, tt.notes
    xj = jnp.ones((1 << 26,), jnp.float16)
    f = jax.jit(lambda a: -a)
    f(xj)
    tj = timing.time_kernels(f, (xj,), framework="jax", reps=5, flush_bytes=flush)
    assert tj.clock == "cupti:mosaic" and not tj.fallback, tj.notes  # kineto never took CUPTI
    for t in (tt, tj):  # 256 MiB moved: tens of µs, not the flush's
        assert 20 < t.stats["p50"] < 2000, t.samples_us
