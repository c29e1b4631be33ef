"""Study 01 with the engine as the experimental unit (issue 35, as Study 06: :mod:`fp8lab.decode.replication`).

The design (:mod:`fp8lab.engine.schedule`): every KV dtype is started ``engines`` times (rounds) in ABBA order, in
a co-located arm (a round's engines alive together, their phases interleaved A B / B A as in the one-engine design:
:func:`~fp8lab.serving.paired.run_paired` on that engine set) and/or a solo arm (one engine at a time, at vLLM's
default ``gpu_memory_utilization``). Every engine serves ``trials`` trials of the same phases on the same requests
(seeded by the plan, not the engine). Each engine set is stored as its own runs (the set is in their key), so a cut
run resumes set by set.

**Statistics**: a metric's value per trial is taken as before (a phase's throughput; a latency percentile of that
trial's own requests or gaps), then averaged over the engine's trials: one value per engine (:func:`engine_values`).
The fp8-vs-baseline delta is paired by round (round ``k``'s engines of the two dtypes) with a Student-t interval on
the log ratios over the engine pairs (:func:`engine_delta_table`, :func:`~fp8lab.serving.deltas.delta_row`: ``n`` =
engine pairs; its noise floor is the change between consecutive engines of one dtype): the two-stage estimator of a
nested design with the engine as a random effect (the reasoning and references are
:mod:`fp8lab.decode.replication`'s). Beside it, ``trial_level_half_width_pct``: the half-width the trials would
claim were they independent pairs (what pseudo-replication reports). The co-location effect
(:func:`colocation_table`): per metric and round, the co-located arm's log fp8/auto ratio minus the solo arm's, a t
interval over rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab import stats
from fp8lab.serving.deltas import DELTA_COLUMNS, Metric, delta_row, headline_metrics, metric_samples, per_trial

#: The columns :func:`engine_delta_table` adds to :data:`~fp8lab.serving.deltas.DELTA_COLUMNS`.
ENGINE_DELTA_COLUMNS = ["arm", "n_engines", "trials_per_engine", "trial_level_half_width_pct"]


def engine_values(res: Any, metric_list: Sequence[Metric] | None = None) -> pd.DataFrame:
    """One row per engine and metric of one arm's result: ``value`` = the mean over the engine's trials of the
    metric's per-trial value (ms for latencies, tok/s for throughput), ``trials`` counted, ``per_trial`` listed."""
    metric_list = list(metric_list) if metric_list is not None else headline_metrics(res)
    per = res.plan.trials
    rows = []
    for m in metric_list:
        scale = 1.0 if m.level == "phase" else 1e3
        for d in res.plan.kv_dtypes:
            v, t = metric_samples(res, m, d)
            pt = per_trial(v, t, m.statistic)
            by: dict[int, list[float]] = {}
            for trial, val in sorted(pt.items()):
                by.setdefault(trial // per, []).append(val * scale)
            for rnd, vals in by.items():
                rows.append(
                    {
                        "metric": m.name,
                        "kv_dtype": d,
                        "round": rnd,
                        "value": float(np.mean(vals)),
                        "trials": len(vals),
                        "per_trial": [float(x) for x in vals],
                        "unit": "tok/s" if m.level == "phase" else "ms",
                    }
                )
    return pd.DataFrame(rows, columns=["metric", "kv_dtype", "round", "value", "trials", "per_trial", "unit"])


def engine_delta_table(
    res: Any, arm: str, metric_list: Sequence[Metric] | None = None, trial_deltas: pd.DataFrame | None = None
) -> pd.DataFrame:
    """:func:`~fp8lab.serving.deltas.delta_table`'s columns with the engine as the unit: per headline metric and
    non-baseline dtype, :func:`~fp8lab.serving.deltas.delta_row` of the per-engine values (:func:`engine_values`)
    paired by round: ``n`` = ``n_engines`` = engine pairs, ``a_per_trial`` / ``b_per_trial`` the per-engine values
    (in round order). ``trial_level_half_width_pct``: the half-width of the same delta over the trials as if
    independent (``trial_deltas``, :func:`~fp8lab.serving.deltas.delta_table` of this arm)."""
    metric_list = list(metric_list) if metric_list is not None else headline_metrics(res)
    ev = engine_values(res, metric_list)
    a_dt = res.plan.baseline
    rows = []
    for m in metric_list:
        g = ev[ev.metric == m.name]
        pa = {int(r["round"]): r["value"] for _, r in g[g.kv_dtype == a_dt].iterrows()}
        for b_dt in res.plan.kv_dtypes[1:]:
            pb = {int(r["round"]): r["value"] for _, r in g[g.kv_dtype == b_dt].iterrows()}
            row = delta_row(m.name, pa, pb, m.higher_is_better)
            hw = math.nan
            if trial_deltas is not None and len(trial_deltas):
                t = trial_deltas[(trial_deltas.metric == m.name) & (trial_deltas.kv_dtype == b_dt)]
                if len(t) and np.isfinite(t.iloc[0].lo_pct):
                    hw = float((t.iloc[0].hi_pct - t.iloc[0].lo_pct) / 2)
            rows.append(
                {
                    **row,
                    "kind": m.kind,
                    "baseline": a_dt,
                    "kv_dtype": b_dt,
                    "unit": "tok/s" if m.level == "phase" else "ms",
                    "arm": arm,
                    "n_engines": row["n"],
                    "trials_per_engine": res.plan.trials,
                    "trial_level_half_width_pct": hw,
                }
            )
    return pd.DataFrame(rows, columns=DELTA_COLUMNS + ENGINE_DELTA_COLUMNS)


def colocation_table(by_arm: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Does co-location change fp8's effect? Per metric and non-baseline dtype, from each arm's
    :func:`engine_delta_table`: per round the co-located arm's log(b / a) minus the solo arm's; ``effect_pct`` =
    100 (exp(mean) - 1) with its 95% t interval over the rounds both arms ran (``n_rounds``), ``resolved`` when it
    excludes 0; each arm's delta beside it."""
    if not {"colocated", "solo"} <= set(by_arm):
        return pd.DataFrame()
    co, so = by_arm["colocated"], by_arm["solo"]
    rows = []
    for r in co.itertuples():
        s = so[(so.metric == r.metric) & (so.kv_dtype == r.kv_dtype)]
        if s.empty:
            continue
        s = s.iloc[0]
        n = min(len(r.a_per_trial), len(r.b_per_trial), len(s.a_per_trial), len(s.b_per_trial))
        d = [
            math.log(r.b_per_trial[k] / r.a_per_trial[k]) - math.log(s.b_per_trial[k] / s.a_per_trial[k])
            for k in range(n)
            if min(r.a_per_trial[k], r.b_per_trial[k], s.a_per_trial[k], s.b_per_trial[k]) > 0
        ]
        i = stats.t_interval(d)
        ok = i.n > 1
        pct = lambda v: 100.0 * (math.exp(v) - 1.0)  # noqa: E731
        rows.append(
            {
                "metric": r.metric,
                "kv_dtype": r.kv_dtype,
                "colocated_delta_pct": r.delta_pct,
                "solo_delta_pct": s.delta_pct,
                "effect_pct": pct(i.estimate) if i.n else math.nan,
                "effect_ci_low_pct": pct(i.lo) if ok else None,
                "effect_ci_high_pct": pct(i.hi) if ok else None,
                "n_rounds": i.n,
                "resolved": bool(ok and (i.lo > 0 or i.hi < 0)),
            }
        )
    return pd.DataFrame(rows)


def summary_keys(res: Any, by_arm: dict[str, pd.DataFrame], colo: pd.DataFrame) -> dict[str, Any]:
    """The replication's summary keys: the design, each arm's engine-level deltas (``deltas_by_arm``: metric ->
    delta, interval, n), the co-location effect and how many metrics it resolves."""
    plan = res.plan

    def rec(df: pd.DataFrame) -> list[dict[str, Any]]:
        keep = ["metric", "kv_dtype", "delta_pct", "lo_pct", "hi_pct", "n", "label", "trial_level_half_width_pct"]
        out = []
        for r in df[keep].to_dict("records") if len(df) else []:
            out.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()})
        return out

    colo_rec = []
    for r in colo.to_dict("records") if len(colo) else []:
        colo_rec.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()})
    failed = res.engines[res.engines.status != "ok"] if len(res.engines) else res.engines
    return {
        "replicated": True,
        "engines_per_dtype": plan.engines,
        "arms": list(plan.arms),
        "primary_arm": plan.headline_arm,
        "interval_over": "engine pairs",
        "trials_per_engine": plan.trials,
        "deltas_by_arm": {a: rec(d) for a, d in by_arm.items()},
        "colocation": colo_rec,
        "colocation_metrics": len(colo_rec),
        "colocation_resolved": int(sum(1 for r in colo_rec if r["resolved"])),
        "engines_failed": sorted({str(e) for e in failed.get("engine", pd.Series(dtype=str))}) if len(failed) else [],
    }


