"""Render the paged-GQA findings (docs/paged_gqa.md) from one GPU session's records, so every number traces to a file.

    python scripts/paged_findings.py [--dir results/paged_gqa/20261122_h100] [--out <dir>/findings.md]

Reads ``<dir>/records.jsonl`` (``python -m compare run --config paged_gqa``: the Pallas rows, fa_decode and
jax:cudnn, p50 µs on the CUPTI clock, L2 flushed) and ``<dir>/paged_times.jsonl`` (``scripts/time_cuda_paged.py``,
removed in issue 26 item 5, whose points the config's ``cuda:*`` rows now run; its file under results/ stays: the CUDA
twins' kernel-only times, partial + merge, CUPTI via torch.profiler, L2 flushed, median of 20). %HBM is
against ONE ceiling for both: the run header's best measured read bandwidth (``ceilings.measured.hbm_read_Bps``,
jnp_sum on the H100 of 2026-11-22: 3.18 TB/s), with the bytes each file counts (compare: the workload's bytes,
Q/O and the table included; time_cuda_paged: K + V only, the larger term). Ratios are written as "speed-up of X
over Y" = t(Y) / t(X): above 1, X is faster.

Prints markdown: the Pallas records per workload (with the plan each ran: splits, chunk, SM count, programs),
the CUDA times as pivots, and the ratio behind each finding P1-P9.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

DEFAULT_DIR = "results/paged_gqa/20261122_h100"
FAMILY = ("v7_paged", "v8_gqa", "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")


def load(d: Path):
    header, ceilings, results = None, None, []
    for line in (d / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("type") == "header":
            header = r
        elif r.get("type") == "ceilings":
            ceilings = r
        elif r.get("type") == "result":
            results.append(r)
    cuda = [json.loads(x) for x in (d / "paged_times.jsonl").read_text().splitlines() if x.strip()]
    return header, ceilings, results, cuda


class Data:
    def __init__(self, d: Path):
        self.dir = d
        self.header, self.ceilings, self.results, self.cuda = load(d)
        meas = self.ceilings["measured"]
        self.ceiling_Bps = float(meas["hbm_read_Bps"])
        self.ceiling_how = meas.get("hbm_read_best", "?")
        self.methods = {k: v["Bps"] for k, v in meas.get("hbm_read_methods", {}).items()}
        self.p = {(r["workload"]["name"], r["impl"]["name"]): r for r in self.results}

    # ---- Pallas / peers (compare records)
    def t(self, wl: str, impl: str) -> float | None:
        r = self.p.get((wl, impl))
        if r is None or r["status"] != "ok":
            return None
        return float(r["metrics"]["time_us_p50"])

    def hbm(self, wl: str, impl: str) -> float | None:
        r = self.p.get((wl, impl))
        if r is None or r["status"] != "ok":
            return None
        return 100 * float(r["metrics"]["hbm_fraction"])

    def status(self, wl: str, impl: str) -> str:
        r = self.p.get((wl, impl))
        return "absent" if r is None else r["status"]

    # ---- CUDA twins (time_cuda_paged)
    def c(self, sweep: str, gen: str, **kw) -> dict | None:
        hits = [r for r in self.cuda if r["sweep"] == sweep and r["gen"] == gen
                and all(r.get(k) == v for k, v in kw.items())]
        if len(hits) > 1:
            raise ValueError(f"ambiguous CUDA point {sweep} {gen} {kw}: {len(hits)} rows")
        return hits[0] if hits else None

    def ct(self, sweep: str, gen: str, **kw) -> float | None:
        r = self.c(sweep, gen, **kw)
        return None if r is None else float(r["kernel_us"])

    def chbm(self, r: dict) -> float:
        """%HBM of a CUDA point against the compare run's ceiling (the same one as the Pallas rows)."""
        return 100 * r["kv_GBps"] * 1e9 / self.ceiling_Bps


def f(x, nd=1) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and math.isnan(x):
        return "—"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def ratio(a, b) -> float | None:
    """t(b)/t(a): the speed-up of a over b."""
    return None if a is None or b is None else b / a


def rng(vals) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "unmeasured"
    lo, hi = min(vals), max(vals)
    return f"{lo:.2f}×" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}×"


def table(rows, head) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ sections


