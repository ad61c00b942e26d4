"""Workloads as data: named, tagged shapes loaded from ``configs/*.toml``.

A config file holds ``[[workload]]`` tables. Any field given as a list expands into the cartesian product,
and ``name`` is then a ``str.format`` template over the fields (``"prefill_n{q_len}_d{head_dim}"``), so a
sweep is one entry, never code. ``include = ["other.toml"]`` at the top level pulls in other files.

Fields (defaults in ``_DEFAULTS``): family (prefill | train | decode | paged_decode | mla), batch, heads_q,
heads_kv (default heads_q), q_len, kv_len (default q_len), head_dim, dtype (float32 | float16 | bfloat16),
causal, q_offset (default 0 for prefill, kv_len - q_len for decode families), page_size (paged_decode:
required; mla: default 64), ragged (paged_decode and mla: per-sequence lengths drawn in [kv_len/2, kv_len]),
kv_dtype (the KV cache's storage format, ``KV_DTYPES``: "fp8_e4m3" | "nvfp4"; absent = the workload dtype; q and
the output stay in ``dtype``; docs/quantized_kv.md; for mla the format of the latent pool, docs/mla.md), kv_lora_rank /
rope_dim (mla: head_dim = kv_lora_rank + rope_dim, heads_kv 1, the latent pool [num_blocks, page, 1, head_dim]),
generations / peers (restrict the implementations; default all that support the workload), tags, seed,
devices (default 1: GPUs of one host a decode's KV cache is split over; only multi-device implementations run
on devices > 1).

The model-shape sweep (``configs/sweep.toml``, docs/sweep.md) adds:

* ``model``: a key of the config's top-level ``[models.<name>]`` tables (a list expands like any field); the
  model's fields (heads_q, heads_kv, head_dim, kv_lora_rank, rope_dim and the features below) fill every field the
  workload leaves out; ``hf`` and ``note`` describe the model and are kept in the record as ``model_info``;
* ``entry``: the public entry a user calls for the workload, the sweep's report groups by it (default: the
  family's, ``DEFAULT_ENTRY``): prefill | train | decode | spec | paged | chunked | mla | quant;
* ``tokens``: tokens per batch; with ``batch`` absent, batch = max(1, tokens // q_len);
* ``max_kv_tokens``: combinations with batch x kv_len above it are not generated (the memory bound of a decode
  grid; ``load_config`` keeps the names it dropped in ``dropped_by_memory``);
* features (``FEATURES``): ``window`` (int W, causal only: query i sees key j iff i + q_offset - W < j <=
  i + q_offset, jax.nn's ``local_window_size=(W - 1, 0)``), ``softcap`` (float c: scores become
  c * tanh(s / c) before the softmax), ``sinks`` (one logit per query head joins each row's softmax denominator,
  gpt-oss), ``packed`` (each batch row holds several documents of mixed lengths, causal within each document,
  none sees another; the lengths are ``attn_core.oracle.packed_doc_lengths``). A workload with a feature runs
  only on implementations that declare it (``Impl.features``); every other one records "unsupported" with the
  reason, never a silent run without the feature.

Errors name the file and the entry: unknown key, bad shape, Hq not a multiple of Hkv, and so on.
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["Workload", "ConfigError", "UsageError", "load_config", "config_dir", "resolve_config", "FEATURES",
           "ENTRIES", "DROPPED_BY_MEMORY"]

FAMILIES = ("prefill", "train", "decode", "paged_decode", "mla")
FEATURES = ("window", "softcap", "sinks", "packed")  # attention features beyond the plain mask (see the docstring)
ENTRIES = ("prefill", "train", "decode", "spec", "paged", "chunked", "mla", "quant")  # the sweep's report groups
DEFAULT_ENTRY = {"prefill": "prefill", "train": "train", "decode": "decode", "paged_decode": "paged", "mla": "mla"}
_MODEL_FIELDS = {"heads_q", "heads_kv", "head_dim", "kv_lora_rank", "rope_dim", "window", "softcap", "sinks", "hf",
                 "note"}
PAGED_FAMILIES = ("paged_decode", "mla")  # KV read from pools through a block table (page_size, ragged)
MLA_PAGE_SIZE = 64  # an mla workload's page_size when absent (DeepSeek-V3's serving page; docs/mla.md)
DTYPES = ("float32", "float16", "bfloat16")
KV_DTYPES = ("fp8_e4m3", "nvfp4")  # quantized KV storage formats (pallas_attn.quant); absent = the workload dtype
_LIST_OK = {"generations", "peers", "tags"}  # list-valued fields that do not expand
TUNE_KEYS = frozenset({"grid", "baselines"})  # a tune config's own top-level keys (compare/tune.py checks them)
DROPPED_BY_MEMORY: dict[Path, tuple[str, ...]] = {}  # config path -> workload names over its max_kv_tokens


class UsageError(ValueError):
    """A mistake in what the user asked for (a flag, a file, a config): the CLI prints it as one line and exits 2.
    Raised only while resolving arguments, never from inside a kernel run."""


class ConfigError(UsageError):
    pass


def ensure_writable(path: Path, flag: str) -> None:
    """Create ``path``'s folder and open the file for append (writing nothing), or raise a UsageError naming
    ``flag``: a run or a report learns that its output cannot be written before it does any work."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a"):
            pass
    except OSError as e:
        raise UsageError(f"{flag}: cannot write {path}: {e.strerror or e}") from None


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    family: str
    batch: int
    heads_q: int
    heads_kv: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str
    causal: bool = False
    q_offset: int = 0
    page_size: int | None = None
    ragged: bool = False
    kv_dtype: str | None = None  # KV storage format (KV_DTYPES); None: the workload dtype
    kv_lora_rank: int | None = None
    rope_dim: int | None = None
    generations: tuple[str, ...] | None = None
    peers: tuple[str, ...] | None = None
    tags: tuple[str, ...] = ()
    seed: int = 0
    devices: int = 1  # GPUs of one host the KV cache is split over (context-parallel decode)
    model: str | None = None  # the sweep's model (a key of the config's [models] tables)
    entry: str | None = None  # the sweep's entry group (ENTRIES); None: the family's (DEFAULT_ENTRY)
    window: int | None = None  # sliding window W (causal): keys i + q_offset - W < j <= i + q_offset
    softcap: float | None = None  # logit soft-cap c: s -> c * tanh(s / c)
    sinks: bool = False  # one sink logit per query head in each row's softmax denominator
    packed: bool = False  # documents of mixed lengths packed in each batch row (attn_core.oracle.packed_doc_lengths)
    model_info: tuple[tuple[str, str], ...] = ()  # the model table's hf / note
    source: str = ""

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def features(self) -> frozenset[str]:
        """The attention features this workload needs beyond the plain (causal) mask (``FEATURES``)."""
        return frozenset(f for f, on in (("window", self.window is not None), ("softcap", self.softcap is not None),
                                         ("sinks", self.sinks), ("packed", self.packed)) if on)

    @property
    def entry_group(self) -> str:
        return self.entry or DEFAULT_ENTRY[self.family]

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["group"] = self.group
        d["entry"] = self.entry_group
        d["features"] = sorted(self.features)
        d["model_info"] = dict(self.model_info)
        return d


