"""Study 03's verdict per candidate KV config (:func:`verdict`, with the thresholds of :class:`VerdictRules`) and its
prose (:func:`verdict_markdown`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fp8lab.quality.spec import BASELINE, REPORT_THRESHOLD


def verdict_markdown(verdicts: Mapping[str, Mapping[str, Any]], notes: Sequence[str] = ()) -> str:
    """The verdicts as one Markdown block (a paragraph per candidate), after ``notes`` (what was not
    measured natively and why, :attr:`QualityRuns.notes`)."""
    return "\n\n".join([*notes, *(v["text"] for v in verdicts.values())]) or "No candidate KV config ran."


@dataclass(frozen=True)
class VerdictRules:
    """Thresholds of :func:`verdict` (candidate vs baseline; task = the greedy copy-task accuracy).

    ``material``: perplexity worse by more than ``ppl_pct_bad`` % or task accuracy down by more than
    ``task_drop_bad``, **and** the 95% paired bootstrap interval of that delta excludes zero.
    ``negligible``: perplexity within ``ppl_pct_ok`` %, task accuracy down by at most ``task_drop_ok``
    and teacher-forced top-1 agreement at least ``tf_top1_ok``. Otherwise ``small``.
    """

    ppl_pct_ok: float = 1.0
    task_drop_ok: float = 0.02
    tf_top1_ok: float = 0.97
    ppl_pct_bad: float = 5.0
    task_drop_bad: float = 0.05


def _f(v: Any, fmt: str = ".3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def finite_ci(ci: Any) -> bool:
    return isinstance(ci, tuple) and len(ci) == 2 and all(isinstance(x, float) and math.isfinite(x) for x in ci)


def _ci(ci: Any, fmt: str) -> str:
    if not finite_ci(ci):
        return ""
    noise = " (within noise)" if ci[0] <= 0 <= ci[1] else ""
    return f", 95% CI {format(ci[0], fmt)} to {format(ci[1], fmt)}{noise}"


def verdict(
    summary: pd.DataFrame, rules: VerdictRules = VerdictRules(), threshold: float = REPORT_THRESHOLD
) -> dict[str, dict[str, Any]]:
    """Per candidate: ``level`` (negligible | small | material | failed, see :class:`VerdictRules`),
    ``report_protocol`` (pass | fail at ``threshold``) and a Markdown ``text`` quoting its numbers."""
    out: dict[str, dict[str, Any]] = {}
    for lab, r in summary.iterrows():
        if lab == BASELINE:
            continue
        if r.status != "ok":
            out[lab] = {
                "level": "failed",
                "report_protocol": "n/a",
                "text": f"**{lab}**: the engine did not run (status `{r.status}`); nothing measured.",
            }
            continue

        def g(name: str, r: pd.Series = r) -> Any:
            return r.get(name, float("nan"))

        dppl, dtask, top1 = g("delta_ppl_pct"), g("delta_task_acc"), g("tf_top1")
        dppl0 = dppl if math.isfinite(dppl) else 0.0
        drop0 = -dtask if math.isfinite(dtask) else 0.0
        ppl_ci, task_ci = g("delta_ppl_pct_ci"), g("delta_task_acc_ci")
        ppl_sig = not finite_ci(ppl_ci) or ppl_ci[0] > 0  # no interval (one window): the point estimate decides
        task_sig = not finite_ci(task_ci) or task_ci[1] < 0
        if (dppl0 > rules.ppl_pct_bad and ppl_sig) or (drop0 > rules.task_drop_bad and task_sig):
            level = "material"
        elif (
            abs(dppl0) <= rules.ppl_pct_ok
            and drop0 <= rules.task_drop_ok
            and (not math.isfinite(top1) or top1 >= rules.tf_top1_ok)
        ):
            level = "negligible"
        else:
            level = "small"
        rp = "pass" if g("top3_match") >= threshold else "fail"
        if g("never_diverged") >= 0.5:
            div = (
                f"{_f(100 * g('never_diverged'), '.0f')}% of the greedy texts never diverge within the generated tokens"
            )
        else:
            div = (
                f"greedy texts first diverge at token {_f(g('first_div_median'), '.0f')} (median; "
                f"{_f(100 * g('never_diverged'), '.0f')}% never)"
            )
        op = r.get("delta_ppl_pct_one_pass")
        one_pass = (
            f"; scored in one prefill instead: Δppl {op:+.2f}%, top-1 {_f(r.get('tf_top1_one_pass'))}"
            if op is not None and op == op
            else ""
        )
        text = (
            f"**{lab}** (`{r.kv_cache_dtype}`): reports' top-3 match {_f(g('top3_match'), '.2f')} "
            f"({'≥' if rp == 'pass' else '<'} {threshold}: the reports' protocol would call it a "
            f"{'pass' if rp == 'pass' else 'failed calibration'}); {div}. "
            f"Teacher-forced through the KV cache: top-1 agreement {_f(top1)}, mean |Δlogprob| "
            f"{_f(g('tf_abs_dlogprob'), '.4f')} nats, KL ≥ {_f(g('tf_kl'), '.2e')} nats/token. Perplexity "
            f"{_f(g('ppl'), '.3f')} ({'+' if dppl >= 0 else ''}{_f(dppl, '.2f')}%{_ci(ppl_ci, '.2f')}){one_pass}. "
            f"Copy task: greedy accuracy "
            f"{_f(g('task_acc'))} (Δ {_f(dtask, '+.3f')}{_ci(task_ci, '+.3f')}), teacher-forced accuracy "
            f"{_f(g('task_tf_acc'))} (Δ {_f(g('delta_task_tf_acc'), '+.3f')}), answer logprob Δ "
            f"{_f(g('delta_task_answer_logprob'), '+.4f')} nats{_ci(g('delta_task_answer_logprob_ci'), '+.4f')}. "
            f"**Effect: {level}** (negligible: |Δppl| ≤ {rules.ppl_pct_ok}%, task drop ≤ {rules.task_drop_ok}, "
            f"top-1 ≥ {rules.tf_top1_ok}; material: Δppl > {rules.ppl_pct_bad}% or task drop > "
            f"{rules.task_drop_bad}, beyond noise)."
        )
        out[lab] = {"level": level, "report_protocol": rp, "text": text}
    return out
