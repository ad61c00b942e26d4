"""Roofline model, layer 1: FLOPs and bytes per family, and three independent time bounds.

The model is the reference's (docs/reference.md §3.2) so its published figures reproduce exactly:
  * standard path: FLOPs = 4·BH·Nq·Nk·d; fused bytes = K+V once (KV heads only) + Q + O;
  * materialized S (v1/v2): operand re-reads with tile reuse r = 1/tile_m + 1/tile_n for QKᵀ and PV, plus
    the S round trip (write, read+write, read = 4 passes);
  * decode: the fused path with Nq = 1, so AI ≈ 2G/b;
  * train (a ``family = "train"`` workload: forward + backward, ``compare.train``): FLOPs ``TRAIN_FLOPS_FACTOR``
    (3.5) times the forward's (the backward as 2.5 forwards: S recomputed, dP, dV, dK, dQ), exps twice (P
    recomputed), bytes each tensor once: the forward reads Q, K, V and writes O; the backward reads Q, K, V, O, dO
    and writes dQ, dK, dV (3 K/V-sized and 6 Q-sized tensors), plus the float32 LSE written and read once; fused
    path only (a declaration with materialized S is refused with the reason);
  * masks beyond causal (a window, packed documents): ``mask_pairs``, the visible (query, key) pairs per batch
    row and head, replaces the causal count, and ``kv_tokens`` the keys read (``compare.interop.roofline_view``);
  * a logit soft-cap (``softcap``): one tanh per visible score on the special-function unit besides its exp
    (exps doubled); sinks cost one exp per row (not counted);
  * MLA: one shared latent of width L+R read once; FLOPs over L+R (scores) and L (values);
  * limiter = the largest of t_mma (FLOPs / the engine's peak), t_hbm (bytes / bandwidth) and t_mufu
    (exps / exp rate); floor = that largest time;
  * quantized KV (``kv_dtype``, docs/quantized_kv.md §3): K and V charged at the storage precision (``BYTES``:
    fp8 1 B, NVFP4 0.5625 B per element with the micro-scales), Q and O at ``io_bytes`` (2 B: the kernels read q
    and write the output in fp16), plus ``SCALE_BYTES`` (the two float32 tensor scales); and a fourth bound,
    t_alu = 2·B·Hkv·N_k·D · dequant_ops / (SMs · ``ALU_OPS_PER_CLK_SM`` · clock), the integer/logic work of
    decoding the KV elements, from the kernel's declared ``dequant_ops`` (0 for fp16 KV: the bound is then
    absent, and every figure is what it was without it).

What an implementation *is* to the model (operand precision, whether S makes the HBM round trip, the tile
reuse) is what it declares: a Pallas kernel's contract (``Kernel.roofline``), cuda_ref's generation table,
or, for a peer, the workload's dtype (``problem_for``). The engine then follows the operand precision as
below; a declaration's ``tensor_cores`` flag is recorded beside the prediction but does not pick the peak.

Where we depart from the reference's conventions, ``reference_conventions=True`` reproduces its numbers
and the default is what we believe is more accurate, for these reasons:
  * MLA Q and O bytes: the reference charges them at the *storage* width (0.5625 B for NVFP4), but kernels
    read Q and write O at 16 bits (docs/reference.md §7.16); we charge ``io_bytes`` (2 B) for them.
  * causal: the reference counts every (i, j) pair; fused kernels skip masked tiles, so by default we
    count only the visible pairs for FLOPs and exps of the fused path (materialized S is still full).
  * bf16 / fp8 engines: the reference maps every 16-bit and 8-bit *storage* format to the fp16 tensor-core
    peak; we keep that (storage is not the engine) except that ``mma_engine`` may name fp8 explicitly.
"""

from __future__ import annotations

import dataclasses
import math

from .hardware import Hardware

__all__ = ["Problem", "Estimate", "estimate", "problem_for", "workload_precision", "kv_precision", "BYTES",
           "KV_PRECISION", "SCALE_BYTES", "ALU_OPS_PER_CLK_SM", "alu_rate", "visible_pairs", "tc_ceiling_fraction",
           "capacity_table", "mla_capacity_table", "LATENT_SCALE_BYTES"]

BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "fp8": 1.0, "nvfp4": 0.5625, "int4": 0.5}
_DTYPE_TO_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# a workload's quantized KV format (Workload.kv_dtype) -> the storage precision whose BYTES the roofline charges
KV_PRECISION = {"fp8_e4m3": "fp8", "nvfp4": "nvfp4"}
SCALE_BYTES = 8.0  # a quantized cache's two float32 per-tensor scales (K and V), read once per call
LATENT_SCALE_BYTES = 4.0  # a quantized MLA latent's one float32 per-tensor scale (the latent is K and V)
# integer / logic instructions (shift, LOP3, PRMT, integer add) issued per clock per SM on sm_80 / sm_90: the
# pipe that decodes quantized KV (CUDA C++ Programming Guide, arithmetic instruction throughput table)
ALU_OPS_PER_CLK_SM = 64
TRAIN_FLOPS_FACTOR = 3.5  # a training step's FLOPs over its forward's (compare.train: the backward as 2.5 forwards)


@dataclasses.dataclass(frozen=True)
class Problem:
    batch: int
    heads_q: int
    q_len: int
    kv_len: int
    head_dim: int
    precision: str = "fp32"
    group: int = 1  # G = Hq / Hkv
    materialize_s: bool = False
    tile: tuple[int, int] = (1, 1)
    use_tensor_core: bool = True
    causal: bool = False
    q_offset: int = 0
    kv_tokens: int | None = None  # ragged batches: total keys over the batch (replaces batch * kv_len)
    mla: bool = False
    kv_lora_rank: int = 512
    rope_dim: int = 64
    mma_engine: str = "fp16"
    io_bytes: float = 2.0
    reference_conventions: bool = False
    # quantized KV: only K and V are at ``precision``; Q and O at io_bytes, + SCALE_BYTES; dequant_ops ALU
    # instructions per KV element (t_alu)
    quantized_kv: bool = False
    dequant_ops: float = 0.0
    # visible (query, key) pairs per batch row and head under a window or packed documents (None: the causal count)
    mask_pairs: float | None = None
    train: bool = False  # forward + backward (the train family)
    softcap: bool = False  # a logit soft-cap: one tanh per visible score on the special-function unit, beside its exp

    def __post_init__(self) -> None:
        if self.precision not in BYTES:
            raise ValueError(f"precision must be one of {sorted(BYTES)}; got {self.precision!r}")
        if self.heads_q % self.group:
            raise ValueError(f"heads_q ({self.heads_q}) must be a multiple of group ({self.group})")
        if min(self.batch, self.heads_q, self.q_len, self.kv_len, self.head_dim, *self.tile) < 1:
            raise ValueError(f"every size must be >= 1: {self}")
        if self.dequant_ops < 0 or (self.dequant_ops and not self.quantized_kv):
            raise ValueError(f"dequant_ops ({self.dequant_ops}) must be >= 0, and only with quantized_kv")
        if self.quantized_kv and (self.mla or self.materialize_s):
            raise ValueError("quantized_kv models the fused GQA/MHA path (no MLA, no materialized S)")
        if self.train and (self.mla or self.materialize_s or self.quantized_kv):
            raise ValueError("the train model (forward + backward) covers the fused dense path only: no MLA, no "
                             "materialized S, no quantized KV")
        if self.mask_pairs is not None and not self.mask_pairs >= 0:
            raise ValueError(f"mask_pairs must be >= 0; got {self.mask_pairs}")


@dataclasses.dataclass(frozen=True)
class Estimate:
    flops: float
    bytes: float
    exps: float
    t_mma: float
    t_hbm: float
    t_mufu: float
    limiter: str
    floor_s: float
    ai: float
    ridge: float
    peak_flops: float
    bw: float
    engine: str
    t_alu: float = 0.0  # quantized KV: decoding the KV elements on the integer/logic pipe (0: no such bound)

    @property
    def times(self) -> dict[str, float]:
        t = {"MMA": self.t_mma, "HBM": self.t_hbm, "MUFU": self.t_mufu}
        if self.t_alu:
            t["ALU"] = self.t_alu
        return t

    def as_dict(self) -> dict[str, float | str]:
        return dataclasses.asdict(self)


def visible_pairs(q_len: int, kv_len: int, q_offset: int) -> int:
    """Number of (i, j) with j <= i + q_offset and j < kv_len (top-left causal)."""
    total = 0
    # rows where the cut-off passes the end see all keys; the rest see i + q_offset + 1
    full_from = max(0, kv_len - 1 - q_offset)
    partial_rows = min(q_len, full_from)
    if partial_rows > 0:
        first = q_offset + 1
        last = q_offset + partial_rows
        total += (first + last) * partial_rows // 2
    total += (q_len - partial_rows) * kv_len
    return total


