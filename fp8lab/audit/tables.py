"""The audit's tables for the notebook: what it read (:func:`evidence_frame`, :func:`rows_note`) and one row per
claim (:func:`verdict_frame`, coloured by :func:`styled`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.audit.evidence import Evidence, Report
from fp8lab.audit.pages import page_name
from fp8lab.audit.readers import ROW_STUDIES
from fp8lab.audit.scale import CONFIRMED, INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE, REFUTED
from fp8lab.paths import REPO_ROOT

VERDICT_COLORS: Mapping[str, str] = {
    CONFIRMED: "#d8f0d8",
    REFUTED: "#f6d5d5",
    NOT_REPRODUCED: "#dde6f6",
    INCONCLUSIVE: "#fbeccb",
    NOT_TESTABLE: "#e6e6e6",
}


def rows_note(rep: Report, stem: str) -> str:
    """How the audit read a study of :data:`ROW_STUDIES`: its typed rows by field, or (a report rendered before the
    typed table existed) its flat summary's keys, as before; empty for the other studies."""
    if page_name(stem) not in ROW_STUDIES:
        return ""
    if stem in rep.rows:
        return f"; its claims read {len(rep.rows[stem])} typed rows by field ({stem}.rows.json)"
    return (
        f"; no typed rows beside this summary (rendered before {stem}.rows.json existed): its claims read the "
        "flat summary's keys"
    )


def evidence_frame(ev: Evidence) -> Any:
    """What the audit read: one row per report and study (with the setting read from its records) and per vLLM
    version (its source)."""
    import pandas as pd

    rows = []
    for r in ev.reports:
        for stem in sorted(r.summaries):
            setting = r.setting(stem)
            rows.append(
                {
                    "evidence": f"report {r.label}: {stem}",
                    "where": os.path.relpath(r.path, REPO_ROOT),
                    "what": f"{setting.text} (read from {setting.source or 'nothing'})" + rows_note(r, stem),
                }
            )
        if not r.summaries:
            rows.append(
                {"evidence": f"report {r.label}", "where": os.path.relpath(r.path, REPO_ROOT), "what": "no summaries"}
            )
    rows += [
        {
            "evidence": f"vLLM {i.get('version')}",
            "where": i.get("source"),
            "what": f"{len(i.get('serve_flags') or [])} serve flags, {len(i.get('engine_args') or [])} EngineArgs fields, "
            f"{len(i.get('request_headers') or [])} request headers",
        }
        for i in ev.vllm
    ]
    rows += [{"evidence": "note", "where": "", "what": n} for n in ev.notes]
    return pd.DataFrame(rows)


def verdict_frame(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The audit table: claim, the claim's setting (structured; the source's prose is in the per-claim details and
    the summary), verdict, basis, the evidence's setting and how it matches the claim's, detectable effect, what
    was measured, why, links."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "#": r["id"],
                "claim": r["claim"],
                "claim's setting": r.get("claim_setting", ""),
                "verdict": r["verdict"],
                "basis": r["basis"],
                "setting of the evidence": r["setting"],
                "setting match": r.get("match", ""),
                "smallest detectable effect": r["detectable"],
                "measured": r["measured"],
                "why / nearest evidence": r["on_what"],
                "evidence": " ".join(f'<a href="{x["href"]}">{x["label"]}</a>' for x in r["links"]),
            }
            for r in rows
        ]
    ).set_index("#")


def styled(frame: Any) -> Any:
    """``verdict_frame`` with each row's verdict cell coloured, text left-aligned, links live."""
    return (
        frame.style.map(
            lambda v: f"background-color: {VERDICT_COLORS.get(v, '')}; font-weight: bold", subset=["verdict"]
        )
        .set_properties(**{"text-align": "left", "vertical-align": "top"})
        .format(escape="html", subset=[c for c in frame.columns if c != "evidence"])
        .format(escape=None, subset=["evidence"])
    )
