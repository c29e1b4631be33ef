"""Study 08's page at a glance: the matrix as a coloured table (status, capacity x, decode x, quality cost), and the
capacity of every format against ``auto`` as a figure in fp8lab's theme (:func:`fp8lab.plots.theme`)."""

from __future__ import annotations

from typing import Any

from fp8lab.plots import kv_color, theme

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


def capacity_bars(table: Any) -> Any:
    """Horizontal bars of ``capacity_x`` (tokens held against ``auto`` at the same KV bytes) per matrix row, coloured by
    kv dtype (:func:`fp8lab.plots.kv_color`); a row whose capacity comes from the formula (it did not start) is
    hatched and says so in its label. Rows without a ``capacity_x`` are left out. Nothing is computed here."""
    plt, _ = theme()
    t = table[table["capacity_x"].notna()] if "capacity_x" in table else table.iloc[0:0]
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(len(t), 1) + 1.2))
    for i, (_, r) in enumerate(t.iterrows()):
        from_formula = r.get("capacity_from") == "formula"
        ax.barh(
            i,
            r["capacity_x"],
            color=kv_color(r["kv_cache_dtype"]),
            hatch="//" if from_formula else None,
            edgecolor="black" if from_formula else None,
        )
    ax.set_yticks(range(len(t)))
    ax.set_yticklabels(
        [f"{r.label} (formula)" if r.get("capacity_from") == "formula" else r.label for _, r in t.iterrows()]
    )
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", linewidth=1)
    ax.set_xlabel("tokens held against auto at the same KV bytes (x)")
    ax.set_title("KV capacity per format")
    fig.tight_layout()
    return fig