def section_header(D: Data) -> str:
    h = D.header
    env = h["env"]
    meth = ", ".join(f"{k} {v / 1e12:.2f} TB/s" for k, v in D.methods.items())
    cuda_ceiling = D.cuda[0]["read_ceiling_GBps"] if D.cuda else None
    return (f"Run `{h['run_id']}` ({env['gpu']}, git {env['git_sha'][:12]}, jax {env['versions']['jax']}, "
            f"Triton {env['versions'].get('triton')}, CUDA {env['versions'].get('cuda')}): "
            f"{len(D.results)} records, "
            f"{sum(r['status'] == 'ok' for r in D.results)} ok, {sum(r['status'] == 'skipped' for r in D.results)} "
            f"skipped, {sum(r['status'] == 'unsupported' for r in D.results)} unsupported. Read ceiling: "
            f"{D.ceiling_how} {D.ceiling_Bps / 1e12:.2f} TB/s (methods: {meth}); time_cuda_paged's own x.sum "
            f"ceiling was {cuda_ceiling:.0f} GB/s, and its CUDA %HBM below is re-based on {D.ceiling_Bps / 1e12:.2f} "
            f"TB/s. CUDA points: {len(D.cuda)} in paged_times.jsonl.")


def section_pallas(D: Data) -> str:
    by_wl = defaultdict(list)
    for r in D.results:
        by_wl[r["workload"]["name"]].append(r)
    rows = []
    for wl, rs in by_wl.items():
        fa = D.t(wl, "pallas:fa_decode:default")
        for r in sorted(rs, key=lambda r: (r["status"] != "ok", (r.get("metrics") or {}).get("time_us_p50") or 0)):
            if r["status"] == "unsupported":
                continue
            name = r["impl"]["name"]
            plan = r["impl"].get("plan") or {}
            part = plan.get("partial") or {}
            pl = (f"S {plan.get('splits')}, chunk {plan.get('chunk')}, {plan.get('num_sm')} SMs, "
                  f"{part.get('programs')} programs" if part else "")
            t = D.t(wl, name)
            rows.append((wl, name, r["status"] if r["status"] != "ok" else f(t), f(D.hbm(wl, name)),
                         f(ratio(t, fa), 2) if t and fa and name != "pallas:fa_decode:default" else "—", pl))
    unsup = sorted({r["impl"]["name"] for r in D.results if r["status"] == "unsupported"})
    return (table(rows, ("workload", "impl", "p50 µs", "%HBM", "fa_decode ÷ this", "plan (partial kernel)"))
            + f"\n\nUnsupported (no record time; see each record's reason): {', '.join(unsup)}.")


def section_cuda(D: Data) -> str:
    out = []
    gens = FAMILY
    for sweep, key in (("gsweep", "G"), ("reclaim", "B"), ("v7_batch", "B")):
        for d in (64, 128):
            sms = sorted({r["num_sm"] for r in D.cuda if r["sweep"] == sweep and r["D"] == d}, reverse=True)
            for sm in sms:
                pts = [r for r in D.cuda if r["sweep"] == sweep and r["D"] == d and r["num_sm"] == sm]
                if not pts:
                    continue
                shape = pts[0]
                keys = sorted({r[key] for r in pts})
                gl = [g for g in gens if any(r["gen"] == g for r in pts)]
                rows = []
                for k in keys:
                    cells = []
                    for g in gl:
                        r = next((r for r in pts if r["gen"] == g and r[key] == k), None)
                        cells.append("—" if r is None else f"{f(r['kernel_us'])} ({f(D.chbm(r))}%)")
                    s = next(r["splits"] for r in pts if r[key] == k)
                    rows.append((f"{key} {k}", s, *cells))
                desc = (f"**{sweep}**, D {d}, {sm} SMs (B {shape['B']}, H_q {shape['H_q']}, N_k {shape['N_k']})"
                        if sweep == "gsweep" else
                        f"**{sweep}**, D {d}, {sm} SMs (H_q {shape['H_q']}, H_kv {shape['H_kv']}, N_k {shape['N_k']})")
                out.append(desc + ": µs (%HBM)\n\n" + table(rows, (key, "S", *gl)))
    v = [r for r in D.cuda if r["sweep"] == "v7_vs_v6"]
    rows = [(r["gen"], r["D"], r["num_sm"], r["splits"], f(r["kernel_us"]), f(D.chbm(r))) for r in v]
    out.append("**v7_vs_v6** (B 1, H 8, N_k 8192; v6 on the dense cache holding the same keys): \n\n"
               + table(rows, ("gen", "D", "SMs", "S", "µs", "%HBM")))
    pl = [r for r in D.cuda if r["sweep"] == "past_l2"]
    keys = sorted({(r["B"], r["N_k"]) for r in pl})
    gl = [g for g in FAMILY if any(r["gen"] == g for r in pl)]
    rows = []
    for b, n in keys:
        cells = []
        for g in gl:
            r = next((r for r in pl if r["gen"] == g and r["B"] == b and r["N_k"] == n), None)
            cells.append("—" if r is None else f"{f(r['kernel_us'])} ({f(D.chbm(r))}%)")
        rows.append((f"B {b}, N_k {n}", next(r["splits"] for r in pl if r["B"] == b and r["N_k"] == n), *cells))
    out.append("**past_l2** (H_q 8, H_kv 1, D 128, device SMs): µs (%HBM)\n\n" + table(rows, ("point", "S", *gl)))
    return "\n\n".join(out)


