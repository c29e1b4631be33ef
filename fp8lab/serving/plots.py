"""Plots of the serving study (notebook 01). Each function takes the tidy tables of
:mod:`fp8lab.serving.tables` and :mod:`fp8lab.serving.deltas`, draws one figure and returns it; nothing here
computes a number that is not in the table it is given (except the empirical CDF, a sort)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fp8lab.metrics import ecdf
from fp8lab.plots import kv_color, kv_palette, theme


def capacity_bars(capacity: Any, search: Any = None) -> Any:
    """KV capacity in tokens per dtype (measured bars, formula as a black tick) and, when the capacity
    search ran, the largest concurrency without preemption (measured vs formula vs vLLM's block
    accounting)."""
    plt, sns = theme()
    ok = capacity[capacity.status == "ok"]
    n = 2 if search is not None and len(search) else 1
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 3.6), squeeze=False)
    ax = axes[0, 0]
    x = np.arange(len(ok))
    ax.bar(x, ok.kv_capacity_tokens, color=[kv_color(d) for d in ok.kv_dtype])
    for i, r in enumerate(ok.itertuples()):
        if r.predicted_blocks is not None and not (
            isinstance(r.predicted_blocks, float) and np.isnan(r.predicted_blocks)
        ):
            ax.hlines(
                r.predicted_blocks * r.block_size,
                i - 0.4,
                i + 0.4,
                color="black",
                lw=2,
                label="formula" if i == 0 else None,
            )
        ax.text(
            i,
            r.kv_capacity_tokens,
            f"{r.kv_capacity_tokens:,}\nx{r.ratio_vs_baseline:.2f}",
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_xticks(x, ok.kv_dtype)
    ax.set(ylabel="KV capacity (tokens)", title="Same KV budget, engine's block count")
    ax.margins(y=0.25)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize="small")
    if n == 2:
        ax = axes[0, 1]
        s = search.reset_index(drop=True)
        w = 0.27
        for j, (col, label, hatch) in enumerate(
            (
                ("measured", "measured", None),
                ("predicted", "formula", "//"),
                ("predicted_vllm", "vLLM block accounting", ".."),
            )
        ):
            vals = s[col].astype(float)
            bars = ax.bar(
                np.arange(len(s)) + (j - 1) * w,
                vals,
                w,
                label=label,
                hatch=hatch,
                color=[kv_color(d) for d in s.kv_dtype],
                edgecolor="black",
                alpha=1.0 if j == 0 else 0.45,
            )
            ax.bar_label(bars, fmt="%d", fontsize="x-small", padding=1)
        ax.set_xticks(np.arange(len(s)), s.kv_dtype)
        ax.set(
            ylabel="concurrent requests", title=f"Largest concurrency without preemption\n({s.capacity_shape.iloc[0]})"
        )
        ax.legend(fontsize="x-small", loc="upper left")
        ax.margins(y=0.2)
    fig.tight_layout()
    return fig


def throughput_vs_concurrency(tput: Any, column: str = "output_tok_s") -> Any:
    """Closed-loop throughput vs concurrency: every trial as a dot, the mean as a line; phases with
    preemptions are ringed in red."""
    plt, sns = theme()
    fig, ax = plt.subplots(figsize=(7, 4))
    for d, g in tput.groupby("kv_dtype", sort=False):
        m = g.groupby("concurrency")[column].mean()
        ax.plot(m.index, m.values, marker="o", color=kv_color(d), label=d)
        ax.scatter(g.concurrency, g[column], color=kv_color(d), alpha=0.4, s=18)
        pre = g[g.preemptions > 0]
        ax.scatter(
            pre.concurrency,
            pre[column],
            facecolors="none",
            edgecolors="#C44E52",
            s=90,
            lw=1.5,
            label=f"{d}: preempted" if len(pre) else None,
        )
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="concurrency (requests in flight, closed loop)",
        ylabel={"output_tok_s": "output tokens/s", "total_tok_s": "total tokens/s"}.get(column, column),
    )
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def latency_percentiles(
    lat: Any, metrics: tuple[str, ...] = ("ttft_ms", "tpot_ms"), stats: tuple[str, ...] = ("p50", "p99")
) -> Any:
    """Bars of TTFT and TPOT (ms) per request class and dtype, one panel per metric and percentile."""
    plt, sns = theme()
    fig, axes = plt.subplots(len(metrics), len(stats), figsize=(5 * len(stats), 3.2 * len(metrics)), squeeze=False)
    for i, m in enumerate(metrics):
        d = lat[lat.metric == m]
        for j, st in enumerate(stats):
            ax = axes[i, j]
            sns.barplot(d, x="cls", y=st, hue="kv_dtype", palette=kv_palette(d.kv_dtype.unique()), ax=ax)
            ax.set(xlabel="request class", ylabel=f"{m.removesuffix('_ms').upper()} {st.upper()} (ms)")
            if i or j:
                ax.get_legend().remove() if ax.get_legend() else None
    fig.tight_layout()
    return fig


def _log_ms_axis(ax: Any) -> None:
    """A log x axis labelled at 1-2-5 steps only, plain numbers (no overlapping minor labels like 2x10^1 3x10^1
    ... when the data span less than a decade)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def itl_cdf(itl: Any, by_class: bool = True) -> Any:
    """Empirical CDF of every inter-token latency (ms, log axis), per dtype; one panel per class."""
    plt, sns = theme()
    classes = sorted(itl.cls.unique()) if by_class else [None]
    fig, axes = plt.subplots(1, len(classes), figsize=(4.2 * len(classes), 3.4), squeeze=False, sharey=True)
    for ax, c in zip(axes[0], classes, strict=True):
        sub = itl if c is None else itl[itl.cls == c]
        for d, g in sub.groupby("kv_dtype", sort=False):
            x, f = ecdf(g.itl_ms)
            ax.step(x, f, where="post", color=kv_color(d), label=f"{d} (n={x.size})")
        _log_ms_axis(ax)
        ax.set(
            xlabel="inter-token latency (ms)",
            ylabel="fraction of gaps" if c == classes[0] else "",
            title=c or "all classes",
        )
        ax.legend(fontsize="x-small", loc="lower right")
    fig.tight_layout()
    return fig