_DEFAULTS: dict[str, Any] = {
    "heads_kv": None, "kv_len": None, "causal": False, "q_offset": None, "page_size": None, "ragged": False,
    "kv_dtype": None, "kv_lora_rank": None, "rope_dim": None, "generations": None, "peers": None, "tags": (), "seed": 0,
    "devices": 1, "model": None, "entry": None, "window": None, "softcap": None, "sinks": False, "packed": False,
    "tokens": None, "max_kv_tokens": None,
}
_REQUIRED = ("name", "family", "batch", "heads_q", "q_len", "head_dim", "dtype")
_BOOL_FIELDS = ("causal", "ragged", "sinks", "packed")
_INT_FIELDS = ("batch", "heads_q", "heads_kv", "q_len", "kv_len", "head_dim", "q_offset", "page_size", "kv_lora_rank",
               "rope_dim", "seed", "devices", "window", "tokens", "max_kv_tokens")  # None (absent) allowed
_STR_FIELDS = ("name", "family", "dtype")
_LOAD_ONLY = {"tokens", "max_kv_tokens"}  # read while loading, not Workload fields
_FIELDS = ({f.name for f in dataclasses.fields(Workload)} - {"source", "model_info"}) | _LOAD_ONLY


def config_dir() -> Path:
    """The shipped configs: ``compare/configs`` (package data in an installed wheel; a link to the checkout's
    ``configs/`` in a checkout), else the checkout's ``configs/`` itself."""
    here = Path(__file__).parent
    packaged = here / "configs"
    if packaged.is_dir():
        return packaged
    return here.resolve().parent / "configs"


