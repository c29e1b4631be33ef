"""Study 03 on the study contract (:mod:`fp8lab.study`): :class:`Spec` (:class:`~fp8lab.quality.spec.QualityStudySpec`),
:func:`run` -> :class:`Results`, a thin adapter over :func:`~fp8lab.quality.run.run_quality` and the existing table,
round-trip, verdict and summary functions (it computes nothing of its own but the verdict words)::

    from fp8lab.quality import study as s03

    spec = s03.Spec.from_params(globals())
    res = s03.run(spec)
    res.tables()["summary"], res.summary(), res.rows(), res.verdict(), res.markdown()

What :func:`run` measures: the engines (:func:`~fp8lab.quality.run.run_quality`, through the results store), the real
K/V/Q of ``kv_capture_prompts`` prompts (:func:`fp8lab.kvcapture.capture_kv`, transformers on the CPU) and, where
the native FP8 kernel and the emulation both exist, the emulated teacher-forced phase
(:func:`fp8lab.quality.emulation.compare_with_native`). Everything else is computed from those, once, on first use.

The verdicts: one per candidate KV config (every config but ``auto``), its :func:`~fp8lab.quality.verdict.verdict`
level put on the audit's scale (:data:`VERDICT_WORDS`: ``negligible`` confirms "the config leaves the outputs
practically unchanged", ``material`` refutes it, which needs a 95% interval that excludes zero, ``small`` is
inconclusive, an engine that did not run is not testable here); ``n`` is the number of prompts, ``detectable`` the
95% CI half-width of the perplexity change (paired by window)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.paths import in_store
from fp8lab.quality.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.quality.roundtrip import (
    attention_error_table,
    capture_prompts,
    engine_roundtrip,
    roundtrip_points,
    roundtrip_summary,
    roundtrip_table,
)
from fp8lab.quality.run import QualityRuns, run_quality
from fp8lab.quality.spec import BASELINE, QualityStudySpec
from fp8lab.quality.summary import headline, summary_rows
from fp8lab.quality.tables import (
    by_position,
    greedy_table,
    ppl_by_label,
    ppl_table,
    scoring_check,
    summary_table,
    task_table,
    teacher_table,
    top3_by_category,
    topk_curve,
)
from fp8lab.quality.verdict import VerdictRules, verdict, verdict_markdown
from fp8lab.study import Verdict, VerdictWord

NAME = "03_quality_token_match"
#: :func:`~fp8lab.quality.verdict.verdict`'s levels on the audit's scale.
VERDICT_WORDS: dict[str, VerdictWord] = {
    "negligible": "confirmed",
    "material": "refuted",
    "small": "inconclusive",
    "failed": "not testable here",
}


class Spec(QualityStudySpec):
    """:class:`~fp8lab.quality.spec.QualityStudySpec`; :meth:`from_params` builds a plain one (the engines' spec is
    its ``quality`` field, so the stored runs are the notebook's own)."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> QualityStudySpec:
        return QualityStudySpec.from_params(params)


@dataclass
class Results:
    """A Study 03 run: the engines' ``runs`` (:class:`~fp8lab.quality.run.QualityRuns`), the captured real K/V/Q
    (``capture``, :class:`fp8lab.kvcapture` capture; None: no round-trip tables) and the emulated-vs-native
    comparison (``emulation``, :func:`fp8lab.quality.emulation.compare_with_native`; None or empty: not compared)."""

    spec: QualityStudySpec
    runs: QualityRuns
    capture: Any = None
    emulation: Any = None
    rules: VerdictRules = VerdictRules()

    @functools.cached_property
    def _tables(self) -> dict[str, Any]:
        import pandas as pd

        s, runs = self.spec, self.runs
        greedy = greedy_table(runs)
        teacher = teacher_table(runs)
        ppl, task = ppl_table(runs), task_table(runs)
        t: dict[str, Any] = {
            "status": runs.status_table(),
            "greedy": greedy,
            "top3": top3_by_category(greedy),
            "teacher": teacher,
            "by_position": by_position(teacher, s.position_bin),
            "topk_curve": topk_curve(teacher),
            "ppl": ppl,
            "ppl_by_label": ppl_by_label(ppl),
            "task": task,
            "scoring_check": scoring_check(runs),
        }
        if self.capture is not None:
            rt = roundtrip_table(
                self.capture, s.fp8_formats, s.roundings, s.roundtrip_scales, s.quality.scale_set_map()
            )
            t["roundtrip"] = rt
            t["roundtrip_summary"] = roundtrip_summary(rt)
            t["roundtrip_points"] = roundtrip_points(self.capture, 0, "K", s.fp8_formats, s.roundings)
            t["attention"] = attention_error_table(self.capture, s.fp8_formats, s.roundings, quantize_q=(False, True))
            t["engine_roundtrip"] = engine_roundtrip(
                t["roundtrip_summary"], runs.configs, s.engine_rounding, s.engine_quantizes_q
            )
        t["emulation"] = self.emulation if self.emulation is not None else pd.DataFrame()
        t["summary"] = summary_table(runs, greedy, teacher, ppl, task)
        return t

    @functools.cached_property
    def _verdicts(self) -> dict[str, dict[str, Any]]:
        return verdict(self._tables["summary"], self.rules)

    def tables(self) -> dict[str, Any]:
        """``status`` (one row per engine), ``greedy``, ``top3`` (per config and category), ``teacher``,
        ``by_position``, ``topk_curve``, ``ppl``, ``ppl_by_label``, ``task``, ``scoring_check`` (does the
        through-the-cache scoring see each candidate's quantization: :func:`scoring_check`); with a capture ``roundtrip``,
        ``roundtrip_summary``, ``roundtrip_points``, ``attention``, ``engine_roundtrip``; ``emulation`` (emulated vs
        native, empty where not compared) and ``summary`` (one row per KV config, :func:`summary_table`)."""
        return dict(self._tables)

    def summary(self) -> dict[str, Any]:
        """:func:`~fp8lab.quality.summary.headline` of the tables, the emulation comparison
        (:func:`fp8lab.quality.emulation.summary_values`) and the engine's rounding: what the notebook records."""
        from fp8lab.quality import emulation

        t = self._tables
        values = headline(
            self.runs,
            t["summary"],
            t["top3"],
            t["greedy"],
            t.get("roundtrip_summary"),
            t.get("attention"),
            self._verdicts,
            t.get("engine_roundtrip"),
            t.get("scoring_check"),
        )
        values.update(emulation.summary_values(self.emulation))
        values.update(engine_rounding=self.spec.engine_rounding, engine_quantizes_q=self.spec.engine_quantizes_q)
        return values

    def rows(self) -> list[dict[str, Any]]:
        """The typed summary rows (:func:`~fp8lab.quality.summary.summary_rows`) the notebook records beside it."""
        t = self._tables
        return summary_rows(self.runs, t["summary"], t["top3"], t["greedy"], scoring=t.get("scoring_check"))

    def verdict(self) -> tuple[Verdict, ...]:
        """One verdict per candidate KV config (the module docstring says what the words, ``n`` and ``detectable``
        are)."""
        r, summ = self.rules, self._tables["summary"]
        model = Path(self.spec.quality.model).name
        n_prompts = len(self.runs.prompts)
        out = []
        for lab, v in self._verdicts.items():
            word = VERDICT_WORDS[v["level"]]
            ci = summ.loc[lab].get("delta_ppl_pct_ci") if lab in summ.index else None
            hw = (ci[1] - ci[0]) / 2 if isinstance(ci, tuple) and len(ci) == 2 else float("nan")
            out.append(
                Verdict(
                    claim_id=f"03.{lab}",
                    claim=f"FP8 KV cache as {lab} leaves the model's outputs practically unchanged against {BASELINE} "
                    f"(|Δppl| <= {r.ppl_pct_ok}%, copy-task drop <= {r.task_drop_ok}, teacher-forced top-1 >= "
                    f"{r.tf_top1_ok})",
                    verdict=word,
                    sentence=f"{lab}: effect {v['level']}, the reports' top-3 protocol: {v['report_protocol']} "
                    f"({model}, {n_prompts} prompts, {len(self.runs.windows)} perplexity windows, "
                    f"{len(self.runs.task)} copy-task items).",
                    n=None if word == "not testable here" else n_prompts,
                    detectable=f"+-{hw:.2f}% of perplexity (95% CI half-width, paired by window)"
                    if word != "not testable here" and math.isfinite(hw)
                    else None,
                )
            )
        return tuple(out)

    def markdown(self) -> str:
        """:func:`~fp8lab.quality.verdict.verdict_markdown`: what was not measured natively, then a paragraph per
        candidate."""
        return verdict_markdown(self._verdicts, self.runs.notes)


def run(spec: QualityStudySpec, store: Path | None = None, progress: bool = True) -> Results:
    """Run (or load) every engine of ``spec`` in the results store ``store`` (None: ``$FP8LAB_RUNS`` or ``runs/``),
    capture the real K/V/Q of its first prompts and compare emulated with native FP8 where both exist."""
    from fp8lab import kvcapture
    from fp8lab.quality.emulation import compare_with_native

    with in_store(store):
        runs = run_quality(spec.quality, progress=progress)
        capture = kvcapture.capture_kv(spec.quality.model, capture_prompts(runs.prompts, spec.kv_capture_prompts))
        emulation = compare_with_native(runs)
    return Results(spec, runs, capture, emulation)
