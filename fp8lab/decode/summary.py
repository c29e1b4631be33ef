"""Study 06's key numbers: the flat summary the notebook records and the claims audit reads (:func:`summary`) and
the typed summary rows (:func:`summary_rows`, :mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fp8lab.decode.run import DecodeRun
from fp8lab.decode.tables import _records, capacity_table, crossover_table, fit_table, point_table, roofline_table


def summary(run: DecodeRun, bandwidth_gbs: float | None = None) -> dict[str, Any]:
    """The study's key numbers (the contract the audit reads; see the module docstring)."""
    import numpy as np

    pts, fits, cross = point_table(run), fit_table(run), crossover_table(run)
    roof = roofline_table(run, bandwidth_gbs) if bandwidth_gbs else None
    cap = capacity_table(run)
    spec = run.spec
    prov = run.provenance
    ok = {d: e.get("status") == "ok" for d, e in run.engines.items()}
    graphs = [e.get("cuda_graphs") for e in run.engines.values() if e.get("status") == "ok"]
    hw = pts.ci_half_width_pct.dropna() if not pts.empty else []
    return {
        "device": prov.get("device"),
        "vllm_version": prov.get("vllm"),
        "fp8lab_commit": prov.get("commit"),
        "model": Path(spec["model"]).name,
        "load_format": spec["load_format"],
        "cuda_graphs": bool(graphs) and all(graphs),
        "tensor_parallel_size": spec["tensor_parallel_size"],
        "concurrent_engines": spec["concurrent_engines"],
        "n_reps": spec["reps"],
        "decode_tokens": spec["decode_tokens"],
        "complete": run.complete,
        "engines_ok": ok,
        "engine_errors": {d: e.get("error") for d, e in run.engines.items() if e.get("status") != "ok"},
        "points": _records(pts),
        "fits": _records(fits),
        "crossovers": _records(cross),
        "roofline": _records(
            roof[["kv_dtype", "batch", "context_len", "fraction"]] if roof is not None and not roof.empty else None
        ),
        "capacity": _records(cap),
        "capacity_exact": bool(len(cap)) and bool(cap.exact.all()),
        "min_detectable_pct": float(np.median(hw)) if len(hw) else None,
        "max_ci_half_width_pct": float(max(hw)) if len(hw) else None,
        "bandwidth_gbs": bandwidth_gbs,
    }


def summary_rows(run: DecodeRun, base: str = "auto", other: str = "fp8") -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from :func:`point_table`: per measured point
    (``batch``, ``context_len``) each dtype's mean decode step (ms, ``n`` repetitions) and ``other``'s step against
    ``base``'s as their paired ratio (unit ``ratio``, its 95% t interval, ``beyond_noise``, ``detectable`` the
    interval's half-width as a ratio: :func:`fp8lab.stats.detectable_pct` / 100); per engine (:func:`capacity_table`,
    setting its KV budget and block size) the ``num_blocks`` it allocated and the ``num_blocks_formula`` predicted
    (evidence ``computed``). Non-finite values give no row."""
    from fp8lab import summary_table as st

    pts = point_table(run, base, other)
    prov, spec = run.provenance or {}, run.spec
    model = Path(spec["model"]).name
    graphs = [e.get("cuda_graphs") for e in run.engines.values() if e.get("status") == "ok"]
    common = {
        "study": "decode",
        "metric": "decode_step_ms",
        "setting": "decode step, " + ("CUDA graphs" if graphs and all(graphs) else "eager"),
        "evidence": st.evidence_of(prov.get("device"), model),
        "device": prov.get("device") or "unknown",
        "model": model,
    }

    def finite(v: Any) -> bool:
        return v is not None and isinstance(v, (int, float)) and math.isfinite(v)

    rows = []
    for p in _records(pts):
        at = {"batch": int(p["batch"]), "context_len": int(p["context_len"]), "n": int(p["n"])}
        for d in (base, other):
            if finite(p.get(f"{d}_step_ms")):
                rows.append(st.make_row(**common, **at, kv_dtype=d, value=p[f"{d}_step_ms"], unit="ms"))
        if not finite(p.get("ratio")):
            continue
        ci = (p["ratio_ci_low"], p["ratio_ci_high"]) if finite(p.get("ratio_ci_low")) else (None, None)
        rows.append(
            st.make_row(
                **common,
                **at,
                kv_dtype=other,
                baseline=base,
                value=p["ratio"],
                ci_low=ci[0],
                ci_high=ci[1],
                unit="ratio",
                beyond_noise=bool(p["beyond_noise"]),
                detectable=p["ci_half_width_pct"] / 100 if finite(p.get("ci_half_width_pct")) else None,
            )
        )
    # each engine's KV blocks beside the formula's for its budget and block size (capacity_table; none without a
    # fixed KV budget)
    cap = capacity_table(run)
    for r in _records(cap):
        at = {
            "study": "decode",
            "kv_dtype": r["kv_dtype"],
            "setting": f"{spec['kv_cache_gib']:g} GiB of KV, block {r['block_size']}",
            "unit": "blocks",
            "n": 1,
            "model": model,
        }
        engine = {"evidence": common["evidence"], "device": common["device"]}
        rows.append(st.make_row(**at, **engine, metric="num_blocks", value=r["num_blocks"]))
        computed = {"evidence": "computed", "device": ARITHMETIC}
        rows.append(st.make_row(**at, **computed, metric="num_blocks_formula", value=r["predicted_blocks"]))
    return rows


#: ``device`` of a row the formula computed (no engine).
ARITHMETIC = "any (arithmetic on config.json)"
