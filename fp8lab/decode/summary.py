"""Study 06's key numbers: the flat summary the notebook records and the claims audit reads (:func:`summary`) and
the typed summary rows (:func:`summary_rows`, :mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fp8lab.decode.run import DecodeRun
from fp8lab.decode.tables import (
    arm_table,
    capacity_table,
    crossover_table,
    fit_table,
    point_table,
    primary_arm,
    roofline_table,
    table_records,
)

#: How each arm is named in a row's ``setting`` and in prose.
ARM_WORDS = {
    "colocated": "two engines co-located on one device",
    "solo": "one engine at a time",
}


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
        "points": table_records(pts),
        "fits": table_records(fits),
        "crossovers": table_records(cross),
        "roofline": table_records(
            roof[["kv_dtype", "batch", "context_len", "fraction"]] if roof is not None and not roof.empty else None
        ),
        "capacity": table_records(cap),
        "capacity_exact": bool(len(cap)) and bool(cap.exact.all()),
        "min_detectable_pct": float(np.median(hw)) if len(hw) else None,
        "max_ci_half_width_pct": float(max(hw)) if len(hw) else None,
        "bandwidth_gbs": bandwidth_gbs,
        **_design(run),
    }


def _design(run: DecodeRun) -> dict[str, Any]:
    """The engine-level replication's keys (issue 35): the design, and per arm its points, plus the co-location
    effect; for a run with one engine per dtype, the design keys only (``replicated`` False)."""
    spec = run.spec
    out: dict[str, Any] = {
        "replicated": run.replicated,
        "engines_per_dtype": int(spec.get("engines", 1)),
        "arms": list(spec.get("arms") or ["colocated"]),
        "primary_arm": primary_arm(run),
        "interval_over": "engine pairs" if run.replicated else "repetitions of one engine per dtype",
    }
    if not run.replicated:
        return out
    out["solo_gpu_memory_utilization"] = spec.get("solo_gpu_memory_utilization")
    out["solo_kv_cache_gib"] = spec.get("solo_kv_cache_gib")
    out["points_by_arm"] = {a: table_records(point_table(run, arm=a)) for a in out["arms"]}
    out["arm_effect"] = table_records(arm_table(run))
    out["engine_failures"] = {k: e.get("error") for k, e in run.starts.items() if e.get("status") != "ok"}
    out["engine_start_s"] = sorted(
        round(float(e["engine_start_s"]), 1) for e in run.starts.values() if e.get("engine_start_s") is not None
    )
    out["deferred_sets"] = len(run.deferred) if not run.complete else 0
    return out


def summary_rows(run: DecodeRun, base: str = "auto", other: str = "fp8") -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from :func:`point_table`: per measured point
    (``batch``, ``context_len``) each dtype's mean decode step (ms, ``n`` repetitions) and ``other``'s step against
    ``base``'s as their paired ratio (unit ``ratio``, its 95% t interval, ``beyond_noise``, ``detectable`` the
    interval's half-width as a ratio: :func:`fp8lab.stats.detectable_pct` / 100); per engine (:func:`capacity_table`,
    setting its KV budget and block size) the ``num_blocks`` it allocated and the ``num_blocks_formula`` predicted
    (evidence ``computed``). Non-finite values give no row."""
    from fp8lab import summary_table as st

    prov, spec = run.provenance or {}, run.spec
    model = Path(spec["model"]).name
    graphs = [e.get("cuda_graphs") for e in run.engines.values() if e.get("status") == "ok"]
    setting = "decode step, " + ("CUDA graphs" if graphs and all(graphs) else "eager")
    rows = _point_rows(run, base, other, setting, prov, model, primary_arm(run), "decode_step_ms")
    if run.replicated:
        for arm in spec["arms"]:
            if arm != primary_arm(run):
                rows += _point_rows(run, base, other, setting, prov, model, arm, "decode_step_ms_colocated")
        rows += _design_rows(run, base, other, setting, prov, model)
    # each engine's KV blocks beside the formula's for its budget and block size (capacity_table; none without a
    # fixed KV budget)
    cap = capacity_table(run)
    for r in table_records(cap):
        at = {
            "study": "decode",
            "kv_dtype": r["kv_dtype"],
            "setting": f"{spec['kv_cache_gib']:g} GiB of KV, block {r['block_size']}",
            "unit": "blocks",
            "n": 1,
            "model": model,
        }
        ev = st.evidence_of(prov.get("device"), model)
        engine = {"evidence": ev, "device": prov.get("device") or "unknown"}
        rows.append(st.make_row(**at, **engine, metric="num_blocks", value=r["num_blocks"]))
        computed = {"evidence": "computed", "device": ARITHMETIC}
        rows.append(st.make_row(**at, **computed, metric="num_blocks_formula", value=r["predicted_blocks"]))
    return rows


