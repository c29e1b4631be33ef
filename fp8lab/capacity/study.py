"""Study 00 on the study contract (:mod:`fp8lab.study`): :class:`Spec` (:class:`~fp8lab.capacity.spec.CapacitySpec`),
:func:`run` -> :class:`Results`, a thin adapter over :func:`~fp8lab.capacity.run.run_capacity` and the study's table,
summary and verdict functions (it computes nothing of its own)::

    from fp8lab.capacity import study as s00

    spec = s00.Spec.from_params(globals())
    res = s00.run(spec)
    res.tables()["formula"], res.summary(), res.rows(), res.verdict(), res.markdown()

The verdicts (:func:`~fp8lab.capacity.verdict.verdicts`): the claims audit's claim 3a ("FP8 halves the KV cache"),
``n`` the configs, and the study's own ``00.formula`` (vLLM allocates the blocks the formula predicts), ``n`` the
engines compared."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.capacity.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.capacity.run import CapacityRun, run_capacity
from fp8lab.capacity.spec import CapacitySpec
from fp8lab.capacity.summary import summary, summary_rows
from fp8lab.capacity.tables import tables
from fp8lab.capacity.verdict import verdict_markdown, verdicts
from fp8lab.study import Verdict

NAME = "00_kv_memory_estimation"


class Spec(CapacitySpec):
    """:class:`~fp8lab.capacity.spec.CapacitySpec`; :meth:`from_params` builds a plain :class:`CapacitySpec`."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CapacitySpec:
        """The spec from a notebook's UPPER_CASE parameters (``globals()``, or a profile's resolved parameters);
        :class:`fp8lab.errors.SpecError` names a bad field before any engine starts."""
        return CapacitySpec.from_params(params)


@dataclass
class Results:
    """A Study 00 run (``run``, a :class:`~fp8lab.capacity.run.CapacityRun`); its tables, summary, rows and verdict
    computed once, on first use."""

    run: CapacityRun

    @property
    def spec(self) -> CapacitySpec:
        return self.run.spec

    @functools.cached_property
    def _tables(self) -> dict[str, Any]:
        return tables(self.run)

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        return summary(self.run, self._tables)

    def tables(self) -> dict[str, Any]:
        """``formula``, ``per_layer``, ``curve``, ``plan``, ``memory``, ``check`` and ``records`` (None without
        engine records): :func:`fp8lab.capacity.tables.tables`."""
        return dict(self._tables)

    def summary(self) -> dict[str, Any]:
        """:func:`fp8lab.capacity.summary.summary`: what the notebook records."""
        return self._summary

    def rows(self) -> list[dict[str, Any]]:
        """:func:`fp8lab.capacity.summary.summary_rows`: the typed rows the notebook records beside the summary."""
        return summary_rows(self.run, self._tables)

    def verdict(self) -> tuple[Verdict, ...]:
        """:func:`fp8lab.capacity.verdict.verdicts` of the summary; an engine measured here that the engines on
        record hold too (``ENGINE_RECORDS`` naming the store it was measured into) counts once."""
        rec = self.run.records
        on_record = set(rec.run) if rec is not None else set()
        dup = sum(
            1
            for r in self.run.check_results
            if getattr(r, "status", None) == "ok" and getattr(r, "run_dir", None) and Path(r.run_dir).name in on_record
        )
        return verdicts(self._summary, dup)

    def markdown(self) -> str:
        """:func:`fp8lab.capacity.verdict.verdict_markdown`: the bullets the notebook shows."""
        return verdict_markdown(self._summary)


def run(spec: CapacitySpec, store: Path | None = None, runner: Callable[..., Any] | None = None) -> Results:
    """Measure (or load) ``spec``'s engines in the results store ``store`` (None: ``$FP8LAB_RUNS`` or ``runs/``) and
    check the engines on record: :func:`~fp8lab.capacity.run.run_capacity` (``runner``: tests give a fake engine)."""
    return Results(run_capacity(spec, store, runner))