def resolve_config(path_or_name: str | Path) -> Path:
    p = Path(path_or_name)
    candidates = [p, p.with_suffix(".toml"), config_dir() / p.name, (config_dir() / p.name).with_suffix(".toml")]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(f"no config {str(path_or_name)!r} (looked for: {', '.join(map(str, candidates))})")


def _expand(entry: dict[str, Any]) -> list[dict[str, Any]]:
    sweep = {k: v for k, v in entry.items() if isinstance(v, list) and k not in _LIST_OK}
    if not sweep:
        return [entry]
    out = []
    for combo in itertools.product(*sweep.values()):
        e = dict(entry)
        e.update(zip(sweep.keys(), combo))
        out.append(e)
    return out


def _with_model(raw: dict[str, Any], models: dict[str, dict[str, Any]], where: str) -> dict[str, Any]:
    """``raw`` with its model's fields filled in where absent (the workload's own fields win), and ``batch`` from
    ``tokens``."""
    raw = dict(raw)
    name = raw.get("model")
    if name is not None:
        if not isinstance(name, str) or name not in models:
            raise ConfigError(f"{where}: model {name!r} is not one of the config's [models] tables "
                              f"({', '.join(sorted(models)) or 'none'})")
        info = models[name]
        for k, v in info.items():
            if k in ("hf", "note"):
                continue
            raw.setdefault(k, v)
        raw["model_info"] = tuple((k, str(info[k])) for k in ("hf", "note") if k in info)
    tokens = raw.get("tokens")
    if tokens is not None and "batch" not in raw:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ConfigError(f"{where}: tokens must be a positive int; got {tokens!r}")
        q_len = raw.get("q_len")
        if isinstance(q_len, int) and q_len > 0:
            raw["batch"] = max(1, tokens // q_len)
    return raw


def _check_models(models: Any, path: Path) -> dict[str, dict[str, Any]]:
    if not isinstance(models, dict) or not all(isinstance(v, dict) for v in models.values()):
        raise ConfigError(f"{path}: models must be tables [models.<name>]")
    for name, m in models.items():
        unknown = set(m) - _MODEL_FIELDS
        if unknown:
            raise ConfigError(f"{path}: models.{name}: unknown key(s) {sorted(unknown)}; allowed: "
                              f"{sorted(_MODEL_FIELDS)}")
    return models


def _build(raw: dict[str, Any], where: str) -> Workload:
    model_info = raw.pop("model_info", ()) if "model_info" in raw else ()
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_FIELDS)}")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing}")
    e = {**_DEFAULTS, **raw}
    base = where
    if isinstance(raw.get("name"), str):
        where = f"{base} ({raw['name']})"
    for k in _BOOL_FIELDS:  # types first: TOML "yes" or 1 is not a bool, and must not reach a name template
        if not isinstance(e[k], bool):
            raise ConfigError(f"{where}: {k} must be true or false; got {e[k]!r}")
    for k in _INT_FIELDS:
        if e[k] is not None and (not isinstance(e[k], int) or isinstance(e[k], bool)):
            raise ConfigError(f"{where}: {k} must be an int; got {e[k]!r}")
    for k in _STR_FIELDS:
        if not isinstance(e[k], str):
            raise ConfigError(f"{where}: {k} must be a string; got {e[k]!r}")
    try:
        e["name"] = str(e["name"]).format(**e)
    except (KeyError, IndexError, ValueError) as err:
        raise ConfigError(f"{where}: bad name template {raw['name']!r}: {err}") from None
    where = f"{base} ({e['name']})"
    for k in ("batch", "heads_q", "q_len", "head_dim", "devices"):
        if not isinstance(e[k], int) or isinstance(e[k], bool) or e[k] < 1:
            raise ConfigError(f"{where}: {k} must be a positive int; got {e[k]!r}")
    e["heads_kv"] = e["heads_q"] if e["heads_kv"] is None else e["heads_kv"]
    e["kv_len"] = e["q_len"] if e["kv_len"] is None else e["kv_len"]
    for k in ("heads_kv", "kv_len"):
        if not isinstance(e[k], int) or e[k] < 1:
            raise ConfigError(f"{where}: {k} must be a positive int; got {e[k]!r}")
    if e["heads_q"] % e["heads_kv"]:
        raise ConfigError(f"{where}: heads_q ({e['heads_q']}) must be a multiple of heads_kv ({e['heads_kv']})")
    if e["family"] not in FAMILIES:
        raise ConfigError(f"{where}: family must be one of {FAMILIES}; got {e['family']!r}")
    if e["dtype"] not in DTYPES:
        raise ConfigError(f"{where}: dtype must be one of {DTYPES}; got {e['dtype']!r}")
    if e["kv_dtype"] is not None:
        if not isinstance(e["kv_dtype"], str) or e["kv_dtype"] not in (*KV_DTYPES, e["dtype"]):
            raise ConfigError(f"{where}: kv_dtype must be one of {KV_DTYPES} (or absent: the workload dtype "
                              f"{e['dtype']}); got {e['kv_dtype']!r}")
        if e["kv_dtype"] == e["dtype"]:
            e["kv_dtype"] = None  # the workload dtype spelt out: the same workload as leaving it absent
    if e["kv_dtype"] is not None:
        if e["devices"] > 1:
            raise ConfigError(f"{where}: kv_dtype {e['kv_dtype']!r} applies on one device; got devices "
                              f"{e['devices']}")
        if e["kv_dtype"] == "nvfp4" and e["head_dim"] % 16:
            raise ConfigError(f"{where}: kv_dtype 'nvfp4' has one micro-scale per 16 elements of the head dim: "
                              f"head_dim must be a multiple of 16; got {e['head_dim']}")
    if e["q_offset"] is None:
        e["q_offset"] = 0 if e["family"] in ("prefill", "train") else e["kv_len"] - e["q_len"]
    if not isinstance(e["q_offset"], int) or e["q_offset"] < 0:
        raise ConfigError(f"{where}: q_offset must be a non-negative int; got {e['q_offset']!r}")
    if e["family"] == "mla" and e["page_size"] is None:
        e["page_size"] = MLA_PAGE_SIZE
    if e["family"] in PAGED_FAMILIES:
        ps = e["page_size"]
        if not isinstance(ps, int) or ps < 1 or ps & (ps - 1):
            raise ConfigError(f"{where}: {e['family']} needs page_size, a power of two; got {ps!r}")
    elif e["page_size"] is not None or e["ragged"]:
        raise ConfigError(f"{where}: page_size/ragged only apply to families {PAGED_FAMILIES}")
    if e["devices"] > 1 and (e["family"] not in ("decode", "train") or e["kv_len"] % e["devices"]):
        raise ConfigError(f"{where}: devices > 1 takes family 'decode' (context-parallel decode) or 'train' (ring "
                          f"attention) with kv_len a multiple of devices; got family {e['family']!r}, kv_len "
                          f"{e['kv_len']}, devices {e['devices']}")
    if e["family"] == "mla":
        if not e["kv_lora_rank"] or e["rope_dim"] is None:
            raise ConfigError(f"{where}: mla needs kv_lora_rank and rope_dim")
        if e["head_dim"] != e["kv_lora_rank"] + e["rope_dim"]:
            raise ConfigError(f"{where}: mla head_dim must be kv_lora_rank + rope_dim "
                              f"({e['kv_lora_rank']} + {e['rope_dim']}); got {e['head_dim']}")
        if e["heads_kv"] != 1:
            raise ConfigError(f"{where}: mla has one shared latent: heads_kv must be 1")
    for k in ("generations", "peers", "tags"):
        if e[k] is not None:
            if not isinstance(e[k], (list, tuple)) or not all(isinstance(x, str) for x in e[k]):
                raise ConfigError(f"{where}: {k} must be a list of strings; got {e[k]!r}")
            e[k] = tuple(e[k])
    if e["model"] is not None and not isinstance(e["model"], str):
        raise ConfigError(f"{where}: model must be a string; got {e['model']!r}")
    if e["entry"] is not None and e["entry"] not in ENTRIES:
        raise ConfigError(f"{where}: entry must be one of {ENTRIES}; got {e['entry']!r}")
    if e["window"] is not None:
        if e["window"] < 1 or not e["causal"]:
            raise ConfigError(f"{where}: window takes a positive int W and causal = true (query i sees the W keys "
                              f"ending at i + q_offset); got window {e['window']!r}, causal {e['causal']}")
    if e["softcap"] is not None:
        if isinstance(e["softcap"], bool) or not isinstance(e["softcap"], (int, float)) or not e["softcap"] > 0:
            raise ConfigError(f"{where}: softcap must be a positive number; got {e['softcap']!r}")
        e["softcap"] = float(e["softcap"])
    if (e["window"] is not None or e["softcap"] is not None or e["sinks"] or e["packed"]) and \
            e["family"] not in ("prefill", "train", "decode", "paged_decode"):
        raise ConfigError(f"{where}: window / softcap / sinks / packed apply to the prefill, train and decode "
                          f"families; got family {e['family']!r}")
    if e["packed"] and (e["family"] not in ("prefill", "train") or not e["causal"] or e["q_len"] != e["kv_len"]
                        or e["q_offset"]):
        raise ConfigError(f"{where}: packed takes a causal prefill or train workload with q_len == kv_len and no "
                          f"q_offset")
    if e["family"] == "train" and e["kv_dtype"] is not None:
        raise ConfigError(f"{where}: train runs plain KV (no kv_dtype)")
    if e["family"] == "train" and e["devices"] > 1 and (e["q_len"] != e["kv_len"] or e["q_offset"]):
        raise ConfigError(f"{where}: train over several devices is ring attention: self-attention, q_len == kv_len "
                          "and no q_offset")
    for k in _LOAD_ONLY:
        e.pop(k, None)
    return Workload(**e, model_info=tuple(model_info), source=where)