def findings(D: Data) -> list[tuple[str, str, str]]:
    """(id, Pallas measured, CUDA measured) strings, each computed from the files."""
    P = "pallas:{}:{}".format
    gs = {(g, d): f"pg_gsweep_hq32_hkv{32 // g}_d{d}" for g in (1, 2, 4, 8, 16, 32) for d in (64, 128)}
    out = []

    # P1: v7 vs v6
    cu = []
    for d in (64, 128):
        for sm in (132, 40):
            cu.append(ratio(D.ct("v7_vs_v6", "v6_splitkv", D=d, num_sm=sm),
                            D.ct("v7_vs_v6", "v7_paged", D=d, num_sm=sm)))
    v7v6 = [r for r in D.results if r["workload"]["name"].startswith("pg_v7v6_")]
    skipped = f"{sum(r['status'] == 'skipped' for r in v7v6)} of {len(v7v6)} records skipped"
    sm8 = "pg_smoke_mha_page8"
    pk = ratio(D.t(sm8, P("v7_paged", "per_tile")), D.t(sm8, P("v7_paged", "faithful")))
    out.append(("P1", f"v7 vs v6 unmeasured (pg_v7v6_*: {skipped}); proxy, same plan (S 1, chunk 200, "
                      f"pg_smoke_mha_page8): per-key v7:faithful is {pk:.2f}× slower than v7:per_tile",
                f"v7 is {rng(cu)} slower than v6 (t(v7)/t(v6), D 64/128 × 132/40 SMs)"))

    # P2: v7 %HBM
    pal = [D.hbm(gs[(1, d)], P("v7_paged", "faithful")) for d in (64, 128)]
    b1 = [D.chbm(D.c("v7_batch", "v7_paged", B=1, D=d)) for d in (64, 128)]
    bmax = [D.chbm(D.c("v7_batch", "v7_paged", B=b, D=d)) for b in (32, 64) for d in (64, 128)]
    out.append(("P2", f"v7:faithful {f(min(pal))}–{f(max(pal))}% at B 1, H 32 (pg_gsweep G 1; the H 8 points "
                      "pg_v7v6_paged_* were skipped)",
                f"v7 {f(min(b1))}–{f(max(b1))}% at B 1, rising to {f(min(bmax))}–{f(max(bmax))}% at B 32–64 "
                "(v7_batch, H 8, device SMs)"))

    # P3: packing
    def pack(d):
        base = D.t(gs[(1, d)], P("v7_paged", "faithful"))
        return {g: ratio(D.t(gs[(g, d)], P("v8_gqa", "faithful")), base) for g in (1, 2, 4, 8, 16, 32)
                if (g, d) in gs and D.t(gs[(g, d)], P("v8_gqa", "faithful"))}
    p128, p64 = pack(128), pack(64)

    def cpack(d, sm):
        base = D.ct("gsweep", "v7_paged", D=d, num_sm=sm, G=1)
        return {g: ratio(D.ct("gsweep", "v8_gqa", D=d, num_sm=sm, G=g), base) for g in (1, 2, 4, 8, 16, 32)}
    c40, c132 = cpack(128, 40), cpack(128, 132)
    out.append(("P3", "v8_gqa:faithful over v7 at G 1, D 128: " + " / ".join(f"{p128[g]:.2f}" for g in sorted(p128))
                + f"× for G {'/'.join(map(str, sorted(p128)))}; D 64: G 8 {p64.get(8, float('nan')):.2f}×",
                "40 SMs, D 128: " + " / ".join(f"{c40[g]:.2f}" for g in sorted(c40)) + "× (G 1…32); device SMs: "
                + " / ".join(f"{c132[g]:.2f}" for g in sorted(c132)) + "×"))

    # P4: tc
    tc_c1 = {k: ratio(D.t(w, P("v8_gqa_tc", "faithful")), D.t(w, P("v8_gqa", "faithful"))) for k, w in gs.items()
             if D.t(w, P("v8_gqa_tc", "faithful"))}
    tc_ss = {k: ratio(D.t(w, P("v8_gqa_tc", "faithful")), D.t(w, P("v8_gqa_ss", "faithful"))) for k, w in gs.items()
             if D.t(w, P("v8_gqa_tc", "faithful"))}
    ctc = [ratio(D.ct("gsweep", "v8_gqa", G=g, D=d, num_sm=sm), D.ct("gsweep", "v8_gqa_tc", G=g, D=d, num_sm=sm))
           for g in (1, 2, 4, 8, 16, 32) for d in (64, 128) for sm in (40, 132)]
    out.append(("P4", f"tc over v8_gqa (faithful): {rng(tc_c1.values())} (G 1–32, D 64/128; "
                      f"G ≥ 4: {rng([v for k, v in tc_c1.items() if k[0] >= 4])}); tc over ss: {rng(tc_ss.values())}",
                f"tc is {rng(ctc)} slower than v8_gqa (t(tc)/t(v8_gqa), gsweep, every G, D, SM count)"))

    # P5-P7: the three knobs of Cut 1
    def arm(gen):
        pal = {w: ratio(D.t(w, P(gen, "faithful")), D.t(w, P("v8_gqa", "faithful")))
               for w in ("pg_pastl2_b1_n32768", "pg_pastl2_b1_n131072", "pg_pastl2_b32_n32768", "pg_pastl2_b64_n32768",
                         "pg_smoke_g4_page16")}
        cl2 = [ratio(D.ct("past_l2", gen, B=b, N_k=n), D.ct("past_l2", "v8_gqa", B=b, N_k=n))
               for b, n in ((1, 32768), (1, 65536), (1, 131072), (8, 32768), (32, 32768), (64, 32768))]
        cgs = [ratio(D.ct("gsweep", gen, G=g, D=d, num_sm=sm), D.ct("gsweep", "v8_gqa", G=g, D=d, num_sm=sm))
               for g in (1, 2, 4, 8, 16, 32) for d in (64, 128) for sm in (40, 132)]
        cbig = [ratio(D.ct("past_l2", gen, B=b, N_k=32768), D.ct("past_l2", "v8_gqa", B=b, N_k=32768))
                for b in (32, 64)]
        return pal, cl2, cgs, cbig
    for pid, gen in (("P5", "v8_gqa_db"), ("P6", "v8_gqa_occ"), ("P7", "v8_gqa_ilp")):
        pal, cl2, cgs, cbig = arm(gen)
        txt = (f"over v8_gqa: past-L2 B 1 {rng([pal['pg_pastl2_b1_n32768'], pal['pg_pastl2_b1_n131072']])}, "
               f"smoke {rng([pal['pg_smoke_g4_page16']])}")
        if gen == "v8_gqa_occ":
            b64 = pal["pg_pastl2_b64_n32768"]
            txt += (f", B 32 past L2 {rng([pal['pg_pastl2_b32_n32768']])}, B 64 "
                    f"{'unmeasured (skipped)' if b64 is None else rng([b64])}")
        ctxt = f"over v8_gqa: past L2 {rng(cl2)}, G-sweep {rng(cgs)}"
        if gen == "v8_gqa_occ":
            ctxt += f"; B 32 / 64 past L2 {rng(cbig)}"
        out.append((pid, txt, ctxt))

    # P8: ss
    same_plan = {w: ratio(D.t(w, P("v8_gqa_ss", "faithful")), D.t(w, P("v8_gqa", "faithful")))
                 for w in ("pg_pastl2_b1_n32768", "pg_pastl2_b1_n131072", "pg_reclaim_b1_d128")}
    gsr = {k: ratio(D.t(w, P("v8_gqa_ss", "faithful")), D.t(w, P("v8_gqa", "faithful"))) for k, w in gs.items()
           if D.t(w, P("v8_gqa_ss", "faithful"))}
    rec = {b: ratio(D.t(f"pg_reclaim_b{b}_d128", P("v8_gqa_ss", "faithful")),
                    D.t(f"pg_reclaim_b{b}_d128", P("v8_gqa", "faithful"))) for b in (8, 64)}
    tuned = [ratio(D.t(w, P("v8_gqa_ss", "tuned")), D.t(w, P("v8_gqa", "tuned")))
             for w in ("pg_pastl2_b1_n32768", "pg_pastl2_b1_n131072")]
    css = {d: [ratio(D.ct(s, "v8_gqa_ss", **kw), D.ct(s, "v8_gqa", **kw))
               for s, kw in ([("gsweep", dict(G=g, D=d, num_sm=sm)) for g in (1, 2, 4, 8, 16, 32) for sm in (40, 132)]
                             + [("reclaim", dict(B=b, D=d)) for b in (1, 8, 16, 32, 64)])] for d in (64, 128)}
    cl2 = [ratio(D.ct("past_l2", "v8_gqa_ss", B=b, N_k=n), D.ct("past_l2", "v8_gqa", B=b, N_k=n))
           for b, n in ((1, 32768), (1, 65536), (1, 131072), (8, 32768), (32, 32768), (64, 32768))]
    out.append(("P8", "ss over v8_gqa (faithful), same plan (S 32; past L2 B 1, reclaim B 1): "
                      f"{rng(same_plan.values())}; "
                      f"G-sweep (ss plans on 132 SMs, v8_gqa on 40): {rng(gsr.values())} "
                      f"(G ≥ 4: {rng([v for k, v in gsr.items() if k[0] >= 4])}); reclaim B 8 / 64: "
                      f"{rng([rec[8]])} / {rng([rec[64]])}; tuned ss over tuned v8_gqa: {rng(tuned)}",
                f"ss over v8_gqa: D 64 {rng(css[64])}, D 128 {rng(css[128])} (G-sweep + reclaim); past L2 {rng(cl2)}"))

    # P9: HBM cap and distance to fa_decode
    fam_pal = [(r["workload"]["name"], r["impl"]["name"], D.hbm(r["workload"]["name"], r["impl"]["name"]))
               for r in D.results if r["status"] == "ok" and r["impl"]["generation"] in FAMILY]
    top = max(fam_pal, key=lambda x: x[2])
    b1_l2 = [x[2] for x in fam_pal if x[0] == "pg_pastl2_b1_n131072"]
    b64 = [x[2] for x in fam_pal if x[0] == "pg_reclaim_b64_d128"]
    fa = {w: D.hbm(w, "pallas:fa_decode:default") for w in ("pg_pastl2_b1_n32768", "pg_pastl2_b1_n131072",
                                                             "pg_reclaim_b1_d128", "pg_reclaim_b64_d128")}
    dist = {w: ratio(D.t(w, "pallas:fa_decode:default"), min(t for t in (D.t(w, P(g, c)) for g in FAMILY
                                                                      for c in ("faithful", "tuned", "device_sm",
                                                                                "reference_sm40")) if t))
            for w in fa}
    cmax = max(D.cuda, key=lambda r: D.chbm(r) if r["gen"] in FAMILY else -1)
    cb1 = max(D.chbm(r) for r in D.cuda if r["gen"] in FAMILY and r["B"] == 1)
    v8max = max((r for r in D.cuda if r["gen"] in FAMILY[1:]), key=D.chbm)
    out.append(("P9", f"family max {f(top[2])}% ({top[1]}, {top[0]}); "
                      f"B 1 N_k 131072: {f(min(b1_l2))}–{f(max(b1_l2))}%; "
                      f"B 64 reclaim: {f(min(b64))}–{f(max(b64))}%; fa_decode "
                      + ", ".join(f"{f(v)}% ({w})" for w, v in fa.items())
                      + "; fastest family member vs fa_decode: "
                      + ", ".join(f"{dist[w]:.1f}× slower ({w})" for w in fa),
                f"family max {f(D.chbm(cmax))}% ({cmax['gen']}, {cmax['sweep']} B {cmax['B']} D {cmax['D']}); "
                f"v8 family max {f(D.chbm(v8max))}% ({v8max['gen']}, {v8max['sweep']} B {v8max['B']} D {v8max['D']}); "
                f"max at B 1 {f(cb1)}%"))
    return out