def _finite(v: Any) -> bool:
    return v is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _arm_setting(run: DecodeRun, setting: str, arm: str) -> str:
    if not run.replicated:
        return setting
    return f"{setting}, {ARM_WORDS[arm]}, {run.spec['engines']} engines per dtype"


def _point_rows(
    run: DecodeRun, base: str, other: str, setting: str, prov: dict, model: str, arm: str, metric: str
) -> list[dict[str, Any]]:
    """Per measured point of ``arm``: each dtype's mean step and the paired ratio (``n``: engine pairs in a replicated
    run, repetitions otherwise)."""
    from fp8lab import summary_table as st

    pts = point_table(run, base, other, arm=arm) if run.replicated else point_table(run, base, other)
    common = {
        "study": "decode",
        "metric": metric,
        "setting": _arm_setting(run, setting, arm),
        "evidence": st.evidence_of(prov.get("device"), model),
        "device": prov.get("device") or "unknown",
        "model": model,
    }

    finite = _finite
    rows = []
    for p in table_records(pts):
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
    return rows


def _design_rows(run: DecodeRun, base: str, other: str, setting: str, prov: dict, model: str) -> list[dict[str, Any]]:
    """A replicated run's fits and crossovers as rows: per arm and batch each dtype's fixed cost per step
    (``decode_fixed_ms``, ms, interval over engines) and ``other``'s against ``base`` (the paired difference, ms),
    and the crossover context (``decode_crossover_tokens``, tokens; its interval only where both ends lie within the
    measured contexts)."""
    from fp8lab import summary_table as st

    common = {"study": "decode", "evidence": st.evidence_of(prov.get("device"), model), "model": model}
    common["device"] = prov.get("device") or "unknown"
    rows = []
    diff = f"{other}-{base}"
    for f in table_records(fit_table(run)):
        if not _finite(f.get("a_ms")):
            continue
        ci = (f["a_ms_ci_low"], f["a_ms_ci_high"]) if _finite(f.get("a_ms_ci_low")) else (None, None)
        who = {"kv_dtype": other, "baseline": base} if f["kv_dtype"] == diff else {"kv_dtype": f["kv_dtype"]}
        rows.append(
            st.make_row(
                **common,
                **who,
                metric="decode_fixed_ms",
                setting=_arm_setting(run, setting, f["arm"]),
                batch=int(f["batch"]),
                value=f["a_ms"],
                ci_low=ci[0],
                ci_high=ci[1],
                n=int(f["n_engines"]),
                unit="ms",
            )
        )
    for c in table_records(crossover_table(run, base, other)):
        if not _finite(c.get("context_len")):
            continue
        both = _finite(c.get("ci_low")) and _finite(c.get("ci_high"))
        rows.append(
            st.make_row(
                **common,
                kv_dtype=other,
                baseline=base,
                metric="decode_crossover_tokens",
                setting=_arm_setting(run, setting, c["arm"]),
                batch=int(c["batch"]),
                value=c["context_len"],
                ci_low=c["ci_low"] if both else None,
                ci_high=c["ci_high"] if both else None,
                n=int(c["n_engines"]),
                unit="tokens",
            )
        )
    return rows


#: ``device`` of a row the formula computed (no engine).
ARITHMETIC = "any (arithmetic on config.json)"
