"""The study contract: what every fp8lab study provides, so that a notebook reads as the same four calls and a new
study is one subpackage that fills them in.

The lifecycle (after lm-evaluation-harness's ``Task``: build requests -> process results -> aggregate, so that its
evaluator has no per-task branch) is four steps::

    from fp8lab.prefix import study as s07

    spec = s07.Spec.from_params(globals())  # 1. the notebook's UPPER_CASE parameters, validated: SpecError first
    res = s07.run(spec)                     # 2. measure, or load from the results store (store=None: runs/)
    res.tables()                            # 3. every table of the run, by name
    res.summary()                           #    the flat dict the notebook records (fp8lab.report.run.record_summary)
    res.verdict()                           # 4. one typed Verdict per claim the study judges

A study is a module (by convention ``fp8lab/<study>/study.py``) with four members, :class:`Study`: ``NAME`` (its
notebook's stem), ``Spec`` (a validated, frozen spec class with ``from_params``), ``run(spec, store=None)`` and the
results class it returns (:class:`Results`: ``spec``, ``tables()``, ``summary()``, ``verdict()``, ``markdown()``).
Like kvpress's presses (one concept per file, each press overriding one hook), the study's module only wires the
subpackage's own modules together; each concept sits in its own file::

    fp8lab/<study>/
        __init__.py   the study's docstring (question, design, store layout) and its public names
        spec.py       the Spec: a frozen dataclass, checked in __post_init__, from_params(params)
        run.py        run the engines (or load a stored run): spec -> the study's run object
        tables.py     the tables, computed from a run (pure functions of stored records)
        summary.py    the flat dict of key numbers the notebook records and the claims audit reads
        verdict.py    the claim(s) judged on the run, and the prose
        plots.py      the notebook's figures (imported on its own: it loads matplotlib)
        study.py      this contract: Spec, run(), the Results class, NAME

then one line in :data:`STUDIES` below, and a unit test that :func:`check` passes (``tests/unit/test_study.py``
checks every registered study).

This module is the standard library only, so that reading or checking the contract loads no study, no pandas and
no vLLM: :data:`STUDIES` names each study's module, :func:`load` imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

#: The verdict words, the claims audit's scale (:data:`fp8lab.audit.VERDICTS`; a unit test keeps the two equal):
#: ``confirmed``, ``refuted``, ``not reproduced here``, ``inconclusive``, ``not testable here``. A study judges a
#: claim on its own run's setting; whether that setting can decide the claim (a GPU claim, a CPU analogue, a seed's
#: other engine or GPU: ``not reproduced here``) is the audit's call.
VerdictWord = Literal["confirmed", "refuted", "not reproduced here", "inconclusive", "not testable here"]
VERDICT_WORDS: tuple[str, ...] = get_args(VerdictWord)


@dataclass(frozen=True)
class Verdict:
    """One claim judged on one run.

    ``claim_id``: the claims audit's id where the study judges one of its claims (:data:`fp8lab.audit.CLAIMS`,
    e.g. ``"16"``), else ``"<study>.<key>"`` (``"04.silent"``); ``claim``: the claim in words; ``verdict``: a
    word of :data:`VERDICT_WORDS`; ``sentence``: the verdict as one sentence, with its setting; ``n``: the number
    of measurements it rests on (paired trials, lengths, block sizes; said in the study's docstring), None when
    nothing was measured; ``detectable``: the smallest effect this run could detect, with its unit (``"+-0.40 pp
    of hit rate (median 95% CI half-width)"``), None where the study has no such interval for this claim.
    """

    claim_id: str
    claim: str
    verdict: VerdictWord
    sentence: str
    n: int | None = None
    detectable: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICT_WORDS:
            raise ValueError(
                f"Verdict.verdict = {self.verdict!r}: allowed {' | '.join(VERDICT_WORDS)} (the audit's scale)"
            )
        if self.n is not None and (isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 0):
            raise ValueError(f"Verdict.n = {self.n!r}: allowed a count >= 0, or None")


class Spec(Protocol):
    """A validated, frozen description of one run (a ``@dataclass(frozen=True)`` that checks itself in
    ``__post_init__``). ``from_params`` builds it from a notebook's UPPER_CASE parameters (``globals()``, or a
    profile's resolved parameters) and raises :class:`fp8lab.errors.SpecError` naming the field, the value and
    what is allowed, before any engine starts."""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Spec: ...


class Results(Protocol):
    """What ``run`` returns: a measured (or loaded) run that carries its own tables. Each method computes from the
    stored records only, at most once, and starts no engine."""

    @property
    def spec(self) -> Any:
        """The spec this run measured."""
        ...

    def tables(self) -> Mapping[str, Any]:
        """Every table of the run by name (pandas DataFrames, tidy: one row per measurement or per cell)."""
        ...

    def summary(self) -> dict[str, Any]:
        """The flat dict of key numbers the notebook records (:func:`fp8lab.report.run.record_summary`), JSON-able."""
        ...

    def verdict(self) -> tuple[Verdict, ...]:
        """One :class:`Verdict` per claim the study judges, in the study's order."""
        ...

    def markdown(self) -> str:
        """The verdict in prose, every number from the tables, as the notebook shows it."""
        ...


@runtime_checkable
class Study(Protocol):
    """A study: a module (or any object) with these members. ``NAME`` is its notebook's stem
    (``"07_prefix_cache"``); ``run(spec, store)`` measures ``spec`` in the results store ``store`` (None:
    ``$FP8LAB_RUNS`` or ``runs/``), loading what is stored there, and returns :class:`Results`."""

    NAME: str
    Spec: type[Any]

    def run(self, spec: Any, store: Path | None = None) -> Results: ...


#: The registered studies: notebook stem -> the module that implements :class:`Study` (imported by :func:`load`).
STUDIES: dict[str, str] = {
    "00_kv_memory_estimation": "fp8lab.capacity.study",
    "01_kv_dtype_auto_vs_fp8": "fp8lab.serving.study",
    "02_calibration_32_tokens": "fp8lab.calibration.study",
    "03_quality_token_match": "fp8lab.quality.study",
    "04_long_context_ramp_128k": "fp8lab.longctx.study",
    "05_claims_audit": "fp8lab.audit.study",
    "06_decode_speed": "fp8lab.decode.study",
    "07_prefix_cache": "fp8lab.prefix.study",
    "08_kv_dtype_matrix": "fp8lab.dtypes.study",
}

#: The members :func:`check` looks for: on the study, and on its results class (``Results``).
STUDY_MEMBERS: tuple[str, ...] = ("NAME", "Spec", "Spec.from_params", "run", "Results")
RESULTS_MEMBERS: tuple[str, ...] = ("spec", "tables", "summary", "verdict", "markdown")


class ContractError(TypeError):
    """A study that does not satisfy the contract; the message names every missing member."""


def missing(study: Any) -> list[str]:
    """The members of the contract that ``study`` lacks (``[]``: it satisfies it), as dotted names:
    ``"Spec.from_params"``, ``"Results.verdict"``. Callables must be callable; ``NAME`` a non-empty string."""
    out = []
    name = getattr(study, "NAME", None)
    if not isinstance(name, str) or not name:
        out.append("NAME")
    spec = getattr(study, "Spec", None)
    if not isinstance(spec, type):
        out.append("Spec")
    elif not callable(getattr(spec, "from_params", None)):
        out.append("Spec.from_params")
    if not callable(getattr(study, "run", None)):
        out.append("run")
    res = getattr(study, "Results", None)
    if not isinstance(res, type):
        out.append("Results")
    else:
        # spec may be a dataclass field (not a class attribute): look at the annotations as well as the class
        fields = set(getattr(res, "__dataclass_fields__", {})) | set(getattr(res, "__annotations__", {}))
        if not (hasattr(res, "spec") or "spec" in fields):
            out.append("Results.spec")
        out += [f"Results.{m}" for m in RESULTS_MEMBERS[1:] if not callable(getattr(res, m, None))]
    return out


def check(study: Any) -> Any:
    """``study`` itself when it satisfies the contract; else :class:`ContractError` naming what is missing."""
    gaps = missing(study)
    if gaps:
        label = getattr(study, "NAME", None) or getattr(study, "__name__", repr(study))
        raise ContractError(f"study {label} does not satisfy fp8lab.study's contract: missing {', '.join(gaps)}")
    return study


def load(name: str) -> Any:
    """The registered study ``name`` (a notebook stem of :data:`STUDIES`), imported and checked."""
    if name not in STUDIES:
        raise KeyError(f"study {name!r}: registered are {' | '.join(STUDIES)}")
    return check(importlib.import_module(STUDIES[name]))
