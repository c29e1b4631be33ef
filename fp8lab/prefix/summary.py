"""Study 07's key numbers (:func:`summary`: what the notebook records and the claims audit reads), from a
stored run through the tables and the prediction, and the same numbers as typed rows (:func:`summary_rows`,
:mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fp8lab.prefix.predict import plan
from fp8lab.prefix.run import PrefixRun
from fp8lab.prefix.tables import cell_table, correctness_table, knee_table, sweep_table
from fp8lab.prefix.verdict import claim_evidence, claim_verdict, isnan, json_records


def summary(run: PrefixRun | Any, base: str = "auto", other: str = "fp8") -> dict[str, Any]:
    """The study's key numbers (what the notebook records and the audit reads)."""
    import numpy as np
    import pandas as pd

    from fp8lab import stats

    spec = run.spec
    pred = plan(spec)
    rep: dict[str, Any] = {}
    if getattr(run, "replicated", False):  # issue 35: per-engine means, intervals over engine pairs (headline: solo)
        from fp8lab.prefix import replication

        cells = replication.engine_cells(run.rows)
        sweeps = {a: replication.engine_sweep(cells, a, pred, base, other) for a in spec.arms}
        sweep = sweeps[spec.headline_arm]
        rep = replication_keys(run, cells, sweeps, replication.colocation_table(cells, base, other))
    else:
        cells = cell_table(run.rows)
        sweep = sweep_table(cells, pred, base, other)
    knees = knee_table(spec, sweep)
    corr = correctness_table(run.correctness)
    prov = run.provenance
    ok = {d: run.engines.get(d, {}).get("status", "not started") for d in spec.kv_dtypes}
    s: dict[str, Any] = {
        "device": prov.get("device"),
        "vllm_version": prov.get("vllm"),
        "fp8lab_commit": prov.get("commit"),
        "model": Path(spec.model).name,
        "load_format": spec.load_format,
        "prompt_source": spec.prompt_source,
        "kv_cache_gib": spec.kv_cache_gib,
        "block_size": spec.effective_block_size(),
        "trials": spec.trials,
        "max_in_flight": spec.max_in_flight,
        "active": list(spec.active),
        "complete": run.complete,
        "engines_status": ok,
        "engine_errors": {d: e.get("error") for d, e in run.engines.items() if e.get("status") != "ok"},
        "num_blocks": {d: e.get("num_blocks") for d, e in run.engines.items() if e.get("status") == "ok"},
        "num_blocks_formula": {d: spec.num_blocks(d) for d in spec.kv_dtypes},
        "knees": json_records(knees),
        "sweep": json_records(sweep),
        "correctness": json_records(corr),
        "counter_turns": int(cells.counter_turns.sum()) if len(cells) else 0,
        "counter_turns_complete": int(cells.counter_turns_complete.sum()) if len(cells) else 0,
        **rep,  # a replicated run's design and engine-level keys (none for one engine per dtype: its summary as it was)
    }
    s["num_blocks_exact"] = bool(s["num_blocks"]) and all(
        s["num_blocks"][d] == s["num_blocks_formula"][d] for d in s["num_blocks"]
    )
    if len(sweep) and "ttft_detectable_pct" in sweep:
        hw = sweep.ttft_detectable_pct.dropna()
        s["ttft_min_detectable_pct"] = float(hw.median()) if len(hw) else None
        # the hit rate's detectable difference at 80% power over the cells whose trials differed; a deterministic
        # replay (every trial alike) has no interval and is counted, not given a detectable effect of 0
        fixed = sweep["dhit_deterministic"] if "dhit_deterministic" in sweep else pd.Series(False, index=sweep.index)
        varied = sweep[~fixed.fillna(False).astype(bool)]
        dh = [
            stats.detectable_from_interval(lo, hi, int(n) - 1)
            for lo, hi, n in zip(varied.dhit_pp_ci_low, varied.dhit_pp_ci_high, varied.n_pairs, strict=True)
            if np.isfinite(lo) and np.isfinite(hi) and n and n > 1
        ]
        s["dhit_min_detectable_pp"] = float(np.median(dh)) if dh else None
        s["dhit_deterministic_cells"] = int(fixed.fillna(False).astype(bool).sum())
    # the claim's numbers: hit rates where both hold (inside auto's knee) and where fp8's extra hits show
    for w in spec.workloads:
        g = sweep[sweep.workload == w.kind] if len(sweep) else sweep
        if not len(g) or f"{base}_hit_rate" not in g:
            continue
        s[f"{w.kind}.max_abs_dhit_pp_inside"] = None
        s[f"{w.kind}.gain"] = None
        kb = knees[(knees.workload == w.kind) & (knees.kv_dtype == base)]
        kb_last = kb.measured_last_held.iloc[0] if len(kb) else None
        if "dhit_pp" in g:
            inside = g[g.n_active <= (kb_last if kb_last is not None and not isnan(kb_last) else 0)]
            if len(inside):
                s[f"{w.kind}.max_abs_dhit_pp_inside"] = float(inside.dhit_pp.abs().max())
            beyond = g[(g.n_active > (kb_last if kb_last is not None and not isnan(kb_last) else 0))]
            beyond = beyond.dropna(subset=["dhit_pp"])
            if len(beyond):
                best = beyond.loc[beyond.dhit_pp.idxmax()]
                s[f"{w.kind}.gain"] = {
                    k: (None if isnan(v) else float(v))
                    for k, v in best.items()
                    if k
                    in (
                        "n_active",
                        "dhit_pp",
                        "dhit_pp_ci_low",
                        "dhit_pp_ci_high",
                        f"{base}_hit_rate",
                        f"{other}_hit_rate",
                        "ttft_ratio",
                        "ttft_ratio_ci_low",
                        "ttft_ratio_ci_high",
                        "tput_ratio",
                    )
                }
                if "dhit_deterministic" in best:  # every trial gave this difference: it has no interval
                    s[f"{w.kind}.gain"]["dhit_deterministic"] = bool(best["dhit_deterministic"])
    s["claim_verdict"] = claim_verdict(s, base, other)
    s["claim_evidence"] = claim_evidence(s, base, other)
    return s


