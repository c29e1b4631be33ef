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

then one line in :data:`fp8lab.studies.MODULES` (the one place that names a study), and a unit test that
:func:`check` passes (``tests/unit/test_study.py`` checks every registered study).

What the report wing and the claims audit ask of a study, beside the four steps, is the study's own too (optional
members, :data:`OPTIONAL_MEMBERS`): ``key_numbers(summary, rows)``, the few numbers the index shows for its page
(``(label with unit, value)`` pairs, from its typed rows when the page has them, else its flat summary); and
``NATIVE_ONLY``, what it measures that only the native FP8 KV kernel can (a phrase; absent: everything runs
emulated where the kernel is missing). A study without ``key_numbers`` shows its first rows or scalars.

This module is the standard library only, so that reading or checking the contract loads no study, no pandas and
no vLLM.
"""

from __future__ import annotations

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


#: The members :func:`check` looks for: on the study, and on its results class (``Results``).
STUDY_MEMBERS: tuple[str, ...] = ("NAME", "Spec", "Spec.from_params", "run", "Results")
RESULTS_MEMBERS: tuple[str, ...] = ("spec", "tables", "summary", "verdict", "markdown")
#: What a study may add for the report wing: its index numbers (a callable) and what needs the native kernel (a str).
OPTIONAL_MEMBERS: tuple[str, ...] = ("key_numbers", "NATIVE_ONLY")


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
    if hasattr(study, "key_numbers") and not callable(study.key_numbers):
        out.append("key_numbers")
    if hasattr(study, "NATIVE_ONLY") and not (isinstance(study.NATIVE_ONLY, str) and study.NATIVE_ONLY):
        out.append("NATIVE_ONLY")
    return out


def check(study: Any) -> Any:
    """``study`` itself when it satisfies the contract; else :class:`ContractError` naming what is missing."""
    gaps = missing(study)
    if gaps:
        label = getattr(study, "NAME", None) or getattr(study, "__name__", repr(study))
        raise ContractError(f"study {label} does not satisfy fp8lab.study's contract: missing {', '.join(gaps)}")
    return study
