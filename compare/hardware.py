"""Hardware table for the roofline: datasheet leads, each value with its source.

Values are leads, not ceilings: ``compare run`` measures HBM bandwidth and matmul rates on the device in
the same process and quotes fractions against both (``Hardware.with_measured``). Rates are dense (no
2:4 sparsity). Where the reference's table (docs/reference.md §3.1) holds a value we keep it, so its published
predictions reproduce exactly.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["Hardware", "HARDWARE", "get", "detect", "keys"]

T = 1e12
P = 1e15


@dataclasses.dataclass(frozen=True)
class Hardware:
    key: str
    name: str
    sm: str
    num_sm: int
    clock_mhz: int
    hbm_gb: float
    hbm_bw: float  # bytes/s
    l2_mb: float
    flops: Mapping[str, float]  # precision -> dense FLOP/s ("fp32" = CUDA cores; the rest tensor cores)
    exp_per_s: float | None  # MUFU exp throughput; None -> the reference's fallback fp32/2 * mufu_ratio
    mufu_ratio: float = 0.25
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    measured: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flops", MappingProxyType(dict(self.flops)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "measured", MappingProxyType(dict(self.measured)))

    @property
    def exp_rate(self) -> float:
        """exp/s: the recorded MUFU rate, else the reference's fallback ``fp32_flops / 2 * mufu_ratio``."""
        if self.exp_per_s is not None:
            return self.exp_per_s
        return self.flops["fp32"] / 2 * self.mufu_ratio

    def peak(self, precision: str) -> float:
        try:
            return self.flops[precision]
        except KeyError:
            raise ValueError(f"{self.name} has no {precision} peak (has: {', '.join(self.flops)})") from None

    def with_measured(self, *, hbm_bw: float | None = None, flops: Mapping[str, float] | None = None) -> Hardware:
        """A copy whose ceilings are the ones measured on the device (datasheet kept in ``sources``)."""
        new_flops = dict(self.flops)
        meas = dict(self.measured)
        srcs = dict(self.sources)
        if hbm_bw:
            meas["hbm_bw"] = hbm_bw
            srcs["hbm_bw"] = f"measured in this run (datasheet {self.hbm_bw / 1e9:.0f} GB/s)"
        for k, v in (flops or {}).items():
            if v:
                meas[f"flops.{k}"] = v
                sheet = self.flops.get(k, float("nan")) / T
                srcs[f"flops.{k}"] = f"measured in this run (datasheet {sheet:.1f} TFLOP/s)"
                new_flops[k] = v
        return dataclasses.replace(self, hbm_bw=hbm_bw or self.hbm_bw, flops=new_flops, measured=meas, sources=srcs)


_REF = "docs/reference.md §3.1 (the reference's archs.py)"

