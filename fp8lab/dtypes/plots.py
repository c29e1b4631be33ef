"""Study 08's page at a glance: the matrix as a coloured table (status, capacity x, decode x, quality cost)."""

from __future__ import annotations

from typing import Any

STATUS_COLOURS = {"started": "#c8f0c8", "refused": "#f0e0b0", "crashed": "#f4b4b4"}
GLANCE = (
    "label",
    "status",
    "cause_class",
    "attention_backend",
    "capacity_x",
    "capacity_from",
    "scales",
    "prefix_hit_equals_cold",
    "dppl_pct",
    "top1_agreement",
    "greedy_identical",
)


def glance(table: Any) -> Any:
    """A pandas Styler of the matrix: one row per format, status coloured, capacity / decode ratios shaded green
    (better than auto) to red (worse), quality columns shaded by their cost."""
    cols = [c for c in (*GLANCE, *[c for c in table.columns if c.startswith("decode_x@")]) if c in table.columns]
    t = table[cols].copy()

    def status(v: Any) -> str:
        return f"background-color: {STATUS_COLOURS.get(v, '')}" if v in STATUS_COLOURS else ""

    def ratio(v: Any, higher_better: bool) -> str:
        if not isinstance(v, (int, float)) or v != v:
            return ""
        good = v > 1.02 if higher_better else v < 0.98
        bad = v < 0.98 if higher_better else v > 1.02
        return "background-color: #c8f0c8" if good else ("background-color: #f4b4b4" if bad else "")

    sty = t.style.map(status, subset=["status"])
    if "capacity_x" in t:
        sty = sty.map(lambda v: ratio(v, True), subset=["capacity_x"])
    dec = [c for c in t.columns if c.startswith("decode_x@")]
    if dec:
        sty = sty.map(lambda v: ratio(v, False), subset=dec)
    if "dppl_pct" in t:
        sty = sty.map(lambda v: ratio(1 + (v or 0) / 100, False) if isinstance(v, float) else "", subset=["dppl_pct"])
    return sty.format(precision=3, na_rep="")