def _finite(v: Any) -> float | None:
    """A finite number as a float, else None (None, NaN, pandas' NA, a string)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


#: ``device`` of the replay's rows (no engine).
REPLAY = "any (vLLM's block pool replayed)"


def summary_rows(
    run: PrefixRun, sweep: Any = None, knees: Any = None, base: str = "auto", other: str = "fp8"
) -> list[dict[str, Any]]:
    """The study's typed rows (:mod:`fp8lab.summary_table`, study ``prefix_cache``) from the sweep and knee tables
    (:func:`~fp8lab.prefix.tables.sweep_table`, :func:`~fp8lab.prefix.tables.knee_table`; computed when None):
    ``subset`` the workload, ``concurrency`` the active conversations N, ``setting`` the serving (requests in flight,
    block size). Per cell and kv dtype: ``prefix_hit_rate`` (fraction), ``ttft_mean`` (ms), ``n`` the paired
    trials; the replay's ``prefix_hit_rate_predicted`` (evidence ``computed``); ``other`` against ``base``: the hit
    rate's paired difference (pp), the TTFT and throughput (``output_tok_s``) paired ratios, each with its 95%
    interval and ``detectable`` the smallest difference the paired trials detect with 80% power
    (:func:`fp8lab.stats.detectable_from_interval`; TTFT: :func:`fp8lab.stats.power_detectable_pct` / 100); a
    hit-rate difference every trial reproduced (a deterministic replay) has no interval and no detectable. TTFT
    ``beyond_noise`` when the interval excludes 1 and the change exceeds the noise floor. Per workload and dtype:
    ``prefix_knee_predicted`` (the replay) and ``prefix_knee_measured`` (the last N held) in conversations."""
    from fp8lab import stats
    from fp8lab import summary_table as st

    spec = run.spec
    if sweep is None or knees is None:
        if getattr(run, "replicated", False):
            from fp8lab.prefix import replication

            sweep = replication.engine_sweep(
                replication.engine_cells(run.rows), spec.headline_arm, plan(spec), base, other
            )
        else:
            sweep = sweep_table(cell_table(run.rows), plan(spec), base, other)
        knees = knee_table(spec, sweep)
    n_units = spec.engines if getattr(run, "replicated", False) else spec.trials  # what the intervals are over
    model = Path(spec.model).name
    device = run.provenance.get("device")
    setting = f"multi-turn, {spec.max_in_flight} in flight, block {spec.effective_block_size()}"
    measured = {"study": "prefix_cache", "evidence": st.evidence_of(device, model), "device": device or "unknown"}
    computed = {"study": "prefix_cache", "evidence": "computed", "device": REPLAY}
    rows: list[dict[str, Any]] = []

    def add(common: dict[str, Any], value: Any, **fields: Any) -> None:
        v = _finite(value)
        if v is not None:
            rows.append(st.make_row(**common, **fields, value=v, model=model, setting=setting))

    def ci(r: dict[str, Any], col: str) -> dict[str, Any]:
        lo, hi = _finite(r.get(f"{col}_ci_low")), _finite(r.get(f"{col}_ci_high"))
        pairs = _finite(r.get("n_pairs"))
        if lo is None or hi is None or not pairs:
            return {}
        return {"ci_low": lo, "ci_high": hi, "detectable": stats.detectable_from_interval(lo, hi, int(pairs) - 1)}

    for r in json_records(sweep):
        pairs = _finite(r.get("n_pairs"))
        at = {"subset": r["workload"], "concurrency": int(r["n_active"])}
        n = {"n": int(pairs) if pairs else n_units}
        for d in (base, other):
            add(measured, r.get(f"{d}_hit_rate"), metric="prefix_hit_rate", kv_dtype=d, unit="fraction", **at, **n)
            add(measured, r.get(f"{d}_ttft_ms"), metric="ttft_mean", kv_dtype=d, unit="ms", **at, **n)
            add(
                computed,
                r.get(f"{d}_hit_rate_pred"),
                metric="prefix_hit_rate_predicted",
                kv_dtype=d,
                unit="fraction",
                n=1,
                **at,
            )
        if not pairs:
            continue
        paired = {"kv_dtype": other, "baseline": base, **at, **n}
        add(measured, r.get("dhit_pp"), metric="prefix_hit_rate", unit="pp", **paired, **ci(r, "dhit_pp"))
        t_ci = ci(r, "ttft_ratio")
        ratio, noise = _finite(r.get("ttft_ratio")), _finite(r.get("ttft_noise_pct"))
        det = _finite(r.get("ttft_detectable_pct"))
        if t_ci:
            t_ci["detectable"] = None if det is None else det / 100
            if ratio is not None and noise is not None:
                t_ci["beyond_noise"] = bool(
                    (t_ci["ci_high"] < 1 or t_ci["ci_low"] > 1) and abs(ratio - 1) * 100 > noise
                )
        add(measured, ratio, metric="ttft_mean", unit="ratio", **paired, **t_ci)
        add(measured, r.get("tput_ratio"), metric="output_tok_s", unit="ratio", **paired, **ci(r, "tput_ratio"))
    for k in json_records(knees):
        at = {"kv_dtype": k["kv_dtype"], "subset": k["workload"], "unit": "conversations"}
        add(computed, k.get("knee_simulated"), metric="prefix_knee_predicted", n=1, **at)
        add(measured, k.get("measured_last_held"), metric="prefix_knee_measured", n=n_units, **at)
    return rows


def replication_keys(run: Any, cells: Any, sweeps: dict[str, Any], colo: Any) -> dict[str, Any]:
    """The replication's keys of the summary: the design (``replicated``, ``engines_per_dtype``, ``arms``,
    ``primary_arm``, ``interval_over``), each arm's engine-level sweep (``sweep_by_arm``) and the co-location effect
    (``colocation``, ``colocation_resolved_cells`` of ``colocation_cells``)."""
    spec = run.spec
    return {
        "replicated": True,
        "engines_per_dtype": spec.engines,
        "arms": list(spec.arms),
        "primary_arm": spec.headline_arm,
        "interval_over": "engine pairs",
        "engines_started": len(run.starts),
        "engines_failed": sorted(k for k, e in run.starts.items() if e.get("status") != "ok"),
        "sweep_by_arm": {a: json_records(s) for a, s in sweeps.items()},
        "colocation": json_records(colo),
        "colocation_cells": len(colo),
        "colocation_resolved_cells": int(colo.resolved.sum()) if len(colo) else 0,
    }
