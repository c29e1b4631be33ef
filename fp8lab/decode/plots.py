"""Plots of Study 06 (decode step time by context and batch). Each takes the study's tables and draws one
figure; nothing here computes a number that is not in the tables it is given."""

from __future__ import annotations

from typing import Any

from fp8lab.plots import kv_palette, theme


def step_vs_context(points: Any, fits: Any, base: str = "auto", other: str = "fp8") -> Any:
    """Mean decode step (ms) against context, one panel per batch, both dtypes, with each dtype's fitted
    line (:func:`fp8lab.decode.tables.fit_table`; in a replicated run, the mean over engines of the points' arm).
    Axes start at zero, so a small difference looks small."""
    import numpy as np

    plt, _ = theme()
    if "arm" in points and "arm" in fits and len(points):  # a replicated run: the lines of the points' arm
        fits = fits[fits.arm == points.arm.iloc[0]]
    batches = sorted(points.batch.unique())
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.6), squeeze=False)
    pal = kv_palette([base, other])
    for ax, b in zip(axes[0], batches, strict=True):
        p = points[points.batch == b].sort_values("context_len")
        for d in (base, other):
            ax.plot(p.context_len, p[f"{d}_step_ms"], "o", color=pal[d], label=d)
            f = fits[(fits.kv_dtype == d) & (fits.batch == b)] if len(fits) else fits
            if len(f):
                x = np.linspace(0, p.context_len.max(), 50)
                ax.plot(x, f.a_ms.iloc[0] + f.b_ms_per_token.iloc[0] * x, "-", color=pal[d], alpha=0.6)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set(title=f"batch {b}", xlabel="context (tokens)", ylabel="decode step (ms)")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(3, 3))
    axes[0][0].legend()
    fig.tight_layout()
    return fig


def ratio_by_point(points: Any) -> Any:
    """fp8/auto step-time ratio per point with its 95% interval (error bars), one line per batch; the grey
    band is the median same-config noise floor around 1."""
    import numpy as np

    plt, sns = theme()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for b, p in points.sort_values("context_len").groupby("batch"):
        ax.errorbar(
            p.context_len,
            p.ratio,
            yerr=[p.ratio - p.ratio_ci_low, p.ratio_ci_high - p.ratio],
            marker="o",
            capsize=3,
            label=f"batch {b}",
        )
    noise = float(np.nanmedian(points.self_noise_pct)) / 100
    ax.axhspan(1 - noise, 1 + noise, color="0.85", zorder=0, label=f"noise floor ±{noise:.1%}")
    ax.axhline(1.0, color="0.4", lw=1)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="context (tokens)", ylabel="fp8 / auto step time")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
