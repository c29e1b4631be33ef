"""Study 01's key numbers: the flat summary the notebook records and the claims audit reads
(:func:`summary_values`) and the typed summary rows (:func:`summary_rows`, :mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.serving.deltas import Metric, headline_metrics
from fp8lab.serving.run import ServingResult
from fp8lab.serving.schedule import min_requests
from fp8lab.serving.tables import latency_summary, ok_rows, throughput_table


def summary_values(
    res: ServingResult,
    deltas: pd.DataFrame,
    capacity: pd.DataFrame,
    search: pd.DataFrame,
    open_loop: pd.DataFrame,
    bandwidth: dict[str, Any] | None = None,
    fidelity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The key numbers for ``record_summary`` (flat keys, one value each; deltas as dicts)."""
    plan, a = res.plan, res.plan.baseline
    c = res.headline_concurrency
    out: dict[str, Any] = {
        "model": Path(plan.engine.model).name,
        "kv_dtypes": list(plan.kv_dtypes),
        "trials": plan.trials,
        "concurrency": list(res.concurrency),
        "headline_concurrency": c,
        "naive_concurrency": list(plan.naive_concurrency),
        "engines_ok": int((res.engines.status == "ok").sum()),
        "engines": len(res.engines),
        "engine_wall_s_total": round(float(res.engines.get("run_wall_s", pd.Series(dtype=float)).sum()), 1),
    }
    cap = capacity.set_index("kv_dtype")
    for d in plan.kv_dtypes:
        if d in cap.index and cap.loc[d].get("status") == "ok":
            out[f"capacity_tokens_{d}"] = int(cap.loc[d].kv_capacity_tokens)
            out[f"num_blocks_{d}"] = int(cap.loc[d].num_blocks)
            out[f"predicted_blocks_{d}"] = cap.loc[d].predicted_blocks
            out[f"mem_peak_gib_{d}"] = cap.loc[d].mem_peak_gib
            out[f"mem_steady_gib_{d}"] = cap.loc[d].mem_steady_gib
            dev = cap.loc[d].get("mem_device_peak_gib")
            if dev is not None and not pd.isna(dev):  # both engines on one GPU: per-engine figures are shares
                out["mem_device_peak_gib"] = max(float(dev), out.get("mem_device_peak_gib", 0.0))
                out["mem_shared_device"] = True
    for d in plan.kv_dtypes[1:]:
        if f"capacity_tokens_{d}" in out and f"capacity_tokens_{a}" in out:
            out["capacity_ratio" if len(plan.kv_dtypes) == 2 else f"capacity_ratio_{d}"] = (
                out[f"capacity_tokens_{d}"] / out[f"capacity_tokens_{a}"]
            )
    tp = throughput_table(res)
    for d in plan.kv_dtypes:
        g = tp[(tp.kv_dtype == d) & (tp.concurrency == c)]
        out[f"output_tok_s_{d}"] = g.output_tok_s.mean()
        out[f"total_tok_s_{d}"] = g.total_tok_s.mean()
        out[f"preemptions_{d}"] = g.preemptions.sum()
    closed = tp[tp.concurrency.notna()] if "concurrency" in tp else tp.iloc[0:0]
    out["preemptions_by_concurrency"] = {
        str(int(cc)): {str(d): float(g.preemptions.sum()) for d, g in gc.groupby("kv_dtype")}
        for cc, gc in closed.groupby("concurrency")
    }
    lat = latency_summary(res, by=("kv_dtype",))
    for r in lat.itertuples():
        if r.metric in ("ttft_ms", "tpot_ms", "itl_ms"):
            out[f"{r.metric.removesuffix('_ms')}_p50_ms_{r.kv_dtype}"] = r.p50
            out[f"{r.metric.removesuffix('_ms')}_p99_ms_{r.kv_dtype}"] = r.p99
    keep = (
        "delta_pct",
        "lo_pct",
        "hi_pct",
        "n",
        "label",
        "noise_floor_pct",
        "noise_floor_q25_pct",
        "noise_floor_q75_pct",
        "noise_pairs",
        "detectable_pct",
        "beyond_noise_floor",
        "a",
        "b",
    )
    out["deltas"] = {f"{r['kv_dtype']}: {r['metric']}": {k: r[k] for k in keep} for r in deltas.to_dict("records")}
    out["design"] = "paired: engines alive together, phases interleaved A B / B A by phase and trial"
    out["phase_seconds"] = plan.phase_seconds
    out["closed_loop_min_requests"] = {str(cc): min_requests(plan, cc) for cc in res.concurrency}
    ph = ok_rows(res, res.phases)
    closed = ph[ph.kind == "closed"] if len(ph) else ph
    if len(closed):
        out["closed_phase_wall_s_min"] = float(closed.wall_s.min())
        out["closed_phase_requests_min_ratio"] = float((closed.requests / closed.concurrency).min())
    head = deltas[deltas.metric == f"output tok/s @c={c}"]
    if len(head):
        h = head.iloc[0]
        out.update(
            throughput_delta_pct=h.delta_pct,
            throughput_delta_lo_pct=h.lo_pct,
            throughput_delta_hi_pct=h.hi_pct,
            throughput_delta_label=h.label,
            throughput_delta_n=int(h.n),
            throughput_detectable_pct=h.detectable_pct,
            throughput_beyond_noise=bool(h.beyond_noise_floor),
        )
    if len(head):
        out["noise_floor_pct"] = head.iloc[0].noise_floor_pct  # headline throughput: consecutive trials, same config
        out["noise_floor_iqr_pct"] = [head.iloc[0].noise_floor_q25_pct, head.iloc[0].noise_floor_q75_pct]
    rec = ok_rows(res, res.records)
    if len(rec) and "merged_deltas" in rec:
        measured = rec[rec.kind.isin(("closed", "open"))]
        out["merged_delta_requests_frac"] = float((measured.merged_deltas > 0).mean())  # 0: the client saw every token
    if len(search):
        for r in search.itertuples():
            out[f"max_concurrency_measured_{r.kv_dtype}"] = r.measured
            out[f"max_concurrency_predicted_{r.kv_dtype}"] = r.predicted
            out[f"max_concurrency_predicted_vllm_{r.kv_dtype}"] = r.predicted_vllm
            out[f"max_concurrency_censored_{r.kv_dtype}"] = bool(r.censored)
    if len(open_loop):
        out["open_loop"] = [
            {
                "kv_dtype": r.kv_dtype,
                "process": r.process,
                "requested_rate": r.requested_rate,
                "scheduled_rate": r.scheduled_rate,
                "achieved_rate": r.achieved_rate,
            }
            for r in open_loop.itertuples()
        ]
        # the sender's accuracy: achieved vs the drawn schedule (a short Poisson draw is not the requested rate)
        out["open_loop_rate_error_max"] = float((open_loop.achieved_rate / open_loop.scheduled_rate - 1).abs().max())
        out["open_loop_send_lag_max_ms"] = float(open_loop.send_lag_max_ms.max())
    if bandwidth:
        out["bandwidth_gbs"] = bandwidth.get("bandwidth_gbs")
        out["bandwidth_source"] = bandwidth.get("source")
    if fidelity:
        out["fidelity_ratio"] = fidelity.get("ratio")
        out["fidelity_within_tolerance"] = fidelity.get("within_tolerance")
        out["fidelity_round_ratios"] = fidelity.get("round_ratios")
        out["fidelity_spread_pct"] = fidelity.get("spread_pct")
        out["fidelity_resolvable"] = fidelity.get("resolvable")
    return out


