"""Run (or load) Study 01: :func:`run_study` -> :class:`ServingResult`, the plan's engine runs collected into tidy
frames (requests, phases, engines, samples); :func:`attribute_shared_memory` splits one GPU's memory between the
engines of the paired design."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fp8lab import metrics
from fp8lab.serving.estimate import estimate_seconds
from fp8lab.serving.paired import run_paired
from fp8lab.serving.schedule import concurrency_limit, phase_meta, predicted_blocks, resolve_concurrency
from fp8lab.serving.spec import STUDY, ServingPlan, default_block_size


@dataclass
class ServingResult:
    """What :func:`run_study` produced: the plan, one entry per engine run (``runs``: trial, kv_dtype,
    order, result), the closed-loop sweep and capacity predictions it used, and tidy frames:
    ``records`` (one row per request, with ``kv_dtype, trial, kind, concurrency, process, rate``),
    ``phases`` (one row per engine and phase), ``engines`` (one row per engine) and ``samples``
    (KV usage and memory over time)."""

    plan: ServingPlan
    runs: list[dict[str, Any]]
    concurrency: tuple[int, ...]
    blocks: dict[str, tuple[int, int]]
    records: pd.DataFrame = field(default_factory=pd.DataFrame)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)
    samples: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_s: float = 0.0
    arm_results: dict[str, ServingResult] = field(default_factory=dict)  # a replicated run: each arm's own result

    @property
    def failed(self) -> pd.DataFrame:
        return self.engines[self.engines.status != "ok"] if len(self.engines) else self.engines

    @property
    def headline_concurrency(self) -> int:
        return max(self.concurrency)


def _block_info(plan: ServingPlan, study: str, runner: Callable[..., Any]) -> dict[str, tuple[int, int]]:
    """``{kv_dtype: (num_blocks, block_size)}``: predicted when the KV budget is fixed, else read from
    an engine started once per dtype with no requests (cached like any run)."""
    out = {}
    for d in plan.kv_dtypes:
        spec = plan.spec_for(d)
        bs = spec.block_size or default_block_size()
        n = predicted_blocks(spec, bs)
        if n is None:
            res = runner(spec, (), study=study)
            if res.status != "ok":
                raise RuntimeError(f"capacity probe for kv_cache_dtype={d} failed ({res.status}): {res.error}")
            n, bs = int(res.engine["num_blocks"]), int(res.engine["block_size"])
        out[d] = (int(n), int(bs))
    return out


def run_study(
    plan: ServingPlan,
    study: str = STUDY,
    runner: Callable[..., Any] | None = None,
    progress: bool = True,
    engine_factory: Callable[..., Any] | None = None,
) -> ServingResult:
    """Run (or load) the paired study: one engine per kv dtype, both alive at once, phases interleaved by
    :func:`paired_schedule` (:func:`run_paired`), and collect the tidy frames.

    ``runner`` replaces :func:`fp8lab.engine.results.run_cached` for the capacity probe of an engine without a fixed
    KV budget, ``engine_factory`` the engine processes (see :func:`run_paired`). A failed engine stays in ``engines`` with its status and error; the analyses use the engines
    that ran.
    """
    if runner is None:
        from fp8lab.engine.results import run_cached as runner
    t0 = time.perf_counter()
    blocks = _block_info(plan, study, runner)
    conc = resolve_concurrency(plan, blocks)
    cap_pred = {}
    if plan.capacity_shape is not None:
        cap_pred = {d: concurrency_limit(n, bs, sum(plan.capacity_shape)) for d, (n, bs) in blocks.items()}
    if progress:
        est = estimate_seconds(plan, conc)
        print(
            f"plan: {len(plan.kv_dtypes)} engines alive together, {plan.trials} trials, closed loop at c={list(conc)}, "
            f"estimate {est.seconds.iloc[-1] / 60:.1f} min",
            flush=True,
        )
    if plan.replicated:  # issue 35: fresh engines per dtype in ABBA order, per arm; the headline arm's result
        from fp8lab.serving.paired import run_sets

        runs = run_sets(plan, study, conc, cap_pred, progress, engine_factory)
        arms: dict[str, ServingResult] = {}
        for arm in plan.arms:
            mine = [r for r in runs if r["arm"] == arm]
            for rnd in {r["round"] for r in mine} if arm == "colocated" else ():  # a co-located set shares a GPU
                attribute_shared_memory([r for r in mine if r["round"] == rnd])
            arms[arm] = ServingResult(plan=plan, runs=mine, concurrency=conc, blocks=blocks)
            _collect(arms[arm])
        out = arms[plan.headline_arm]
        out.arm_results = arms
        out.wall_s = time.perf_counter() - t0
        return out
    runs = run_paired(plan, study, conc, cap_pred, progress, engine_factory)
    attribute_shared_memory(runs)
    out = ServingResult(plan=plan, runs=runs, concurrency=conc, blocks=blocks)
    _collect(out)
    out.wall_s = time.perf_counter() - t0
    return out


def attribute_shared_memory(runs: list[dict[str, Any]]) -> None:
    """Per-engine memory where the engines of the paired design shared one GPU (``mem_kind`` ``gpu``: NVML
    reads the whole device, so every engine's samples hold both engines' memory). In place, on each run's
    ``result.engine``: ``mem_device_peak_bytes`` keeps the device's peak (both engines), ``mem_shared_device``
    is set, and ``mem_peak_bytes`` / ``mem_steady_bytes`` become this engine's own: what the device gained
    over its start (``mem_after_start_bytes - mem_baseline_bytes``) plus what the device gained after the last
    engine started (an upper bound: that growth is counted to each engine). Engines measured alone, or
    on CPU (each engine's own resident memory), are left as they are."""
    facts = [r["result"].engine for r in runs if r["result"].engine]
    gpu = [
        f
        for f in facts
        if f.get("mem_kind") == "gpu"
        and f.get("mem_after_start_bytes") is not None
        and f.get("mem_baseline_bytes") is not None
    ]
    if len({r["kv_dtype"] for r in runs}) < 2 or len(gpu) < 2 or any(f.get("mem_shared_device") for f in gpu):
        return
    all_started = max(float(f["mem_after_start_bytes"]) for f in gpu)
    for f in gpu:
        own = float(f["mem_after_start_bytes"]) - float(f["mem_baseline_bytes"])
        peak = f.get("mem_peak_bytes")
        steady = f.get("mem_steady_bytes")
        f["mem_device_peak_bytes"] = peak
        f["mem_shared_device"] = True
        f["mem_engine_start_bytes"] = own
        f["mem_peak_bytes"] = own + max(0.0, float(peak) - all_started) if peak is not None else own
        f["mem_steady_bytes"] = own + max(0.0, float(steady) - all_started) if steady is not None else own


def _collect(res: ServingResult) -> None:
    recs, phases, engines, samples = [], [], [], []
    for run in res.runs:
        r, key = run["result"], {"kv_dtype": run["kv_dtype"], "trial": run["trial"], "order": run["order"]}
        key |= {k: run[k] for k in ("arm", "round", "engine") if k in run}  # a replicated run's engine
        engines.append(
            {
                **key,
                "status": r.status,
                "error": r.error,
                "run_dir": str(r.run_dir or ""),
                **{k: v for k, v in (r.engine or {}).items() if not isinstance(v, (list, dict))},
            }
        )
        if len(r.records):
            df = r.records.copy()
            for k, v in key.items():
                df[k] = v
            recs.append(df)
        for name, ph in (r.phases or {}).items():
            phases.append({**key, "phase": name, **phase_meta(name), **ph})
        if len(r.samples):
            s = r.samples.copy()
            for k, v in key.items():
                s[k] = v
            samples.append(s)
    res.engines = pd.DataFrame(engines)
    res.samples = pd.concat(samples, ignore_index=True) if samples else pd.DataFrame()
    rec = pd.concat(recs, ignore_index=True) if recs else pd.DataFrame()
    if len(rec):
        meta = pd.DataFrame([{"phase": p, **phase_meta(p)} for p in rec.phase.unique()])
        rec = rec.merge(meta, on="phase", how="left")
    res.records = rec
    ph = pd.DataFrame(phases)
    if len(ph):
        tp = ph.apply(lambda r: metrics.throughput(r.prompt_tokens, r.output_tokens, r.wall_s, r.requests), axis=1)
        ph = pd.concat([ph, pd.DataFrame(list(tp), index=ph.index)], axis=1)
        if len(rec):
            key = ["kv_dtype", "trial", "phase"]
            g = rec.groupby(key)
            extra = pd.DataFrame(
                {
                    "achieved_rate": g["sent_s"].apply(metrics.achieved_rate) if "sent_s" in rec else np.nan,
                    "request_preemptions": g["num_preemptions"].sum() if "num_preemptions" in rec else np.nan,
                    "completed": g.apply(lambda d: int((d.finish_reason == "length").sum()), include_groups=False),
                    "merged_deltas": g["merged_deltas"].sum() if "merged_deltas" in rec else np.nan,
                }
            ).reset_index()
            ph = ph.merge(extra, on=key, how="left")
        ph["preemptions_any"] = (
            ph[["preemptions", "request_preemptions"]].max(axis=1) if "request_preemptions" in ph else ph["preemptions"]
        )
    res.phases = ph
