"""A time model for context-parallel decode (``pallas_attn.distributed``): per-device bytes at the read
ceiling, a fixed per-step kernel cost, and the collective's latency, scored against measurements.

    t(n) = t_fixed + kv_bytes / (n * bw_eff) + c(n),    c(1) = 0,    c(n) = alpha + beta * log2(n)  (one host)

* ``bw_eff``: what the decode kernel reads per GPU (fa_decode sits at 94-99% of the measured read ceiling on
  long caches: docs/fa_decode.md);
* ``t_fixed``: the kernel's own fixed cost per step (launch, pipeline fill, its split merge);
* ``c(n)``: the cross-device merge: measured on H200 hosts (2026-11-22, the issue that asked for this) a psum
  inside a jitted sharded program adds ~12 us on 2 GPUs and ~18 us on 4 (NVLink, all pairs), i.e.
  alpha = 6 us, beta = 6 us per doubling. The state is tiny ((D + 1) * 4 bytes per row per device), so the
  bytes term of the collective is negligible at these shapes and left out.
* Across hosts the collective pays a network hop: ``alpha_x`` (default 40 us, an assumption, not measured
  here) once the devices span more than one host.

``speedup(n) = t(1) / t(n)``; the merge stops paying where adding devices saves less read time than it adds
collective time: ``kv_bytes / bw_eff * (1/n - 1/2n) < c(2n) - c(n)``.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["CPModel", "H200", "H200_FIT"]


@dataclasses.dataclass(frozen=True)
class CPModel:
    bw_eff: float  # bytes/s one GPU's decode kernel reads
    t_fixed: float = 10e-6
    alpha: float = 6e-6
    beta: float = 6e-6
    gpus_per_host: int = 8
    alpha_x: float = 40e-6

    def collective(self, n: int) -> float:
        if n <= 1:
            return 0.0
        c = self.alpha + self.beta * math.log2(n)
        return c + (self.alpha_x if n > self.gpus_per_host else 0.0)

    def time(self, kv_bytes: float, n: int) -> float:
        return self.t_fixed + kv_bytes / (n * self.bw_eff) + self.collective(n)

    def speedup(self, kv_bytes: float, n: int) -> float:
        return self.time(kv_bytes, 1) / self.time(kv_bytes, n)

    def crossover(self, kv_bytes: float, max_n: int = 1 << 12) -> int:
        """The device count past which doubling no longer lowers the step time."""
        n = 1
        while n < max_n and self.time(kv_bytes, 2 * n) < self.time(kv_bytes, n):
            n *= 2
        return n


# H200: read ceiling 4.27 TB/s (x.sum) to 4.6 (jnp.sum under CUPTI); fa_decode read ~4.0-4.35 TB/s on long
# caches in the 2026-11-21 runs (README): 4.1 TB/s effective.
H200 = CPModel(bw_eff=4.1e12)

# Refit after the first run (results/cp_decode/20261122_h200x4, loop clock): the 1-GPU step reads 4.45 TB/s,
# and the steps on 2 and 4 GPUs sit 31-46 us above perfect scaling, more than the 12-18 us psum the model took
# from a bandwidth-bound read: alpha 18 us, beta 8 us, t_fixed folded into them. Scored on the 2-GPU machine
# (results/cp_decode/20261122_h200x2) in docs/distributed.md.
H200_FIT = CPModel(bw_eff=4.45e12, t_fixed=0.0, alpha=18e-6, beta=8e-6)