def _engine(p: Problem, hw: Hardware) -> str:
    """The unit that does the math: fp32 CUDA cores, or the tensor-core rate of the compute dtype."""
    if not p.use_tensor_core or p.precision == "fp32":
        return "fp32"
    if p.precision == "int8":
        return "int8"
    if p.mla or p.mma_engine != "fp16":
        return p.mma_engine
    if p.precision == "bf16" and not p.reference_conventions:
        return "bf16"
    return "fp16"


def estimate(p: Problem, hw: Hardware) -> Estimate:
    b = BYTES[p.precision]
    alu_ops = 0.0
    engine = _engine(p, hw)
    peak = hw.peak(engine)
    if p.mla:
        L, R = p.kv_lora_rank, p.rope_dim
        tokens = p.kv_tokens if p.kv_tokens is not None else p.batch * p.kv_len  # ragged: the real keys
        pairs = p.heads_q * p.q_len * tokens
        flops = 2.0 * pairs * (L + R) + 2.0 * pairs * L
        qo_b = b if p.reference_conventions else p.io_bytes
        nbytes = tokens * (L + R) * b + p.batch * p.heads_q * p.q_len * ((L + R) + L) * qo_b
        exps = float(pairs)
    else:
        bh = p.batch * p.heads_q
        d = p.head_dim
        if p.mask_pairs is not None and not p.materialize_s and not p.reference_conventions:
            pairs_per_head = p.mask_pairs  # a window or packed documents: the pairs their mask leaves
        elif p.kv_tokens is not None:
            pairs_per_head = p.q_len * p.kv_tokens / p.batch  # averaged; exact in the bytes below
        elif p.causal and not p.materialize_s and not p.reference_conventions:
            pairs_per_head = visible_pairs(p.q_len, p.kv_len, p.q_offset)
        else:
            pairs_per_head = p.q_len * p.kv_len
        pairs = bh * pairs_per_head
        flops = 4.0 * pairs * d
        o_bytes = bh * p.q_len * d * b
        if p.materialize_s:
            full = bh * p.q_len * p.kv_len
            r = 1.0 / p.tile[0] + 1.0 / p.tile[1]
            operand = (full * d * r + full * d * r) * b
            s_trip = 4.0 * full * b
            nbytes = operand + s_trip + o_bytes
        else:
            tokens = p.kv_tokens if p.kv_tokens is not None else p.batch * p.kv_len
            kv_elems = 2.0 * (p.heads_q // p.group) * tokens * d
            kv_bytes = kv_elems * b
            if p.quantized_kv:  # only K and V are stored quantized: q is read and O written at io_bytes
                o_bytes = bh * p.q_len * d * p.io_bytes
                nbytes = kv_bytes + bh * p.q_len * d * p.io_bytes + o_bytes + SCALE_BYTES
                alu_ops = kv_elems * p.dequant_ops
            elif p.train:  # fwd: Q, K, V in, O out; bwd: Q, K, V, O, dO in, dQ, dK, dV out; the fp32 LSE out and in
                nbytes = 3.0 * kv_bytes + 6.0 * o_bytes + 2.0 * 4.0 * bh * p.q_len
            else:
                nbytes = kv_bytes + bh * p.q_len * d * b + o_bytes
        exps = float(pairs) * (2.0 if p.softcap else 1.0)  # tanh runs on the MUFU as exp2 does
        if p.train:
            flops *= TRAIN_FLOPS_FACTOR
            exps *= 2.0  # P recomputed in the backward
    t_mma = flops / peak
    t_hbm = nbytes / hw.hbm_bw
    t_mufu = exps / hw.exp_rate
    t_alu = alu_ops / alu_rate(hw) if alu_ops else 0.0
    times = {"MMA": t_mma, "HBM": t_hbm, "MUFU": t_mufu}
    if t_alu:
        times["ALU"] = t_alu
    limiter = max(times, key=times.__getitem__)
    return Estimate(
        flops=flops, bytes=nbytes, exps=exps, t_mma=t_mma, t_hbm=t_hbm, t_mufu=t_mufu, limiter=limiter,
        floor_s=times[limiter], ai=flops / nbytes, ridge=peak / hw.hbm_bw, peak_flops=peak, bw=hw.hbm_bw,
        engine=engine, t_alu=t_alu,
    )


def alu_rate(hw: Hardware) -> float:
    """Integer/logic instructions per second of the whole chip: SMs x ``ALU_OPS_PER_CLK_SM`` x the table's clock
    (the datasheet boost clock; a chip that runs slower under load makes t_alu an underestimate)."""
    return hw.num_sm * ALU_OPS_PER_CLK_SM * hw.clock_mhz * 1e6


def workload_precision(workload) -> str:
    """The roofline precision of a workload's own dtype (q and the output; KV too unless it sets kv_dtype)."""
    return _DTYPE_TO_PRECISION[workload.dtype]


def kv_precision(workload) -> str:
    """The roofline precision of a workload's KV cache: its kv_dtype's storage precision, else its dtype's."""
    kvd = getattr(workload, "kv_dtype", None)
    return KV_PRECISION[kvd] if kvd else workload_precision(workload)


def problem_for(workload, facts=None, *, reference_conventions: bool = False) -> Problem:
    """The roofline problem of running an implementation on a workload.

    ``facts`` is what the implementation declares about itself (``compare.schema.RooflineFacts`` or a
    kernel contract's ``RooflineInputs``: ``precision``, ``materialize_s``, ``tile``); None models a peer at
    the workload's own dtype on the fused path. Nothing here knows generation ids.
    """
    w = workload
    precision = kv_precision(w) if facts is None else facts.precision
    # a quantized workload is modelled as such only at its storage precision (an implementation that declares
    # another precision refuses the workload; its prediction is what it would cost it at its own precision)
    kvd = getattr(w, "kv_dtype", None)
    quantized = bool(kvd) and precision == KV_PRECISION.get(kvd)
    materialize = bool(facts is not None and facts.materialize_s)
    tile = tuple(facts.tile) if materialize else (1, 1)
    kv_tokens = getattr(w, "kv_tokens", None)
    if w.family == "mla":
        # the latent at its storage precision (bf16 / fp16, or the kv_dtype format); q and O at the workload
        # dtype's width; the MMA at the workload dtype's tensor-core rate (a quantized latent is dequantized to
        # it before the MMA: docs/mla.md); ragged batches count their real keys
        io = workload_precision(w)
        engine = {"bf16": "bf16", "fp16": "fp16"}.get(io, "fp16")
        return Problem(
            batch=w.batch, heads_q=w.heads_q, q_len=w.q_len, kv_len=w.kv_len, head_dim=w.head_dim,
            precision=precision, group=w.heads_q, mla=True, kv_lora_rank=w.kv_lora_rank, rope_dim=w.rope_dim,
            causal=w.causal, q_offset=w.q_offset, reference_conventions=reference_conventions,
            kv_tokens=kv_tokens, io_bytes=BYTES[io],
            mma_engine="fp16" if reference_conventions else engine,
        )
    quant: dict = {}
    if quantized:
        quant = {"quantized_kv": True, "io_bytes": BYTES[workload_precision(w)],
                 "dequant_ops": float(getattr(facts, "dequant_ops", 0.0) or 0.0)}
    return Problem(
        batch=w.batch, heads_q=w.heads_q, q_len=w.q_len, kv_len=w.kv_len, head_dim=w.head_dim,
        precision=precision, group=w.group, materialize_s=materialize, tile=tile, causal=w.causal,
        q_offset=w.q_offset, kv_tokens=kv_tokens, reference_conventions=reference_conventions,
        mask_pairs=getattr(w, "mask_pairs", None), train=getattr(w, "family", None) == "train",
        softcap=getattr(w, "softcap", None) is not None, **quant,
    )


def tc_ceiling_fraction(est: Estimate) -> float:
    """The most of the tensor-core (engine) peak a problem can use: t_mma / floor (e.g. ~0.3% at decode)."""
    return est.t_mma / est.floor_s if est.floor_s > 0 else math.nan


def capacity_table(*, heads_q: int, head_dim: int, tokens: int = 1, gqa_heads_kv: int = 8) -> list[dict]:
    """KV-cache bytes per token (one layer) and for ``tokens`` tokens: MHA (Hkv = Hq) and GQA (Hkv =
    ``gqa_heads_kv``) x fp16 / fp8 / NVFP4. Per token: ``2·Hkv·D·BYTES[precision]`` (K and V; NVFP4's 0.5625 B
    holds its E4M3 micro-scale per 16 elements); a quantized cache adds ``SCALE_BYTES`` once (its two float32
    tensor scales), counted in ``total_bytes``."""
    if min(heads_q, head_dim, tokens, gqa_heads_kv) < 1:
        raise ValueError(f"sizes must be >= 1; got heads_q={heads_q}, head_dim={head_dim}, tokens={tokens}, "
                         f"gqa_heads_kv={gqa_heads_kv}")
    if heads_q % gqa_heads_kv:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of the GQA KV heads ({gqa_heads_kv})")
    rows = []
    for layout, hkv in (("MHA", heads_q), (f"GQA-{gqa_heads_kv}", gqa_heads_kv)):
        base = None
        for fmt, prec in (("fp16", "fp16"), ("fp8_e4m3", "fp8"), ("nvfp4", "nvfp4")):
            per_token = 2.0 * hkv * head_dim * BYTES[prec]
            total = per_token * tokens + (SCALE_BYTES if prec != "fp16" else 0.0)
            base = base or total
            rows.append({"layout": layout, "heads_kv": hkv, "format": fmt, "bytes_per_token": per_token,
                         "tokens": tokens, "total_bytes": total, "vs_fp16": total / base})
    return rows


def mla_capacity_table(*, heads_q: int = 128, head_dim: int = 128, kv_lora_rank: int = 512, rope_dim: int = 64,
                       tokens: int = 65536, gqa_heads_kv: int = 8) -> list[dict]:
    """Cache bytes (one layer) of the same attention stored three ways, the reference's capacity comparison
    (docs/reference.md §2.16, docs/mla.md): MHA (``heads_q`` K and V heads of ``head_dim``) and GQA
    (``gqa_heads_kv`` heads) in fp16, ``2·Hkv·D·2`` B per token; the MLA latent (one vector of
    ``kv_lora_rank + rope_dim`` per token, K and V at once) in bf16, fp8 and NVFP4, ``(L + R)·BYTES`` per token
    plus ``LATENT_SCALE_BYTES`` once for a quantized latent. Each row has ``vs_mha`` and ``vs_gqa`` (how many
    times less than those, > 1 = smaller). At the defaults: MHA 4294.97 MB, GQA-8 268.44 MB, NVFP4 latent
    21.23 MB at 65536 tokens."""
    if min(heads_q, head_dim, kv_lora_rank, tokens, gqa_heads_kv) < 1 or rope_dim < 0:
        raise ValueError(f"sizes must be >= 1 (rope_dim >= 0); got heads_q={heads_q}, head_dim={head_dim}, "
                         f"kv_lora_rank={kv_lora_rank}, rope_dim={rope_dim}, tokens={tokens}, "
                         f"gqa_heads_kv={gqa_heads_kv}")
    if heads_q % gqa_heads_kv:
        raise ValueError(f"heads_q ({heads_q}) must be a multiple of the GQA KV heads ({gqa_heads_kv})")
    dqk = kv_lora_rank + rope_dim
    rows = [{"layout": "MHA", "format": "fp16", "heads_kv": heads_q, "width": head_dim,
             "bytes_per_token": 2.0 * heads_q * head_dim * BYTES["fp16"]},
            {"layout": f"GQA-{gqa_heads_kv}", "format": "fp16", "heads_kv": gqa_heads_kv, "width": head_dim,
             "bytes_per_token": 2.0 * gqa_heads_kv * head_dim * BYTES["fp16"]}]
    for fmt, prec in (("bf16", "bf16"), ("fp8_e4m3", "fp8"), ("nvfp4", "nvfp4")):
        rows.append({"layout": "MLA latent", "format": fmt, "heads_kv": 1, "width": dqk,
                     "bytes_per_token": dqk * BYTES[prec]})
    for r in rows:
        quantized = r["layout"] == "MLA latent" and r["format"] != "bf16"
        r["tokens"] = tokens
        r["total_bytes"] = r["bytes_per_token"] * tokens + (LATENT_SCALE_BYTES if quantized else 0.0)
    mha, gqa = rows[0]["total_bytes"], rows[1]["total_bytes"]
    for r in rows:
        r["vs_mha"] = mha / r["total_bytes"]
        r["vs_gqa"] = gqa / r["total_bytes"]
    return rows
