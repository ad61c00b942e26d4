"""The train family's timed program: one training step of attention, the same for every implementation.

A ``family = "train"`` workload times, per implementation, the jitted ``jax.value_and_grad`` of ``sum(out * w)``
(the product and the sum in float32; ``w`` the workload's seeded cotangent weight, ``interop.Inputs.w``) with
respect to q, k and v, the forward output kept as an auxiliary result (it is the backward's residual: returning it
costs no work) so that the runner checks it against the oracle as for a prefill. torch implementations run the
same step with ``torch.autograd.grad`` (``TorchProgram``). A step returns ``(out, (dq, dk, dv), loss)``
(``TRAIN_OUTPUT``) in the implementation's layout.

The runner (``compare.runner``) then checks the output against the float64 oracle on its usual subset and the
gradients against ``attn_core.oracle.attention_grad_reference`` on one batch row and one KV head group
(``compare.accuracy.grad_oracle``), and counts ``TRAIN_FLOPS_FACTOR`` times the forward's FLOPs (the backward as
2.5 forwards: S recomputed, dP, dV, dK, dQ; ``compare.roofline``). torch's backward runs on the autograd engine's
device thread, whose kernels the Mosaic CUPTI collector does not see (an H100 run measured a 408 us "backward"
against cuDNN's ~800 us): ``torch_step`` asks the runner for CUDA events (``Prepared.clock = "events"``).

``configs/dropin.toml`` times these steps (and the forwards, family prefill) on the shapes of the drop-in's benchmark,
``scripts/bench_dropin.py`` with its ``compare.train_bench``, which it replaced (git history keeps both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .roofline import TRAIN_FLOPS_FACTOR  # forward + backward FLOPs over the forward's (the backward as 2.5)
from .schema import Prepared

__all__ = ["TRAIN_OUTPUT", "TRAIN_FLOPS_FACTOR", "TRAIN_NOTE", "loss_fn", "train_core", "train_step", "jax_step",
           "TorchProgram", "torch_step", "split_output"]

TRAIN_OUTPUT = ("out", "grads", "loss")  # what a train step returns: out, (dq, dk, dv), the fp32 loss
TRAIN_NOTE = ("train step: value_and_grad of sum(out * w) (fp32 product and sum) w.r.t. q, k, v; the forward output "
              "kept as aux")


def loss_fn(attn: Callable) -> Callable:
    """``loss(q, k, v, wt, *extra) -> (sum(out * wt), out)`` with ``out = attn(q, k, v, *extra)``: the fp32 product
    and sum of a train step, the output as aux."""
    import jax.numpy as jnp

    def loss(q, k, v, wt, *extra):
        out = attn(q, k, v, *extra)
        return jnp.sum(out.astype(jnp.float32) * wt.astype(jnp.float32)), out

    return loss


def train_core(attn: Callable, q, k, v, wt, *extra):
    """One train step of ``attn(q, k, v, *extra)`` (traceable, not jitted): ``(out, (dq, dk, dv), loss)`` from
    ``jax.value_and_grad`` of ``sum(out * wt)`` with respect to q, k, v (``extra``: non-differentiated operands such
    as a mask or ``cu_seqlens``)."""
    import jax

    (loss, out), grads = jax.value_and_grad(loss_fn(attn), argnums=(0, 1, 2), has_aux=True)(q, k, v, wt, *extra)
    return out, grads, loss


def train_step(attn: Callable) -> Callable:
    """``jax.jit`` of ``train_core`` for a fixed ``attn``: ``step(q, k, v, wt, *extra) -> (out, (dq, dk, dv),
    loss)``."""
    import jax

    return jax.jit(lambda q, k, v, wt, *extra: train_core(attn, q, k, v, wt, *extra))


def jax_step(attn: Callable, w, inp, *, notes: str = "", extra: tuple = ()) -> Prepared:
    """The train family's ``Prepared`` for a JAX attention ``attn(q, k, v, *extra)`` on BTNH arrays: the jitted step
    on ``(inp.q, inp.k, inp.v, inp.w, *extra)``."""
    if w.family != "train" or inp.w is None:
        raise ValueError(f"jax_step takes a train workload with its cotangent weight; got family {w.family!r}")
    return Prepared(train_step(attn), (inp.q, inp.k, inp.v, inp.w, *extra), "jax", "BTNH",
                    notes="; ".join(x for x in (notes, TRAIN_NOTE) if x))


class TorchProgram:
    """A torch SDPA program on JAX inputs: ``prepare(args)`` makes the BHND torch views once (untimed),
    ``run(*views)`` is what the clock times, and calling it with JAX arrays (the agreement check) returns JAX
    arrays in BTNH, as the JAX programs do. ``return_out``: ``run`` returns ``(out, (dq, dk, dv), loss)``
    (``TRAIN_OUTPUT``, compare's train family) instead of ``(loss, grads)``; ``scale`` None is SDPA's default
    ``1/sqrt(D)``."""

    def __init__(self, backend: str, causal: bool, gqa: bool, with_grad: bool, *, scale: float | None = None,
                 return_out: bool = False):
        self.backend, self.causal, self.gqa, self.with_grad = backend, causal, gqa, with_grad
        self.scale, self.return_out = scale, return_out

    def prepare(self, args: tuple) -> tuple:
        from .interop import to_torch

        views = [to_torch(x) for x in args]
        views[:3] = [t.transpose(1, 2).detach().requires_grad_(self.with_grad) for t in views[:3]]  # BHND
        if len(views) == 4:
            views[3] = views[3].transpose(1, 2)
        return tuple(views)

    def run(self, q, k, v, wt=None):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kw = {"is_causal": self.causal, **({"enable_gqa": True} if self.gqa else {}),
              **({"scale": self.scale} if self.scale is not None else {})}
        with sdpa_kernel([getattr(SDPBackend, self.backend)]):
            out = F.scaled_dot_product_attention(q, k, v, **kw)
        if not self.with_grad:
            return out
        loss = torch.sum(out.float() * wt.float())
        grads = torch.autograd.grad(loss, (q, k, v))
        if self.return_out:
            return out.detach(), grads, loss.detach()
        return loss, grads

    def __call__(self, *args):
        from .interop import to_jax

        res = self.run(*self.prepare(args))
        if not self.with_grad:
            return to_jax(res.detach().transpose(1, 2))
        if self.return_out:
            out, grads, loss = res
            return (to_jax(out.transpose(1, 2)), tuple(to_jax(g.transpose(1, 2)) for g in grads),
                    to_jax(loss.detach()))
        loss, grads = res
        return to_jax(loss.detach()), tuple(to_jax(g.transpose(1, 2)) for g in grads)


def torch_step(backend: str, w, inp, *, causal: bool, notes: str = "") -> Prepared:
    """The train family's ``Prepared`` for torch SDPA with one backend (``SDPBackend`` name): q, k, v, w as BHND views
    of the BTNH device buffers (no copy; leaf tensors requiring grad), made once and shared by the torch peers,
    untimed; timed with CUDA events (module docstring)."""
    if w.family != "train" or inp.w is None:
        raise ValueError(f"torch_step takes a train workload with its cotangent weight; got family {w.family!r}")
    prog = TorchProgram(backend, causal, w.heads_q != w.heads_kv, True, scale=inp.scale, return_out=True)
    views = inp.cached("torch_train_views", lambda: prog.prepare((inp.q, inp.k, inp.v, inp.w)))
    note = ("torch.autograd.grad; BHND views of the BTNH buffers (no copy); timed with CUDA events (the autograd "
            "engine's device thread launches the backward, which the CUPTI collector misses)")
    return Prepared(prog.run, views, "torch", "BHND", clock="events",
                    notes="; ".join(x for x in (notes, TRAIN_NOTE, note) if x))


def split_output(res: Any) -> tuple[Any, tuple[Any, Any, Any]]:
    """``(out, (dq, dk, dv))`` of a train step's result (``TRAIN_OUTPUT``); a clear error for anything else."""
    if not (isinstance(res, (tuple, list)) and len(res) == 3 and isinstance(res[1], (tuple, list))
            and len(res[1]) == 3):
        raise TypeError(f"a train step returns (out, (dq, dk, dv), loss); got {type(res).__name__}")
    return res[0], tuple(res[1])