def verdict_lines(s: dict[str, Any]) -> list[str]:
    """The replication's bullets: n and the level of every interval, and whether co-location matters."""
    arms = " and ".join(s["arms"])
    out = [
        f"- **Replication.** {s['engines_per_dtype']} fresh engines per dtype and arm ({arms}), started in ABBA "
        f"order, {s['trials_per_engine']} trial(s) each; every interval below is a t interval over n = "
        f"{s['engines_per_dtype']} engine pairs (each engine's trials averaged first), not over trials inside one "
        f"engine. The headline is the {s['primary_arm']} arm's"
        + (
            " (one engine at a time at vLLM's default memory setting, what a user deploys)."
            if s["primary_arm"] == "solo"
            else "."
        )
    ]
    if s.get("engines_failed"):
        out.append(f"- **Engines that failed:** {', '.join(s['engines_failed'])}.")
    colo = s.get("colocation") or []
    if colo:
        res = [r for r in colo if r["resolved"]]
        out.append(
            f"- **Co-location** (the co-located arm's fp8-vs-baseline ratio over the solo arm's, per round, t interval "
            f"over n = {colo[0]['n_rounds']} rounds): resolved for {len(res)} of {len(colo)} metrics"
            + (
                ": "
                + "; ".join(
                    f"{r['metric']} {r['effect_pct']:+.1f}% [{r['effect_ci_low_pct']:+.1f}, {r['effect_ci_high_pct']:+.1f}]"
                    for r in res
                )
                + ". Co-location matters there: read the solo arm."
                if res
                else ". No metric shows that co-location changes fp8's effect at this n."
            )
        )
    return out
