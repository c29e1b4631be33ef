"""The audit in prose: the headline and the counts (:func:`verdict_markdown`), and per claim its rule and numbers
(:func:`details_markdown`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.audit.evidence import Evidence
from fp8lab.audit.scale import VERDICTS
from fp8lab.audit.summary import headline


def verdict_markdown(rows: Sequence[Mapping[str, Any]], ev: Evidence) -> str:
    """The headline, then how many claims got each verdict, from which evidence (every number from ``rows``)."""
    counts = {v: [str(r["id"]) for r in rows if r["verdict"] == v] for v in VERDICTS}
    reports = ", ".join(f"`{r.label}` ({len(r.summaries)} studies)" for r in ev.reports) or "none"
    versions = ", ".join(str(i.get("version")) for i in ev.vllm) or "none"
    lines = [f"- {h}" for h in headline(rows)]
    lines += ["", f"Evidence: reports {reports}; vLLM versions inspected: {versions}.", ""]
    lines += [f"- **{v}**: {len(ids)} claim(s)" + (f" ({', '.join(ids)})" if ids else "") for v, ids in counts.items()]
    return "\n".join(lines)


def details_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per claim: the verdict (each report's), the claim as quoted, the claim's setting and how the evidence's
    matches it, and the rule; the numbers, settings and detectable effects are the audit table's (not repeated)."""

    def esc(text: str) -> str:  # numbers and identifiers (calculate_kv_scales, __init__) are not Markdown
        return re.sub(r"([\\`*_<>\[\]|])", r"\\\1", text)

    out = []
    for r in rows:
        by = ", ".join(f"{k}: {v}" for k, v in r["by_report"].items())
        out += [
            f"**{r['id']}. {r['verdict']}**" + (f" ({esc(by)})" if by else "") + f" — {esc(r['claim'])}",
            "",
            *([f'- *As the reports put it:* "{esc(r["quote"])}"'] if r.get("quote") else []),
            f"- *Source:* {esc(r['source'])}; *decided by:* {esc(r['needs'])} evidence",
            f"- *Basis:* {esc(r['basis'] or '-')}; *setting match:* {esc(r.get('match') or '-')}",
            f"- *Rule:* {esc(r['rule'])}",
            "",
        ]
    return "\n".join(out)
