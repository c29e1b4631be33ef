"""Study 05, the claims audit, on the study contract (:mod:`fp8lab.study`): :class:`Spec`
(:class:`~fp8lab.audit.spec.AuditSpec`), :func:`run` -> :class:`Results`, a thin adapter over
:func:`~fp8lab.audit.evidence.load_evidence`, :func:`~fp8lab.audit.run.audit` and the existing tables, summary and
prose (it computes nothing of its own)::

    from fp8lab.audit import study as s05

    spec = s05.Spec.from_params(globals())
    res = s05.run(spec)
    res.tables()["claims"], res.summary(), res.verdict(), res.markdown()

The audit runs no engine: ``run`` reads the report folders the spec names (each study's recorded summary and typed
rows, the folders' ``summary.json`` and committed records), the saved vLLM introspections and the published model
configs; ``store`` (a results store) is accepted for the contract and not read.

The verdicts: one :class:`fp8lab.study.Verdict` per claim of :data:`~fp8lab.audit.claims.CLAIMS`, in its order, the
rule's verdict word as it is (the audit's scale is the contract's); ``sentence`` the verdict, its basis and the
setting of the deciding evidence; ``detectable`` the smallest effect that evidence could detect, as the rule wrote
it; ``n`` None, since the audit's verdicts rest on several studies' runs, each counting its own measurements
(shown in the rule's ``measured`` text)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.audit.evidence import Evidence
from fp8lab.audit.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.audit.rules_facts import options_table
from fp8lab.audit.rules_quality import format_facts
from fp8lab.audit.run import audit
from fp8lab.audit.spec import AuditSpec
from fp8lab.audit.summary import summary_values
from fp8lab.audit.tables import evidence_frame, verdict_frame
from fp8lab.audit.verdict import details_markdown, verdict_markdown
from fp8lab.study import Verdict

NAME = "05_claims_audit"


class Spec(AuditSpec):
    """:class:`~fp8lab.audit.spec.AuditSpec`: :meth:`from_params` reads only the notebook's parameter names
    (``REPORT_DIR``, ``OTHER_REPORTS``, ``EXTRA_SUMMARIES``, ``VLLM_OPTIONS_FILES``, ``INTROSPECT_INSTALLED``), so a
    notebook's ``globals()`` can be passed whole, and builds a plain :class:`AuditSpec`."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> AuditSpec:
        """The spec from notebook 05's parameters; :class:`fp8lab.errors.SpecError` names a bad field."""
        return AuditSpec.from_params(params)


@dataclass
class Results:
    """The evidence the audit read (``evidence``) under ``spec``; the audit's rows (one per claim), the tables, the
    summary and the verdicts computed once, on first use."""

    spec: AuditSpec
    evidence: Evidence

    @functools.cached_property
    def rows(self) -> list[dict[str, Any]]:
        """:func:`~fp8lab.audit.run.audit`: one row per claim (verdict, measured, setting, detectable, rule, ...)."""
        return audit(self.evidence)

    def tables(self) -> dict[str, Any]:
        """``evidence`` (what was read, :func:`~fp8lab.audit.tables.evidence_frame`), ``claims`` (one row per
        claim, :func:`~fp8lab.audit.tables.verdict_frame`; :func:`~fp8lab.audit.tables.styled` colours it),
        ``formats`` (the FP8 formats as torch implements them, claim 9) and ``options`` (claim 15's options against
        each inspected vLLM version)."""
        import pandas as pd

        return {
            "evidence": evidence_frame(self.evidence),
            "claims": verdict_frame(self.rows),
            "formats": pd.DataFrame(format_facts()).T,
            "options": pd.DataFrame(options_table(self.evidence)),
        }

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        return summary_values(self.rows, self.evidence)

    def summary(self) -> dict[str, Any]:
        """:func:`~fp8lab.audit.summary.summary_values`: what the notebook records (and the index reads)."""
        return self._summary

    def verdict(self) -> tuple[Verdict, ...]:
        """One verdict per claim, in the claims' order (the module docstring says what each field holds)."""
        out = []
        for r in self.rows:
            why = f", by {r['basis']}" if r["basis"] else ""
            where = f" ({r['setting']})" if r["setting"] else ""
            out.append(
                Verdict(
                    claim_id=str(r["id"]),
                    claim=r["claim"],
                    verdict=r["verdict"],
                    sentence=f"Claim {r['id']} ({r['claim'].rstrip('.')}): {r['verdict']}{why}{where}.",
                    n=None,
                    detectable=r["detectable"] or None,
                )
            )
        return tuple(out)

    def details_markdown(self) -> str:
        """Per claim, its rule and the numbers it read (:func:`~fp8lab.audit.verdict.details_markdown`)."""
        return details_markdown(self.rows)

    def markdown(self) -> str:
        """The headline and the counts (:func:`~fp8lab.audit.verdict.verdict_markdown`)."""
        return verdict_markdown(self.rows, self.evidence)


def run(spec: AuditSpec, store: Path | None = None) -> Results:
    """Read the evidence ``spec`` names (:meth:`~fp8lab.audit.spec.AuditSpec.evidence`); no engine runs and
    ``store`` is not read (the audit reads report folders, not a results store)."""
    return Results(spec, spec.evidence())
