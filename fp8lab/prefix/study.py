"""Study 07 on the study contract (:mod:`fp8lab.study`): :class:`Spec` (:class:`~fp8lab.prefix.spec.PrefixSpec`),
:func:`run` -> :class:`Results`, a thin adapter over :func:`~fp8lab.prefix.run.run_prefix` and the existing table,
summary and verdict functions (it computes nothing of its own)::

    from fp8lab.prefix import study as s07

    spec = s07.Spec.from_params(globals())
    res = s07.run(spec)
    res.tables()["sweep"], res.summary(), res.rows(), res.verdict(), res.markdown()

The verdict: the field report's claim (the claims audit's claim 16, :data:`~fp8lab.prefix.verdict.CLAIM`) judged by
:func:`~fp8lab.prefix.verdict.claim_verdict`, its words put on the audit's scale as the audit does
(:data:`VERDICT_WORDS`); ``n`` is the number of paired trials; ``detectable`` the median detectable difference at 80% power of the
hit-rate difference (percentage points)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.prefix import replication
from fp8lab.prefix.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.prefix.predict import plan
from fp8lab.prefix.run import PrefixRun, run_prefix
from fp8lab.prefix.spec import PrefixSpec
from fp8lab.prefix.summary import summary, summary_rows
from fp8lab.prefix.tables import cell_table, correctness_table, knee_table, sweep_table
from fp8lab.prefix.verdict import CLAIM, verdict
from fp8lab.study import Verdict, VerdictWord

NAME = "07_prefix_cache"
#: The claims audit's id of the claim this study judges (:data:`fp8lab.audit.CLAIMS`).
CLAIM_ID = "16"
#: :func:`~fp8lab.prefix.verdict.claim_verdict`'s words on the audit's scale (as :data:`fp8lab.audit.PREFIX_VERDICTS`
#: reads them; a unit test keeps the two equal), ``not measured`` (a dtype did not run) as ``not testable here``.
VERDICT_WORDS: dict[str, VerdictWord] = {
    "refuted": "refuted",
    "consistent": "confirmed",
    "inconclusive": "inconclusive",
    "not measured": "not testable here",
}
#: The engine facts the notebook's engine table shows, one row per KV dtype.
ENGINE_COLUMNS = (
    "status",
    "error",
    "num_blocks",
    "block_size",
    "kv_cache_dtype",
    "attention_backend",
    "engine_start_s",
)


class Spec(PrefixSpec):
    """:class:`~fp8lab.prefix.spec.PrefixSpec` with :meth:`from_params` reading the UPPER_CASE names only, so a
    notebook's ``globals()`` can be passed whole (a lower-case variable never fills a field). It builds a plain
    :class:`PrefixSpec`: the run's descriptor, hash and store are the same as the spec's own."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> PrefixSpec:
        """The spec from a notebook's UPPER_CASE parameters (``globals()``, or a profile's resolved parameters);
        :class:`fp8lab.errors.SpecError` names a bad field before any engine starts."""
        return PrefixSpec.from_params({k: v for k, v in params.items() if isinstance(k, str) and k.isupper()})


