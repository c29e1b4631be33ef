"""Study 04 on the study contract (:mod:`fp8lab.study`): :class:`Spec` (:class:`~fp8lab.longctx.spec.LongCtxPlan`),
:func:`run` -> :class:`Results`, a thin adapter over :func:`~fp8lab.longctx.run.run_study` and the existing
:func:`~fp8lab.longctx.tables.tables`, :func:`~fp8lab.longctx.verdict.claims`,
:func:`~fp8lab.longctx.summary.summary_values` and :func:`~fp8lab.longctx.verdict.verdict_markdown` (it computes
nothing of its own but the verdict words)::

    from fp8lab.longctx import study as s04

    spec = s04.Spec.from_params(globals())
    res = s04.run(spec)
    res.tables()["ramp"], res.summary(), res.rows(), res.verdict(), res.markdown()

The verdicts: the five field-report claims of :func:`~fp8lab.longctx.verdict.claims`, each ``label`` put on the
audit's scale by :func:`verdict_word` (``supported`` -> confirmed, ``not measured`` -> not testable here, anything
else -> inconclusive: a label such as ``not supported`` says the run did not show the effect, not that an interval
excludes it, which the audit's ``refuted`` needs; for the silent-failure claim, divergence that grows along the
context confirms it). The block-size claim (the audit's 12a) is the exception: its verdict is the claims audit's own
rule, :func:`fp8lab.audit.rules_longctx.block_size_finding`, applied to the summary this run records (the audit
applies it to the same summary), so Study 04 and the audit give one verdict on one run; its ``label`` says only which
block size was fastest. So is the random-token claim (the audit's 28): the audit's rule
:func:`fp8lab.audit.rules_longctx.rule_random_tokens` on this run's summary, reading the FP8 candidate native or
emulated. ``n`` and ``detectable`` per claim: ``oom`` the dtypes whose boundary was found, to one KV
block; ``gains_grow`` the ramp lengths compared one request at a time, the 95% CI half-width of the ITL median's
relative delta at the longest; ``block256`` the block sizes that ran at the longest sweep length, the rule's
detectable effect (the ramp's own scatter, :func:`fp8lab.audit.readers.ramp_noise`); ``silent`` the teacher-forced positions scored on real text; ``random_tokens`` the rows
of the random-vs-real table."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.audit.scale import Finding, safe
from fp8lab.errors import SpecError
from fp8lab.longctx.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.longctx.run import LongCtxResult, run_study
from fp8lab.longctx.spec import LongCtxPlan
from fp8lab.longctx.summary import summary_rows, summary_values
from fp8lab.longctx.tables import Tables, tables
from fp8lab.longctx.verdict import claims, verdict_markdown
from fp8lab.paths import in_store
from fp8lab.study import Verdict, VerdictWord

NAME = "04_long_context_ramp_128k"
#: The claims :func:`~fp8lab.longctx.verdict.claims` judges, in its order: key -> (claim id, the claim). The id is
#: the claims audit's (:data:`fp8lab.audit.CLAIMS`) where the claim is one of its own, else ``04.<key>``.
CLAIMS: dict[str, tuple[str, str]] = {
    "oom": ("04.oom", "bf16 runs out of memory where fp8 keeps going"),
    "gains_grow": ("04.gains_grow", "FP8's gains grow with context length"),
    "block256": ("12a", "Block size 256 beats 16 at 128K"),
    "silent": ("04.silent", "The real danger of FP8 KV at long context is silent failure, not OOM"),
    "random_tokens": ("28", "128K tests with random tokens are worthless"),
}


def verdict_word(key: str, label: str) -> VerdictWord:
    """Claim ``key``'s label (:func:`~fp8lab.longctx.verdict.claims`) on the audit's scale."""
    if label == "not measured":
        return "not testable here"
    if key == "silent":
        return "confirmed" if label == "divergence grows along the context" else "inconclusive"
    # "not supported" says the run did not show the effect, not that an interval excludes it (the audit's refuted)
    return "confirmed" if label == "supported" else "inconclusive"


class Spec(LongCtxPlan):
    """:class:`~fp8lab.longctx.spec.LongCtxPlan` with :meth:`from_params` naming a missing parameter as a
    :class:`~fp8lab.errors.SpecError` (the plan's own raises ``KeyError``). It builds a plain :class:`LongCtxPlan`:
    the engines' specs and the store are the plan's own."""

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> LongCtxPlan:
        """The plan from a notebook's UPPER_CASE parameters (``globals()``, or a profile's resolved parameters)."""
        try:
            return LongCtxPlan.from_params(p)
        except KeyError as e:
            raise SpecError(
                "LongCtxPlan", str(e.args[0]), "missing", "a parameter of notebook 04's parameters cell"
            ) from None


@dataclass
class Results:
    """A Study 04 run (``run``, a :class:`~fp8lab.longctx.run.LongCtxResult`); its tables, claims, summary and
    verdict computed once, on first use."""

    run: LongCtxResult

    @property
    def spec(self) -> LongCtxPlan:
        return self.run.plan

    @functools.cached_property
    def _tables(self) -> Tables:
        return tables(self.run)

    @functools.cached_property
    def _claims(self) -> dict[str, dict[str, Any]]:
        return claims(self.run, self._tables)

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        return summary_values(self.run, self._tables, self._claims)

    def tables(self) -> dict[str, Any]:
        """``engines`` (one row per engine: role, dtype, block size, status, ...) and every table of
        :class:`~fp8lab.longctx.tables.Tables` by its field name (``ramp``, ``boundary``, ``frontier``, ``growth``,
        ``speed``, ``crossover``, ``blocksize``, ``divergence``, ``bypos``, ``trend``, ``passkey``, ``random``)."""
        t = self._tables
        return {"engines": self.run.engines, **{f.name: getattr(t, f.name) for f in dataclasses.fields(t)}}

    def summary(self) -> dict[str, Any]:
        """:func:`fp8lab.longctx.summary.summary_values`: what the notebook records."""
        return self._summary

    def rows(self) -> list[dict[str, Any]]:
        """:func:`fp8lab.longctx.summary.summary_rows`: the typed rows the notebook records beside the summary."""
        return summary_rows(self.run, self._tables)

    def verdict(self) -> tuple[Verdict, ...]:
        """The five claims on this run's setting (the module docstring says what ``n`` and ``detectable`` count)."""
        c, t = self._claims, self._tables
        bs = self.run.block_size
        n = {
            "oom": len(t.boundary),
            "gains_grow": min(
                (
                    len(t.speed[(t.speed.kv_dtype == d) & (t.speed.concurrency == 1)])
                    for d in c["gains_grow"]["by_dtype"]
                ),
                default=0,
            ),
            "block256": len(c["block256"]["sizes"]),
            "silent": int(((t.divergence.source == "text").sum()) if len(t.divergence) else 0),
            "random_tokens": len(t.random),
        }

        def ci_text(cis: list[tuple[float, float]], what: str) -> str | None:
            hw = [(hi - lo) / 2 for lo, hi in cis if math.isfinite(lo) and math.isfinite(hi)]
            return f"+-{100 * max(hw):.1f}% of {what} (95% CI half-width)" if hw else None

        detectable = {
            "oom": f"one KV block ({bs} tokens)",
            "gains_grow": ci_text(
                [v["itl_ci_longest"] for v in c["gains_grow"]["by_dtype"].values()],
                "the ITL median at the longest length",
            ),
        }
        out = []
        for key, (cid, text) in CLAIMS.items():
            label = c[key]["label"]
            word = verdict_word(key, label)
            where = self._setting(quality=key in ("silent", "random_tokens"))
            sentence = f'"{text}": {label} ({where}).'
            if key == "block256":  # the audit's rule 12a, on the summary this run records
                f = self._block_size
                word = f.verdict  # type: ignore[assignment]  # a word of the audit's scale (Finding checks it)
                detectable["block256"] = f.detectable or None
                sentence = (
                    f'"{text}": {word} by the claims audit\'s rule 12a ({f.measured}; {f.on_what}); '
                    f"fastest: {label} ({self._setting()})."
                )
            if key == "random_tokens":  # the audit's rule 28 on this run's summary (FP8 native or emulated)
                f = self._random_tokens
                word = f.verdict  # type: ignore[assignment]  # a word of the audit's scale (Finding checks it)
                detectable["random_tokens"] = f.detectable or None
                sentence = (
                    f'"{text}": {word} by the claims audit\'s rule 28 ({f.measured}; {f.on_what}); {label} ({where}).'
                )
            out.append(
                Verdict(
                    claim_id=cid,
                    claim=text,
                    verdict=word,
                    sentence=sentence,
                    n=None if word == "not testable here" else int(n[key]),
                    detectable=None if word == "not testable here" else detectable.get(key),
                )
            )
        return tuple(out)

    @functools.cached_property
    def _block_size(self) -> Finding:
        """Claim 12a judged by the audit's rule (:func:`~fp8lab.audit.rules_longctx.block_size_finding`) on this
        run's summary, capped as the audit caps it where this run's setting differs from the claim's
        (:func:`fp8lab.audit.scale.cap`: one verdict per claim on every page); ``not testable here`` naming what is
        missing (no sweep, no ramp fit)."""
        import fp8lab.audit as audit

        rep = audit.Report("run", Path("."), {NAME: self._summary})
        return audit.cap(audit.CLAIMS_BY_ID["12a"], safe(audit.rule_block_size, rep))

    @functools.cached_property
    def _random_tokens(self) -> Finding:
        """Claim 28 judged by the audit's rule (:func:`~fp8lab.audit.rules_longctx.rule_random_tokens`) on this
        run's summary, capped as the audit caps it (one verdict per claim on every page); ``not testable here`` when
        no random-token divergence was recorded (a timing-only run: the claim can at most hold for quality)."""
        import fp8lab.audit as audit

        rep = audit.Report("run", Path("."), {NAME: self._summary})
        return audit.cap(audit.CLAIMS_BY_ID["28"], safe(audit.rule_random_tokens, rep))

    def _setting(self, quality: bool = False) -> str:
        """The run's setting for a verdict's sentence; ``quality``: of the divergence and passkey engines (their
        model, which may not be the ramp's, their documents, and the candidates that ran emulated)."""
        p = self.spec
        if quality and p.quality_model is not None:
            emulated = f", {' and '.join(self.run.emulated)} (no FP8 KV kernel here)" if self.run.emulated else ""
            return f"{Path(p.quality_model).name}, teacher-forced documents of {p.doc_length:,} tokens{emulated}"
        budget = f"{p.kv_cache_gib:g} GiB of KV" if p.kv_cache_gib else "vLLM's own KV sizing"
        return (
            f"{Path(p.model).name}, {budget}, block size {self.run.block_size}, prompts up to {p.lengths[-1]:,} tokens"
        )

    def markdown(self) -> str:
        """:func:`fp8lab.longctx.verdict.verdict_markdown`: one paragraph per claim."""
        return verdict_markdown(self.run, self._tables, self._claims)


def run(
    spec: LongCtxPlan, store: Path | None = None, runner: Callable[..., Any] | None = None, progress: bool = True
) -> Results:
    """Run (or load) every engine of ``spec`` in the results store ``store`` (None: ``$FP8LAB_RUNS`` or ``runs/``):
    :func:`~fp8lab.longctx.run.run_study` (``runner`` and ``progress`` passed on: tests give a fake runner)."""
    with in_store(store):
        return Results(run_study(spec, runner=runner, progress=progress))
