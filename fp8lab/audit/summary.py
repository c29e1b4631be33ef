"""What notebook 05 records: the headline for the index (:func:`headline`) and the flat summary
(:func:`summary_values`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.audit.evidence import Evidence
from fp8lab.audit.scale import CONFIRMED, CPU_EVIDENCE, REFUTED, VERDICTS

#: The findings the headline names first, in this order, when their rule wrote a sentence: what FP8 KV buys
#: (capacity), what it costs or gives in decode speed, the formats, and the invented options and hardware.
HEADLINE_ORDER = ("4a", "13a", "10", "9", "15", "20", "22", "3a")
HEADLINE_MAX = 5


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Short sentences for the index: the verdict counts, then up to :data:`HEADLINE_MAX` - 1 findings whose rule
    wrote a headline sentence (in :data:`HEADLINE_ORDER`, then any other), then the count of refutations that rest
    on GPU evidence or physics rather than on a CPU analogue."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    out = [f"Of {len(rows)} claims of the field reports: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "."]
    by_id = {str(r["id"]): r for r in rows}
    order = [i for i in HEADLINE_ORDER if i in by_id] + [
        str(r["id"]) for r in rows if str(r["id"]) not in HEADLINE_ORDER
    ]
    for i in order:
        r = by_id[i]
        if r.get("headline") and r["verdict"] in (CONFIRMED, REFUTED) and len(out) < HEADLINE_MAX:
            out.append(f"{r['headline']} (claim {i}: {r['verdict']})")
    refuted = [r for r in rows if r["verdict"] == REFUTED]
    if refuted:
        kinds: dict[str, int] = {}
        for r in refuted:
            for b in (r.get("basis") or "unstated").split(", "):
                kinds[b] = kinds.get(b, 0) + 1
        cpu_only = [str(r["id"]) for r in refuted if r.get("basis") == CPU_EVIDENCE]
        out.append(
            f"The {len(refuted)} refutations rest on "
            + ", ".join(f"{k} ({n})" for k, n in sorted(kinds.items()))
            + (" (a claim may rest on more than one)" if sum(kinds.values()) > len(refuted) else "")
            + (
                f"; on CPU runs alone: claims {', '.join(cpu_only)} (numerical claims)"
                if cpu_only
                else "; none on CPU runs alone"
            )
            + "."
        )
    return out


def summary_values(rows: Sequence[Mapping[str, Any]], ev: Evidence) -> dict[str, Any]:
    """What the notebook records: ``headline`` (:func:`headline`), verdict counts, ``{claim id: verdict}``, the rows
    (for the index page; without the rule's text, which the page and the code hold), the reports read with the setting of each of their studies, the vLLM versions read,
    and the notes."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return {
        "headline": headline(rows),
        "verdict_counts": counts,
        "verdicts": {str(r["id"]): r["verdict"] for r in rows},
        # each row as the index shows it; the rule's text is the code's docstring and the notebook's page, not repeated
        "audit_rows": [{k: v for k, v in r.items() if k != "rule"} for r in rows],
        "reports": {r.label: sorted(r.summaries) for r in ev.reports},
        # where each study read here ran, as the rules saw it (an unknown device makes its evidence undecidable)
        "settings": {r.label: {stem: r.setting(stem).text for stem in sorted(r.summaries)} for r in ev.reports},
        "vllm_versions": [i.get("version") for i in ev.vllm],
        "notes": list(ev.notes),
        "n_claims": len(rows),
    }