def delta_forest(deltas: Any) -> Any:
    """Each headline metric's relative delta (B vs baseline, %) with its 95% t-interval over paired trials;
    grey band: the metric's noise floor (median difference between consecutive trials of one config). Green =
    better, red = worse, grey = within noise (the interval contains 0); a hollow marker: outside the interval's
    0 but not beyond the noise floor."""
    plt, sns = theme()
    d = deltas.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(d) + 1.4))
    y = np.arange(len(d))[::-1]
    colors = {"better": "#55A868", "worse": "#C44E52", "within noise": "#8C8C8C"}
    for yi, r in zip(y, d.itertuples(), strict=True):
        if np.isfinite(r.noise_floor_pct):
            ax.fill_betweenx([yi - 0.35, yi + 0.35], -r.noise_floor_pct, r.noise_floor_pct, color="#DDDDDD", lw=0)
        c = colors.get(r.label, "black")
        lo = r.delta_pct - r.lo_pct if np.isfinite(r.lo_pct) else 0.0
        hi = r.hi_pct - r.delta_pct if np.isfinite(r.hi_pct) else 0.0
        ax.errorbar(
            r.delta_pct,
            yi,
            xerr=[[lo], [hi]],
            fmt="o",
            color=c,
            capsize=3,
            mfc=c if getattr(r, "beyond_noise_floor", True) or r.label == "within noise" else "white",
        )
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [f"{r.metric} ({r.kv_dtype})" for r in d.itertuples()], fontsize="small")
    ax.set(
        xlabel=f"{d.kv_dtype.iloc[0]} vs {d.baseline.iloc[0]} (%), 95% t-interval over paired trials" if len(d) else ""
    )
    fig.tight_layout()
    return fig


