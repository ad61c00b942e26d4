"""``python -m compare predict``: the layer-1 roofline for one problem, with the reference's flags.

Flags follow the reference's ``roofline.predict`` (docs/reference.md §3.3) plus ``--arch t4|a100|h100|h200|b200|
b300`` (``sm_XY`` spellings accepted), ``--q-len``, ``--causal``, ``--reference-conventions`` and ``--json``.
``--shape BxHxNxd``: N is the query length and, unless ``--kv-len`` is given, the key length. With ``--mla``
(or an MLA ``--generation``) H is the query heads (``--h-q`` may say the same, not otherwise) and d is ignored (the
latent is ``--kv-lora-rank`` + ``--rope-dim``); without ``--shape`` an MLA prediction is DeepSeek-V3's decode,
``1x128x1x576`` with ``--kv-len`` 8192 (``MLA_DEFAULT_SHAPE``, ``MLA_DEFAULT_KV_LEN``). The MMA engine follows the
16-bit input (``--precision`` / ``--dtype`` bf16: the bf16 tensor-core peak) unless ``--mma-engine`` names one.

``--generation GEN`` takes the operand precision, S materialization and tile from what the generation
declares instead of ``--precision/--materialize-s/--tile``: a generation built in Pallas from its kernel's
contract (``Kernel.roofline`` for the input ``--dtype`` and ``--config``), an unbuilt one from
``REFERENCE_STORAGE`` below.

``--kv-dtype fp8_e4m3|nvfp4``: a quantized KV cache (docs/quantized_kv.md): K and V charged at the storage
precision, q and O at 2 bytes, + the two float32 tensor scales, and the dequant ALU bound from the generation's
declared ``dequant_ops`` (``--generation``, the quantized entry) or ``--dequant-ops``.

``--capacity``: the KV-cache capacity table instead of a prediction: bytes per token (one layer, K and V) and
for B x N tokens, MHA (Hkv = H) and GQA (Hkv = H / --gqa-group, or 8 when --gqa-group is 1) x fp16 / fp8 /
NVFP4 (default shape 1x32x65536x128: Llama-3-8B heads at a 64K context). ``--capacity --mla``: the MLA capacity
table instead (docs/mla.md): MHA and GQA-8 in fp16 against the MLA latent in bf16 / fp8 / NVFP4 (default shape
1x128x65536x128 and latent 512 + 64, the reference's comparison: MHA 4294.97 MB, GQA-8 268.44 MB, NVFP4 latent
21.23 MB).

``--workloads CONFIG``: the layer-1 table of every workload of a config file (``configs/<name>.toml``) on each
``--arch`` (comma-separated; default h100,h200) at the datasheet and at the measured ceilings
(``MEASURED_CEILINGS``), as compare run predicts a peer (the workload's own dtype and KV / latent format, fused).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import hardware, roofline
from .schema import RooflineFacts
from .workloads import UsageError

__all__ = ["add_parser", "run", "REFERENCE_STORAGE", "reference_storage", "generation_facts", "MEASURED_CEILINGS",
           "measured_hardware", "workload_table", "DEFAULT_SHAPE", "MLA_DEFAULT_SHAPE", "MLA_DEFAULT_KV_LEN"]

DEFAULT_SHAPE = (1, 8, 2048, 64)  # the reference's default problem (a prefill)
# an MLA prediction without --shape: DeepSeek-V3's single-token decode (128 query heads, latent 512 + 64) at an 8K
# context, the reference's MLA example (not a 2048-query prefill)
MLA_DEFAULT_SHAPE = (1, 128, 1, 576)
MLA_DEFAULT_KV_LEN = 8192

# Ceilings measured on our device machines by compare's own ceilings pass (docs/compare.md, "Ceilings"), for
# predictions made before a run (docs/mla.md). The run itself re-measures them and predicts with its own.
#   h100: results/paged_gqa/20261122_h100 (HBM read: best of three methods, jnp.sum under CUPTI 3.18 TB/s;
#         8192^3 matmuls: fp16 745, bf16 771, fp8 e4m3 1393 TFLOP/s; 4096^3 fp32 with TF32 off 50.7);
#   h200: HBM read: jnp.sum under CUPTI 4.59-4.67 TB/s (docs/compare.md), the middle 4.63; matmuls: the median of
#         the five H200 runs under results/20261121T09*_nvidia-h200 (fp16 756, bf16 786, fp8 1439, fp32 50.6).
MEASURED_CEILINGS: dict[str, dict[str, float]] = {
    "h100": {"hbm_bw": 3.18e12, "fp16": 745e12, "bf16": 771e12, "fp8": 1393e12, "fp32": 50.7e12},
    "h200": {"hbm_bw": 4.63e12, "fp16": 756e12, "bf16": 786e12, "fp8": 1439e12, "fp32": 50.6e12},
}


def measured_hardware(key: str) -> hardware.Hardware:
    """The table row of ``key`` with ``MEASURED_CEILINGS`` in place of the datasheet (KeyError: none measured)."""
    c = MEASURED_CEILINGS[key]
    return hardware.get(key).with_measured(hbm_bw=c["hbm_bw"], flops={k: v for k, v in c.items() if k != "hbm_bw"})

# The reference's harness convention, not a declaration of any kernel here: the storage precision at which
# the reference's benchmark feeds (and its roofline tool charges) each generation that Pallas does not
# build yet (docs/reference.md §4.1, "Roofline column": fp16 from v5 on, FP8 E4M3 for v9, NVFP4 for v10-v12).
# Used ONLY to predict an unbuilt generation (``--generation`` here, and the prediction of a ``not_built``
# record); a built kernel's precision is always its contract's.
REFERENCE_STORAGE: dict[str, str] = {
    "v7_paged": "fp16", "v8_gqa": "fp16", "v8_gqa_tc": "fp16", "v8_gqa_db": "fp16", "v8_gqa_occ": "fp16",
    "v8_gqa_ilp": "fp16", "v8_gqa_ss": "fp16",
    "v9_fp8": "fp8",
    "v10_nvfp4": "nvfp4", "v11_mla": "nvfp4", "v12_mla_tc": "nvfp4",
}


def reference_storage(gen_id: str) -> str:
    """The reference's storage precision of an unbuilt generation (KeyError names what is known)."""
    try:
        return REFERENCE_STORAGE[gen_id]
    except KeyError:
        raise KeyError(f"no reference storage convention for {gen_id!r} (known: {', '.join(REFERENCE_STORAGE)}); "
                       "a built generation's precision comes from its kernel contract") from None


