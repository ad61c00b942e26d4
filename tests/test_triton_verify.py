"""The Triton verifier in the CPU suite (tests/conftest.py, session 39): every Triton module a test lowers for CUDA is
verified as Triton's parser will verify it on the device. The hook is in place; it refuses the loop bound that failed
on the GPU in session 39 (``fori_loop(0, jnp.where(pred, 1, 0), ...)``: an i1 bound) and passes its int32 form; and
the decode merge that reads only live rows (``splitkv.merge(live=...)``) lowers to a module that verifies."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from pallas_attn import _compat


def _lower_cuda(fn, *shapes):
    return jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))


def test_the_hook_is_installed():
    from jax._src.pallas.triton import lowering as triton_lowering

    assert getattr(triton_lowering.lower_jaxpr_to_triton_module, "_verifies", False)


def _loop_kernel(x_ref, a_ref, o_ref, *, as_where: bool):
    live = a_ref[0] > 0
    n = jnp.where(live, 1, 0) if as_where else jnp.asarray(live, jnp.int32)
    o_ref[...] = jax.lax.fori_loop(0, n, lambda i, c: c + x_ref[...], jnp.zeros((16,), jnp.float32))


@pytest.mark.parametrize("as_where", [False, True])
def test_an_i1_loop_bound_is_refused_here_as_on_the_device(as_where):
    f = pl.pallas_call(functools.partial(_loop_kernel, as_where=as_where),
                       out_shape=jax.ShapeDtypeStruct((16,), jnp.float32), interpret=False,
                       compiler_params=_compat.triton_params(num_warps=4, num_stages=1))
    shapes = (jax.ShapeDtypeStruct((16,), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32))
    if not as_where:
        _lower_cuda(f, *shapes)
        return
    with pytest.raises(Exception, match="scf.for"):
        _lower_cuda(f, *shapes)


def test_the_live_row_merge_verifies():
    from pallas_attn.kernels import splitkv

    def f(o, lse, q_rows):
        return splitkv.merge(o, lse, out_dtype=jnp.bfloat16, interpret=False, name="t_merge", return_lse=True,
                             live=(q_rows, lambda r, ref: r % 8 < ref[r // 32] * 4))

    text = _lower_cuda(f, jax.ShapeDtypeStruct((128, 8, 128), jnp.float32), jax.ShapeDtypeStruct((128, 8), jnp.float32),
                       jax.ShapeDtypeStruct((4,), jnp.int32)).as_text()
    assert "t_merge" in text
