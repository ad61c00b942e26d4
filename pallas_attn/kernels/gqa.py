"""GQA M-packing (reference §2.0 "GQA M-packing index math"), written once.

The G = Hq / Hkv query heads that share a KV head, times the Tq query positions, become the M rows of one
program, so each KV tile is read once for all of them. Packed row ``r`` of a (b, h_kv) pair is query head
``h_kv*G + r // Tq`` at query position ``r % Tq`` (head-major). For Tq == 1 packing and unpacking are free
reshapes of BTNH.
"""

from __future__ import annotations

__all__ = ["pack_q", "unpack_o", "row_position", "unpack_lse"]


def pack_q(q, hkv: int):
    """``[B, Tq, Hq, D] -> [B*Hkv*G*Tq, D]``, head-major packed rows."""
    b, tq, hq, d = q.shape
    g = hq // hkv
    return q.reshape(b, tq, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b * hkv * g * tq, d)


def unpack_o(o, b: int, tq: int, hq: int, hkv: int):
    """Inverse of ``pack_q`` for the output rows ``[B*Hkv*G*Tq, D] -> [B, Tq, Hq, D]``."""
    g = hq // hkv
    d = o.shape[-1]
    return o.reshape(b, hkv, g, tq, d).transpose(0, 3, 1, 2, 4).reshape(b, tq, hq, d)


def unpack_lse(lse, b: int, tq: int, hq: int):
    """Packed per-row LSE ``[B*Hkv*G*Tq] -> [B, Hq, Tq]`` (head-major packing is already Hq-major)."""
    return lse.reshape(b, hq, tq)


def row_position(r, tq: int):
    """In-kernel: ``(g, i_q)`` of packed row(s) ``r``."""
    return r // tq, r % tq
