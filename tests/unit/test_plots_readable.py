"""Plots a reader can read: tick labels that do not overlap, axes that do not magnify noise."""

from __future__ import annotations

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")


def _overlaps(fig, ax) -> list[tuple[str, str]]:
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    labels = [t for t in ax.get_xticklabels(which="both") if t.get_visible() and t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in labels]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]


def test_itl_cdf_ticks_do_not_overlap_within_a_decade():
    from fp8lab.serving.plots import itl_cdf

    rng = np.random.default_rng(0)
    itl = pd.DataFrame(
        {"cls": "short", "kv_dtype": np.repeat(["auto", "fp8"], 500), "itl_ms": rng.uniform(21, 58, 1000)}
    )  # the H200's ITLs: 21-58 ms, under one decade
    fig = itl_cdf(itl)
    ax = fig.axes[0]
    assert _overlaps(fig, ax) == []
    texts = [t.get_text() for t in ax.get_xticklabels(which="both") if t.get_visible() and t.get_text()]
    assert texts and all("times" not in t and "^" not in t for t in texts), texts  # plain numbers, no 2x10^1


def test_memory_plot_starts_at_zero():
    from fp8lab.longctx.plots import memory_vs_length

    gib = 2**30
    ramp = pd.DataFrame(
        {
            "kv_dtype": ["auto", "auto", "fp8", "fp8"],
            "concurrency": 1,
            "length": [1024, 2048] * 2,
            "outcome": "ok",
            "kv_used_bytes": [1 * gib, 2 * gib, 0.5 * gib, 1 * gib],
            "mem_peak_bytes": [43.90 * gib, 43.91 * gib, 43.93 * gib, 43.94 * gib],
        }
    )
    fig = memory_vs_length(ramp)
    lo, hi = fig.axes[1].get_ylim()
    assert lo == 0 and hi >= 43.94  # 0.04 GiB between the dtypes is a sliver, not the whole axis


def test_one_theme_for_every_plots_module():
    """Every plots module draws through fp8lab.plots.theme(); none sets a theme of its own, and theme() puts back
    seaborn's whitegrid / notebook settings whatever a notebook changed before."""
    from pathlib import Path

    import seaborn as sns

    import fp8lab
    from fp8lab.plots import theme

    pkg = Path(fp8lab.__file__).parent  # plots_<study>.py, and plots.py inside a study's subpackage
    sources = {str(p.relative_to(pkg)): p.read_text() for p in [*pkg.glob("plots*.py"), *pkg.glob("*/plots.py")]}
    assert len(sources) >= 7, sorted(sources)
    for name, src in sources.items():
        if name != "plots.py":
            assert "set_theme" not in src and "set_style" not in src and "rcParams" not in src, name
            assert "theme()" in src, name
    mpl.rcParams.update({"axes.grid": False, "axes.facecolor": "black", "font.size": 30.0})
    plt, _ = theme()
    assert plt is __import__("matplotlib.pyplot").pyplot
    expected = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook")}
    assert {k: mpl.rcParams[k] for k in expected} == expected
    assert mpl.rcParams["axes.grid"] is True and mpl.rcParams["axes.facecolor"] == "white"


def test_study_08_capacity_bars_draw_the_table_values_in_the_theme():
    """One bar per row with a capacity, its length the table's capacity_x, coloured by kv dtype; a formula-only row is
    hatched and labelled as such; a row without a capacity is not drawn."""
    from fp8lab.dtypes.plots import capacity_bars
    from fp8lab.plots import kv_color

    table = pd.DataFrame(
        {
            "label": ["auto", "fp8", "nvfp4", "broken"],
            "kv_cache_dtype": ["auto", "fp8", "nvfp4", "int4_per_token_head"],
            "capacity_x": [1.0, 2.0, 3.5, None],
            "capacity_from": ["engine", "engine", "formula", None],
        }
    )
    fig = capacity_bars(table)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, mpl.patches.Rectangle)]
    assert [round(b.get_width(), 6) for b in bars] == [1.0, 2.0, 3.5]
    assert [mpl.colors.to_hex(b.get_facecolor()) for b in bars] == [
        kv_color("auto").lower(),
        kv_color("fp8").lower(),
        kv_color("nvfp4").lower(),
    ]
    assert [b.get_hatch() for b in bars] == [None, None, "//"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["auto", "fp8", "nvfp4 (formula)"]
    assert mpl.rcParams["axes.grid"] is True  # drawn in fp8lab's theme
