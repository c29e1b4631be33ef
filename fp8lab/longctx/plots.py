"""Plots of the long-context study (notebook 04). Each function takes tables of :mod:`fp8lab.longctx`,
draws one figure and returns it; nothing here computes a number that is not in the tables it is given
(except evaluating the fitted growth curves, :func:`fp8lab.longctx.fitted`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fp8lab.plots import kv_color, theme

_OUTCOME_MARKER = {"held": "o", "ok": "o", "preempted": "X", "serialized": "s"}


def _tokens_axis(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1024:g}K" if v >= 1024 else f"{v:g}"))


def latency_vs_length(ramp: Any, growth: Any = None) -> Any:
    """TTFT, ITL P50, ITL P95 and E2E (ms, log scale) against prompt length per dtype: one request at a
    time (filled markers, with the fitted growth curve dashed) and at the fixed concurrency (hollow)."""
    from fp8lab.longctx import fitted

    plt, _ = theme()
    metrics = [
        ("ttft_p50_s", "TTFT (median)"),
        ("itl_p50_s", "ITL P50"),
        ("itl_p95_s", "ITL P95"),
        ("e2e_p50_s", "E2E (median)"),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    ran = ramp[ramp.outcome.isin(["ok", "held", "preempted", "serialized"])] if len(ramp) else ramp
    for ax, (m, title) in zip(axes, metrics, strict=True):
        for (dt, c), g in ran.groupby(["kv_dtype", "concurrency"], sort=False):
            g = g.sort_values("length")
            ax.plot(
                g.length,
                1e3 * g[m],
                marker="o",
                ls="-" if c == 1 else ":",
                color=kv_color(dt),
                mfc=kv_color(dt) if c == 1 else "white",
                label=f"{dt}, c={c}",
            )
            if c == 1 and growth is not None and len(growth):
                f = growth[(growth.kv_dtype == dt) & (growth.metric == m)]
                if len(f) and np.isfinite(f.iloc[0]["a"]):
                    xs = np.geomspace(g.length.min(), g.length.max(), 100)
                    ax.plot(xs, 1e3 * fitted(f.iloc[0], xs), ls="--", lw=1, color=kv_color(dt), alpha=0.7)
        _tokens_axis(ax)
        ax.set_yscale("log")
        ax.set(title=title, xlabel="prompt length (tokens)", ylabel="ms")
    axes[0].legend(fontsize="x-small")
    fig.suptitle("Latency vs context length (dashed: fitted growth, one request at a time)", y=1.02)
    fig.tight_layout()
    return fig


def memory_vs_length(ramp: Any) -> Any:
    """KV cache in use (GiB: sampled usage x pool) and device memory (GiB: NVML on GPU, RSS of the engine's
    processes on CPU) at each length, per dtype and concurrency."""
    plt, _ = theme()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ran = ramp[ramp.outcome.isin(["ok", "held", "preempted", "serialized"])] if len(ramp) else ramp
    for (dt, c), g in ran.groupby(["kv_dtype", "concurrency"], sort=False):
        g = g.sort_values("length")
        kw = dict(
            marker="o",
            color=kv_color(dt),
            ls="-" if c == 1 else ":",
            mfc=kv_color(dt) if c == 1 else "white",
            label=f"{dt}, c={c}",
        )
        axes[0].plot(g.length, g.kv_used_bytes / 2**30, **kw)
        axes[1].plot(g.length, g.mem_peak_bytes.astype(float) / 2**30, **kw)
    for ax, t in zip(axes, ("KV cache in use (sampled peak)", "Device memory (peak)"), strict=True):
        _tokens_axis(ax)
        ax.set(title=t, xlabel="prompt length (tokens)", ylabel="GiB")
        ax.set_ylim(bottom=0)  # from zero: a 0.03 GiB difference must not fill the axis
    axes[0].legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def capacity_frontier(frontier: Any, boundary: Any, concurrency: int) -> Any:
    """Left: largest concurrency per length (formula line, engine's block count dashed, measured points)
    with the fixed-concurrency outcome marked at ``concurrency``. Right: longest single-sequence context
    per dtype: formula, vLLM's estimate (measured by the probe), and what the ramp needed."""
    plt, _ = theme()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    ax = axes[0]
    col = f"outcome_c{concurrency}"
    for i, (dt, g) in enumerate(frontier.groupby("kv_dtype", sort=False)):
        g = g.sort_values("length")
        nudge = 1.04**i  # side by side where the dtypes' markers would hide each other
        ax.plot(g.length, g.max_conc_formula, color=kv_color(dt), label=f"{dt}: formula")
        ax.plot(g.length, g.max_conc_engine, color=kv_color(dt), ls="--", lw=1, label=f"{dt}: engine blocks")
        ax.scatter(
            g.length,
            g.max_conc_measured,
            color=kv_color(dt),
            marker="D",
            s=25,
            zorder=3,
            label=f"{dt}: measured KV use",
        )
        if col in g:
            for outcome, h in g.groupby(col):
                ax.scatter(
                    h.length * nudge,
                    [concurrency] * len(h),
                    marker=_OUTCOME_MARKER.get(outcome, "^"),
                    s=70,
                    facecolor="white" if outcome == "held" else kv_color(dt),
                    edgecolor=kv_color(dt),
                    zorder=4,
                    label=f"{dt}: c={concurrency} {outcome}",
                )
    ax.axhline(concurrency, color="grey", lw=0.8, ls=":")
    _tokens_axis(ax)
    ax.set_yscale("log")
    ax.set(
        title="Concurrency each dtype holds (every sequence at full length)",
        xlabel="prompt length (tokens)",
        ylabel="sequences",
    )
    ax.legend(fontsize="xx-small", ncol=2)
    ax = axes[1]
    b = boundary.reset_index(drop=True)
    x = np.arange(len(b))
    w = 0.38
    ax.bar(
        x - w / 2,
        b.longest_formula.astype(float),
        w,
        color=[kv_color(d) for d in b.kv_dtype],
        alpha=0.5,
        label="formula",
        edgecolor="black",
    )
    ax.bar(
        x + w / 2,
        b.longest_measured.astype(float),
        w,
        color=[kv_color(d) for d in b.kv_dtype],
        label="vLLM estimate (probe)",
        edgecolor="black",
        hatch="//",
    )
    need = float(b.ramp_max_model_len.max()) if b.ramp_max_model_len.notna().any() else None
    if need:
        ax.axhline(need, color="black", ls=":", lw=1, label="ramp's longest request")
    top = np.nanmax(np.r_[b.longest_formula.astype(float), b.longest_measured.astype(float), need or 0.0])
    limit = float(b.model_limit.iloc[0]) if b.model_limit.notna().any() else None
    if limit and limit <= 1.5 * top:
        ax.axhline(limit, color="red", ls="--", lw=1, label="model max_position_embeddings")
    elif limit:
        ax.set_xlabel(f"(model max_position_embeddings: {limit:,.0f}, off the scale)", fontsize="small")
    ax.set_ylim(0, 1.25 * max(top, limit if limit and limit <= 1.5 * top else 0))
    ax.set_xticks(x, b.kv_dtype)
    ax.set(title="Longest context, one sequence", ylabel="tokens")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def blocksize_sweep(bs: Any) -> Any:
    """TTFT, ITL P50 and E2E (ms) per block size at each sweep length and dtype; sizes the backend
    rejected are written under the axis."""
    plt, _ = theme()
    metrics = [("ttft_p50_s", "TTFT (median)"), ("itl_p50_s", "ITL P50"), ("e2e_p50_s", "E2E (median)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    ok = bs[bs.outcome == "ok"]
    for ax, (m, title) in zip(axes, metrics, strict=True):
        for (dt, L), g in ok.groupby(["kv_dtype", "length"], sort=False):
            g = g.sort_values("block_size")
            ax.plot(
                g.block_size.astype(str),
                1e3 * g[m],
                marker="o",
                color=kv_color(dt),
                label=f"{dt}, {L:,} tokens",
                ls="-" if L == bs.length.max() else ":",
            )
        ax.set(title=title, xlabel="block size (tokens)", ylabel="ms")
        ax.set_ylim(bottom=0)
    bad = bs[bs.outcome != "ok"][["kv_dtype", "block_size", "outcome"]].drop_duplicates()
    if len(bad):
        note = "; ".join(f"{r.kv_dtype} bs={r.block_size}: {r.outcome}" for r in bad.itertuples())
        fig.text(0.01, -0.04, "Not run: " + note, fontsize="small")
    axes[0].legend(fontsize="x-small")
    fig.suptitle("Block-size sweep at the longest lengths", y=1.02)
    fig.tight_layout()
    return fig


def divergence_vs_position(bypos: Any, bin_tokens: int | None = None) -> Any:
    """Per position bin: top-1 flip rate and mean |Δ logprob| of each candidate dtype against auto (real
    text solid, random tokens dotted), and the baseline's own NLL per token (where the model stops
    using its context)."""
    plt, _ = theme()
    fig, axes = plt.subplots(1, 3, figsize=(16, 3.8))
    for (dt, src), g in bypos.groupby(["kv_dtype", "source"], sort=False):
        ls = "-" if src == "text" else ":"
        axes[0].plot(g.pos_bin, 100 * g.flip_rate, ls=ls, marker=".", color=kv_color(dt), label=f"{dt}, {src}")
        axes[1].plot(g.pos_bin, g.abs_dlogprob, ls=ls, marker=".", color=kv_color(dt), label=f"{dt}, {src}")
        axes[2].plot(g.pos_bin, g.nll_base, ls=ls, marker=".", color=kv_color("auto"), label=f"auto, {src}")
    for ax, (t, y) in zip(
        axes,
        (
            ("Top-1 flips vs auto", "% of positions"),
            ("|Δ logprob| of the actual token", "nats"),
            ("auto's NLL per token", "nats"),
        ),
        strict=True,
    ):
        ax.set(title=t, xlabel="position in the context (bin start, tokens)", ylabel=y)
        ax.legend(fontsize="x-small")
    fig.suptitle(
        "Teacher-forced divergence along the context" + (f" ({bin_tokens}-token bins)" if bin_tokens else ""), y=1.02
    )
    fig.tight_layout()
    return fig


def passkey_heatmap(pk: Any) -> Any:
    """Passkey accuracy per (length, depth), one panel per dtype."""
    plt, sns = theme()
    dts = list(dict.fromkeys(pk.kv_dtype))
    fig, axes = plt.subplots(1, len(dts), figsize=(4.5 * len(dts), 3.2), squeeze=False)
    for ax, dt in zip(axes[0], dts, strict=True):
        t = pk[pk.kv_dtype == dt].pivot_table(index="length", columns="depth", values="correct", aggfunc="mean")
        sns.heatmap(t, vmin=0, vmax=1, annot=True, fmt=".2f", cmap="viridis", cbar=False, ax=ax)
        ax.set(title=f"{dt}: passkey accuracy", xlabel="needle depth", ylabel="prompt length (tokens)")
    fig.tight_layout()
    return fig