#: The row metric (:data:`fp8lab.summary_table.METRICS`) of a headline metric's phase kind and column.
ROW_METRICS = {("closed", "output_tok_s"): "output_tok_s", ("naive", "output_tok_s"): "output_tok_s_no_stream"}


def _row_metric(m: Metric) -> str:
    return ROW_METRICS.get((m.kind, m.column)) or f"{m.column.removesuffix('_s')}_{m.statistic}"


def _row_setting(m: Metric) -> str:
    if m.kind == "open":
        return f"open loop {m.process} {m.rate:g}/s"
    return "closed loop, not streamed" if m.kind == "naive" else "closed loop"


def run_device(res: ServingResult) -> str | None:
    """The device the study's engines ran on, as their provenance names it (the first successful run's)."""
    for run in res.runs:
        r = run["result"]
        if r.status == "ok" and (r.provenance or {}).get("device"):
            return str(r.provenance["device"])
    return None


def summary_rows(
    res: ServingResult, deltas: pd.DataFrame, capacity: pd.DataFrame, search: pd.DataFrame
) -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from its own tables: per headline metric
    (:func:`headline_metrics`) each dtype's per-trial mean and each candidate's paired change against the baseline
    (from :func:`delta_table`: value ``delta_pct`` %, its t interval, ``n`` pairs, ``beyond_noise``, ``detectable``);
    the pooled TTFT and ITL P50/P99 at the headline concurrency (:func:`latency_summary`; ``n`` the requests, or
    the gaps); preemptions per closed-loop
    point (:func:`throughput_table`); capacity and peak memory per dtype (:func:`capacity_table`); the largest
    concurrency held without preemption where the search found the limit (:func:`capacity_search`; a censored
    search, a lower bound only, gives no row). Non-finite values give no row."""
    from fp8lab import summary_table as st

    plan, a = res.plan, res.plan.baseline
    device = run_device(res)
    model = Path(plan.engine.model).name
    common = {"study": "serving", "evidence": st.evidence_of(device, model), "device": device or "unknown"}
    common["model"] = model
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def finite(v: Any) -> bool:
        return v is not None and not pd.isna(v) and math.isfinite(float(v))

    def add(**f: Any) -> None:
        if not finite(f.get("value")):
            return
        if not (finite(f.get("ci_low")) and finite(f.get("ci_high"))):
            f["ci_low"] = f["ci_high"] = None
        if not finite(f.get("detectable")):
            f["detectable"] = None
        row = st.make_row(**common, **f)
        rows.setdefault(tuple(row[k] for k in st.KEY), row)

    by_name = {m.name: m for m in headline_metrics(res)}
    for r in deltas.to_dict("records"):
        m = by_name.get(r["metric"])
        if m is None:
            continue
        where = {"metric": _row_metric(m), "setting": _row_setting(m), "concurrency": m.concurrency}
        add(**where, kv_dtype=a, value=r["a"], n=int(r["n_a"]), unit=r["unit"])
        add(**where, kv_dtype=r["kv_dtype"], value=r["b"], n=int(r["n_b"]), unit=r["unit"])
        add(
            **where,
            kv_dtype=r["kv_dtype"],
            baseline=a,
            value=r["delta_pct"],
            ci_low=r["lo_pct"],
            ci_high=r["hi_pct"],
            n=int(r["n"]),
            unit="%",
            beyond_noise=bool(r["beyond_noise_floor"]),
            detectable=r["detectable_pct"],
        )
    lat = latency_summary(res, by=("kv_dtype",))
    for r in lat.itertuples():
        if r.metric in ("ttft_ms", "itl_ms"):
            for q in ("p50", "p99"):
                add(
                    metric=f"{r.metric.removesuffix('_ms')}_{q}_pooled",
                    setting="closed loop",
                    concurrency=res.headline_concurrency,
                    kv_dtype=r.kv_dtype,
                    value=getattr(r, q),
                    n=int(r.n),
                    unit="ms",
                )
    tp = throughput_table(res)
    if len(tp) and "concurrency" in tp:
        for (d, c), g in tp[tp.concurrency.notna()].groupby(["kv_dtype", "concurrency"]):
            add(
                metric="preemptions",
                setting="closed loop",
                concurrency=int(c),
                kv_dtype=d,
                value=float(g.preemptions.sum()),
                n=len(g),
                unit="preemptions",
            )
    n_eng = res.engines[res.engines.status == "ok"].groupby("kv_dtype").size() if len(res.engines) else {}
    for r in capacity.to_dict("records"):
        if r.get("status") != "ok":
            continue
        d = r["kv_dtype"]
        for metric, unit in (("kv_capacity_tokens", "tokens"), ("num_blocks", "blocks"), ("mem_peak_gib", "GiB")):
            if r.get(metric) is not None:
                n = int(n_eng.get(d, 1)) if metric == "mem_peak_gib" else 1
                add(metric=metric, setting="engine", kv_dtype=d, value=r[metric], n=n, unit=unit)
    shape = plan.capacity_shape
    for r in search.to_dict("records") if len(search) else []:
        if r["measured"] is not None and not r["censored"] and not pd.isna(r["measured"]):
            add(
                metric="max_concurrency_no_preemption",
                setting=f"capacity search, {shape[0]} in + {shape[1]} out" if shape else "capacity search",
                kv_dtype=r["kv_dtype"],
                value=int(r["measured"]),
                n=1,
                unit="requests",
            )
    return list(rows.values())
