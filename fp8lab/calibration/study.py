"""Study 02 on the study contract (:mod:`fp8lab.study`): :class:`Spec`
(:class:`~fp8lab.calibration.spec.CalibrationStudySpec`), :func:`run` -> :class:`Results`, a thin adapter over
:func:`~fp8lab.calibration.run.calibrate`, the export, Study 03's :func:`~fp8lab.quality.run.run_quality` and the
existing table, verdict and summary functions (it computes nothing of its own but the verdict words)::

    from fp8lab.calibration import study as s02

    spec = s02.Spec.from_params(globals())
    res = s02.run(spec)
    res.tables()["diff_summary"], res.summary(), res.rows(), res.verdict(), res.markdown()

What :func:`run` measures: the amax captures (the prompt cuts and the large set, through the results store), the
held-out K/V (Study 03's prompts and perplexity windows, never used for calibration), the exported scale sets' engines
with Study 03's measures (and vLLM's dynamic scales where asked). Every table, the head-reduction check, the summary
and the verdict are computed from those, once, on first use: the notebook no longer passes its tables back in.

The verdicts: the claims audit's claims 10 ("scales from a 32-token prompt are within 0.03 of a large set's")
and 14 (per-head and dynamic scales), each judged by the audit's own rule applied to this run alone (:func:`judge`):
one rule per claim, so the study and the audit cannot disagree on the same numbers. Claim 10 reads "0.03" as the
mean absolute difference, as the audit does; the relative difference (28-30% on the H200) is in its sentence."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.calibration.capture import capture_heldout
from fp8lab.calibration.endtoend import head_reduction_check, quality_label, run_dynamic
from fp8lab.calibration.export import export_sets
from fp8lab.calibration.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.calibration.pool import quality_reserved_tokens
from fp8lab.calibration.run import Calibration, calibrate, quality_scale_sets
from fp8lab.calibration.scales import ScaleSet
from fp8lab.calibration.spec import CalibrationStudySpec
from fp8lab.calibration.summary import headline, summary_rows
from fp8lab.calibration.tables import (
    convergence_table,
    prompt_points,
    quant_error_summary,
    quant_error_table,
    scale_diff_summary,
    scale_diff_table,
)
from fp8lab.calibration.verdict import claim_verdict
from fp8lab.paths import in_store
from fp8lab.quality.inputs import load_prompt_set, ppl_windows
from fp8lab.quality.run import QualityRuns, run_quality
from fp8lab.quality.tables import greedy_table, ppl_table, summary_table, task_table, teacher_table
from fp8lab.study import Verdict

NAME = "02_calibration_32_tokens"

#: The claims audit's claims this study is the evidence of, each with the audit's per-report rule that judges it.
CLAIMS: dict[str, str] = {"10": "rule_32_token_calibration", "14": "rule_dynamic_per_head"}


def judge(
    summary: Mapping[str, Any],
    rows: list[dict[str, Any]] | None,
    model: str,
    device: str | None = None,
    vllm: str | None = None,
) -> tuple[Verdict, ...]:
    """The claims of :data:`CLAIMS` judged by the claims audit's rules on one Study 02 run (its ``summary`` and typed
    ``rows``, as its notebook records them), as the audit judges each report before it weighs the reports' settings:
    one rule per claim, so this study and the audit cannot disagree on the same numbers. A CPU run is an analogue
    the audit never decides a GPU claim by; the verdict here is what the run says on its own setting. ``n``: None
    (claim 10 compares deterministic scales, exactly; claim 14 compares logprobs bit for bit)."""
    from fp8lab import audit
    from fp8lab.paths import runs_dir

    index = {"notebooks": {NAME: {"ran_on": {"device": device, "vllm": vllm}, "parameters": {"MODEL": model}}}}
    rep = audit.Report("this run", runs_dir() / NAME, {NAME: dict(summary)}, index, {NAME: rows} if rows else {})
    return audit.judge_run(rep, NAME, CLAIMS)


class Spec(CalibrationStudySpec):
    """:class:`~fp8lab.calibration.spec.CalibrationStudySpec`; :meth:`from_params` builds a plain one."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CalibrationStudySpec:
        return CalibrationStudySpec.from_params(params)


