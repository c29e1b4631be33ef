"""Study 01's tables from a :class:`~fp8lab.serving.run.ServingResult` (pure functions of its stored records):
engines, capacity and the capacity search, throughput per phase, latency percentiles and ITL, the open loop, KV
usage over time, and the roofline bound beside the measured ITL (:mod:`fp8lab.roofline`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab import kvmath, metrics, roofline
from fp8lab.serving.run import ServingResult
from fp8lab.serving.schedule import concurrency_limit
from fp8lab.serving.spec import ServingPlan
from fp8lab.specs import Request
from fp8lab.workloads import with_arrivals

ENGINE_COLUMNS = [
    "order",
    "trial",
    "kv_dtype",
    "status",
    "error",
    "engine_start_s",
    "run_wall_s",
    "num_blocks",
    "block_size",
    "kv_capacity_tokens",
]


def engine_table(res: ServingResult) -> pd.DataFrame:
    """One row per engine run, in run order: status, error, start-up and run time, KV blocks."""
    return res.engines.reindex(columns=ENGINE_COLUMNS)


def require_ok(res: ServingResult) -> None:
    """Raise, naming every failure, unless each kv dtype has at least one engine that ran."""
    ok = set(res.engines[res.engines.status == "ok"].kv_dtype) if len(res.engines) else set()
    missing = [d for d in res.plan.kv_dtypes if d not in ok]
    if missing:
        errs = "; ".join(f"{r.kv_dtype} trial {r.trial}: {r.status}: {r.error}" for r in res.failed.itertuples())
        raise RuntimeError(f"no successful engine for kv_cache_dtype {', '.join(missing)} ({errs})")


def ok_rows(res: ServingResult, df: pd.DataFrame) -> pd.DataFrame:
    if df.empty or res.engines.empty:
        return df
    ok = res.engines[res.engines.status == "ok"][["kv_dtype", "trial"]]
    return df.merge(ok, on=["kv_dtype", "trial"], how="inner")


def capacity_table(res: ServingResult) -> pd.DataFrame:
    """One row per kv dtype (its first successful engine): ``num_blocks``, ``block_size``,
    ``kv_capacity_tokens``, ``predicted_blocks`` (:func:`fp8lab.kvmath.predict_num_blocks` on the engine's
    budget and block size, when the budget is known), ``ratio_vs_baseline`` (capacity / the baseline's)
    and memory (``mem_peak_gib``, ``mem_steady_gib``: GPU used memory, or the engine's RSS on CPU; where both
    engines shared one GPU, each engine's own share (:func:`attribute_shared_memory`) and ``mem_device_peak_gib``,
    the device's peak with both)."""
    e = res.engines[res.engines.status == "ok"] if len(res.engines) else res.engines
    rows = []
    for d in res.plan.kv_dtypes:
        g = e[e.kv_dtype == d] if len(e) else e
        if g.empty:
            rows.append({"kv_dtype": d, "status": "failed"})
            continue
        r = g.sort_values("trial").iloc[0]
        budget = r.get("kv_budget_bytes")
        pred = None
        if budget is not None and not (isinstance(budget, float) and math.isnan(budget)):
            hybrid = bool(r.get("hybrid_kv_cache_manager", r.get("mem_kind", "gpu") == "gpu"))
            pred = int(
                kvmath.predict_num_blocks(
                    res.plan.engine.model,
                    int(budget),
                    int(r.block_size),
                    d,
                    res.plan.engine.tensor_parallel_size,
                    hybrid_kv_cache_manager=hybrid,
                )
            )
        rows.append(
            {
                "kv_dtype": d,
                "status": "ok",
                "num_blocks": int(r.num_blocks),
                "block_size": int(r.block_size),
                "kv_capacity_tokens": int(r.kv_capacity_tokens),
                "predicted_blocks": pred,
                "kv_budget_gib": (budget / 2**30) if pred is not None else None,
                "mem_peak_gib": g.mem_peak_bytes.max() / 2**30 if "mem_peak_bytes" in g else None,
                "mem_steady_gib": g.mem_steady_bytes.median() / 2**30 if "mem_steady_bytes" in g else None,
                "mem_device_peak_gib": (
                    g.mem_device_peak_bytes.max() / 2**30 if "mem_device_peak_bytes" in g else None
                ),
                "engine_start_s": g.engine_start_s.median() if "engine_start_s" in g else None,
            }
        )
    df = pd.DataFrame(rows)
    if "kv_capacity_tokens" in df:
        base = df.loc[df.kv_dtype == res.plan.baseline, "kv_capacity_tokens"]
        df["ratio_vs_baseline"] = (
            df.kv_capacity_tokens / float(base.iloc[0]) if len(base) and base.notna().all() else np.nan
        )
    return df


def throughput_table(res: ServingResult, kinds: Sequence[str] = ("closed",)) -> pd.DataFrame:
    """One row per engine and phase of ``kinds``: ``kv_dtype, trial, phase, concurrency, rate``, tokens/s
    (``input_tok_s``, ``output_tok_s``, ``total_tok_s``), ``requests_s``, ``preemptions``,
    ``kv_usage_peak`` and ``merged_deltas`` (stream outputs that carried several tokens because the client
    fell behind: their gaps are split evenly, so ITL is smeared there; 0 means every token was seen)."""
    ph = ok_rows(res, res.phases)
    if ph.empty:
        return ph
    cols = [
        "kv_dtype",
        "trial",
        "phase",
        "kind",
        "concurrency",
        "process",
        "rate",
        "requests",
        "wall_s",
        "input_tok_s",
        "output_tok_s",
        "total_tok_s",
        "requests_s",
        "preemptions_any",
        "kv_usage_peak",
        "achieved_rate",
        "merged_deltas",
    ]
    out = ph[ph.kind.isin(kinds)][[c for c in cols if c in ph]].rename(columns={"preemptions_any": "preemptions"})
    return out.sort_values(["kind", "concurrency", "rate", "kv_dtype", "trial"]).reset_index(drop=True)


def phase_records(
    res: ServingResult, kind: str, concurrency: int | None = None, process: str | None = None, rate: float | None = None
) -> pd.DataFrame:
    """The request records of the successful engines for one kind of phase (optionally one sweep point)."""
    r = ok_rows(res, res.records)
    if r.empty:
        return r
    m = r.kind == kind
    if concurrency is not None:
        m &= r.concurrency == concurrency
    if process is not None:
        m &= r.process == process
    if rate is not None:
        m &= np.isclose(r.rate.astype(float), rate)
    return r[m]


def latency_summary(
    res: ServingResult,
    kind: str = "closed",
    concurrency: int | None = None,
    by: Sequence[str] = ("kv_dtype", "cls"),
    **sel: Any,
) -> pd.DataFrame:
    """TTFT, TPOT (excluding the first token), ITL (every gap) and E2E in ms: ``n, mean, p50, p95, p99``
    per kv dtype and request class, pooled over trials (:func:`fp8lab.metrics.latency_table`)."""
    if kind == "closed" and concurrency is None:
        concurrency = res.headline_concurrency
    return metrics.latency_table(phase_records(res, kind, concurrency, **sel), by=by)


def itl_frame(res: ServingResult, kind: str = "closed", concurrency: int | None = None, **sel: Any) -> pd.DataFrame:
    """Every inter-token gap (``itl_ms``) of one phase kind / sweep point, with ``kv_dtype, trial, cls``."""
    if kind == "closed" and concurrency is None:
        concurrency = res.headline_concurrency
    df = metrics.explode_itl(phase_records(res, kind, concurrency, **sel), keep=("kv_dtype", "trial", "cls", "request"))
    df["itl_ms"] = df["itl_s"] * 1e3
    return df


def open_loop_schedule(plan: ServingPlan, process: str, rate: float) -> np.ndarray:
    """The scheduled send times (s) of one open-loop phase, exactly as :func:`build_phases` drew them."""
    i = list(plan.rates).index(rate)
    dummy = [Request(prompt_token_ids=(1,), max_tokens=1)] * plan.open_loop_requests
    return np.array([r.arrival_s for r in with_arrivals(dummy, rate, process, seed=plan.seed + 100 + i)])  # type: ignore[arg-type]


def open_loop_table(res: ServingResult) -> pd.DataFrame:
    """Open-loop phases, per kv dtype, process and rate: ``requested_rate``; ``scheduled_rate`` (of the
    drawn schedule: a Poisson draw of few requests deviates from the requested rate by chance);
    ``achieved_rate`` (of the actual send times, mean over trials); ``send_lag_p50_ms`` /
    ``send_lag_max_ms`` (actual minus scheduled send time: a client that falls behind, e.g. one that
    does not read its streams, shows up here); output tokens/s; TTFT and TPOT P50/P99 in ms (pooled over
    trials); preemptions."""
    ph = ok_rows(res, res.phases)
    rec = phase_records(res, "open")
    if ph.empty or rec.empty:
        return pd.DataFrame()
    rows = []
    for (d, proc, rate), g in ph[ph.kind == "open"].groupby(["kv_dtype", "process", "rate"], sort=True):
        rr = rec[(rec.kv_dtype == d) & (rec.process == proc) & np.isclose(rec.rate, rate)]
        sched = open_loop_schedule(res.plan, proc, rate)
        lag = (rr.sent_s.to_numpy() - sched[rr.request.to_numpy().astype(int)]) * 1e3
        tt, tp = metrics.percentiles(rr.ttft_s * 1e3), metrics.percentiles(rr.tpot_s * 1e3)
        rows.append(
            {
                "kv_dtype": d,
                "process": proc,
                "requested_rate": rate,
                "scheduled_rate": metrics.achieved_rate(sched),
                "achieved_rate": g.achieved_rate.mean(),
                "send_lag_p50_ms": float(np.median(lag)),
                "send_lag_max_ms": float(np.max(lag)),
                "output_tok_s": g.output_tok_s.mean(),
                "ttft_p50_ms": tt["p50"],
                "ttft_p99_ms": tt["p99"],
                "tpot_p50_ms": tp["p50"],
                "tpot_p99_ms": tp["p99"],
                "preemptions": g.preemptions_any.sum(),
                "trials": g.trial.nunique(),
            }
        )
    return pd.DataFrame(rows)


def capacity_search(res: ServingResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ladder and its outcome.

    ``ladder``: one row per dtype and concurrency tried: ``preemptions`` (the engine's counter over the
    phase, or the requests' own counts if higher), ``kv_usage_peak``, ``sustained`` (no preemption and
    every request completed).
    ``result``: one row per dtype: ``measured`` (the largest concurrency sustained with every smaller
    one sustained too), ``first_preempted``, ``censored`` (True when even the top of the ladder was
    sustained: the limit is at least ``measured``), ``predicted`` (the KV formula on the engine's blocks,
    ``num_blocks // ceil((input + output) / block_size)``) and ``predicted_vllm`` (the same with vLLM's
    block accounting: one block of the pool is its reserved null block, and the last generated token's
    KV is never written: ``(num_blocks - 1) // ceil((input + output - 1) / block_size)``).
    """
    ph = ok_rows(res, res.phases)
    shape = res.plan.capacity_shape
    if ph.empty or shape is None or not (ph.kind == "capacity").any():
        return pd.DataFrame(), pd.DataFrame()
    cap = ph[ph.kind == "capacity"].copy()
    cap["sustained"] = (cap.preemptions_any == 0) & (cap.completed == cap.requests)
    ladder = cap[
        [
            "kv_dtype",
            "trial",
            "concurrency",
            "requests",
            "completed",
            "preemptions_any",
            "kv_usage_peak",
            "sustained",
            "wall_s",
        ]
    ].rename(columns={"preemptions_any": "preemptions"})
    ladder = ladder.sort_values(["kv_dtype", "trial", "concurrency"]).reset_index(drop=True)
    rows = []
    cap_eng = res.engines[res.engines.status == "ok"]
    for d, g in ladder.groupby("kv_dtype", sort=False):
        g = g.groupby("concurrency").sustained.all().sort_index()
        measured, first_fail = None, None
        for c, ok in g.items():
            if ok and first_fail is None:
                measured = int(c)
            elif not ok and first_fail is None:
                first_fail = int(c)
        e = cap_eng[cap_eng.kv_dtype == d].sort_values("trial").iloc[0]
        n, bs = int(e.num_blocks), int(e.block_size)
        total = sum(shape)
        rows.append(
            {
                "kv_dtype": d,
                "capacity_shape": f"{shape[0]} in + {shape[1]} out",
                "num_blocks": n,
                "block_size": bs,
                "measured": measured,
                "first_preempted": first_fail,
                "censored": first_fail is None,
                "predicted": concurrency_limit(n, bs, total),
                "predicted_vllm": max(1, (n - 1) // max(1, math.ceil((total - 1) / bs))),
            }
        )
    result = pd.DataFrame(rows)
    result["measured_vs_predicted"] = result.measured / result.predicted
    return ladder, result


def roofline_measured(
    res: ServingResult, kinds: Sequence[str] = ("closed", "capacity"), bins: int = 12, min_gaps: int = 20
) -> pd.DataFrame:
    """Measured ITL against the KV tokens each decode step read (:func:`fp8lab.metrics.decode_steps`,
    per engine and phase), binned on a log scale: per dtype and bin the median ITL (ms), the median batch
    and the number of gaps (bins with fewer than ``min_gaps`` are dropped). Steps that also ran another request's prefill are included (they are the
    ITL spikes); the median is robust to them."""
    rec = ok_rows(res, res.records)
    if rec.empty:
        return pd.DataFrame()
    rec = rec[rec.kind.isin(kinds)]
    steps = []
    for (d, _trial, _phase), g in rec.groupby(["kv_dtype", "trial", "phase"]):
        s = metrics.decode_steps(g)
        s["kv_dtype"] = d
        steps.append(s)
    if not steps:
        return pd.DataFrame()
    s = pd.concat(steps, ignore_index=True)
    s = s[s.kv_tokens > 0]
    edges = np.unique(np.geomspace(max(1.0, s.kv_tokens.min()), s.kv_tokens.max() * 1.0001, bins + 1))
    s["bin"] = np.clip(np.searchsorted(edges, s.kv_tokens, side="right") - 1, 0, len(edges) - 2)
    out = (
        s.groupby(["kv_dtype", "bin"])
        .agg(
            kv_tokens=("kv_tokens", "median"),
            itl_ms=("itl_s", "median"),
            batch=("batch", "median"),
            n=("itl_s", "size"),
        )
        .reset_index()
    )
    out["itl_ms"] *= 1e3
    return out[out.n >= min_gaps].reset_index(drop=True)


def roofline_tables(
    res: ServingResult,
    bandwidth_gbs: float,
    context_lens: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> dict[str, pd.DataFrame]:
    """The bound and the measurement side by side.

    ``grid``: :func:`fp8lab.roofline.bound_grid` over ``context_lens`` x ``batch_sizes`` (defaults: the
    mix's input lengths and the concurrency sweep), with ``itl_bound_ms`` and, per (batch, context), the
    ``fp8_speedup_bound`` (baseline bound / fp8 bound). ``measured``: :func:`roofline_measured` with the
    bound at each bin's KV tokens (``itl_bound_ms``) and ``bound_over_measured`` (1.0 = at the bound)."""
    plan = res.plan
    model, tp = plan.engine.model, plan.engine.tensor_parallel_size
    context_lens = list(context_lens or sorted({c.input_len + c.output_len // 2 for c in plan.mix}))
    batch_sizes = list(batch_sizes or res.concurrency)
    grid = pd.DataFrame(roofline.bound_grid(model, bandwidth_gbs, context_lens, batch_sizes, plan.kv_dtypes, tp))
    grid["itl_bound_ms"] = grid.itl_bound_s * 1e3
    base = grid[grid.kv_dtype == plan.baseline].set_index(["batch", "context_len"]).itl_bound_s
    grid["speedup_bound_vs_baseline"] = grid.apply(lambda r: base.loc[(r.batch, r.context_len)] / r.itl_bound_s, axis=1)
    meas = roofline_measured(res)
    if len(meas):
        w = roofline.weight_bytes_per_step(model, tp=tp)
        kvb = {d: kvmath.kv_bytes_per_token(model, d, tp) for d in plan.kv_dtypes}
        meas["itl_bound_ms"] = [
            roofline.itl_lower_bound(w, t, kvb[d], bandwidth_gbs * 1e9) * 1e3
            for d, t in zip(meas.kv_dtype, meas.kv_tokens, strict=True)
        ]
        meas["bound_over_measured"] = meas.itl_bound_ms / meas.itl_ms
    return {"grid": grid, "measured": meas}


def kv_usage_timeline(res: ServingResult, trial: int = 0) -> pd.DataFrame:
    """The sampled KV-cache usage (fraction), running / waiting requests and memory of each dtype's engine
    of one trial, with ``t_s`` from the engine's start of sampling."""
    s = res.samples
    if s.empty:
        return s
    return s[(s.trial == trial) & (s.phase != "start")].copy()
