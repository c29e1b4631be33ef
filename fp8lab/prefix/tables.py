"""Study 07's tables from a stored run's rows: per cell (:func:`cell_table`), per swept working set with paired
intervals (:func:`sweep_table`), the knees predicted and measured (:func:`measured_knee`, :func:`knee_table`), and
the hit-vs-cold correctness check (:func:`correctness_table`, per prompt :func:`compare_outputs`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fp8lab import stats
from fp8lab.prefix.predict import knee_formula, knee_simulated
from fp8lab.prefix.run import PrefixRun


def cell_table(rows: Any, block_size: int | None = None) -> Any:
    """One row per (workload, n_active, trial, kv_dtype) from per-turn rows: ``queries, hits`` (tokens, summed over
    turns), ``hit_rate = hits / queries``, ``cached_tokens`` (per-request ``num_cached_tokens`` summed),
    ``counter_turns`` / ``counter_turns_complete`` (turns, and turns whose scheduler counters saw every prompt
    token), ``ttft_mean_ms`` (request-weighted over every turn), ``ttft_followup_ms`` (turns after the first),
    ``output_tok_s`` (output tokens / wall seconds of all waves), ``preemptions``, ``kv_usage_max``.

    A turn's ``queries, hits`` are vLLM's scheduler counters when they are complete for it (``queries`` equals the
    prompt tokens sent), else the per-request figures vLLM returned with each output (the prompt tokens and
    ``num_cached_tokens``). vLLM 0.26's ``LLMEngine.step`` records a step's scheduler stats only when the step
    returned outputs: on the H200 with the 6-layer model (eager, steps of milliseconds) 62 of 216 turns lost some
    of their counts, while every turn whose counters were complete had ``hits == num_cached_tokens`` exactly (532
    of 532 turns on the H200, both models)."""
    import pandas as pd

    if rows is None or not len(rows):
        return pd.DataFrame()
    out = []
    rows = rows.copy()
    sent = rows.prompt_tokens if "prompt_tokens" in rows else rows.queries
    rows["_complete"] = rows.queries == sent
    rows["_q"] = sent
    rows["_h"] = rows.hits.where(rows._complete, rows.cached_tokens)
    for (w, n, t, d), g in rows.groupby(["workload", "n_active", "trial", "kv_dtype"], sort=True):
        q, h = float(g._q.sum()), float(g._h.sum())
        fu = g[g.turn > 0]
        out.append(
            {
                "workload": w,
                "n_active": int(n),
                "trial": int(t),
                "kv_dtype": d,
                "queries": int(q),
                "hits": int(h),
                "hit_rate": h / q if q else math.nan,
                "cached_tokens": int(g.cached_tokens.sum()),
                "counter_turns": len(g),
                "counter_turns_complete": int(g._complete.sum()),
                "ttft_mean_ms": float((g.ttft_mean_s * g.requests).sum() / g.requests.sum() * 1e3),
                "ttft_followup_ms": float((fu.ttft_mean_s * fu.requests).sum() / fu.requests.sum() * 1e3)
                if len(fu)
                else math.nan,
                "output_tok_s": float(g.output_tokens.sum() / g.wall_s.sum()) if g.wall_s.sum() > 0 else math.nan,
                "preemptions": int(g.preemptions.sum()),
                "kv_usage_max": float(g.kv_usage_max.max()),
            }
        )
    return pd.DataFrame(out)


def sweep_table(cells: Any, predicted: Any = None, base: str = "auto", other: str = "fp8") -> Any:
    """Per (workload, n_active): each dtype's mean hit rate over trials (and predicted, when ``predicted`` is the
    :func:`plan` table); ``dhit_pp`` = other - base hit rate in percentage points with a paired t interval over
    trials; ``ttft_ratio`` = other / base mean TTFT (geometric mean of per-trial ratios, t interval on the logs,
    :func:`fp8lab.stats.paired_ratio`) with ``ttft_detectable_pct`` (the smallest change the paired trials detect
    with 80% power, :func:`fp8lab.stats.power_detectable_pct`) and ``ttft_noise_pct`` (the base's same-config noise,
    :func:`fp8lab.stats.self_noise`); ``tput_ratio`` likewise for output tokens/s. ``dhit_deterministic``: every
    trial gave the same hit-rate difference (the replay is deterministic: hit counts follow token counts), so the
    difference has no interval (its ends NaN), not a zero-width one."""
    import pandas as pd

    if cells is None or not len(cells):
        return pd.DataFrame()
    out = []
    for (w, n), g in cells.groupby(["workload", "n_active"], sort=True):
        row: dict[str, Any] = {"workload": w, "n_active": int(n)}
        for d, gd in g.groupby("kv_dtype"):
            row[f"{d}_hit_rate"] = float(gd.hit_rate.mean())
            row[f"{d}_ttft_ms"] = float(gd.ttft_mean_ms.mean())
            row[f"{d}_preemptions"] = int(gd.preemptions.sum())
            row[f"{d}_kv_usage_max"] = float(gd.kv_usage_max.max())
            if predicted is not None and len(predicted):
                p = predicted[(predicted.workload == w) & (predicted.n_active == n) & (predicted.kv_dtype == d)]
                if len(p):
                    row[f"{d}_hit_rate_pred"] = float(p.hit_rate_pred.iloc[0])
                    row["hit_rate_unbounded"] = float(p.hit_rate_unbounded.iloc[0])
        if {base, other} <= set(g.kv_dtype):
            w_ = g.pivot_table(index="trial", columns="kv_dtype", values=["hit_rate", "ttft_mean_ms", "output_tok_s"])
            w_ = w_.dropna()
            diffs = (w_["hit_rate"][other] - w_["hit_rate"][base]) * 100
            dh = stats.t_interval(diffs)
            fixed = stats.deterministic(diffs)
            tr = stats.paired_ratio(w_["ttft_mean_ms"][base], w_["ttft_mean_ms"][other])
            pr = stats.paired_ratio(w_["output_tok_s"][base], w_["output_tok_s"][other])
            row.update(
                {
                    "dhit_pp": dh.estimate,
                    "dhit_pp_ci_low": float("nan") if fixed else dh.lo,
                    "dhit_pp_ci_high": float("nan") if fixed else dh.hi,
                    "dhit_deterministic": fixed,
                    "ttft_ratio": tr.estimate,
                    "ttft_ratio_ci_low": tr.lo,
                    "ttft_ratio_ci_high": tr.hi,
                    "ttft_detectable_pct": stats.power_detectable_pct(tr),
                    "ttft_noise_pct": stats.self_noise(w_["ttft_mean_ms"][base]),
                    "tput_ratio": pr.estimate,
                    "tput_ratio_ci_low": pr.lo,
                    "tput_ratio_ci_high": pr.hi,
                    "n_pairs": tr.n,
                }
            )
        out.append(row)
    return pd.DataFrame(out)


def measured_knee(sweep: Any, workload: str, kv_dtype: str, tolerance_pp: float) -> dict[str, Any]:
    """Where a dtype's measured hit rate starts to fall: ``last_held`` = the largest swept ``N`` before the first
    ``N`` whose mean hit rate is more than ``tolerance_pp`` percentage points below the unbounded-cache prediction
    (``first_fallen``; ``None`` when no swept ``N`` falls). The knee lies in ``[last_held, first_fallen)``."""
    g = sweep[sweep.workload == workload].sort_values("n_active")
    col = f"{kv_dtype}_hit_rate"
    if col not in g or "hit_rate_unbounded" not in g:
        return {"last_held": None, "first_fallen": None}
    last, first = None, None
    for r in g.itertuples():
        hr, ideal = getattr(r, col), r.hit_rate_unbounded
        if not math.isfinite(hr):
            continue
        if (ideal - hr) * 100 > tolerance_pp:
            first = int(r.n_active)
            break
        last = int(r.n_active)
    return {"last_held": last, "first_fallen": first}


def knee_table(run_or_spec: Any, sweep: Any) -> Any:
    """Per workload and dtype: the predicted knee (formula, replay) beside the measured interval."""
    import pandas as pd

    spec = run_or_spec.spec if isinstance(run_or_spec, PrefixRun) else run_or_spec
    bs = spec.effective_block_size()
    rows = []
    for s in spec.workloads:
        for d in spec.kv_dtypes:
            nb = spec.num_blocks(d)
            m = (
                measured_knee(sweep, s.kind, d, spec.hold_tolerance)
                if len(sweep)
                else {"last_held": None, "first_fallen": None}
            )
            ks = knee_simulated(
                s,
                nb,
                bs,
                spec.max_in_flight,
                n_max=max(4 * max(spec.active), knee_formula(s, nb, bs, spec.max_in_flight) + 2),
            )
            agree = (
                m["first_fallen"] is not None
                and m["last_held"] is not None
                and m["last_held"] <= ks < m["first_fallen"]
            ) or (m["first_fallen"] is None and m["last_held"] is not None and ks >= m["last_held"])
            rows.append(
                {
                    "workload": s.kind,
                    "kv_dtype": d,
                    "num_blocks": nb,
                    "knee_formula": knee_formula(s, nb, bs, spec.max_in_flight),
                    "knee_simulated": ks,
                    "measured_last_held": m["last_held"],
                    "measured_first_fallen": m["first_fallen"],
                    "prediction_in_interval": bool(agree) if m["last_held"] is not None else None,
                }
            )
    return pd.DataFrame(rows)


def correctness_table(corr: Any) -> Any:
    """Per dtype and kind (``hit_decode``: the prefix written by an earlier turn's prefill and decode;
    ``hit_repeat``: the same prompt again): prompts checked, the fraction with identical greedy tokens, the first
    divergence seen, the largest ``|logprob difference|`` over positions before any divergence, the cached tokens."""
    import pandas as pd

    if corr is None or not len(corr):
        return pd.DataFrame()
    out = []
    for (d, k), g in corr.groupby(["kv_dtype", "kind"], sort=True):
        div = g.first_diff.dropna()
        out.append(
            {
                "kv_dtype": d,
                "kind": k,
                "prompts": len(g),
                "tokens_equal": float(g.tokens_equal.mean()),
                "first_divergence": int(div.min()) if len(div) else None,
                "max_abs_dlogprob": float(g.max_abs_dlogprob.max()),
                "mean_abs_dlogprob": float(g.mean_abs_dlogprob.mean()),
                "cached_tokens_min": int(g.cached_tokens.min()),
                "cold_cached_max": int(g.cold_cached.max()),
            }
        )
    return pd.DataFrame(out)


def compare_outputs(
    a_tokens: Sequence[int], a_lp: Sequence[float], b_tokens: Sequence[int], b_lp: Sequence[float]
) -> dict[str, Any]:
    """Greedy outputs A (hit) vs B (cold): ``tokens_equal``, ``first_diff`` (index of the first differing token or
    ``None``), ``max_abs_dlogprob`` / ``mean_abs_dlogprob`` of the chosen token's logprob over the positions up to
    and including the first difference (after it the contexts differ)."""
    n = min(len(a_tokens), len(b_tokens))
    first = next((i for i in range(n) if a_tokens[i] != b_tokens[i]), None)
    if first is None and len(a_tokens) != len(b_tokens):
        first = n
    upto = n if first is None else min(first + 1, n)
    d = [abs(float(a_lp[i]) - float(b_lp[i])) for i in range(upto)]
    return {
        "tokens_equal": first is None,
        "first_diff": first,
        "max_abs_dlogprob": max(d) if d else 0.0,
        "mean_abs_dlogprob": sum(d) / len(d) if d else 0.0,
    }