@dataclass
class Results:
    """A Study 02 run: the captures (``cal``), the held-out K/V (``held``, :mod:`fp8lab.kvcapture`; None: no
    round-trip error tables), the sets measured end to end (``chosen``, and ``twin``, the per-tensor twin of the
    last, or None) and their model folders (``folders``), Study 03's ``runs`` of them and vLLM's dynamic scales
    (``dynamic``, :func:`~fp8lab.calibration.endtoend.run_dynamic`'s outcome, or None)."""

    spec: CalibrationStudySpec
    cal: Calibration
    runs: QualityRuns
    held: Any = None
    chosen: list[ScaleSet] = dataclasses.field(default_factory=list)
    twin: ScaleSet | None = None
    folders: dict[str, str] = dataclasses.field(default_factory=dict)
    dynamic: dict[str, Any] | None = None

    @functools.cached_property
    def sets(self) -> list[ScaleSet]:
        """Every scale set: (a) each prompt cut, (b) the large set, (c) vLLM's dynamic formula, (d) 1.0."""
        return self.cal.scale_sets()

    @functools.cached_property
    def head_check(self) -> dict[str, Any] | None:
        """:func:`~fp8lab.calibration.endtoend.head_reduction_check` of the last per-head set and its twin (None
        without a twin)."""
        if self.twin is None:
            return None
        return head_reduction_check(
            self.runs,
            self.chosen[-1],
            quality_label(self.folders[f"{self.twin.name}-attn_head"]),
            quality_label(self.folders[f"{self.twin.name}-tensor"]),
        )

    @functools.cached_property
    def _tables(self) -> dict[str, Any]:
        import pandas as pd

        c, runs = self.spec.calibration, self.runs
        diff = scale_diff_table(self.sets)
        t: dict[str, Any] = {
            "timing": self.cal.timing_table(),
            "scales": pd.concat([s.to_frame() for s in self.sets], ignore_index=True),
            "diff": diff,
            "diff_summary": scale_diff_summary(diff),
            "convergence": convergence_table(self.cal.large, c.subset_sizes, c.subset_draws, c.seed, c.strategies),
            "prompt_points": prompt_points(self.cal, diff),
        }
        if self.held is not None:
            t["quant_error"] = quant_error_table(self.held, self.sets, c.roundings)
            t["quant_error_summary"] = quant_error_summary(t["quant_error"])
        t["status"] = runs.status_table()
        greedy, teacher, ppl, task = greedy_table(runs), teacher_table(runs), ppl_table(runs), task_table(runs)
        t.update(greedy=greedy, teacher=teacher, ppl=ppl, task=task)
        t["quality"] = summary_table(runs, greedy, teacher, ppl, task)
        return t

    def tables(self) -> dict[str, Any]:
        """``timing`` (per calibration source), ``scales`` (every set, long), ``diff`` and ``diff_summary`` (against
        the large set), ``convergence`` (random subsets) and ``prompt_points`` (the prompt cuts on that curve); with
        the held-out capture ``quant_error`` and ``quant_error_summary``; ``status`` (one row per engine),
        ``greedy``, ``teacher``, ``ppl``, ``task`` and ``quality`` (Study 03's summary, one row per KV config)."""
        return dict(self._tables)

    def summary(self) -> dict[str, Any]:
        """:func:`~fp8lab.calibration.summary.headline` of the tables, the engine's rounding, the quality labels and
        what was not measured natively: what the notebook records."""
        t = self._tables
        values = headline(
            self.cal,
            t["diff_summary"],
            t["convergence"],
            t.get("quant_error_summary"),
            t["quality"],
            self.head_check,
            self.dynamic,
        )
        values.update(engine_rounding=self.spec.engine_rounding, quality_labels=list(t["quality"].index))
        if self.runs.notes:  # no native FP8 KV kernel here: what ran emulated, and why
            values["not_measured"] = " ".join(self.runs.notes)
        return values

    def rows(self) -> list[dict[str, Any]]:
        """The typed summary rows (:func:`~fp8lab.calibration.summary.summary_rows`) the notebook records."""
        t = self._tables
        return summary_rows(self.cal, t["diff"], t["diff_summary"], self.runs, t["quality"])

    def verdict(self) -> tuple[Verdict, ...]:
        """Claims 10 and 14 of the claims audit, each judged by the audit's own rule on this run alone
        (:func:`judge`)."""
        return self._verdicts

    @functools.cached_property
    def _verdicts(self) -> tuple[Verdict, ...]:
        """:meth:`verdict`'s answer, judged once: :meth:`markdown` quotes claim 10's word from it too."""
        ok = [r for r in self.runs.results.values() if r.status == "ok"]
        prov = ok[0].provenance if ok else {}
        return judge(self.summary(), self.rows(), self.spec.calibration.model, prov.get("device"), prov.get("vllm"))

    def markdown(self) -> str:
        """What was not measured natively, then :func:`~fp8lab.calibration.verdict.claim_verdict` on the tables."""
        t = self._tables
        text = claim_verdict(
            self.cal,
            t["diff_summary"],
            t["convergence"],
            t.get("quant_error_summary"),
            t["quality"],
            self.head_check,
            self.dynamic,
            self.spec.engine_rounding,
            judged=next((v.verdict for v in self.verdict() if v.claim_id == "10"), None),
        )
        return "\n\n".join([*self.runs.notes, text])


def run(spec: CalibrationStudySpec, store: Path | None = None, progress: bool = True) -> Results:
    """Calibrate, capture held-out K/V, export the sets measured end to end and run them with Study 03's measures
    (every capture, model copy and engine run kept in the results store ``store``; None: ``$FP8LAB_RUNS`` or
    ``runs/``; what is stored is loaded)."""
    c, q = spec.calibration, spec.quality
    with in_store(store):
        all_prompts = load_prompt_set(q.prompts, q.tokenizer)  # every prompt's span is left out of the pool
        cal = calibrate(c, list(all_prompts.text), quality_reserved_tokens(q), progress=progress)
        eval_prompts = load_prompt_set(q.prompts, q.tokenizer, q.max_prompts_per_category)
        eval_seqs = list(eval_prompts.token_ids) + ppl_windows(q.tokenizer, q.ppl_windows, q.ppl_window_tokens)
        held = capture_heldout(c.model, eval_seqs, c.capture_threads)
        chosen, twin = quality_scale_sets(cal)
        folders = export_sets(c.model, chosen)
        if twin is not None:
            folders.update(export_sets(c.model, [twin]))
        runs = run_quality(dataclasses.replace(q, scale_sets=tuple(folders.values())), progress=progress)
        dynamic = None
        if c.try_dynamic:
            runs, dynamic = run_dynamic(runs)
    return Results(spec, cal, runs, held, chosen, twin, folders, dynamic)