# ``compare predict --model``: a workload at any size from the sweep's model tables (configs/sweep.toml)
_ENTRY_FAMILY = {"prefill": "prefill", "train": "train", "decode": "decode", "spec": "decode", "quant": "decode",
                 "paged": "paged_decode", "chunked": "paged_decode", "mla": "mla"}


def sweep_models() -> dict[str, dict[str, Any]]:
    """The ``[models.<name>]`` tables of configs/sweep.toml (heads, head dim, window, soft-cap, MLA ranks)."""
    path = resolve_config("sweep")
    return _check_models(tomllib.loads(path.read_text()).get("models", {}), path)


def model_workload(model: str, entry: str, *, q_len: int | None = None, kv_len: int | None = None,
                   batch: int | None = None, tokens: int | None = None, page_size: int | None = None,
                   kv_dtype: str | None = None, causal: bool = True, dtype: str | None = None) -> Workload:
    """One workload of sweep model ``model`` (configs/sweep.toml) for ``entry`` at any size, as the sweep would
    write it: prefill / train default to kv_len = q_len and a batch of ``tokens`` (32768) // q_len; the decode
    entries to one query (spec: 4) and batch 1; quant to fp16 queries over ``kv_dtype`` (fp8_e4m3 by default);
    paged / chunked to page 16. A bad model, entry or size is a UsageError naming what is allowed."""
    models = sweep_models()
    if model not in models:
        raise UsageError(f"--model: {model!r} is not a sweep model; one of {', '.join(sorted(models))}")
    if entry not in _ENTRY_FAMILY:
        raise UsageError(f"--entry: {entry!r}; one of {', '.join(_ENTRY_FAMILY)}")
    if (entry == "mla") != (models[model].get("kv_lora_rank") is not None):
        raise UsageError(f"--entry {entry} does not fit model {model!r} ("
                         + ("an MLA model takes --entry mla)" if entry != "mla" else "not an MLA model)"))
    dense = entry in ("prefill", "train")
    if q_len is None:
        q_len = 4096 if dense else 512 if entry == "chunked" else 4 if entry == "spec" else 1
    if kv_len is None:
        kv_len = q_len if dense else 8192
    raw: dict[str, Any] = {"name": f"predict_{entry}_{model}_n{q_len}_s{kv_len}", "family": _ENTRY_FAMILY[entry],
                           "entry": entry, "model": model, "q_len": q_len, "kv_len": kv_len, "causal": causal,
                           "dtype": dtype or ("float16" if entry == "quant" else "bfloat16")}
    if batch is not None:
        raw["batch"] = batch
    elif dense:
        raw["tokens"] = tokens or 32768
    else:
        raw["batch"] = 1
    if entry in ("paged", "chunked"):
        raw["page_size"] = page_size or 16
    if entry == "quant":
        raw["kv_dtype"] = kv_dtype or "fp8_e4m3"
    where = f"compare predict --model {model} --entry {entry}"
    try:
        return _build(_with_model(raw, models, where), where)
    except ConfigError as e:
        raise UsageError(str(e)) from None


