"""Study 04's machine-readable key numbers (:func:`summary_values`, what the notebook records with
:func:`fp8lab.report.run.record_summary` and the claims audit reads) and the same numbers as typed rows
(:func:`summary_rows`, :mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.engine.fp8emu import EMULATED_SUFFIX
from fp8lab.longctx.run import LongCtxResult
from fp8lab.longctx.spec import BASELINE
from fp8lab.longctx.tables import Tables
from fp8lab.longctx.verdict import claims


def summary_values(res: LongCtxResult, t: Tables, c: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The notebook's machine-readable key numbers (``record_summary``)."""
    plan = res.plan
    c = claims(res, t) if c is None else c
    s: dict[str, Any] = {
        "model": Path(plan.model).name,
        # the model the divergence and passkey verdicts rest on (the ramp's model above when it is the same one)
        **({"quality_model": Path(plan.quality_model).name} if plan.quality_model is not None else {}),
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
        keys = t.passkey["keys"] if "keys" in t.passkey else 1
        for (dt, k, L), a in t.passkey.assign(keys=keys).groupby(["kv_dtype", "keys", "length"]).correct.mean().items():
            s[f"{dt}.passkey.L{L}" if k == 1 else f"{dt}.passkey.k{k}.L{L}"] = a
    for r in t.passkey_paired.to_dict("records"):
        pre = f"{r['kv_dtype']}.passkey_diff.L{r['length']}" + (f".k{r['keys']}" if r["keys"] != 1 else "")
        s[pre] = r["diff"]
        if _finite(r["ci_low"]) is not None and _finite(r["ci_high"]) is not None:  # one prompt per cell: none
            s[f"{pre}.ci"] = [r["ci_low"], r["ci_high"]]
        s[f"{pre}.n"] = r["n"]
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


def _finite(v: Any) -> float | None:
    """A finite number as a float, else None (None, NaN, pandas' NA, a string)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _device(res: LongCtxResult) -> str | None:
    """The device the engines ran on (the first engine result whose provenance names one)."""
    for r in res.runs:
        dev = (getattr(r.get("result"), "provenance", None) or {}).get("device")
        if dev:
            return str(dev)
    return None


#: ``device`` of a row the formula computed (no engine).
ARITHMETIC = "any (arithmetic on config.json)"
#: The ramp's latency metrics: table column -> (metric, unit, scale).
RAMP_METRICS: dict[str, tuple[str, str, float]] = {
    "ttft_p50_s": ("ttft_p50", "ms", 1000.0),
    "itl_p50_s": ("itl_p50", "ms", 1000.0),
    "itl_p95_s": ("itl_p95", "ms", 1000.0),
    "e2e_p50_s": ("e2e_p50", "s", 1.0),
}


def summary_rows(res: LongCtxResult, t: Tables) -> list[dict[str, Any]]:
    """The study's typed rows (:mod:`fp8lab.summary_table`, study ``long_context``), from its tables; ``context_len``
    is a request's prompt length (the ramp's ``L``), ``concurrency`` the requests sent at once.

    - the boundary, per kv dtype (``boundary``): ``num_blocks_formula`` and ``longest_context_formula`` (evidence
      ``computed``), the ramp engine's ``num_blocks`` and the ``longest_context`` its blocks hold (setting ``engine
      blocks``) and vLLM's own estimate past the boundary (setting ``vLLM's estimate past the boundary``);
    - the ramp, per kv dtype x concurrency x length that ran (``ramp``, setting ``ramp, block <B>``): TTFT P50, ITL
      P50 and P95 (ms), E2E P50 (s), ``preemptions``, ``kv_usage_peak`` and ``mem_peak_gib``, ``n`` the requests;
    - the capacity frontier (``frontier``): ``max_concurrency_formula`` (computed) and ``max_concurrency`` from the
      engine's blocks (setting ``engine blocks``) and from the blocks one sequence was measured to hold (setting
      ``measured blocks per sequence``);
    - the block-size sweep (``blocksize``, setting ``block-size sweep, block <B>``, one request at a time): TTFT,
      ITL and E2E medians of every point that ran."""
    from fp8lab import summary_table as st

    plan = res.plan
    model = Path(plan.model).name
    device = _device(res)
    measured = {"study": "long_context", "evidence": st.evidence_of(device, model), "device": device or "unknown"}
    computed = {"study": "long_context", "evidence": "computed", "device": ARITHMETIC}
    rows: list[dict[str, Any]] = []

    def add(common: Mapping[str, Any], value: Any, **fields: Any) -> None:
        v = _finite(value)
        if v is not None:
            rows.append(st.make_row(**common, **fields, value=v, model=model))

    bs = res.block_size
    for b in t.boundary.to_dict("records"):
        dt = b["kv_dtype"]
        at = {"kv_dtype": dt, "n": 1}
        budget = f"{b['kv_budget_bytes'] / 2**30:g} GiB of KV" if _finite(b.get("kv_budget_bytes")) else "KV budget"
        add(
            computed,
            b["num_blocks_formula"],
            metric="num_blocks_formula",
            setting=f"{budget}, block {bs}",
            unit="blocks",
            **at,
        )
        add(
            computed,
            b["longest_formula"],
            metric="longest_context_formula",
            setting=f"{budget}, block {bs}",
            unit="tokens",
            **at,
        )
        add(measured, b["num_blocks_engine"], metric="num_blocks", setting=f"ramp, block {bs}", unit="blocks", **at)
        add(measured, b["longest_engine"], metric="longest_context", setting="engine blocks", unit="tokens", **at)
        add(
            measured,
            b["longest_measured"],
            metric="longest_context",
            setting="vLLM's estimate past the boundary",
            unit="tokens",
            **at,
        )
    for r in t.ramp.to_dict("records"):
        if r.get("outcome") not in ("ok", "held", "preempted", "serialized") or not _finite(r.get("n")):
            continue
        at = {
            "kv_dtype": r["kv_dtype"],
            "setting": f"ramp, block {int(r['block_size'])}",
            "concurrency": int(r["concurrency"]),
            "context_len": int(r["length"]),
            "n": int(r["n"]),
        }
        for col, (metric, unit, scale) in RAMP_METRICS.items():
            v = _finite(r.get(col))
            add(measured, None if v is None else v * scale, metric=metric, unit=unit, **at)
        add(measured, r.get("preemptions"), metric="preemptions", unit="preemptions", **at)
        add(measured, r.get("kv_usage_peak"), metric="kv_usage_peak", unit="fraction", **at)
        mem = _finite(r.get("mem_peak_bytes"))
        add(measured, None if mem is None else mem / 2**30, metric="mem_peak_gib", unit="GiB", **at)
    for r in t.frontier.to_dict("records"):
        at = {"kv_dtype": r["kv_dtype"], "context_len": int(r["length"]), "n": 1, "unit": "requests"}
        add(computed, r["max_conc_formula"], metric="max_concurrency_formula", setting=f"formula, block {bs}", **at)
        add(measured, r["max_conc_engine"], metric="max_concurrency", setting="engine blocks", **at)
        add(measured, r["max_conc_measured"], metric="max_concurrency", setting="measured blocks per sequence", **at)
    for r in t.blocksize.to_dict("records"):
        if r.get("outcome") != "ok" or not _finite(r.get("n")):
            continue
        at = {
            "kv_dtype": r["kv_dtype"],
            "setting": f"block-size sweep, block {int(r['block_size'])}",
            "concurrency": 1,
            "context_len": int(r["length"]),
            "n": int(r["n"]),
        }
        for col, (metric, unit, scale) in RAMP_METRICS.items():
            if col != "itl_p95_s":
                v = _finite(r.get(col))
                add(measured, None if v is None else v * scale, metric=metric, unit=unit, **at)
    qmodel = Path(plan.quality_model).name if plan.quality_model else model
    qmeasured = {**measured, "evidence": st.evidence_of(device, qmodel)}
    for r in t.passkey_paired.to_dict("records"):
        # an emulated configuration (fp8lab.fp8emu, "fp8 (emulated)") is a row of the dtype it stands in for, its
        # setting saying it ran emulated
        emulated = str(r["kv_dtype"]).endswith(EMULATED_SUFFIX)
        kv_dtype = str(r["kv_dtype"]).removesuffix(EMULATED_SUFFIX)
        setting = f"passkey, {r['keys']} needle{'s' if r['keys'] > 1 else ''}, {qmodel}"
        setting += f", {kv_dtype} emulated" if emulated else ""
        common = {"setting": setting, "context_len": int(r["length"]), "n": int(r["n"])}
        for dt, v in ((BASELINE, r["acc_base"]), (kv_dtype, r["acc"])):
            rows.append(
                st.make_row(
                    **qmeasured,
                    **common,
                    metric="passkey_accuracy",
                    kv_dtype=dt,
                    value=v,
                    unit="fraction",
                    model=qmodel,
                )
            )
        rows.append(
            st.make_row(
                **qmeasured,
                **common,
                metric="passkey_accuracy_diff",
                kv_dtype=kv_dtype,
                baseline=BASELINE,
                value=r["diff"],
                ci_low=_finite(r["ci_low"]),  # None where one prompt per cell leaves no interval
                ci_high=_finite(r["ci_high"]),
                detectable=_finite(r["mde"]),
                unit="fraction",
                model=qmodel,
            )
        )
    return rows