def section_twins(D: Data) -> str:
    """Pallas and CUDA on the same shape and split plan (where both files have it)."""
    P = "pallas:{}:{}".format
    rows = []
    pts = [("pg_gsweep_hq32_hkv32_d128", "v8_gqa", "faithful", dict(sweep="gsweep", G=1, D=128, num_sm=40)),
           ("pg_gsweep_hq32_hkv4_d128", "v8_gqa", "faithful", dict(sweep="gsweep", G=8, D=128, num_sm=40)),
           ("pg_gsweep_hq32_hkv32_d128", "v8_gqa_tc", "faithful", dict(sweep="gsweep", G=1, D=128, num_sm=40)),
           ("pg_gsweep_hq32_hkv4_d128", "v8_gqa_tc", "faithful", dict(sweep="gsweep", G=8, D=128, num_sm=40)),
           ("pg_gsweep_hq32_hkv32_d128", "v8_gqa_ss", "faithful", dict(sweep="gsweep", G=1, D=128, num_sm=132)),
           ("pg_gsweep_hq32_hkv4_d128", "v8_gqa_ss", "faithful", dict(sweep="gsweep", G=8, D=128, num_sm=132)),
           ("pg_reclaim_b1_d128", "v8_gqa", "faithful", dict(sweep="reclaim", B=1, D=128)),
           ("pg_reclaim_b1_d128", "v8_gqa_ss", "faithful", dict(sweep="reclaim", B=1, D=128)),
           ("pg_reclaim_b64_d128", "v8_gqa_ss", "faithful", dict(sweep="reclaim", B=64, D=128)),
           ("pg_pastl2_b1_n131072", "v8_gqa", "faithful", dict(sweep="past_l2", B=1, N_k=131072)),
           ("pg_pastl2_b1_n131072", "v8_gqa_db", "faithful", dict(sweep="past_l2", B=1, N_k=131072)),
           ("pg_pastl2_b1_n131072", "v8_gqa_occ", "faithful", dict(sweep="past_l2", B=1, N_k=131072)),
           ("pg_pastl2_b1_n131072", "v8_gqa_ilp", "faithful", dict(sweep="past_l2", B=1, N_k=131072)),
           ("pg_pastl2_b1_n131072", "v8_gqa_ss", "faithful", dict(sweep="past_l2", B=1, N_k=131072)),
           ("pg_pastl2_b32_n32768", "v8_gqa", "faithful", dict(sweep="past_l2", B=32, N_k=32768))]
    for wl, gen, cfg, kw in pts:
        sweep = kw.pop("sweep")
        r = D.c(sweep, gen, **kw)
        pr = D.p.get((wl, P(gen, cfg)))
        if r is None or pr is None or pr["status"] != "ok":
            continue
        tp, tc = D.t(wl, P(gen, cfg)), r["kernel_us"]
        rows.append((wl, gen, f"S {pr['impl']['plan']['splits']} / {r['splits']}", f(tp), f(tc), f"{tc / tp:.2f}×"))
    return table(rows, ("workload", "gen", "S Pallas / CUDA", "Pallas µs", "CUDA µs", "Pallas speed-up over CUDA"))


def render(D: Data) -> str:
    parts = [f"# Paged GQA findings, rendered from `{D.dir}` by scripts/paged_findings.py", "", section_header(D), "",
             "## Finding ratios (P1-P9)", "",
             table(findings(D), ("#", "Pallas (records.jsonl)", "CUDA twin (paged_times.jsonl)")), "",
             "## Pallas vs CUDA on the same shape (cross-harness: compare's clock vs time_cuda_paged's; both CUPTI "
             "kernel time, L2 flushed)", "", section_twins(D), "",
             "## Pallas, fa_decode and jax:cudnn (records.jsonl)", "", section_pallas(D), "",
             "## CUDA twins (paged_times.jsonl)", "", section_cuda(D), ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=DEFAULT_DIR)
    ap.add_argument("--out", default=None, help="write the markdown here too (default: stdout only)")
    args = ap.parse_args(argv)
    D = Data(Path(args.dir))
    text = render(D)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
