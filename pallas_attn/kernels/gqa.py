"""GQA M-packing (reference §2.0 "GQA M-packing index math"), written once.

The G = Hq / Hkv query heads that share a KV head, times the Tq query positions, become the M rows of one
program, so each KV tile is read once for all of them. Packed row ``r`` of a (b, h_kv) pair is query head
``h_kv*G + r // Tq`` at query position ``r % Tq`` (head-major). For Tq == 1 packing and unpacking are free
reshapes of BTNH. ``q_major`` (fa_decode's row limit, a mixed batch's decode part): row ``r`` is query head ``h_kv*G +
r % G`` at position ``r // G``, so the rows of the first queries come first and a tile past a sequence's real queries
holds none of them.
"""

from __future__ import annotations

__all__ = ["pack_q", "unpack_o", "row_position", "unpack_lse"]


def pack_q(q, hkv: int, q_major: bool = False):
    """``[B, Tq, Hq, D] -> [B*Hkv*G*Tq, D]``, head-major packed rows (``q_major``: query-major)."""
    b, tq, hq, d = q.shape
    g = hq // hkv
    order = (0, 2, 1, 3, 4) if q_major else (0, 2, 3, 1, 4)
    return q.reshape(b, tq, hkv, g, d).transpose(order).reshape(b * hkv * g * tq, d)


def unpack_o(o, b: int, tq: int, hq: int, hkv: int, q_major: bool = False):
    """Inverse of ``pack_q`` for the output rows ``[B*Hkv*G*Tq, D] -> [B, Tq, Hq, D]``."""
    g = hq // hkv
    d = o.shape[-1]
    if q_major:
        return o.reshape(b, hkv, tq, g, d).transpose(0, 2, 1, 3, 4).reshape(b, tq, hq, d)
    return o.reshape(b, hkv, g, tq, d).transpose(0, 3, 1, 2, 4).reshape(b, tq, hq, d)


def unpack_lse(lse, b: int, tq: int, hq: int, hkv: int | None = None, q_major: bool = False):
    """Packed per-row LSE ``[B*Hkv*G*Tq] -> [B, Hq, Tq]`` (head-major packing is already Hq-major)."""
    if q_major:
        return lse.reshape(b, hkv, tq, hq // hkv).transpose(0, 1, 3, 2).reshape(b, hq, tq)
    return lse.reshape(b, hq, tq)


def row_position(r, tq: int, g: int | None = None, q_major: bool = False):
    """In-kernel: ``(g, i_q)`` of packed row(s) ``r`` (``q_major``: ``g`` the group size is needed)."""
    if q_major:
        return r % g, r // g
    return r // tq, r % tq
