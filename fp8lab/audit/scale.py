"""The audit's verdict scale and how a verdict is reached: the words (:data:`VERDICTS`), the outcome of one part of a
claim (``holds`` ... ``untested``), the bases (GPU evidence, physics, ...), the thresholds, :class:`Finding`,
:func:`judge` (a claimed change against a measured interval), :func:`parts_verdict`, :func:`combine` and
:func:`decide` (per-report findings by comparability), and the rule registry (:data:`RULES`, :func:`rule`,
:func:`per_report`, :func:`safe`)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from fp8lab.audit.claims import CLAIMS_BY_ID, Claim
from fp8lab.audit.evidence import Evidence, Missing, Report, Setting
from fp8lab.audit.match import match_text, mismatches
from fp8lab.specs import SpecError

Verdict = Literal["confirmed", "refuted", "not reproduced here", "inconclusive", "not testable here"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
CONFIRMED, REFUTED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE = VERDICTS
#: What one part of a claim came to: it ``holds``, is ``contradicted``, the evidence cannot resolve it
#: (``unresolved``), or no evidence addresses it (``untested``).
Outcome = Literal["holds", "contradicted", "unresolved", "untested"]
HOLDS, CONTRADICTED, UNRESOLVED, UNTESTED = get_args(Outcome)
#: What a claim needs to be decided: GPU runs of a full-size model, GPU runs of any model, or any run.
Needs = Literal["gpu-model", "gpu", "any"]
#: The bases that carry no evidence setting (never capped by a setting mismatch).
SETTING_FREE_BASES = ("physics", "arithmetic", "documented fact", "introspection", "computation", "the seed's script")
#: The basis of a finding.
GPU_EVIDENCE, CPU_EVIDENCE, ANALOGUE, PHYSICS, ARITHMETIC, FACT, INTROSPECTION, COMPUTATION, SCRIPT = (
    "GPU evidence",
    "CPU evidence",
    "analogue",
    "physics",
    "arithmetic",
    "documented fact",
    "introspection",
    "computation",
    "the seed's script",
)

# ------------------------------------------------------------------------------------------------ thresholds
#: "About" a claimed effect: a value within +-50% of the claimed change counts as one of the claimed size (the
#: reports' figures come from other models and GPUs; the sign and the order of magnitude are what can carry over).
SIZE_TOL = 0.5
#: "About" a claimed figure of arithmetic (claim 2): within 15% of it.
ABOUT_TOL = 0.15
#: Peak memory (claim 3b): a change under 2% of the baseline's peak is no change (the sampler's resolution).
MEMORY_NOISE = 0.02
#: Open loop (claim 8): the sender kept its schedule when achieved / scheduled rate is within 5% of 1.
OPEN_LOOP_RATE_TOL = 0.05
#: z for a two-sided 95% interval, z for 80% power, and the MAD-to-sigma factor of a normal distribution.
Z95, Z80, MAD_SIGMA = 1.96, 0.8416, 1.4826
#: Halving the KV bytes can at most halve a memory-bound decode step: a cut above 50% (a gain above x2) is
#: impossible by bandwidth whatever the model (the KV share of the bytes read approaches 1 at best).
MAX_FP8_STEP_CUT = 0.5


@dataclass(frozen=True)
class Finding:
    """What a rule concluded: ``verdict``; ``measured`` (the numbers it read); ``on_what`` (why, or the nearest
    evidence when not testable); ``setting`` (of the deciding evidence); ``detectable`` (the smallest effect that
    evidence could detect); ``basis`` (GPU evidence, physics, ...); ``details`` (machine-readable); ``by_report``
    (each report's verdict, analogues marked); ``headline`` (one sentence for the index, when the finding is
    worth one); ``match`` (how the evidence's setting compares with the claim's: :func:`fp8lab.audit.match.match_text`,
    or why none is needed)."""

    verdict: str
    measured: str
    on_what: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    by_report: Mapping[str, str] = field(default_factory=dict)
    setting: str = ""
    detectable: str = ""
    basis: str = ""
    headline: str = ""
    match: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise SpecError("Finding", "verdict", self.verdict, "allowed: " + " | ".join(VERDICTS))


@dataclass(frozen=True)
class Rule:
    claim_id: str
    fn: Callable[[Evidence], Finding]
    text: str


RULES: dict[str, Rule] = {}

COMBINE_TEXT = (
    " Applied to each report alone; only reports whose setting can decide the claim (see its 'needs') "
    "decide: they agreeing give their verdict, confirmed beside refuted gives inconclusive; the others are "
    "shown as analogues; none comparable gives 'not testable here'."
)


def _doc(fn: Callable[..., Any]) -> str:
    return " ".join((inspect.getdoc(fn) or "").split())


def rule(claim_id: str) -> Callable[[Callable[[Evidence], Finding]], Callable[[Evidence], Finding]]:
    """Register ``fn(evidence) -> Finding`` as the rule of claim ``claim_id`` (its docstring is the rule's text)."""

    def deco(fn: Callable[[Evidence], Finding]) -> Callable[[Evidence], Finding]:
        def capped(ev: Evidence) -> Finding:
            return cap(CLAIMS_BY_ID[claim_id], fn(ev))

        RULES[claim_id] = Rule(claim_id, capped, _doc(fn))
        return fn

    return deco


def per_report(
    claim_id: str, physics: Callable[[Evidence], Finding | None] | None = None, label: str = "physics"
) -> Callable[[Callable[[Report], Finding]], Callable[[Report], Finding]]:
    """Register ``fn(report) -> Finding`` as claim ``claim_id``'s rule, applied to every report and combined by
    comparability (:func:`decide`); ``physics(evidence)``, when given, adds a setting-free finding (physics,
    arithmetic, introspection: named ``label``) that decides beside the comparable reports."""

    def deco(fn: Callable[[Report], Finding]) -> Callable[[Report], Finding]:
        def over_reports(ev: Evidence) -> Finding:
            claim = CLAIMS_BY_ID[claim_id]
            found = {r.label: safe(fn, r) for r in ev.reports}
            extra = physics(ev) if physics is not None else None
            return decide(claim, found, {label: extra} if extra is not None else {})

        RULES[claim_id] = Rule(
            claim_id,
            over_reports,
            _doc(fn) + COMBINE_TEXT + (f" {label.capitalize()}: " + _doc(physics) if physics is not None else ""),
        )
        return fn

    return deco


def safe(fn: Callable[[Any], Finding], arg: Any) -> Finding:
    """``fn(arg)``, or ``not testable here`` naming what was missing."""
    try:
        return fn(arg)
    except Missing as e:
        return Finding(NOT_TESTABLE, f"not recorded: {e}", f"run the study for this profile ({e})")


def _setting_of(f: Finding) -> Setting | None:
    s = f.details.get("_setting")
    return s if isinstance(s, Setting) else None


def combine(findings: Mapping[str, Finding]) -> Finding:
    """One finding from several that all may decide: the testable ones agreeing give their verdict; confirmed
    beside refuted gives inconclusive (the settings disagree); refuted or confirmed beside any other keeps the
    decisive one; ``not reproduced here`` (a capped finding) beside inconclusive keeps the capped one; none testable
    gives ``not testable here``."""
    if not findings:
        return Finding(NOT_TESTABLE, "no report holds evidence", "no report folder was found")
    measured = " | ".join(f"[{k}] {f.measured}" for k, f in findings.items())
    details = {
        k: {"verdict": f.verdict, **{a: b for a, b in f.details.items() if a != "_setting"}}
        for k, f in findings.items()
    }
    by = {k: f.verdict for k, f in findings.items()}
    testable = {k: f for k, f in findings.items() if f.verdict != NOT_TESTABLE}
    shown = testable or findings
    setting = "; ".join(f"[{k}] {f.setting}" for k, f in shown.items() if f.setting)
    detectable = "; ".join(f"[{k}] {f.detectable}" for k, f in shown.items() if f.detectable)
    basis = ", ".join(sorted({f.basis for f in shown.values() if f.basis}))
    on = "; ".join(f"[{k}] {f.on_what}" for k, f in shown.items() if f.on_what)
    match = "; ".join(f"[{k}] {f.match}" for k, f in shown.items() if f.match)
    heads = [f.headline for f in testable.values() if f.headline]
    if not testable:
        return Finding(NOT_TESTABLE, measured, on, details, by, setting, detectable, "", "", match)
    kinds = {f.verdict for f in testable.values()}
    if {CONFIRMED, REFUTED} <= kinds:
        split = ", ".join(f"{k}: {f.verdict}" for k, f in testable.items())
        return Finding(
            INCONCLUSIVE,
            measured,
            f"the settings disagree ({split}). " + on,
            details,
            by,
            setting,
            detectable,
            basis,
            "",
            match,
        )
    verdict = next(v for v in (REFUTED, CONFIRMED, NOT_REPRODUCED, INCONCLUSIVE) if v in kinds)
    head = heads[0] if heads and verdict in (CONFIRMED, REFUTED) else ""
    return Finding(verdict, measured, on, details, by, setting, detectable, basis, head, match)


def cap(claim: Claim, f: Finding) -> Finding:
    """``f`` with its setting checked against the claim's (:func:`fp8lab.audit.match.mismatches`): a confirmation or
    refutation from evidence that differs from the claim's setting on a dimension that matters becomes ``not
    reproduced here``, naming the mismatch (``match``) and what the evidence shows in its own setting
    (``details['uncapped']``);
    a finding on a setting-free basis (physics, arithmetic, a documented fact, introspection, a computation, the
    seed's own script) or without an evidence setting is left as it is, with its match stated."""
    s = _setting_of(f)
    if s is None:
        why = f"setting-free ({f.basis})" if f.basis else ""
        return dataclasses.replace(f, match=f.match or why)
    mm = mismatches(claim.where, s)
    text = match_text(claim.where, s)
    if not mm or f.verdict not in (CONFIRMED, REFUTED):
        return dataclasses.replace(f, match=text)
    return dataclasses.replace(
        f,
        verdict=NOT_REPRODUCED,
        on_what=f"{f.verdict} in the evidence's own setting, capped: the settings differ where it matters (setting "
        "match). " + f.on_what,
        details={**f.details, "uncapped": f.verdict},  # the mismatch is named in `match`
        match=text,
        headline="",
    )


def decide(claim: Claim, findings: Mapping[str, Finding], extra: Mapping[str, Finding] = {}) -> Finding:  # noqa: B006
    """Split per-report findings by comparability (each finding's setting against ``claim.needs``): the comparable
    ones, each capped by its setting match (:func:`cap`), and ``extra`` (physics, setting-free) decide
    (:func:`combine`); the rest are shown as analogues, never as the basis."""
    deciding, analogue = {}, {}
    for k, f in findings.items():
        s = _setting_of(f)
        if f.verdict != NOT_TESTABLE and s is not None and not s.qualifies(claim.needs):
            analogue[k] = f
        else:
            deciding[k] = cap(claim, f)
    deciding.update({k: cap(claim, f) for k, f in extra.items()})
    out = combine(deciding) if deciding else Finding(NOT_TESTABLE, "", "")
    comparable = any(s is not None and s.qualifies(claim.needs) for s in map(_setting_of, findings.values()))
    if not [f for f in deciding.values() if f.verdict != NOT_TESTABLE] and analogue and not comparable:
        why = {"gpu-model": "a GPU run of a full-size model", "gpu": "a GPU run", "sglang": "an SGLang run"}
        out = dataclasses.replace(
            out,
            verdict=NOT_TESTABLE,
            on_what=(
                f"no comparable evidence: this claim needs {why.get(claim.needs, 'comparable evidence')}"
                + (f"; {out.on_what}" if out.on_what else "")
            ),
        )
    if analogue:
        # the analogue's setting is in the evidence table (and in `settings` of the summary): named, not repeated
        a = "; ".join(f"[{k}, analogue] {f.verdict} ({f.measured})" for k, f in analogue.items())
        by = {**out.by_report, **{k: f"{f.verdict} (analogue)" for k, f in analogue.items()}}
        details = {
            **out.details,
            # an analogue's numbers are in `measured`; its details are not repeated
            **{k: {"verdict": f.verdict, "analogue": True} for k, f in analogue.items()},
        }
        out = dataclasses.replace(
            out, measured=(out.measured + " | " if out.measured else "") + a, by_report=by, details=details
        )
    return out


def parts_verdict(parts: Mapping[str, str]) -> str:
    """Any part contradicted -> refuted; every part holds -> confirmed; any part unresolved -> inconclusive;
    otherwise (a part no evidence addresses) not testable here."""
    if any(v == CONTRADICTED for v in parts.values()):
        return REFUTED
    if parts and all(v == HOLDS for v in parts.values()):
        return CONFIRMED
    if any(v == UNRESOLVED for v in parts.values()):
        return INCONCLUSIVE
    return NOT_TESTABLE


def judge(lo: float, hi: float, claimed: float, size_tol: float = SIZE_TOL) -> str:
    """One claimed change (``claimed``, signed, e.g. -7.9 for "-7.9%") against an interval ``[lo, hi]`` of the
    measured change, in the same units. Holds when the interval excludes zero on the claim's side and reaches
    the claim's size (within ``size_tol`` of it); contradicted when it excludes zero on the other side, when it
    holds zero but excludes the claimed value (no effect of the claimed size), or when it has the claim's sign
    but not its size; unresolved when it holds both zero and the claimed value (the run cannot resolve it)."""
    lo, hi = min(lo, hi), max(lo, hi)
    if claimed == 0:
        return HOLDS if lo <= 0 <= hi else CONTRADICTED
    same = lo > 0 if claimed > 0 else hi < 0
    other = hi < 0 if claimed > 0 else lo > 0
    if same:
        a, b = sorted((claimed * (1 - size_tol), claimed * (1 + size_tol)))
        return HOLDS if lo <= b and hi >= a else CONTRADICTED
    if other:
        return CONTRADICTED
    return UNRESOLVED if lo <= claimed <= hi else CONTRADICTED


def outcome_verdict(outcome: str) -> str:
    return {HOLDS: CONFIRMED, CONTRADICTED: REFUTED, UNRESOLVED: INCONCLUSIVE, UNTESTED: NOT_TESTABLE}[outcome]


def finding(
    verdict: str,
    measured: str,
    on_what: str,
    details: Mapping[str, Any] | None = None,
    *,
    setting: Setting | None = None,
    detectable: str = "",
    basis: str = "",
    headline: str = "",
) -> Finding:
    """A :class:`Finding` that carries its setting (text, and the object for :func:`decide`)."""
    d = dict(details or {})
    if setting is not None:
        d["_setting"] = setting
        if not basis:
            basis = {"gpu": GPU_EVIDENCE, "cpu": CPU_EVIDENCE}.get(setting.kind or "", "")
    return Finding(verdict, measured, on_what, d, {}, setting.text if setting else "", detectable, basis, headline)