@dataclass
class Results:
    """A stored Study 07 run (``run``, a :class:`~fp8lab.prefix.run.PrefixRun`) and the spec it measured, with the
    comparison ``other`` vs ``base``; every table, the summary and the verdict computed once, on first use."""

    run: PrefixRun
    spec: PrefixSpec
    base: str = "auto"
    other: str = "fp8"

    @functools.cached_property
    def _tables(self) -> dict[str, Any]:
        import pandas as pd

        predicted = plan(self.spec)
        extra: dict[str, Any] = {}
        if self.spec.replicated:  # issue 35: one row per engine and cell; intervals over engine pairs
            cells = replication.engine_cells(self.run.rows)
            sweeps = {a: replication.engine_sweep(cells, a, predicted, self.base, self.other) for a in self.spec.arms}
            sweep = sweeps[self.spec.headline_arm]
            extra = {"sweep_by_arm": sweeps, "colocation": replication.colocation_table(cells, self.base, self.other)}
            engines = pd.DataFrame(
                [{"engine": k, **{c: e.get(c) for c in ENGINE_COLUMNS}} for k, e in self.run.starts.items()]
            )
        else:
            cells = cell_table(self.run.rows)
            sweep = sweep_table(cells, predicted, self.base, self.other)
            engines = pd.DataFrame(
                [{"kv_dtype": d, **{k: e.get(k) for k in ENGINE_COLUMNS}} for d, e in self.run.engines.items()]
            )
        return {
            "predicted": predicted,
            "cells": cells,
            "sweep": sweep,
            "knees": knee_table(self.spec, sweep),
            "correctness": correctness_table(self.run.correctness),
            "engines": engines,
            **extra,
        }

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        return summary(self.run, self.base, self.other)

    def tables(self) -> dict[str, Any]:
        """``predicted`` (the replay, :func:`~fp8lab.prefix.predict.plan`), ``cells`` (per workload, N, trial and
        dtype), ``sweep`` (per workload and N: both dtypes, the paired differences), ``knees``, ``correctness``
        (hit vs cold) and ``engines`` (one row per KV dtype: status, error, blocks, backend, start time). A replicated
        run (issue 35): ``cells`` one row per engine and cell (its trials averaged), ``sweep`` the headline arm's
        with intervals over engine pairs, ``sweep_by_arm``, ``colocation`` (:func:`~fp8lab.prefix.replication.
        colocation_table`) and ``engines`` one row per engine started."""
        return dict(self._tables)

    def summary(self) -> dict[str, Any]:
        """:func:`fp8lab.prefix.summary.summary` of the run: what the notebook records."""
        return self._summary

    def rows(self) -> list[dict[str, Any]]:
        """:func:`fp8lab.prefix.summary.summary_rows` of the run's sweep and knees: the typed rows the notebook
        records beside the summary."""
        t = self._tables
        return summary_rows(self.run, t["sweep"], t["knees"], self.base, self.other)

    def verdict(self) -> tuple[Verdict, ...]:
        """The claim (audit claim 16) on this run's setting; the sentence says when the setting is a CPU analogue."""
        s = self._summary
        word = s["claim_verdict"]
        det = s.get("dhit_min_detectable_pp")
        line = verdict(s, self.base, self.other)[-1].replace("**", "")  # "Claim '...': <word> on this setting."
        evidence = s.get("claim_evidence")
        said = VERDICT_WORDS[word]
        if said in ("confirmed", "refuted"):  # capped as the audit caps it: one verdict per claim on every page
            import fp8lab.audit as audit

            f = audit.rule_prefix_hit_rate(audit.Report("run", Path("."), {NAME: s}))
            if f.verdict == said:
                said = audit.cap(audit.CLAIMS_BY_ID[CLAIM_ID], f).verdict
        return (
            Verdict(
                claim_id=CLAIM_ID,
                claim=CLAIM["text"],
                verdict=said,  # type: ignore[arg-type]  # a word of the audit's scale
                sentence=line + (f" {evidence}." if evidence else ""),
                n=None
                if word == "not measured"
                else int(s["engines_per_dtype"] if s.get("replicated") else s["trials"]),
                detectable=f"{det:.2f} pp of hit rate (detectable at 80% power, median over the cells that varied)"
                if det is not None
                else "deterministic replay, no interval"
                if s.get("dhit_deterministic_cells")
                else None,
            ),
        )

    def markdown(self) -> str:
        """The headline bullets (:func:`fp8lab.prefix.verdict.verdict`) as a Markdown list."""
        return "\n".join(f"- {line}" for line in verdict(self._summary, self.base, self.other))


def run(spec: PrefixSpec, store: Path | None = None) -> Results:
    """Measure (or load, or resume) ``spec`` in the results store ``store`` (None: ``$FP8LAB_RUNS`` or ``runs/``):
    :func:`~fp8lab.prefix.run.run_prefix`."""
    if spec.replicated:  # issue 35: fresh engines per dtype in ABBA order, each engine set its own stored sub-run
        return Results(replication.run_replicated(spec, root=store), spec)  # type: ignore[arg-type]
    return Results(run_prefix(spec, root=store), spec)