def _entry(gen) -> str:
    return next(e for e in ("dense", "paged", "quantized", "mla") if e in gen.entries)


def generation_facts(gen_id: str, *, batch: int, heads_q: int, heads_kv: int, q_len: int, kv_len: int,
                     head_dim: int, causal: bool, dtype: str | None, config: str | None,
                     page_size: int = 16, kv_dtype: str | None = None,
                     kv_lora_rank: int | None = None) -> tuple[RooflineFacts, str]:
    """``(facts, what)``: the roofline facts ``gen_id`` declares for this problem and a line saying whence.
    ``kv_dtype``: the quantized entry (a quantized KV cache of that format)."""
    from pallas_attn import registry

    gen = registry.get(gen_id)
    mla = "mla" in gen.entries
    if mla and registry.built(gen_id):
        return _mla_generation_facts(gen_id, batch=batch, heads_q=heads_q, q_len=q_len, kv_len=kv_len,
                                     head_dim=head_dim, causal=causal, dtype=dtype, config=config,
                                     page_size=page_size, kv_dtype=kv_dtype,
                                     kv_lora_rank=kv_lora_rank or head_dim - 64)
    if kv_dtype is not None and "quantized" not in gen.entries:
        raise UsageError(f"--kv-dtype: {gen_id} serves the {sorted(gen.entries)} entries, not 'quantized'")
    if not registry.built(gen_id):
        if config is not None or dtype is not None or kv_dtype is not None:
            raise SystemExit(f"--config/--dtype/--kv-dtype apply to a generation built in Pallas; {gen_id} is not "
                             "built")
        prec = reference_storage(gen_id)
        return (RooflineFacts(prec, source="reference storage convention (not built)"),
                f"{gen_id} is not built in Pallas: the reference's storage precision {prec} (REFERENCE_STORAGE)")
    from pallas_attn import api
    from pallas_attn.kernels.contract import Problem

    kern = registry.kernel(gen_id)
    if dtype is None:
        dtype = "float32" if "float32" in kern.dtypes else kern.dtypes[0]
    if kv_dtype is None and gen.entries == {"quantized"} and len(kern.kv_precision) == 1:
        kv_dtype = next(iter(kern.kv_precision))  # a one-format quantized generation (v9_fp8, v10_nvfp4)
    entry = "quantized" if kv_dtype else _entry(gen)
    # a paged-only kernel reads a quantized cache from paged pools
    page = page_size if entry == "paged" or (entry == "quantized" and kern.dense is None) else None
    kv = -(-kv_len // page) * page if page else kv_len
    problem = Problem(entry=entry, dtype=dtype, batch=batch, q_len=q_len, kv_len=kv, heads_q=heads_q,
                      heads_kv=heads_kv, head_dim=head_dim, causal=causal, page_size=page, kv_dtype=kv_dtype)
    try:
        kern, cfg = api.resolve(gen_id, problem, config)
    except (NotImplementedError, ValueError) as e:
        raise SystemExit(f"--generation {gen_id}: {e}") from None
    ri = kern.roofline(problem, cfg)
    facts = RooflineFacts(ri.precision, bool(ri.materialize_s), tuple(ri.tile), bool(ri.tensor_cores),
                          f"pallas contract ({kern.name})", float(getattr(ri, "dequant_ops", 0.0)))
    name = next((n for n, c in registry.configs(gen_id).items() if c == cfg), "from the kernel's heuristic")
    what = (f"{gen_id} (Pallas kernel {kern.name}, config {name}, {dtype} input"
            + (f", {kv_dtype} KV, {facts.dequant_ops:g} dequant ops per KV element" if kv_dtype else "")
            + f"): {facts.precision} operands"
            + (f", S materialized, tile {facts.tile[0]}x{facts.tile[1]}" if facts.materialize_s else ", fused"))
    return facts, what


_LATENT_FORMAT = {"nvfp4": "nvfp4", "fp8": "fp8_e4m3"}  # REFERENCE_STORAGE precision -> kv_dtype


def _mla_generation_facts(gen_id: str, *, batch: int, heads_q: int, q_len: int, kv_len: int, head_dim: int,
                          causal: bool, dtype: str | None, config: str | None, page_size: int,
                          kv_dtype: str | None, kv_lora_rank: int) -> tuple[RooflineFacts, str]:
    """A built MLA generation's declared facts (docs/mla.md): the latent paged at ``page_size`` in ``kv_dtype``
    (None: the q dtype). With neither --dtype nor --kv-dtype, the reference's input where the kernel takes it (fp16
    q and an NVFP4 latent for v11_mla: REFERENCE_STORAGE), else the kernel's own default dtype."""
    from pallas_attn import api, registry
    from pallas_attn.kernels.contract import Problem

    kern = registry.kernel(gen_id)
    tries = [(dtype, kv_dtype)]
    if dtype is None and kv_dtype is None:
        ref = _LATENT_FORMAT.get(REFERENCE_STORAGE.get(gen_id, ""))
        tries = ([("float16", ref)] if ref else []) + [(kern.dtypes[0], None)]
    elif dtype is None:
        tries = [(d, kv_dtype) for d in kern.dtypes]
    kv = -(-kv_len // page_size) * page_size
    err = None
    for dt, kvd in tries:
        problem = Problem(entry="mla", dtype=dt, batch=batch, q_len=q_len, kv_len=kv, heads_q=heads_q, heads_kv=1,
                          head_dim=head_dim, causal=causal, page_size=page_size, kv_dtype=kvd,
                          kv_lora_rank=kv_lora_rank)
        try:
            kern, cfg = api.resolve(gen_id, problem, config)
        except (NotImplementedError, ValueError) as e:
            err = e
            continue
        ri = kern.roofline(problem, cfg)
        facts = RooflineFacts(ri.precision, False, (1, 1), bool(ri.tensor_cores), f"pallas contract ({kern.name})")
        name = next((n for n, c in registry.configs(gen_id).items() if c == cfg), "from the kernel's heuristic")
        what = (f"{gen_id} (Pallas kernel {kern.name}, config {name}, {dt} q, latent {kvd or dt} paged at "
                f"{page_size}): {facts.precision} latent, fused")
        return facts, what
    raise SystemExit(f"--generation {gen_id}: {err}")


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        b, h, n, d = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be BxHxNxd (e.g. 1x8x2048x64); got {text!r}") from None
    if min(b, h, n, d) < 1:
        raise argparse.ArgumentTypeError(f"--shape sizes must be >= 1; got {text!r}")
    return b, h, n, d


def _tile(text: str) -> tuple[int, int]:
    try:
        m, n = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tile must be MxN (e.g. 64x64); got {text!r}") from None
    return m, n


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="layer-1 roofline prediction for one problem (no GPU needed)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="t4", help="t4 | a100 | h100 | h200 | b200 | b300 (or sm_XY); default t4")
    p.add_argument("--shape", type=_shape, default=None,
                   help="BxHxNxd, H = query heads; default 1x8x2048x64 (--mla: 1x128x1x576 with --kv-len 8192; "
                        "1x32x65536x128 with --capacity)")
    p.add_argument("--precision", default=None, choices=sorted(roofline.BYTES), help="storage precision; default fp32")
    p.add_argument("--materialize-s", action="store_true", help="v1/v2 model: S round-trips through HBM")
    p.add_argument("--tile", type=_tile, default=None, help="MxN tile reuse for --materialize-s; default 1x1")
    p.add_argument("--generation", default=None,
                   help="take precision, materialization and tile from this generation's declaration "
                        "(Pallas kernel contract; REFERENCE_STORAGE when not built)")
    p.add_argument("--config", default=None, help="with --generation: the Pallas config name")
    p.add_argument("--framework", default="pallas", choices=("pallas", "cuda"),
                   help="with --generation: layer 2 models this framework's kernel (default pallas)")
    p.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"),
                   help="with --generation: the input dtype (default float32 if the kernel takes it)")
    p.add_argument("--page-size", type=int, default=16, help="with --generation of a paged-only kernel")
    p.add_argument("--no-tensor-core", action="store_true", help="use the fp32 CUDA-core peak")
    p.add_argument("--kv-len", type=int, default=None, help="key length N_k (decode); default N")
    p.add_argument("--q-len", type=int, default=None, help="query length; default N from --shape")
    p.add_argument("--gqa-group", type=int, default=1, help="G = Hq / Hkv")
    p.add_argument("--causal", action="store_true", help="count only visible (i, j) pairs (fused path)")
    p.add_argument("--mla", action="store_true", help="MLA latent decode model (uses --h-q, ranks)")
    p.add_argument("--h-q", type=int, default=None,
                   help="MLA query heads: H of --shape (they must agree when both are given); default 128")
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--rope-dim", type=int, default=64)
    p.add_argument("--mma-engine", default=None, choices=("fp16", "bf16", "fp8", "nvfp4"),
                   help="the tensor-core rate; default the 16-bit input's (bf16 for --precision / --dtype bf16, "
                        "else fp16; fp16 with --reference-conventions)")
    p.add_argument("--reference-conventions", action="store_true",
                   help="reproduce the reference tool exactly (MLA Q/O at storage width, causal ignored)")
    p.add_argument("--kv-dtype", default=None, choices=tuple(roofline.KV_PRECISION),
                   help="quantized KV cache: K/V at its storage bytes, q/O at 2 B, + scales, and the dequant ALU bound")
    p.add_argument("--dequant-ops", type=float, default=None,
                   help="with --kv-dtype and no --generation: ALU instructions per KV element (default 0)")
    p.add_argument("--capacity", action="store_true",
                   help="print the KV-cache capacity table (bytes per token, MHA / GQA x fp16 / fp8 / NVFP4)")
    p.add_argument("--workloads", default=None, metavar="CONFIG",
                   help="layer-1 table of every workload of a config (e.g. mla) on --arch (default h100,h200), "
                        "datasheet and measured ceilings")
    p.add_argument("--model", default=None,
                   help="a sweep model (configs/sweep.toml: llama-3.1-8b, deepseek-v3, ...) at any size: layer 1 and "
                        "layer 2 for --entry with --q-len / --kv-len / --batch or --tokens on --arch (default "
                        "h100,h200)")
    p.add_argument("--entry", default="prefill",
                   help="with --model: prefill | train | decode | spec | quant | paged | chunked | mla")
    p.add_argument("--batch", type=int, default=None, help="with --model: the batch (default: --tokens // q_len for "
                   "prefill / train, else 1)")
    p.add_argument("--tokens", type=int, default=None, help="with --model: tokens per batch (prefill / train; 32768)")
    p.add_argument("--non-causal", action="store_true", help="with --model: no causal mask (default causal)")
    p.add_argument("--impl", action="append", default=None, metavar="IMPL",
                   help="with --model: layer 2 for this implementation (repeatable; pallas:GEN:CONFIG or cuda:GEN); "
                        "default pallas:auto: the kernel and config the public entry picks on each --arch's table")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> None:
    for flag, v, lo in (("--kv-len", args.kv_len, 1), ("--q-len", args.q_len, 1), ("--gqa-group", args.gqa_group, 1),
                        ("--h-q", args.h_q, 1), ("--kv-lora-rank", args.kv_lora_rank, 1),
                        ("--rope-dim", args.rope_dim, 0), ("--page-size", args.page_size, 1)):
        if v is not None and v < lo:
            raise UsageError(f"{flag} must be >= {lo}; got {v}")
    if args.tile is not None and min(args.tile) < 1:
        raise UsageError(f"--tile sizes must be >= 1; got {args.tile[0]}x{args.tile[1]}")
    if not args.mla and args.generation is None and args.shape[1] % args.gqa_group:
        raise UsageError(f"H ({args.shape[1]}) must be a multiple of --gqa-group ({args.gqa_group})")
    if args.generation is not None:
        from pallas_attn import registry

        try:
            registry.get(args.generation)
        except (KeyError, ValueError) as e:
            raise UsageError(f"--generation: {e.args[0] if e.args else e}") from None


def run(args: argparse.Namespace) -> int:
    if getattr(args, "model", None):
        return model_cli(args)
    if getattr(args, "workloads", None):
        return workloads_cli(args)
    if getattr(args, "capacity", False):
        return mla_capacity(args) if args.mla else capacity(args)
    try:
        hw = hardware.get(args.arch)
    except ValueError as e:
        raise UsageError(f"--arch: {e}") from None
    _mla_shape(args)
    _check_args(args)
    kv_dtype = getattr(args, "kv_dtype", None)
    dequant_ops = getattr(args, "dequant_ops", None)
    if kv_dtype is None and dequant_ops is not None:
        raise UsageError("--dequant-ops applies with --kv-dtype")
    mla_gen = False
    if args.generation is not None:
        from pallas_attn import registry

        mla_gen = "mla" in registry.get(args.generation).entries
    if kv_dtype is not None and mla_gen:
        if dequant_ops is not None or args.precision is not None:
            raise UsageError("--kv-dtype with an MLA --generation is its latent's format: drop --dequant-ops / "
                             "--precision")
    elif kv_dtype is not None:
        if args.mla or args.materialize_s:
            raise UsageError("--kv-dtype models the fused GQA/MHA decode path (no --mla, no --materialize-s); "
                             "with an MLA --generation it is the latent's format")
        if args.generation is not None and dequant_ops is not None:
            raise UsageError("--generation declares its dequant ops: drop --dequant-ops")
        if args.precision is not None and args.precision != roofline.KV_PRECISION[kv_dtype]:
            raise UsageError(f"--kv-dtype {kv_dtype} stores KV as {roofline.KV_PRECISION[kv_dtype]}; got --precision "
                             f"{args.precision}")
        if dequant_ops is not None and dequant_ops < 0:
            raise UsageError(f"--dequant-ops must be >= 0; got {dequant_ops:g}")
    b, h, n, d = args.shape
    q_len = args.q_len or n
    kv_len = args.kv_len or n
    contract = None
    if args.generation is not None:
        if args.precision is not None or args.materialize_s or args.tile is not None:
            raise SystemExit("--generation takes precision, S materialization and tile from the generation's "
                             "declaration: drop --precision/--materialize-s/--tile")
        from pallas_attn import registry

        mla = "mla" in registry.get(args.generation).entries
        args.mla = args.mla or mla
        if mla:
            hq, hkv, dim = h, 1, args.kv_lora_rank + args.rope_dim
        else:
            if h % args.gqa_group:
                raise SystemExit(f"H ({h}) must be a multiple of --gqa-group ({args.gqa_group})")
            hq, hkv, dim = h, h // args.gqa_group, d
        if kv_dtype is not None and args.dtype is None:
            args.dtype = "float16"  # the q dtype a quantized cache is read with (docs/quantized_kv.md)
        facts, contract = generation_facts(args.generation, batch=b, heads_q=hq, heads_kv=hkv, q_len=q_len,
                                           kv_len=kv_len, head_dim=dim, causal=args.causal, dtype=args.dtype,
                                           config=args.config, page_size=args.page_size, kv_dtype=kv_dtype,
                                           kv_lora_rank=args.kv_lora_rank if mla else None)
        args.precision, args.materialize_s, args.tile = facts.precision, facts.materialize_s, facts.tile
        dequant_ops = facts.dequant_ops if kv_dtype is not None else None
    elif args.config is not None or args.dtype is not None:
        raise SystemExit("--config and --dtype only apply with --generation")
    args.precision = args.precision or (roofline.KV_PRECISION[kv_dtype] if kv_dtype else "fp32")
    args.tile = args.tile or (1, 1)
    quant = {}
    if kv_dtype is not None:
        quant = {"quantized_kv": True, "dequant_ops": float(dequant_ops or 0.0),
                 "io_bytes": 4.0 if args.dtype == "float32" else 2.0}
    if args.mla:
        prob = roofline.Problem(
            batch=b, heads_q=h, q_len=q_len, kv_len=kv_len, head_dim=args.kv_lora_rank + args.rope_dim,
            precision=args.precision, group=h, mla=True, kv_lora_rank=args.kv_lora_rank,
            rope_dim=args.rope_dim, mma_engine=_mma_engine(args), use_tensor_core=not args.no_tensor_core,
            reference_conventions=args.reference_conventions,
        )
        shape = f"B={b} h_q={h} Nq={q_len} Nk={kv_len} latent {args.kv_lora_rank}+{args.rope_dim}"
    else:
        prob = roofline.Problem(
            batch=b, heads_q=h, q_len=q_len, kv_len=kv_len, head_dim=d, precision=args.precision,
            group=args.gqa_group, materialize_s=args.materialize_s, tile=args.tile,
            use_tensor_core=not args.no_tensor_core, causal=args.causal, q_offset=max(0, kv_len - q_len),
            mma_engine=_mma_engine(args), reference_conventions=args.reference_conventions, **quant,
        )
        shape = f"B={b} Hq={h} Hkv={h // args.gqa_group} (G={args.gqa_group}) Nq={q_len} Nk={kv_len} d={d}"
    est = roofline.estimate(prob, hw)
    l2 = _layer2(args, hw, b, h, q_len, kv_len, d) if args.generation is not None and not args.mla else None
    if l2 is not None and kv_dtype is not None:
        l2 = {"error": f"layer 2 does not model quantized KV yet (kv_dtype={kv_dtype}); layer 1 does"}
    if args.json:
        print(json.dumps({"arch": hw.key, "generation": args.generation, "contract": contract,
                          "problem": prob.__dict__, "estimate": est.as_dict(), "layer2": l2}, default=str))
        return 0
    side = "BELOW -> memory-bound" if est.ai < est.ridge else "ABOVE -> compute-bound"
    print(f"arch      : {hw.name} ({hw.sm}), {hw.num_sm} SMs, HBM {hw.hbm_bw / 1e12:.2f} TB/s, "
          f"{est.engine} peak {est.peak_flops / 1e12:.1f} TFLOP/s  [datasheet; see compare/hardware.py]")
    if contract:
        print(f"declared  : {contract}")
    print(f"shape     : {shape} {args.precision}{' causal' if args.causal else ''}"
          f"{' materialized-S tile ' + 'x'.join(map(str, args.tile)) if args.materialize_s else ''}")
    if kv_dtype is not None:
        print(f"KV        : {kv_dtype}, {roofline.BYTES[prob.precision]:g} B/element; q and O at {prob.io_bytes:g} B; "
              f"+{roofline.SCALE_BYTES:g} B of tensor scales; dequant {prob.dequant_ops:g} ALU ops/element at "
              f"{roofline.alu_rate(hw) / 1e12:.1f} T ops/s ({roofline.ALU_OPS_PER_CLK_SM}/clk/SM)")
    print(f"LIMITER   : {est.limiter} (predicted lower bound {est.floor_s * 1e3:.4g} ms)")
    for k, t in est.times.items():
        print(f"t_{k.lower():<8}: {t * 1e3:.4g} ms ({100 * t / est.floor_s:.1f}% of bound)")
    print(f"intensity : {est.ai:.2f} FLOP/byte (ridge {est.ridge:.1f}; {side})")
    print(f"work      : {est.flops / 1e9:.4g} GFLOP, {est.bytes / 1e6:.4g} MB, {est.exps / 1e6:.4g} M exp")
    frac = roofline.tc_ceiling_fraction(est)
    print(f"ceiling   : at most {100 * frac:.2f}% of the {est.engine} "
          f"{'tensor-core' if est.engine != 'fp32' else 'CUDA-core'} peak can be used (t_mma / floor)")
    if l2 is not None:
        if "error" in l2:
            print(f"LAYER 2   : not modelled: {l2['error']}")
        else:
            print(f"LAYER 2   : {l2['time_us']:.4g} us, limiter {l2['limiter']} (schedule-aware; docs/roofline.md)")
            print(f"plan      : {json.dumps(l2['plan'], default=str)}")
            for ln in l2["launches"]:
                print(f"  {ln['name']}: {ln['programs']} programs x {ln['threads']} threads, {ln['resident']}/SM "
                      f"({ln['occupancy_limit']}), {ln['waves']:.2f} waves -> {ln['time_us']:.4g} us ({ln['limiter']})")
    return 0


def _is_mla(args: argparse.Namespace) -> bool:
    """--mla, or an MLA --generation (an unknown generation is _check_args' to report)."""
    if args.mla:
        return True
    if args.generation is None:
        return False
    from pallas_attn import registry

    try:
        return "mla" in registry.get(args.generation).entries
    except (KeyError, ValueError):
        return False


def _mla_shape(args: argparse.Namespace) -> None:
    """Fill ``args.shape`` (and, for MLA, ``args.kv_len`` / ``args.h_q``): the MLA defaults without --shape, and
    one query-head count (H of --shape, or --h-q) that the prediction uses; a disagreement is a UsageError."""
    if not _is_mla(args):
        args.shape = args.shape or DEFAULT_SHAPE
        return
    if args.shape is None:
        b, h, n, d = MLA_DEFAULT_SHAPE
        args.shape = (b, args.h_q or h, n, d)
        if args.kv_len is None:
            args.kv_len = MLA_DEFAULT_KV_LEN
    elif args.h_q is not None and args.h_q != args.shape[1]:
        raise UsageError(f"--h-q {args.h_q} disagrees with the query heads H={args.shape[1]} of --shape "
                         f"{'x'.join(map(str, args.shape))}: pass one, or the same number in both")
    args.h_q = args.shape[1]


def _mma_engine(args: argparse.Namespace) -> str:
    """``--mma-engine``, else the tensor-core rate of the 16-bit input: bf16 when --dtype / --precision is bf16,
    else fp16 (the reference's; always fp16 under --reference-conventions). For a non-MLA problem roofline's
    _engine already maps bf16 storage to the bf16 peak from "fp16"; for MLA the engine is taken as given."""
    if args.mma_engine is not None:
        return args.mma_engine
    if args.reference_conventions or not args.mla:
        return "fp16"
    io = {"bfloat16": "bf16", "float16": "fp16"}.get(args.dtype or "", args.precision)
    return "bf16" if io == "bf16" else "fp16"


def _layer2(args, hw, b: int, h: int, q_len: int, kv_len: int, d: int) -> dict:
    """Layer 2 for ``--generation`` (docs/roofline.md): the launch plan it assumed and its time."""
    from . import layer2

    impl = f"{args.framework}:{args.generation}" + (f":{args.config}" if args.config and args.framework == "pallas"
                                                     else "")
    shape = layer2.Shape(b, h, h // args.gqa_group, q_len, kv_len, d, args.dtype or "float16", args.causal,
                         max(0, kv_len - q_len))
    try:
        return layer2.predict(impl, shape, hw).as_dict()
    except (NotImplementedError, KeyError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def capacity(args: argparse.Namespace) -> int:
    """``--capacity``: the KV-cache capacity table (``roofline.capacity_table``) for --shape's H, N x B, d."""
    b, h, n, d = args.shape or (1, 32, 65536, 128)
    tokens = b * (args.kv_len or n)
    if args.gqa_group < 1 or h % args.gqa_group:
        raise UsageError(f"H ({h}) must be a multiple of --gqa-group ({args.gqa_group})")
    gqa = h // args.gqa_group if args.gqa_group > 1 else 8
    try:
        rows = roofline.capacity_table(heads_q=h, head_dim=d, tokens=tokens, gqa_heads_kv=gqa)
    except ValueError as e:
        raise UsageError(f"--capacity: {e}") from None
    if args.json:
        print(json.dumps({"heads_q": h, "head_dim": d, "tokens": tokens, "rows": rows}))
        return 0
    print(f"KV-cache capacity: Hq={h}, d={d}, {tokens} tokens (B={b} x N={tokens // b}), one layer, K and V; "
          f"a quantized cache adds {roofline.SCALE_BYTES:g} B of tensor scales (docs/quantized_kv.md)")
    print(f"{'layout':10s} {'Hkv':>4s} {'format':9s} {'B/token':>9s} {'total MB':>11s} {'vs fp16':>8s}")
    for r in rows:
        print(f"{r['layout']:10s} {r['heads_kv']:4d} {r['format']:9s} {r['bytes_per_token']:9.0f} "
              f"{r['total_bytes'] / 1e6:11.2f} {r['vs_fp16']:8.3f}")
    return 0


def mla_capacity(args: argparse.Namespace) -> int:
    """``--capacity --mla``: ``roofline.mla_capacity_table`` for --shape's H (query heads), N (tokens) x B and d
    (the MHA / GQA head dim), the latent --kv-lora-rank + --rope-dim, GQA-(H / --gqa-group, or 8)."""
    b, h, n, d = args.shape or (1, 128, 65536, 128)
    tokens = b * (args.kv_len or n)
    if args.gqa_group < 1 or h % args.gqa_group:
        raise UsageError(f"H ({h}) must be a multiple of --gqa-group ({args.gqa_group})")
    gqa = h // args.gqa_group if args.gqa_group > 1 else 8
    try:
        rows = roofline.mla_capacity_table(heads_q=h, head_dim=d, kv_lora_rank=args.kv_lora_rank,
                                           rope_dim=args.rope_dim, tokens=tokens, gqa_heads_kv=gqa)
    except ValueError as e:
        raise UsageError(f"--capacity --mla: {e}") from None
    if args.json:
        print(json.dumps({"heads_q": h, "head_dim": d, "kv_lora_rank": args.kv_lora_rank, "rope_dim": args.rope_dim,
                          "tokens": tokens, "rows": rows}))
        return 0
    print(f"cache capacity, one layer, {tokens} tokens: MHA / GQA K and V ({h} query heads, d={d}) vs the MLA latent "
          f"({args.kv_lora_rank} + {args.rope_dim}, K and V at once; a quantized latent adds "
          f"{roofline.LATENT_SCALE_BYTES:g} B of tensor scale) [docs/mla.md]")
    print(f"{'layout':11s} {'format':9s} {'Hkv':>4s} {'width':>5s} {'B/token':>9s} {'total MB':>11s} "
          f"{'vs MHA':>8s} {'vs GQA':>8s}")
    for r in rows:
        print(f"{r['layout']:11s} {r['format']:9s} {r['heads_kv']:4d} {r['width']:5d} {r['bytes_per_token']:9.0f} "
              f"{r['total_bytes'] / 1e6:11.2f} {r['vs_mha']:7.1f}x {r['vs_gqa']:7.2f}x")
    return 0


def workload_table(config: str, archs: list[str], *, tensor_cores: bool = True) -> list[dict]:
    """Layer 1 of every workload of ``config`` on each arch, datasheet and (where ``MEASURED_CEILINGS`` has the
    arch) measured: a peer's prediction as compare run makes it (``roofline.problem_for`` with no declaration:
    the workload's dtype and KV / latent format, fused; ragged batches count their real keys).
    ``tensor_cores=False``: the products on the fp32 CUDA cores (a CUDA-core kernel such as v11_mla)."""
    from .workloads import load_config

    return layer1_rows(load_config(config), archs, tensor_cores=tensor_cores)


def layer1_rows(workloads, archs: list[str], *, tensor_cores: bool = True) -> list[dict]:
    """``workload_table``'s rows for a list of workloads."""
    import dataclasses

    from . import interop

    rows = []
    for w in workloads:
        # as compare run counts it (interop.roofline_view): ragged batches their real keys, a window or packed
        # documents their visible pairs, a soft-cap its tanh
        prob = roofline.problem_for(interop.roofline_view(w))
        if not tensor_cores:
            prob = dataclasses.replace(prob, use_tensor_core=False)
        for key in archs:
            for basis in ("datasheet", "measured"):
                if basis == "measured" and key not in MEASURED_CEILINGS:
                    continue
                hw = measured_hardware(key) if basis == "measured" else hardware.get(key)
                est = roofline.estimate(prob, hw)
                rows.append({"workload": w.name, "arch": hw.key, "basis": basis, "precision": prob.precision,
                             "engine": est.engine, "flops": est.flops, "bytes": est.bytes, "ai": est.ai,
                             "ridge": est.ridge, "t_mma_us": est.t_mma * 1e6, "t_hbm_us": est.t_hbm * 1e6,
                             "t_mufu_us": est.t_mufu * 1e6, "floor_us": est.floor_s * 1e6, "limiter": est.limiter})
    return rows


def workloads_cli(args: argparse.Namespace) -> int:
    """``--workloads CONFIG``: ``workload_table`` printed (or as JSON)."""
    archs = [a.strip() for a in (args.arch if args.arch != "t4" else "h100,h200").split(",") if a.strip()]
    try:
        archs = [hardware.get(a).key for a in archs]
        rows = workload_table(args.workloads, archs, tensor_cores=not args.no_tensor_core)
    except ValueError as e:
        raise UsageError(f"--workloads: {e}") from None
    if args.json:
        print(json.dumps({"config": args.workloads, "rows": rows}))
        return 0
    print(f"layer 1 (docs/roofline.md) per workload of {args.workloads}: floor = max(t_mma, t_hbm, t_mufu); "
          "measured = MEASURED_CEILINGS (compare/predict.py)")
    print(f"{'workload':30s} {'arch':5s} {'basis':9s} {'prec':5s} {'AI':>7s} {'ridge':>7s} {'t_mma us':>9s} "
          f"{'t_hbm us':>9s} {'t_mufu us':>9s} {'floor us':>9s} limiter")
    for r in rows:
        print(f"{r['workload']:30.30s} {r['arch']:5s} {r['basis']:9s} {r['precision']:5s} {r['ai']:7.1f} "
              f"{r['ridge']:7.1f} {r['t_mma_us']:9.2f} {r['t_hbm_us']:9.2f} {r['t_mufu_us']:9.2f} "
              f"{r['floor_us']:9.2f} {r['limiter']}")
    return 0


def auto_impl(w, arch: str) -> tuple[str, str]:
    """``(impl, why)``: the kernel and config ``pallas:auto`` (the public entry with its defaults) runs on workload
    ``w`` on a Hopper of table ``arch`` (h100 / h200), from any machine: the heuristics read that chip's tuning table
    (``tuning.use_chip``). Prefill and training steps take the drop-in's forward config on sm_90 (fa_prefill's; the
    drop-in's other routes, cuDNN or XLA for what fa_prefill refuses, are not modelled here); a chunk of a paged
    cache fa_prefill's at the chunk's dense shape; the decode and MLA entries their default generation and the
    config its heuristic picks."""
    from pallas_attn import tuning

    from . import auto

    with tuning.use_chip(arch):
        if w.entry == "chunked":
            _, name = auto.chunk_prefill_config(w)
            return f"pallas:fa_prefill:{name}", f"paged_attention's chunk on fa_prefill, on a Hopper ({arch} table)"
        if w.family in ("prefill", "train"):
            _, name = auto.prefill_forward_config(w)
            return f"pallas:fa_prefill:{name}", f"the drop-in's fa_prefill config on a Hopper ({arch} table)"
        ch = auto.choice(w)
    if not ch.get("generation") or not ch.get("config"):
        raise NotImplementedError(f"pallas:auto chose {ch.get('chose')!r}, which layer 2 does not model")
    return f"pallas:{ch['generation']}:{ch['config']}", f"{ch.get('why', '')} ({arch} table)"


def model_rows(args: argparse.Namespace) -> tuple[Any, list[dict], list[dict]]:
    """``(workload, layer-1 rows, layer-2 rows)`` of ``--model``: the workload from the sweep's model tables at the
    asked size, layer 1 as ``--workloads`` prints it, layer 2 (``compare.layer2.predict``) per ``--impl`` per arch
    on the datasheet row with the measured HBM bandwidth where there is one (the scorecard's basis); a layer-2
    failure is a row with its error."""
    from . import layer2
    from .workloads import model_workload

    archs = [a.strip() for a in (args.arch if args.arch != "t4" else "h100,h200").split(",") if a.strip()]
    try:
        archs = [hardware.get(a).key for a in archs]
    except ValueError as e:
        raise UsageError(f"--arch: {e}") from None
    for flag, v in (("--batch", args.batch), ("--tokens", args.tokens), ("--q-len", args.q_len),
                    ("--kv-len", args.kv_len)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be >= 1; got {v}")
    w = model_workload(args.model, args.entry, q_len=args.q_len, kv_len=args.kv_len, batch=args.batch,
                       tokens=args.tokens, page_size=args.page_size, kv_dtype=args.kv_dtype,
                       causal=not args.non_causal, dtype=args.dtype)
    l1 = layer1_rows([w], archs)
    impls = args.impl or ["pallas:auto"]
    l2 = []
    for impl in impls:
        for key in archs:
            # layer 2's basis as the scorecard scores it (layer2.hardware_of): the datasheet row with the measured
            # HBM bandwidth; its fitted constants carry the rest
            hw = hardware.get(key)
            measured = key in MEASURED_CEILINGS
            if measured:
                hw = hw.with_measured(hbm_bw=MEASURED_CEILINGS[key]["hbm_bw"])
            row = {"impl": impl, "arch": key, "basis": "meas. HBM" if measured else "datasheet"}
            try:
                inner = impl
                if w.family == "train":  # the drop-in's step: its forward, the loss and its backward's launches
                    from .predict_l2 import _as_on, plan_for
                    from .schema import Ctx

                    with _as_on(key):
                        plan = plan_for(impl, w, Ctx(jax_gpu=True, torch_cuda=False, hopper=True, interpret=False))
                    if impl == "pallas:auto":
                        row["via"] = (plan or {}).get("chose")
                    pr = layer2.predict_record(w, impl, plan, hw)
                    if "error" in pr:
                        raise NotImplementedError(pr["error"])
                    row.update(time_us=pr["time_us"], limiter=pr.get("limiter"))
                    l2.append(row)
                    continue
                if impl == "pallas:auto":
                    inner, row["why"] = auto_impl(w, key)
                    row["via"] = inner
                pr = layer2.predict(inner, w, hw).as_dict()
                row.update(time_us=pr["time_us"], limiter=pr.get("limiter"))
            except Exception as e:  # noqa: BLE001 - a prediction that cannot be made is a row that says why
                row.update(time_us=None, error=f"{type(e).__name__}: {e}"[:200])
            l2.append(row)
    return w, l1, l2


def model_cli(args: argparse.Namespace) -> int:
    """``--model``: the workload, then layer 1 and layer 2 (or JSON)."""
    w, l1, l2 = model_rows(args)
    if args.json:
        print(json.dumps({"workload": {k: getattr(w, k) for k in ("name", "family", "entry", "model", "batch",
                                                                   "heads_q", "heads_kv", "q_len", "kv_len",
                                                                   "head_dim", "dtype", "causal", "page_size",
                                                                   "kv_dtype", "window", "softcap")},
                          "layer1": l1, "layer2": l2}))
        return 0
    feats = ", ".join(f"{k} {getattr(w, k)}" for k in ("window", "softcap", "page_size", "kv_dtype")
                      if getattr(w, k) is not None)
    print(f"{w.model} {w.entry}: B {w.batch} Hq {w.heads_q} Hkv {w.heads_kv} Tq {w.q_len} Tk {w.kv_len} "
          f"D {w.head_dim} {w.dtype}{' causal' if w.causal else ''}{', ' + feats if feats else ''}")
    print("layer 1 (floor = max(t_mma, t_hbm, t_mufu)):")
    print(f"  {'arch':5s} {'basis':9s} {'t_mma us':>9s} {'t_hbm us':>9s} {'t_mufu us':>9s} {'floor us':>9s} limiter")
    for r in l1:
        print(f"  {r['arch']:5s} {r['basis']:9s} {r['t_mma_us']:9.2f} {r['t_hbm_us']:9.2f} {r['t_mufu_us']:9.2f} "
              f"{r['floor_us']:9.2f} {r['limiter']}")
    print("layer 2 (the kernel's launches on the machine model, docs/roofline.md):")
    for r in l2:
        t = f"{r['time_us']:9.2f} us  {r.get('limiter')}" if r["time_us"] is not None else f"-  {r['error']}"
        name = r["impl"] + (f" -> {r['via']}" if r.get("via") else "")
        print(f"  {name:50s} {r['arch']:5s} {r['basis']:9s} {t}")
    return 0
