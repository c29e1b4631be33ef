"""Study 02's key numbers: the flat summary the notebook records (:func:`headline`) and its typed rows
(:func:`summary_rows`, :mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.calibration.endtoend import EMULATED_SUFFIX, fp8_base
from fp8lab.calibration.run import Calibration
from fp8lab.calibration.spec import REFERENCE
from fp8lab.calibration.tables import tokens_to_threshold


def headline(
    cal: Calibration,
    diff_summary: pd.DataFrame,
    conv: pd.DataFrame,
    err_summary: pd.DataFrame | None,
    quality_summary: pd.DataFrame | None = None,
    head_check: Mapping[str, Any] | None = None,
    dynamic: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The flat ``{key: value}`` dict for ``report.record_summary``. Keys:

    ``reldiff.<set>.<format>.<strategy>.{mean,max}`` (vs the large set), ``absdiff.<...>.mean``;
    ``claim.<format>.<strategy>.holds`` (the prompt32-style first cut, mean < threshold);
    ``calib_s.<source>``, ``calib_tokens.<source>``, ``calib_load_s``; ``tokens_to_threshold.<strategy>``;
    ``clip_rate.<set>.<format>.<strategy>.<K|V>``, ``snr_db.<set>.<format>.<strategy>.<rounding>.<K|V>``;
    ``quality.<label>.<metric>`` (Study 03's measures, ``labels`` maps engine labels to readable ones);
    ``head_reduction.*``; ``dynamic.*``."""
    s = cal.spec
    first = s.prompt_name(s.prompt_tokens[0])
    out: dict[str, Any] = {
        "model": Path(s.model).name,
        "num_layers": cal.large.num_layers,
        "num_kv_heads": cal.large.num_kv_heads,
        "claim_threshold": s.claim_threshold,
        "prompt_set": first,
        "calib_samples": cal.large.n_samples,
        "calib_tokens": cal.large.n_tokens,
        "pool_tokens": cal.pool.n_tokens,
        "calib_load_s": cal.large.load_s,
    }
    for name, c in cal.captures.items():
        out[f"calib_s.{name}"] = c.capture_s
        out[f"calib_cpu_s.{name}"] = c.cpu_s
        out[f"calib_tokens.{name}"] = c.n_tokens
    for _, r in diff_summary.iterrows():
        if r["name"] == REFERENCE:
            continue
        key = f"{r['name']}.{r.format}.{r.strategy}"
        out[f"reldiff.{key}.mean"] = float(r.rel_diff_mean)
        out[f"reldiff.{key}.max"] = float(r.rel_diff_max)
        out[f"absdiff.{key}.mean"] = float(r.abs_diff_mean)
        if r["name"] == first:
            out[f"claim.{r.format}.{r.strategy}.holds"] = bool(r.rel_diff_mean < s.claim_threshold)
    claims = [v for k, v in out.items() if k.startswith("claim.") and k.endswith(".holds")]
    out["claim.holds"] = bool(claims) and all(claims)
    for st, v in tokens_to_threshold(conv, s.claim_threshold).items():
        out[f"tokens_to_threshold.{st}"] = v
    for _, r in (err_summary if err_summary is not None else pd.DataFrame()).iterrows():  # None: not captured
        key = f"{r['name']}.{r.format}.{r.strategy}"
        out[f"clip_rate.{key}.{r.tensor}"] = float(r.clip_rate)
        out[f"snr_db.{key}.{r.rounding}.{r.tensor}"] = float(r.snr_db)
    if quality_summary is not None:
        for lab, r in quality_summary.iterrows():
            name = (labels or {}).get(lab, lab)
            out[f"quality.{name}.status"] = r.status
            for m in (
                "top3_match",
                "tf_top1",
                "tf_abs_dlogprob",
                "tf_kl",
                "ppl",
                "delta_ppl_pct",
                "task_acc",
                "delta_task_acc",
                "task_tf_acc",
                "delta_task_answer_logprob",
            ):
                if m in r and r[m] is not None and not (isinstance(r[m], float) and math.isnan(r[m])):
                    out[f"quality.{name}.{m}"] = float(r[m])
    base = fp8_base(quality_summary) if quality_summary is not None else None
    if base is not None:
        qs = quality_summary
        emu = base.endswith(EMULATED_SUFFIX)  # emulated sets compared with emulated fp8 only, never mixed
        cal_labels = [
            lab
            for lab in qs.index
            if str(lab).startswith("fp8+")
            and qs.loc[lab, "status"] == "ok"
            and str(lab).endswith(EMULATED_SUFFIX) == emu
        ]
        key = "quality.max_shift_vs_fp8_emulated" if emu else "quality.max_shift_vs_fp8"
        for col in ("delta_ppl_pct", "tf_abs_dlogprob", "task_acc"):
            if cal_labels and col in qs:  # how far the calibrated sets move each measure from fp8 with scale 1.0
                out[f"{key}.{col}"] = max(abs(float(qs.loc[lab, col]) - float(qs.loc[base, col])) for lab in cal_labels)
    for k, v in (head_check or {}).items():
        out[f"head_reduction.{k}"] = v
    for k, v in (dynamic or {}).items():
        if k != "run_dir":
            out[f"dynamic.{k}"] = v
    return out


#: The kv cache dtype of each FP8 format (vLLM's ``fp8`` is E4M3).
FORMAT_DTYPES = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


def summary_rows(
    cal: Calibration, diff: pd.DataFrame, diff_summary: pd.DataFrame, runs: Any, qsummary: pd.DataFrame
) -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from its own tables: per scale set other than
    the large one (``setting`` its name), format (``kv_dtype``) and granularity (``subset``) the mean absolute and
    relative difference of its scales from the large set's (:func:`scale_diff_summary`; ``n`` the layer x head x
    K/V values averaged, from :func:`scale_diff_table`; evidence ``computed``: arithmetic on captured K/V), then
    the end-to-end quality of every config it ran (:func:`fp8lab.quality.summary_rows` under study
    ``calibration``)."""
    from fp8lab import quality
    from fp8lab import summary_table as st

    model = Path(cal.spec.model).name
    sizes = diff.groupby(["name", "format", "strategy"], sort=False).size()
    rows = []
    for r in diff_summary.to_dict("records"):
        if r["name"] == REFERENCE:
            continue
        for metric, col, unit in (
            ("scale_abs_diff", "abs_diff_mean", "1"),
            ("scale_rel_diff", "rel_diff_mean", "ratio"),
        ):
            if math.isfinite(float(r[col])):
                rows.append(
                    st.make_row(
                        study="calibration",
                        metric=metric,
                        kv_dtype=FORMAT_DTYPES[r["format"]],
                        setting=str(r["name"]),
                        subset=str(r["strategy"]),
                        value=float(r[col]),
                        n=int(sizes[(r["name"], r["format"], r["strategy"])]),
                        unit=unit,
                        evidence="computed",
                        device="any (K/V captured with transformers)",
                        model=model,
                    )
                )
    greedy = quality.greedy_table(runs)
    rows += quality.summary_rows(runs, qsummary, quality.top3_by_category(greedy), greedy, study="calibration")
    return rows