CPU_ONLY = "cpu-only"  # the tag of a workload that came in through a config's cpu_include


def _check_budget(data: dict, path: Path) -> float | None:
    b = data.get("budget_s")
    if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0):
        raise ConfigError(f"{path}: budget_s must be a positive number of seconds; got {b!r}")
    return None if b is None else float(b)


def config_budget_s(path_or_name: str | Path) -> float | None:
    """The config file's own per-record budget (top-level ``budget_s``: seconds of calls one record may take, for
    configs of multi-second steps), or None. Only the named file's key counts, not its includes'. None when the
    name resolves to no config file (a caller that passed its workloads itself)."""
    if not path_or_name:
        return None
    try:
        path = resolve_config(path_or_name)
    except (ConfigError, UsageError, OSError):
        return None
    try:
        return _check_budget(tomllib.loads(path.read_text()), path)
    except tomllib.TOMLDecodeError:
        return None


def load_config(path_or_name: str | Path, _seen: frozenset[Path] = frozenset()) -> list[Workload]:
    """All workloads of a config file (includes followed), in file order; names must be unique."""
    path = resolve_config(path_or_name)
    if path in _seen:
        raise ConfigError(f"{path}: include cycle")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    extra = set(data) - {"workload", "include", "cpu_include", "description", "models", "budget_s"} - TUNE_KEYS
    if extra:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(extra)}; allowed: workload, include, cpu_include, "
                          f"description, models, budget_s (and {', '.join(sorted(TUNE_KEYS))} in a tune config, read "
                          "by compare.tune)")
    _check_budget(data, path)
    models = _check_models(data.get("models", {}), path)
    out: list[Workload] = []
    for inc in data.get("include", []):
        out.extend(load_config(path.parent / inc, _seen | {path}))
    # cpu_include: configs whose workloads run only where there is no GPU (the interpret-mode checks of the default
    # config); tagged CPU_ONLY, and a GPU run leaves them out of its plan and says so
    for inc in data.get("cpu_include", []):
        out.extend(w if CPU_ONLY in w.tags else dataclasses.replace(w, tags=tuple(w.tags) + (CPU_ONLY,))
                   for w in load_config(path.parent / inc, _seen | {path}))
    dropped: list[str] = []
    for i, raw in enumerate(data.get("workload", [])):
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: workload[{i}] must be a table")
        combos = _expand(raw)
        for j, e in enumerate(combos):
            where = f"{path.name}: workload[{i}]" + (f".{j}" if j or len(combos) > 1 else "")
            w = _build(_with_model(e, models, where), where)
            cap = e.get("max_kv_tokens")
            if cap is not None and w.batch * w.kv_len > cap:
                dropped.append(w.name)
                continue
            out.append(w)
    DROPPED_BY_MEMORY[path] = tuple(dropped)
    names = [w.name for w in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{path}: duplicate workload names {dup}")
    if not out:
        raise ConfigError(f"{path}: no workloads")
    return out
