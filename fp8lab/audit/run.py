"""The audit itself: every claim of :data:`~fp8lab.audit.claims.CLAIMS` judged by its rule, in the claims' order
(:func:`audit`, one row per claim), with links to the evidence (:func:`links`). Importing this module registers
every rule (the ``rules_*`` modules), in the claims' order."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

# every rule module registers its rules in RULES when imported (by topic, so not in the claims' order) ...
from fp8lab.audit import (  # noqa: F401
    rules_facts,
    rules_longctx,
    rules_memory,
    rules_quality,
    rules_seeds,
    rules_serving,
)
from fp8lab.audit.claims import CLAIMS, Claim
from fp8lab.audit.evidence import Evidence, Report
from fp8lab.audit.pages import page_number
from fp8lab.audit.scale import NOT_TESTABLE, RULES, Finding, safe

# ... so RULES is put in the claims' order, as the single module registered them before the split
for _c in CLAIMS:
    RULES[_c.id] = RULES.pop(_c.id)
del _c


def links(claim: Claim, ev: Evidence) -> list[dict[str, str]]:
    """Relative links (from ``ev.base_dir``) to the HTML of each study holding the claim's evidence, per
    report (the summary JSON when there is no HTML); for the vLLM claims also the vLLM options files."""
    out = []
    for rep in ev.reports:
        for study in claim.studies:
            stem = rep.stem(study)
            if stem is None:
                continue
            target = rep.path / f"{stem}.html"
            if not target.is_file():
                target = rep.path / f"{stem}.summary.json"
            if not target.is_file():
                continue  # an extra summary rendered elsewhere (a temporary folder): not linked
            out.append({"label": f"{rep.label} {page_number(stem)}", "href": os.path.relpath(target, ev.base_dir)})
    if claim.id in ("14", "15", "25", "26"):
        for info in ev.vllm:
            src = info.get("source")
            if src and src != "installed":
                out.append({"label": f"vLLM {info.get('version')} options", "href": os.path.relpath(src, ev.base_dir)})
    return out


def audit(ev: Evidence) -> list[dict[str, Any]]:
    """One row per claim: ``id``, ``claim``, ``quote``, ``source``, ``needs``, ``measured``, ``verdict``, ``on_what``,
    ``setting`` (of the deciding evidence), ``claim_setting`` (the claim's: :class:`~fp8lab.audit.match.ClaimSetting`),
    ``match`` (how the two compare, or why no setting applies), ``detectable``, ``basis``, ``headline``, ``rule``
    (its text), ``links``, ``by_report`` and ``details``. A rule that fails is reported as not testable, with its
    error."""
    rows = []
    for c in CLAIMS:
        r = RULES[c.id]
        try:
            f = r.fn(ev)
        except Exception as e:  # noqa: BLE001 - one rule's failure must not hide the other verdicts
            f = Finding(NOT_TESTABLE, f"rule failed: {type(e).__name__}: {e}", "the rule could not read these records")
        details = {k: v for k, v in f.details.items() if k != "_setting"}
        rows.append(
            {
                "id": c.id,
                "claim": c.text,
                "quote": c.quote,
                "source": c.source,
                "needs": c.needs,
                "measured": f.measured,
                "verdict": f.verdict,
                "on_what": f.on_what,
                "setting": f.setting,
                "claim_setting": c.where.text,
                "match": f.match or ("setting-free" if f.verdict != NOT_TESTABLE and not f.setting else ""),
                "detectable": f.detectable,
                "basis": f.basis,
                "headline": f.headline,
                "rule": r.text,
                "links": links(c, ev),
                "by_report": dict(f.by_report),
                "details": details,
            }
        )
    return rows


def judge_run(
    rep: Report, study: str, rules: Mapping[str, str], n: Callable[[str], int | None] = lambda cid: None
) -> tuple[Any, ...]:
    """A study's verdicts on its own run (``study``: its page stem or name, :mod:`fp8lab.audit.pages`): each claim of ``rules`` (claim id -> the name of its per-report rule in
    :mod:`fp8lab.audit`) judged by the audit's rule on ``rep`` (a :class:`Report` holding that one run) and capped where the run's setting
    differs from the claim's (:func:`fp8lab.audit.scale.cap`), as the audit judges each report, as :class:`fp8lab.study.Verdict` s; ``n(claim_id)``:
    the count the verdict rests on (None when the rule could not test the claim). One rule per claim, so a study and
    the audit cannot disagree on the same numbers."""
    import fp8lab.audit as audit
    from fp8lab.study import Verdict

    by_id = {c.id: c for c in CLAIMS}
    out = []
    for cid, fn in rules.items():
        # capped as the audit caps it: a study page and the audit say one verdict per claim
        f = audit.cap(by_id[cid], safe(getattr(audit, fn), rep))
        why = "; ".join(x for x in (f.measured, f.on_what) if x)
        text = by_id[cid].text
        out.append(
            Verdict(
                claim_id=cid,
                claim=text,
                verdict=f.verdict,  # type: ignore[arg-type]  # the audit's scale (a unit test keeps them equal)
                sentence=f"Claim '{text.rstrip('.')}': {f.verdict} on this run ({rep.setting(study).text}): {why}.",
                n=None if f.verdict == NOT_TESTABLE else n(cid),
                detectable=f.detectable or None,
            )
        )
    return tuple(out)
