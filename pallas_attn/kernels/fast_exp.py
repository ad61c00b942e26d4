"""exp2 split between the special-function unit and the FMA pipe (a block of the Hopper forward).

At head dim 64 a key block's exponentials take the special-function unit (MUFU, 16 results a clock per SM) as long as
its two wgmmas take the tensor cores (docs/fa_prefill.md, "exp2 on two pipes"). ``exp2_split`` computes every
``every``-th register pair of a WGMMA-layout fp32 array with a degree-3 polynomial on the FMA pipe instead of
``ex2.approx``, so the two pipes share the work. The polynomial, per fp32 element ``x`` (the softmax's argument,
<= 0 in exact arithmetic):

1. ``xc = max.NaN(x, -127)``: -inf becomes -127 (below), NaN stays NaN;
2. ``t = xc + M`` with ``M = 1.5 * 2**23 + 127`` rounds to the nearest integer ``j`` (``t``'s low mantissa bits hold
   ``127 + j``); ``r = t - M`` is ``j`` as a float and ``f = xc - r`` lies in [-0.5, 0.5];
3. ``p = ((C3 f + C2) f + C1) f + C0``: 2**f with a relative error under 7.5e-5 (a Lawson minimax fit, written out
   by ``coefficients``), below half a bf16 ulp (2**-9) by a factor of 26;
4. ``2**j`` is ``(bits(t) << 23)`` read as a float (exact for j >= -126; 0.0 for j = -127), and the result is
   ``p * 2**j``: exactly 0 for -inf (a masked key adds nothing, as with ``ex2``), NaN for NaN.

Nine FMA-pipe instructions (one max, three adds, three FMAs, one shift, one multiply) against one MUFU issue that
holds the unit for 8 clocks a warp; ``every=4`` moves a quarter of the exponentials. ``exp2_split_reference`` is the
same sequence in numpy float32, op for op (the CPU tests check it; the GPU tests check the kernel against the oracle).
"""

from __future__ import annotations

import numpy as np

# 2**f on [-0.5, 0.5], relative error <= 7.5e-5 (float32 Horner); ``coefficients()`` recomputes them
C0, C1, C2, C3 = 0.9999281167984009, 0.6932609677314758, 0.24261054396629333, 0.05517132207751274
MAGIC = 12583039.0  # 1.5 * 2**23 + 127
LOW = -127.0


def _hex(v: float) -> str:
    return f"0f{int(np.float32(v).view(np.uint32)):08X}"


POLY_ASM = "\n".join([
    "{",
    ".reg .f32 xc, t, r, f, p;",
    ".reg .b32 s;",
    f"max.NaN.f32 xc, $1, {_hex(LOW)};",
    f"add.rn.f32 t, xc, {_hex(MAGIC)};",
    f"sub.rn.f32 r, t, {_hex(MAGIC)};",
    "sub.rn.f32 f, xc, r;",
    f"fma.rn.f32 p, f, {_hex(C3)}, {_hex(C2)};",
    f"fma.rn.f32 p, p, f, {_hex(C1)};",
    f"fma.rn.f32 p, p, f, {_hex(C0)};",
    "shl.b32 s, t, 23;",
    "mul.rn.f32 $0, p, s;",
    "}",
])
MUFU_ASM = "ex2.approx.ftz.f32 $0, $1;"


def coefficients(degree: int = 3, iters: int = 200) -> np.ndarray:
    """The polynomial's coefficients (lowest first): a Lawson iteration towards the minimax relative error of
    2**f on [-0.5, 0.5]."""
    f = np.linspace(-0.5, 0.5, 20001)
    y = np.exp2(f)
    a = np.vander(f, degree + 1, increasing=True) / y[:, None]
    w = np.ones_like(f)
    c = np.zeros(degree + 1)
    for _ in range(iters):
        c, *_ = np.linalg.lstsq(a * np.sqrt(w)[:, None], np.sqrt(w), rcond=None)
        w = w * (np.abs(a @ c - 1) + 1e-30)
        w /= w.sum()
    return c


def poly_exp2_reference(x) -> np.ndarray:
    """The polynomial path in numpy float32, one operation per PTX instruction of ``POLY_ASM``."""
    f32 = np.float32
    x = np.asarray(x, f32)
    with np.errstate(invalid="ignore", over="ignore"):
        xc = np.where(np.isnan(x), x, np.maximum(x, f32(LOW)))  # max.NaN: NaN wins
        t = (xc + f32(MAGIC)).astype(f32)
        r = (t - f32(MAGIC)).astype(f32)
        f = (xc - r).astype(f32)
        f64 = f.astype(np.float64)
        # fma.rn rounds once: float64 holds the product of two float32 exactly (the sum may round twice: <= 1 ulp)
        p = (f64 * np.float64(f32(C3)) + np.float64(f32(C2))).astype(f32)
        p = (p.astype(np.float64) * f64 + np.float64(f32(C1))).astype(f32)
        p = (p.astype(np.float64) * f64 + np.float64(f32(C0))).astype(f32)
        s = (t.view(np.uint32) << np.uint32(23)).view(f32)
        return (p * s).astype(f32)


def exp2_split(x, *, every: int):
    """``exp2(x)`` of a (rows, cols) fp32 array in the WGMMA register layout, inside a Mosaic GPU kernel: register
    pairs whose flat index is ``every - 1`` mod ``every`` by the polynomial, the rest by ``ex2.approx.ftz.f32``."""
    import jax.numpy as jnp
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import llvm
    from jax.experimental.mosaic.gpu import fragmented_array as fa
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if every < 2:
        raise ValueError(f"exp2_split: every must be >= 2 (1 would put every exponential on the FMA pipe); got {every}")

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,),
                       return_type=plgpu.ShapeDtypeStruct(x.shape, jnp.float32, layout=plgpu.Layout.WGMMA))
    def _split(_ctx, xa):
        f32 = ir.F32Type.get()
        poly = fa.FragmentedArray._lift_fast_instr(lambda v: llvm.inline_asm(f32, [v], POLY_ASM, "=f,f"))
        mufu = fa.FragmentedArray._lift_fast_instr(lambda v: llvm.inline_asm(f32, [v], MUFU_ASM, "=f,f"))
        regs = xa.registers
        out = np.empty_like(regs)
        for n, (idx, reg) in enumerate(np.ndenumerate(regs)):
            out[idx] = poly(reg) if n % every == every - 1 else mufu(reg)
        return fa.FragmentedArray(_registers=out, _layout=xa.layout, _is_signed=None)

    return _split(x)
