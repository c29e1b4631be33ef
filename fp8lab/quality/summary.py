"""Study 03's key numbers: the flat summary the notebook records (:func:`headline`) and its typed rows
(:func:`summary_rows`, :mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.quality.run import QualityRuns
from fp8lab.quality.spec import BASELINE, REPORT_THRESHOLD
from fp8lab.quality.verdict import finite_ci


def headline(
    runs: QualityRuns,
    summary: pd.DataFrame,
    top3_cat: pd.DataFrame,
    greedy: pd.DataFrame,
    rt_summary: pd.DataFrame | None = None,
    attn: pd.DataFrame | None = None,
    verdicts: Mapping[str, Mapping[str, Any]] | None = None,
    engine_rt: pd.DataFrame | None = None,
    scoring: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """The flat ``{key: number}`` dict a notebook passes to ``report.record_summary``.

    Keys: ``<label>.<metric>`` per KV config (``top3_match``, ``top3_match.<category>``,
    ``first_div_median``, ``tf_top1``, ``tf_abs_dlogprob``, ``tf_kl``, ``ppl``, ``delta_ppl``,
    ``delta_ppl_pct``, ``task_acc``, ``verdict``...); ``auto.rerun_*`` (noise floor, auto vs the
    reference run); ``roundtrip.<tensor>.<format>.<rounding>.scale_<s>.rel_err``;
    ``attn_sim.<format>.<rounding>.<q|noq>.out_rel_err``; ``<label>.kv_roundtrip.<K|V>.rel_err`` (the
    round trip this engine applies, from :func:`engine_roundtrip`); ``scoring_method`` and, per candidate,
    ``<label>.scoring_check.<cache|one_pass>.<frac_differ|max_abs_dlogprob|mean_abs_dlogprob|positions>``,
    ``<label>.scoring_check.gap_max_abs_dlogprob`` and ``<label>.attention_backend`` (:func:`scoring_check`).
    ``tf_*``, ``ppl``, ``delta_ppl*`` and ``task_tf_acc`` are scored through the KV cache; ``tf_top1_one_pass``,
    ``ppl_one_pass`` and ``delta_ppl_pct_one_pass`` are the one-pass twins (a per-backend check, no verdict).
    """
    out: dict[str, Any] = {
        "baseline": BASELINE,
        "labels": [c.label for c in runs.configs],
        "n_prompts": len(runs.prompts),
        "categories": sorted(runs.prompts.category.unique()),
        "gen_tokens": runs.spec.gen_tokens,
        "report_threshold": REPORT_THRESHOLD,
        "model": Path(runs.spec.model).name,
        "scoring_method": "through the KV cache (forced decode, fp8lab.scoring)",
    }
    if runs.notes:
        out["not_measured"] = " ".join(runs.notes)
    metrics = [
        "top3_match",
        "first_div_median",
        "never_diverged",
        "agreement",
        "tf_top1",
        "tf_topk",
        "tf_abs_dlogprob",
        "tf_kl",
        "ppl",
        "delta_ppl",
        "delta_ppl_pct",
        "task_acc",
        "task_exact",
        "delta_task_acc",
        "task_tf_acc",
        "delta_task_tf_acc",
        "task_answer_logprob",
        "delta_task_answer_logprob",
        "tf_top1_one_pass",
        "ppl_one_pass",
        "delta_ppl_pct_one_pass",
    ]
    for lab, r in summary.iterrows():
        out[f"{lab}.status"] = r.status
        for m in metrics:
            if m in r and r[m] is not None and not (isinstance(r[m], float) and math.isnan(r[m])):
                out[f"{lab}.{m}"] = float(r[m])
        for m in ("top3_ci", "delta_ppl_pct_ci", "delta_task_acc_ci", "delta_task_answer_logprob_ci"):
            ci = r.get(m)
            if finite_ci(ci):
                out[f"{lab}.{m}_lo"], out[f"{lab}.{m}_hi"] = ci
        if lab in top3_cat.index:
            for cat in runs.prompts.category.unique():
                out[f"{lab}.top3_match.{cat}"] = float(top3_cat.loc[lab, cat])
    g = greedy[greedy.label == BASELINE]
    out["auto.rerun_top3_match"] = float(g.top3_match.mean())
    out["auto.rerun_max_abs_dlogprob"] = float(g.max_abs_dlogprob.max())
    if rt_summary is not None:
        for _, r in rt_summary.iterrows():
            out[f"roundtrip.{r.tensor}.{r.format}.{r.rounding}.scale_{r.scale}.rel_err"] = float(r.rel_err)
            out[f"roundtrip.{r.tensor}.{r.format}.{r.rounding}.scale_{r.scale}.mag_bias"] = float(r.mag_bias)
    if attn is not None:
        a = attn.groupby(["format", "rounding", "quantize_q"]).out_rel_err.mean()
        for (f, rnd, qq), v in a.items():
            out[f"attn_sim.{f}.{rnd}.{'q' if qq else 'noq'}.out_rel_err"] = float(v)
    if engine_rt is not None:
        for _, r in engine_rt.iterrows():
            out[f"{r.label}.kv_roundtrip.{r.tensor}.rel_err"] = float(r.rel_err)
            out[f"{r.label}.kv_roundtrip.{r.tensor}.mag_bias"] = float(r.mag_bias)
    for r in [] if scoring is None else scoring.to_dict("records"):
        out[f"{r['label']}.attention_backend"] = r.get("attention_backend") or "unknown"
        for k in ("positions", "frac_differ", "max_abs_dlogprob", "mean_abs_dlogprob"):
            if r.get(k) == r.get(k):
                out[f"{r['label']}.scoring_check.{r['method']}.{k}"] = float(r[k])
        if r["method"] == "cache" and r.get("gap_max_abs_dlogprob") == r.get("gap_max_abs_dlogprob"):
            out[f"{r['label']}.scoring_check.gap_max_abs_dlogprob"] = float(r["gap_max_abs_dlogprob"])
            out[f"{r['label']}.scoring_check.gap_frac_differ"] = float(r["gap_frac_differ"])
    for lab, v in (verdicts or {}).items():
        out[f"{lab}.verdict"] = v["level"]
        out[f"{lab}.report_protocol"] = v["report_protocol"]
    return out


def summary_rows(
    runs: QualityRuns,
    summary: pd.DataFrame,
    top3_cat: pd.DataFrame,
    greedy: pd.DataFrame,
    study: str = "quality",
    scoring: pd.DataFrame | None = None,
) -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from its own tables: per KV config that ran
    (``setting`` its label: the dtype, or ``fp8+<scale set>``) the top-3 match over all prompts with its bootstrap
    CI (:func:`summary_table`) and per prompt category (``subset``, :func:`top3_by_category`), the first
    divergence, agreement, teacher-forced top-1 and KL, perplexity and the copy task's accuracy; per candidate the
    perplexity change (% paired by window) and the accuracy change (difference paired by item) against the baseline,
    each with its CI. ``n`` counts prompts, windows or items. Non-finite values give no row. ``study``: the study
    the rows belong to (Study 02 measures its scale sets with these runs). Teacher-forced and perplexity rows are
    scored through the KV cache; ``tf_top1_one_pass`` / ``ppl_one_pass`` (change, %) are the one-pass twins, and
    ``scoring_frac_differ`` / ``scoring_max_abs_dlogprob`` (``subset`` the method, ``n`` the positions; from
    ``scoring``, :func:`~fp8lab.quality.tables.scoring_check`) show whether each method saw the quantization."""
    from fp8lab import summary_table as st

    model = Path(runs.spec.model).name
    rows: list[dict[str, Any]] = []

    def add(**f: Any) -> None:
        v = f.get("value")
        if v is None or not math.isfinite(float(v)):
            return
        if not finite_ci(f.get("ci")):
            f["ci"] = (None, None)
        f["ci_low"], f["ci_high"] = f.pop("ci")
        rows.append(st.make_row(study=study, model=model, **f))

    for lab, r in summary.iterrows():
        if r.status != "ok":
            continue
        res = runs.results[lab]
        device = (res.provenance or {}).get("device")
        common = {
            "kv_dtype": r.kv_cache_dtype,
            "setting": str(lab),
            "evidence": st.evidence_of(device, model),
            "device": device or "unknown",
        }
        g = greedy[greedy.label == lab]
        n_prompts = len(g)
        add(**common, metric="top3_match", value=r.get("top3_match"), ci=r.get("top3_ci"), n=n_prompts, unit="fraction")
        if lab in top3_cat.index:
            for cat in sorted(runs.prompts.category.unique()):
                add(
                    **common,
                    metric="top3_match",
                    subset=str(cat),
                    value=top3_cat.loc[lab, cat],
                    n=int((g.category == cat).sum()),
                    unit="fraction",
                )
        for metric, unit in (("first_div_median", "tokens"), ("agreement", "fraction")):
            add(**common, metric=metric, value=r.get(metric), n=n_prompts, unit=unit)
        for metric, col, unit in (("tf_top1", "tf_top1", "fraction"), ("tf_kl", "tf_kl", "nats")):
            add(**common, metric=metric, value=r.get(col), n=n_prompts, unit=unit)
        n_windows, n_items = len(runs.windows), len(runs.task)
        if n_windows:
            add(**common, metric="ppl", value=r.get("ppl"), n=n_windows, unit="1")
        if n_items:
            add(**common, metric="task_acc", value=r.get("task_acc"), ci=r.get("task_ci"), n=n_items, unit="fraction")
        add(**common, metric="tf_top1_one_pass", value=r.get("tf_top1_one_pass"), n=n_prompts, unit="fraction")
        if lab == BASELINE:
            continue
        if n_windows:
            add(
                **common,
                metric="ppl_one_pass",
                baseline=BASELINE,
                value=r.get("delta_ppl_pct_one_pass"),
                n=n_windows,
                unit="%",
            )
        for c in [] if scoring is None or not len(scoring) else scoring[scoring.label == lab].to_dict("records"):
            for metric, col, unit in (
                ("scoring_frac_differ", "frac_differ", "fraction"),
                ("scoring_max_abs_dlogprob", "max_abs_dlogprob", "nats"),
            ):
                add(
                    **common,
                    metric=metric,
                    subset=c["method"],
                    baseline=BASELINE,
                    value=c.get(col),
                    n=int(c.get("positions") or 0),
                    unit=unit,
                )
        if n_windows:
            add(
                **common,
                metric="ppl",
                baseline=BASELINE,
                value=r.get("delta_ppl_pct"),
                ci=r.get("delta_ppl_pct_ci"),
                n=n_windows,
                unit="%",
            )
        if n_items:
            add(
                **common,
                metric="task_acc",
                baseline=BASELINE,
                value=r.get("delta_task_acc"),
                ci=r.get("delta_task_acc_ci"),
                n=n_items,
                unit="fraction",
            )
    return rows
