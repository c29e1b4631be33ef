"""Study 04's machine-readable key numbers (:func:`summary_values`, what the notebook records with
:func:`fp8lab.report.record_summary` and the claims audit reads)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.longctx.run import LongCtxResult
from fp8lab.longctx.tables import Tables
from fp8lab.longctx.verdict import claims


def summary_values(res: LongCtxResult, t: Tables, c: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The notebook's machine-readable key numbers (``record_summary``)."""
    plan = res.plan
    c = claims(res, t) if c is None else c
    s: dict[str, Any] = {
        "model": Path(plan.model).name,
        "load_format": plan.load_format,
        "kv_dtypes": list(plan.kv_dtypes),
        "lengths": list(plan.lengths),
        "max_context": plan.max_context,
        "output_tokens": plan.output_tokens,
        "concurrency": plan.concurrency,
        "block_size": res.block_size,
        "kv_cache_gib": plan.kv_cache_gib,
        "engines": len(res.runs),
        "engines_started": int((~res.engines.cached).sum()) if len(res.engines) else 0,
        "engine_statuses": res.engines.groupby(["role", "status"]).size().rename(lambda x: x).to_dict()
        if len(res.engines)
        else {},
        "study_wall_s": res.wall_s,
    }
    s["engine_statuses"] = {f"{k[0]}.{k[1]}": int(v) for k, v in s["engine_statuses"].items()}
    for _, b in t.boundary.iterrows():
        dt = b.kv_dtype
        for col in ("num_blocks_formula", "num_blocks_engine", "longest_formula", "longest_engine", "longest_measured"):
            s[f"{dt}.{col}"] = None if pd.isna(b[col]) else int(b[col])
        s[f"{dt}.over_status"] = b.over_status
        s[f"{dt}.holds_ramp"] = bool(b.holds_ramp)
    for _, r in t.ramp.iterrows():
        key = f"{r.kv_dtype}.c{r.concurrency}.L{r.length}"
        s[f"{key}.outcome"] = r.outcome
        for m in (
            "ttft_p50_s",
            "itl_p50_s",
            "itl_p95_s",
            "e2e_p50_s",
            "preemptions",
            "kv_usage_peak",
            "mem_peak_bytes",
        ):
            if m in r and pd.notna(r[m]):
                s[f"{key}.{m}"] = r[m]
    for _, r in t.frontier.iterrows():
        for m in ("max_conc_formula", "max_conc_engine", "max_conc_measured"):
            if pd.notna(r[m]):
                s[f"{r.kv_dtype}.{m}.L{r.length}"] = int(r[m])
    for _, r in t.growth.iterrows():
        for m in ("a", "b", "c", "r2", "exponent"):
            s[f"{r.kv_dtype}.fit.{r.metric}.{m}"] = r[m]
    for _, r in t.crossover.iterrows():
        s[f"{r.kv_dtype}.crossover.{r.metric}.measured"] = None if pd.isna(r.measured) else int(r.measured)
        s[f"{r.kv_dtype}.crossover.{r.metric}.fitted"] = r.fitted
        s[f"{r.kv_dtype}.ratio_at_longest.{r.metric}"] = r.ratio_at_longest
    for _, r in t.blocksize.iterrows():
        key = f"{r.kv_dtype}.bs{r.block_size}.L{r.length}"
        s[f"{key}.outcome"] = r.outcome
        if r.outcome == "ok":
            for m in ("ttft_p50_s", "itl_p50_s", "e2e_p50_s"):
                s[f"{key}.{m}"] = r[m]
    for _, r in t.trend.iterrows():
        for m in (
            "flip_rate",
            "abs_dlogprob",
            "kl",
            "last_over_first",
            "spearman_rho",
            "nll_base_first",
            "nll_base_last",
        ):
            s[f"{r.kv_dtype}.{r.source}.div.{m}"] = r[m]
    if len(t.passkey):
        for (dt, L), a in t.passkey.groupby(["kv_dtype", "length"]).correct.mean().items():
            s[f"{dt}.passkey.L{L}"] = a
    for k, v in c.items():
        s[f"claim.{k}"] = v["label"]
    s["claim.block256.unsupported"] = c["block256"]["unsupported"]
    s["silent.baseline_can_retrieve"] = c["silent"]["baseline_can_retrieve"]
    for k in ("timing_ttft_ratio", "timing_itl_ratio", "divergence_ratio", "flip_ratio"):
        for dt, v in c["random_tokens"].get(k, {}).items():
            s[f"{dt}.random.{k}"] = v
    if res.notes:
        s["not_measured"] = " ".join(res.notes)
        s["emulated"] = list(res.emulated)
    return s