def roofline(grid: Any, measured: Any, bandwidth_gbs: float) -> Any:
    """Left: the ITL lower bound vs context length for each batch size (solid: baseline dtype, dashed:
    the others). Right: measured median ITL per bin of KV tokens read per step (dots) against the bound
    (lines), one color per dtype."""
    plt, sns = theme()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    dtypes = list(dict.fromkeys(grid.kv_dtype))
    cmap = plt.get_cmap("viridis")
    batches = sorted(grid.batch.unique())
    for k, b in enumerate(batches):
        col = cmap(k / max(1, len(batches) - 1))
        for j, d in enumerate(dtypes):
            g = grid[(grid.batch == b) & (grid.kv_dtype == d)].sort_values("context_len")
            a1.plot(
                g.context_len,
                g.itl_bound_ms,
                color=col,
                ls="-" if j == 0 else "--",
                marker=".",
                label=f"batch {b}" if j == 0 else None,
            )
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")

    a1.set(
        xlabel="context length (tokens)",
        ylabel="ITL lower bound (ms)",
        title=f"Bound at {bandwidth_gbs:.0f} GB/s (solid {dtypes[0]}, dashed {', '.join(dtypes[1:])})",
    )
    a1.legend(fontsize="x-small")
    if len(measured):
        lo, hi = measured.kv_tokens.min(), measured.kv_tokens.max()
        t = np.geomspace(max(1, lo / 2), hi * 2, 50)
        w = grid.weight_bytes.iloc[0]
        for d in dtypes:
            k = grid[grid.kv_dtype == d].kv_bytes_per_token.iloc[0]
            a2.plot(t, (w + t * k) / (bandwidth_gbs * 1e9) * 1e3, color=kv_color(d), label=f"{d} bound")
            m = measured[measured.kv_dtype == d]
            a2.scatter(
                m.kv_tokens,
                m.itl_ms,
                color=kv_color(d),
                s=12 + 60 * m.n / measured.n.max(),
                label=f"{d} measured (median)",
                edgecolors="black",
                lw=0.4,
            )
        a2.set_xscale("log")
        a2.set_yscale("log")
        a2.set(
            xlabel="KV tokens read per decode step (sum of the batch's contexts)",
            ylabel="ITL (ms)",
            title="Measured vs bound",
        )
        a2.legend(fontsize="x-small")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    for ax in (a1, a2):  # plain numbers on the log axes; minor labels only when less than a decade is shown
        lo, hi = ax.get_ylim()
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g") if hi / max(lo, 1e-12) < 10 else NullFormatter())
    fig.tight_layout()
    return fig


def kv_usage_over_time(timeline: Any) -> Any:
    """KV-cache usage (%) over the engine's life, one line per dtype (one trial), phases labelled."""
    plt, sns = theme()
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for d, g in timeline.groupby("kv_dtype", sort=False):
        ax.plot(g.t_s - g.t_s.min(), 100 * g.kv_usage, color=kv_color(d), label=d, lw=1)
    first = timeline[timeline.kv_dtype == timeline.kv_dtype.iloc[0]]
    t0 = first.t_s.min()
    for p, g in first.groupby("phase", sort=False):
        ax.axvline(g.t_s.min() - t0, color="grey", lw=0.5)
        ax.text(g.t_s.min() - t0, 101, p, rotation=60, fontsize="xx-small", va="bottom")
    ax.set(
        xlabel=f"seconds since the start of the first phase ({timeline.kv_dtype.iloc[0]} engine's phases marked)",
        ylabel="KV cache used (%)",
        ylim=(0, 105),
    )
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    return fig


__all__ = [
    "capacity_bars",
    "delta_forest",
    "itl_cdf",
    "kv_usage_over_time",
    "latency_percentiles",
    "roofline",
    "throughput_vs_concurrency",
]
