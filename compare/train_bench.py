"""Training attention for ``scripts/bench_dropin.py``: forward and forward + backward of
``pallas_attn.dot_product_attention`` against ``jax.nn.dot_product_attention`` (cuDNN and XLA), on compare's kernel
clock (``compare.timing``). The programs are compare's train family's (``compare.train``: the loss, the
value_and_grad step, ``TorchProgram``); ``compare run`` on a ``family = "train"`` workload times the same step.

A workload is one attention shape (BTNH, GQA by head count); an implementation is a way to compute
``jax.nn.dot_product_attention``'s answer. Per (workload, implementation) two timed programs:

* ``fwd``: the jitted forward;
* ``fwd_bwd``: the jitted ``jax.value_and_grad`` of ``sum(out * w)`` with respect to q, k, v (what a
  training step pays for attention: the forward that saves residuals, then the backward).

Implementations (``IMPLS``): the drop-in forced onto each of its kernel pairs, ``pallas:fa_train`` (Triton)
and ``pallas:fa_prefill`` (Mosaic GPU forward + backward, sm_90 only; what ``implementation=None`` runs
there for these workloads); jax.nn's ``jax:cudnn`` and ``jax:xla``; and torch SDPA with one backend selected
(``torch:sdpa_cudnn``, ``torch:sdpa_flash``: FlashAttention-2), a peer outside JAX. The torch programs take
the same device buffers through DLPack as BHND views of the BTNH arrays (``transpose(1, 2)``, no copy; the
last dimension stays contiguous, which is all SDPA's fused backends need), made once outside the timed
region; ``fwd_bwd`` is ``torch.autograd.grad`` of the same ``sum(out * w)`` (fp32 product and sum, as the
JAX programs), so both frameworks time the same work on the same kernel clock. GQA passes ``enable_gqa``
(a backend that refuses it is an error record, not a gap). They need a CUDA GPU, as ``jax:cudnn`` does; a
CPU smoke run takes ``--impls pallas:fa_train,jax:xla`` (fa_prefill refuses the smoke's float32 too).

Layer-1 roofline (docs/dropin.md): FLOPs ``4*B*Hq*N*N*D`` for the forward (half when causal) and 2.5 times
that for the backward (5 products of N x N x D: S recomputed, dP, dV, dK, dQ; the FlashAttention-2 count,
whatever an implementation recomputes beyond it: fa_train's two backward kernels run 7), against the
practical 16-bit tensor-core ceiling ``PRACTICAL_PEAK_FP16``. ``PREDICTIONS`` holds the fraction of that
ceiling each implementation was predicted to reach, written before the GPU run; records carry the
prediction and its error. Agreement: max |difference| of the output and of each gradient against the XLA
implementation on the same inputs (same dtype; its softmax runs in float32), relative to the largest element.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from .train import TRAIN_FLOPS_FACTOR, TorchProgram, loss_fn

__all__ = ["TrainWorkload", "WORKLOADS", "SWEEP", "D256", "IMPLS", "PREDICTIONS", "PRACTICAL_PEAK_FP16", "flops",
           "predicted_us", "build", "agreement", "time_one", "TorchProgram"]


@dataclasses.dataclass(frozen=True)
class TrainWorkload:
    name: str
    batch: int
    heads_q: int
    heads_kv: int
    seq: int
    head_dim: int
    dtype: str
    causal: bool

    def shapes(self):
        q = (self.batch, self.seq, self.heads_q, self.head_dim)
        kv = (self.batch, self.seq, self.heads_kv, self.head_dim)
        return q, kv


WORKLOADS: tuple[TrainWorkload, ...] = (
    TrainWorkload("train_b4_h16_n4096_d128_fp16_c0", 4, 16, 16, 4096, 128, "float16", False),
    TrainWorkload("train_b4_h16_n4096_d128_fp16_c1", 4, 16, 16, 4096, 128, "float16", True),
    TrainWorkload("train_gqa_b4_hq32_hkv8_n4096_d128_bf16_c1", 4, 32, 8, 4096, 128, "bfloat16", True),
)
# the forward's other shapes for the backward (issue 14: "on the same shapes"): D 64, N 1024 and 16384 (16384 tokens
# per call), GQA without the mask, bf16 (D 256: the D256 set below)
SWEEP: tuple[TrainWorkload, ...] = (
    TrainWorkload("train_b4_h16_n4096_d64_fp16_c0", 4, 16, 16, 4096, 64, "float16", False),
    TrainWorkload("train_b4_h16_n4096_d64_fp16_c1", 4, 16, 16, 4096, 64, "float16", True),
    TrainWorkload("train_b16_h16_n1024_d128_fp16_c1", 16, 16, 16, 1024, 128, "float16", True),
    TrainWorkload("train_b1_h16_n16384_d128_fp16_c1", 1, 16, 16, 16384, 128, "float16", True),
    TrainWorkload("train_gqa_b4_hq32_hkv8_n4096_d128_bf16_c0", 4, 32, 8, 4096, 128, "bfloat16", False),
    TrainWorkload("train_b4_h16_n4096_d128_bf16_c0", 4, 16, 16, 4096, 128, "bfloat16", False),
)
# D 256 (config d256's backward: docs/fa_prefill.md "Backward at D 256"), causal and not
D256: tuple[TrainWorkload, ...] = (
    TrainWorkload("train_b4_h16_n4096_d256_fp16_c0", 4, 16, 16, 4096, 256, "float16", False),
    TrainWorkload("train_b4_h16_n4096_d256_fp16_c1", 4, 16, 16, 4096, 256, "float16", True),
)
# for a CPU smoke run of the script (interpret mode): the same code path, tiny shapes
SMOKE: tuple[TrainWorkload, ...] = (
    TrainWorkload("smoke_b1_h2_n64_d64_fp32_c1", 1, 2, 2, 64, 64, "float32", True),
    TrainWorkload("smoke_gqa_b1_hq4_hkv1_n48_d32_fp32_c0", 1, 4, 1, 48, 32, "float32", False),
)

IMPLS = ("pallas:fa_train", "pallas:fa_prefill", "jax:cudnn", "jax:xla", "torch:sdpa_cudnn", "torch:sdpa_flash")
_TORCH_BACKENDS = {"torch:sdpa_cudnn": "CUDNN_ATTENTION", "torch:sdpa_flash": "FLASH_ATTENTION"}

# The roofline's compute ceiling for 16-bit attention on an H100 / H200 (same GH100 compute): the ~660 TFLOP/s
# dense fp16 that cuDNN's fused attention and GEMMs reach in practice, not the 989 TFLOP/s datasheet figure
# (which no attention kernel approaches at sustainable clocks). Records carry both.
PRACTICAL_PEAK_FP16 = 660e12

# Predicted fraction of PRACTICAL_PEAK_FP16, (fwd, fwd_bwd) per implementation and causal,
# written before the first GPU run of each (docs/dropin.md "Predictions" explains each number; the
# fa_prefill and torch rows were added with the fa_prefill path, before it was timed through the drop-in).
PREDICTIONS: dict[tuple[str, bool], tuple[float, float]] = {
    ("pallas:fa_prefill", False): (0.88, 0.55),
    ("pallas:fa_prefill", True): (0.76, 0.46),
    ("torch:sdpa_cudnn", False): (0.97, 0.78),
    ("torch:sdpa_cudnn", True): (0.84, 0.70),
    ("torch:sdpa_flash", False): (0.55, 0.46),
    ("torch:sdpa_flash", True): (0.45, 0.38),
    ("pallas:fa_train", False): (0.45, 0.30),
    ("pallas:fa_train", True): (0.38, 0.25),
    ("jax:cudnn", False): (0.80, 0.60),
    ("jax:cudnn", True): (0.70, 0.50),
    ("jax:xla", False): (0.10, 0.08),
    ("jax:xla", True): (0.05, 0.04),
}


def flops(w: TrainWorkload, program: str) -> float:
    """Useful FLOPs of ``program`` ("fwd" or "fwd_bwd"): 4*B*Hq*N^2*D forward (x0.5 causal), backward 2.5x."""
    fwd = 4.0 * w.batch * w.heads_q * w.seq * w.seq * w.head_dim * (0.5 if w.causal else 1.0)
    if program == "fwd":
        return fwd
    if program == "fwd_bwd":
        return fwd * TRAIN_FLOPS_FACTOR
    raise ValueError(f"program must be 'fwd' or 'fwd_bwd'; got {program!r}")


def predicted_us(w: TrainWorkload, impl: str, program: str, peak_flops: float) -> float | None:
    frac = PREDICTIONS.get((impl, w.causal))
    if frac is None:
        return None
    return flops(w, program) / (peak_flops * frac[0 if program == "fwd" else 1]) * 1e6


def _attention(impl: str, causal: bool) -> Callable:
    import jax

    import pallas_attn

    if impl in ("pallas:fa_train", "pallas:fa_prefill"):  # the drop-in, forced onto one kernel pair
        return lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)
    if impl == "jax:cudnn":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
    if impl == "jax:xla":
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
    raise ValueError(f"unknown implementation {impl!r}; known: {IMPLS}")


def inputs(w: TrainWorkload, seed: int = 0):
    """``(q, k, v, w)`` on the default device: standard normal, in the workload's dtype."""
    import jax

    qs, kvs = w.shapes()
    ks = jax.random.split(jax.random.key(seed), 4)
    return tuple(jax.random.normal(kk, s, "float32").astype(w.dtype) for kk, s in zip(ks, (qs, kvs, kvs, qs)))


