"""One verdict per claim across the committed pages: the index's audit table, the claims audit's page and its
summary agree claim by claim, and a study page that judges an audit claim on its own run (its verdict table,
``fp8lab.audit.judge_run``) says what the audit's per-report verdict for that report says, unless the audit's
``measured`` text for that report names another study as its evidence ("(04 frontier)").
Where the audit decided a report from another study (claim 4a on the H200: Study 04's frontier, while Study 01's
own capacity search was censored), the two pages rest on different numbers; :func:`different_evidence` lists them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from fp8lab.paths import REPO_ROOT

REPORTS = REPO_ROOT / "reports"
AUDITS = sorted(p.parent for p in REPORTS.rglob("05_claims_audit.summary.json"))


def _tables(page: Path) -> list[tuple[list[str], list[list[str]]]]:
    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    out = []
    for t in soup.find_all("table"):
        rows = t.find_all("tr")
        if not rows:
            continue
        head = [c.get_text(" ", strip=True) for c in rows[0].find_all(["th", "td"])]
        body = [[c.get_text(" ", strip=True) for c in r.find_all(["th", "td"])] for r in rows[1:]]
        out.append((head, body))
    return out


def _verdict_word(text: str) -> str:
    return re.sub(r"\s*\(analogue\)$", "", text.strip())


def _studies_cited(row: dict, label: str) -> set[str]:
    """The study prefixes ("01", "04") the audit's ``measured`` text cites for one report."""
    for seg in str(row.get("measured", "")).split(" | "):
        if seg.startswith(f"[{label}]") or seg.startswith(f"[{label},"):
            return set(re.findall(r"\((\d\d) ", seg))
    return set()


def different_evidence(folder: Path) -> list[str]:
    """Claims a study page and the audit judge differently for one report because the audit used another study."""
    out = []
    audit = _audit(folder)
    for label, page, cid, said, expected in _study_verdicts(audit):
        cited = _studies_cited(audit[cid], label)
        if said != expected and cited and page.name[:2] not in cited:
            out.append(
                f"{label}/{page.name}: claim {cid} {said!r} on its run; the audit {expected!r} from another study"
            )
    return out


def _study_verdicts(audit: dict[str, dict]):
    labels = {lab for r in audit.values() for lab in (r.get("by_report") or {})}
    for label in sorted(labels):
        target = REPORTS / label
        if not target.is_dir():
            continue
        for page in sorted(target.glob("0[0-46-9]_*.html")):
            for head, body in _tables(page):
                if head[:1] != ["claim_id"] or "verdict" not in head:
                    continue
                i = head.index("verdict")
                for row in body:
                    cid, said = row[0], row[i]
                    if cid in audit and label in (audit[cid].get("by_report") or {}):
                        yield label, page, cid, said, _verdict_word(audit[cid]["by_report"][label])


def _audit(folder: Path) -> dict[str, dict]:
    s = json.loads((folder / "05_claims_audit.summary.json").read_text(encoding="utf-8"))
    return {str(r["id"]): r for r in s["audit_rows"]}


@pytest.mark.parametrize("folder", AUDITS, ids=lambda p: str(p.relative_to(REPORTS)))
def test_index_and_audit_page_agree_with_the_audit(folder):
    audit = _audit(folder)
    seen = 0
    for page in (folder / "index.html", folder / "05_claims_audit.html"):
        for head, body in _tables(page):
            if "verdict" not in head:
                continue
            i = head.index("verdict")
            for row in body:
                if len(row) > i and row[0] in audit:
                    assert row[i] == audit[row[0]]["verdict"], (page.name, row[0], row[i], audit[row[0]]["verdict"])
                    seen += 1
    assert seen >= len(audit)  # every claim found on the index at least


@pytest.mark.parametrize("folder", AUDITS, ids=lambda p: str(p.relative_to(REPORTS)))
def test_study_pages_agree_with_the_audit_per_report(folder):
    audit = _audit(folder)
    checked = 0
    for label, page, cid, said, expected in _study_verdicts(audit):
        cited = _studies_cited(audit[cid], label)
        if not cited or page.name[:2] in cited:  # the audit's verdict for this report rests on this page's run
            assert said == expected, f"{label}/{page.name}: claim {cid} '{said}' vs the audit's '{expected}'"
            checked += 1
    assert checked >= 5