HARDWARE: dict[str, Hardware] = {
    "t4": Hardware(
        "t4", "Tesla T4", "sm_75", 40, 1590, 16, 320e9, 4,
        {"fp32": 8.1 * T, "fp16": 65 * T, "bf16": 65 * T, "int8": 130 * T},
        None,
        sources={"*": f"NVIDIA T4 datasheet; {_REF}", "bf16": "no bf16 tensor cores on sm_75: fp16 rate used"},
    ),
    "a100": Hardware(
        "a100", "A100-SXM4-80GB", "sm_80", 108, 1410, 80, 2039e9, 40,
        {"fp32": 19.5 * T, "fp16": 312 * T, "bf16": 312 * T, "int8": 624 * T},
        None,
        sources={"*": f"NVIDIA A100 datasheet (SXM4 80GB, dense); {_REF}"},
    ),
    "h100": Hardware(
        "h100", "H100 SXM", "sm_90", 132, 1980, 80, 3.35e12, 50,
        {"fp32": 66.9 * T, "fp16": 989.4 * T, "bf16": 989.4 * T, "fp8": 1978.9 * T, "int8": 1978.9 * T},
        132 * 16 * 1.98e9,
        sources={
            "*": "NVIDIA H100 datasheet (SXM5, dense = half the sparsity figures)",
            "exp_per_s": "CUDA C++ Programming Guide throughput table: 16 exp2/clk/SM on cc 9.0 x 132 SMs x 1.98 GHz",
            "l2_mb": "torch 2.11 L2_cache_size on the device machine (KINDS.md, 2026-11-13)",
        },
    ),
    "h200": Hardware(
        "h200", "H200 SXM", "sm_90", 132, 1980, 141, 4.8e12, 60,
        {"fp32": 66.9 * T, "fp16": 989.4 * T, "bf16": 989.4 * T, "fp8": 1978.9 * T, "int8": 1978.9 * T},
        132 * 16 * 1.98e9,
        sources={
            "*": "NVIDIA H200 datasheet (same GH100 compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s)",
            "exp_per_s": "CUDA C++ Programming Guide throughput table: 16 exp2/clk/SM on cc 9.0 x 132 SMs x 1.98 GHz",
            "l2_mb": "torch L2_cache_size on the device machine (KINDS.md, 2026-10-28)",
            "measured": "docs/peers.md §1: HBM read 4.27 TB/s, copy 4.24 TB/s, fp16 matmul 746-780, fp8 1422 TFLOP/s",
        },
    ),
    "b200": Hardware(
        "b200", "B200", "sm_100", 148, 1965, 192, 8e12, 132.6,
        {"fp32": 60 * T, "fp16": 2.25 * P, "bf16": 2.25 * P, "fp8": 4.5 * P, "nvfp4": 9.0 * P, "int8": 4.5 * P},
        None,
        sources={"*": f"{_REF}; compute peaks tagged speculative there; SMs, clock and L2 measured there"},
    ),
    "b300": Hardware(
        "b300", "B300 SXM6", "sm_103", 148, 2032, 288, 8e12, 132.6,
        {"fp32": 105 * T, "fp16": 2.5 * P, "bf16": 2.5 * P, "fp8": 5.0 * P, "nvfp4": 15.0 * P, "int8": 0.15 * P},
        10.7e12,
        sources={
            "*": f"{_REF}; fp16 'likely', fp32 'unconfirmed' there",
            "exp_per_s": "vendor figure quoted by the reference (measured there: 5.33e12)",
        },
    ),
}

_ALIASES = {
    "sm_75": "t4", "sm75": "t4", "sm_80": "a100", "sm80": "a100", "sm_90": "h100", "sm_90a": "h100",
    "sm_100": "b200", "sm_103": "b300", "sm_103a": "b300",
}


def keys() -> tuple[str, ...]:
    return tuple(HARDWARE)


def get(key: str) -> Hardware:
    k = key.strip().lower()
    k = _ALIASES.get(k, k)
    try:
        return HARDWARE[k]
    except KeyError:
        raise ValueError(f"unknown arch {key!r}; known: {', '.join(HARDWARE)} (or {', '.join(_ALIASES)})") from None


def detect(device_name: str) -> Hardware | None:
    """Map a device name (``torch.cuda.get_device_name``, ``jax.Device.device_kind``) to a table row."""
    n = device_name.lower()
    for pat, key in ((r"h200", "h200"), (r"h100", "h100"), (r"a100", "a100"), (r"\bt4\b", "t4"),
                     (r"b300", "b300"), (r"b200", "b200")):
        if re.search(pat, n):
            return HARDWARE[key]
    return None


def aggregate(hw: Hardware, devices: int) -> Hardware:
    """``devices`` copies of ``hw`` working on one problem (context parallelism on one host): bandwidth, SMs,
    FLOP and exp rates add up; the same hardware when ``devices == 1``."""
    if devices == 1:
        return hw
    return dataclasses.replace(
        hw, name=f"{devices}x {hw.name}", num_sm=hw.num_sm * devices, hbm_gb=hw.hbm_gb * devices,
        hbm_bw=hw.hbm_bw * devices, l2_mb=hw.l2_mb * devices, flops={k: v * devices for k, v in hw.flops.items()},
        exp_per_s=None if hw.exp_per_s is None else hw.exp_per_s * devices)