def build(impl: str, w: TrainWorkload) -> dict[str, Callable]:
    """The two programs: ``fwd(q, k, v)`` and ``fwd_bwd(q, k, v, w) -> (loss, (dq, dk, dv))``, jitted JAX
    functions, or ``TorchProgram`` for the torch implementations (same call signature on JAX arrays)."""
    import jax

    if impl in _TORCH_BACKENDS:
        from .interop import torch_cuda_available

        if not torch_cuda_available():
            raise RuntimeError(f"{impl} needs torch with a CUDA GPU")
        gqa = w.heads_q != w.heads_kv
        return {"fwd": TorchProgram(_TORCH_BACKENDS[impl], w.causal, gqa, False),
                "fwd_bwd": TorchProgram(_TORCH_BACKENDS[impl], w.causal, gqa, True)}
    attn = _attention(impl, w.causal)
    vg = jax.value_and_grad(loss_fn(attn), argnums=(0, 1, 2), has_aux=True)

    def fwd_bwd(q, k, v, wt):
        (loss, _), grads = vg(q, k, v, wt)
        return loss, grads

    return {"fwd": jax.jit(attn), "fwd_bwd": jax.jit(fwd_bwd)}


def agreement(progs: dict[str, Callable], ref: dict[str, Callable], args: tuple) -> dict[str, float]:
    """Max |ours - reference| / max |reference| for the output and each gradient."""
    import jax.numpy as jnp
    import numpy as np

    def rel(a, b):
        a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
        b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
        return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))

    q, k, v, wt = args
    out = {"out": rel(progs["fwd"](q, k, v), ref["fwd"](q, k, v))}
    _, g = progs["fwd_bwd"](q, k, v, wt)
    _, rg = ref["fwd_bwd"](q, k, v, wt)
    out.update({f"d{n}": rel(a, b) for n, a, b in zip("qkv", g, rg)})
    return out


def time_one(prog: Callable, args: tuple, *, reps: int, flush_bytes: int, clock: str, interpret: bool) -> Any:
    """Warm the program, then time it on compare's kernel clock (CPU interpret: host wall, labelled). A
    ``TorchProgram`` is timed on its torch views (made here, untimed) with the torch clock chain."""
    import jax

    from . import timing

    if getattr(prog, "framework", "jax") == "torch":
        views = prog.prepare(args)
        prog.run(*views)  # warm (cuDNN plan / autotuning)
        if prog.with_grad and clock == "cupti":
            # torch runs a CUDA backward on the autograd engine's device thread; the Mosaic CUPTI collector missed
            # those kernels (H100, 2026-11-22: sdpa_cudnn fwd_bwd 1239.5 us against fwd 831.7 us, i.e. a 408 us
            # "backward"), and kineto cannot be used without costing JAX the Mosaic collector (compare.timing).
            # CUDA events on the stream bracket the whole call, whichever thread enqueued its kernels.
            clock = "events"
        return timing.time_kernels(prog.run, views, framework="torch", reps=reps, flush_bytes=flush_bytes,
                                   clock=clock)
    jax.block_until_ready(prog(*args))
    if interpret:
        return timing.time_cpu(prog, args, reps=reps)
    return timing.time_kernels(prog, args, framework="jax", reps=reps, flush_bytes=flush_bytes, clock=clock)


def tflops(w: TrainWorkload, program: str, us: float) -> float:
    return flops(w, program) / (us * 1e-6) / 1e12 if us > 0 and math.isfinite(us) else float("nan")
