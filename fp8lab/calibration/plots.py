"""Plots of Study 02 (notebook 02). Each takes a tidy DataFrame from :mod:`fp8lab.calibration`, draws
one figure and returns it; nothing here computes a number that is not in the DataFrame it is given
(means over draws are what seaborn draws)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fp8lab.plots import theme

STRATEGY_COLORS = {"tensor": "#4C72B0", "attn_head": "#DD8452"}
#: Heatmaps write each cell's value up to this many layers; a deeper model (SmolLM2-135M: 30) gets a colour bar
#: instead (30 rows of numbers overlap into an unreadable, and several times larger, image).
MAX_ANNOTATED_LAYERS = 12


def scale_heatmaps(scales: Any, names: Sequence[str], fmt: str = "e4m3", strategy: str = "attn_head") -> Any:
    """Heatmaps of the scales, layer (rows) x KV head (columns), one row of panels per set in
    ``names`` and one column per tensor (K, V). ``scales``: rows of ``ScaleSet.to_frame``."""
    plt, sns = theme()
    s = scales[(scales.format == fmt) & (scales.strategy == strategy)]
    fig, axes = plt.subplots(len(names), 2, figsize=(7, 2.2 + 1.6 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        for j, t in enumerate(("K", "V")):
            d = s[(s["name"] == name) & (s.tensor == t)].pivot(index="layer", columns="head", values="scale")
            annot = d.shape[0] <= MAX_ANNOTATED_LAYERS
            sns.heatmap(d, annot=annot, fmt=".4f", cmap="viridis", cbar=not annot, ax=axes[i, j], annot_kws={"size": 8})
            axes[i, j].set(title=f"{name}: {t} scale ({fmt}, {strategy})", xlabel="KV head", ylabel="layer")
    fig.tight_layout()
    return fig


def reldiff_heatmaps(
    diff: Any,
    name: str,
    fmt: str = "e4m3",
    strategies: Sequence[str] = ("tensor", "attn_head"),
    threshold: float = 0.03,
) -> Any:
    """Relative scale difference of set ``name`` against the large set, layer x KV head, per strategy
    (rows) and tensor (columns); cells at or above ``threshold`` are outlined."""
    plt, sns = theme()
    d0 = diff[(diff["name"] == name) & (diff.format == fmt)]
    strategies = [s for s in strategies if (d0.strategy == s).any()]
    fig, axes = plt.subplots(len(strategies), 2, figsize=(7, 1.2 + 2.2 * len(strategies)), squeeze=False)
    vmax = max(float(d0.rel_diff.max()), threshold * 2)
    for i, st in enumerate(strategies):
        for j, t in enumerate(("K", "V")):
            d = d0[(d0.strategy == st) & (d0.tensor == t)].pivot(index="layer", columns="head", values="rel_diff")
            ax = axes[i, j]
            annot = d.shape[0] <= MAX_ANNOTATED_LAYERS
            sns.heatmap(
                d,
                annot=annot,
                fmt=".3f",
                cmap="magma_r",
                vmin=0,
                vmax=vmax,
                cbar=not annot,
                ax=ax,
                annot_kws={"size": 8},
            )
            for r in range(d.shape[0]):
                for c in range(d.shape[1]):
                    if d.iloc[r, c] >= threshold:
                        ax.add_patch(plt.Rectangle((c, r), 1, 1, fill=False, ec="#C44E52", lw=1.5))
            ax.set(title=f"{t}, {st}: {name} vs large", xlabel="KV head", ylabel="layer")
    fig.suptitle(
        "relative scale difference |Δscale| / scale (outlined: at or above the claim's bound)", fontsize="medium"
    )
    fig.tight_layout()
    return fig


def convergence_curve(conv: Any, points: Any | None = None, threshold: float = 0.03) -> Any:
    """Mean relative scale difference against the full large set vs calibration tokens (log x), per
    strategy (colour) and tensor (panel): the line is the mean over random subsets, the band their range.
    ``points``: rows ``name, n_tokens, strategy, tensor, rel_diff_mean`` drawn as labelled markers (the
    reports' prompt); the dashed line is the claim's ``threshold``."""
    plt, sns = theme()
    tensors = list(dict.fromkeys(conv.tensor))
    fig, axes = plt.subplots(1, len(tensors), figsize=(5.5 * len(tensors), 4), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], tensors, strict=True):
        c = conv[conv.tensor == t]
        sns.lineplot(
            c,
            x="n_tokens",
            y="rel_diff_mean",
            hue="strategy",
            palette=STRATEGY_COLORS,
            marker="o",
            errorbar=("pi", 100),
            ax=ax,
        )
        if points is not None and len(points):
            named: set[str] = set()
            for _, r in points[points.tensor == t].iterrows():
                ax.scatter(
                    [r.n_tokens],
                    [r.rel_diff_mean],
                    marker="*",
                    s=160,
                    color=STRATEGY_COLORS.get(r.strategy, "k"),
                    edgecolor="k",
                    zorder=5,
                )
                if r["name"] not in named:  # one label per prompt cut (one star per strategy)
                    named.add(r["name"])
                    ax.annotate(
                        r["name"],
                        (r.n_tokens, r.rel_diff_mean),
                        textcoords="offset points",
                        xytext=(8, 0),
                        fontsize="small",
                    )
        ax.axhline(threshold, color="#C44E52", ls="--", lw=1.2, label=f"claim: < {threshold}")
        ax.set_xscale("log")
        ax.set(
            xlabel="calibration tokens (random subsets of the large set)",
            ylabel="mean |Δscale| / scale vs full large set",
            title=f"{t}",
        )
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def quant_error_bars(err_summary: Any, rounding: str = "rtz", fmt: str = "e4m3") -> Any:
    """Held-out K/V round trip per scale set: SNR (dB, top) and clipping rate (bottom, log), per
    tensor (columns), strategy (colour)."""
    plt, sns = theme()
    e = err_summary[(err_summary.rounding == rounding) & (err_summary.format == fmt)]
    tensors = list(dict.fromkeys(e.tensor))
    fig, axes = plt.subplots(2, len(tensors), figsize=(5.5 * len(tensors), 6.5), squeeze=False)
    for j, t in enumerate(tensors):
        d = e[e.tensor == t]
        sns.barplot(d, x="name", y="snr_db", hue="strategy", palette=STRATEGY_COLORS, ax=axes[0, j], legend=j == 0)
        if j == 0:
            sns.move_legend(axes[0, j], "lower left", fontsize="small", title="strategy")
        axes[0, j].set(title=f"{t}: SNR of the {fmt} round trip ({rounding})", xlabel="", ylabel="SNR (dB)")
        lo = float(d.snr_db[d.snr_db > 0].min()) if (d.snr_db > 0).any() else 0.0
        axes[0, j].set_ylim(max(lo - 3, 0), None)
        clip = d.assign(clip_pct=100 * d.clip_rate)
        sns.barplot(clip, x="name", y="clip_pct", hue="strategy", palette=STRATEGY_COLORS, ax=axes[1, j], legend=False)
        axes[1, j].set(title=f"{t}: held-out values clipped", xlabel="scale set", ylabel="clipped (%)")
        if (clip.clip_pct > 0).any():
            axes[1, j].set_yscale("symlog", linthresh=1e-3)
        for ax in axes[:, j]:
            ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig


def quality_deltas(summary: Any, metrics: Sequence[str] = ("delta_ppl_pct", "tf_abs_dlogprob", "tf_top1")) -> Any:
    """Study 03's measures per KV config (rows of ``quality.summary_table``, index = label): one panel
    per metric, ``auto`` included as the reference; ``delta_ppl_pct`` gets its paired bootstrap 95%
    interval (``delta_ppl_pct_ci``) as error bars."""
    plt, _ = theme()
    s = summary[summary.status == "ok"].reset_index()
    titles = {
        "delta_ppl_pct": "Δ perplexity vs auto (%, 95% CI)",
        "tf_abs_dlogprob": "teacher-forced |Δ logprob| (nats)",
        "tf_top1": "teacher-forced top-1 agreement",
        "top3_match": "reports' top-3 match",
        "task_acc": "copy-task accuracy",
        "tf_kl": "KL lower bound (nats/token)",
    }
    metrics = [m for m in metrics if m in s]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.8), squeeze=False)
    x = list(range(len(s)))
    for ax, m in zip(axes[0], metrics, strict=True):
        y = s[m].astype(float).to_numpy()
        err = None
        if m == "delta_ppl_pct" and "delta_ppl_pct_ci" in s:
            lo, hi = [], []
            for v, ci in zip(y, s.delta_ppl_pct_ci, strict=True):
                ok = isinstance(ci, (tuple, list)) and len(ci) == 2
                lo.append(v - ci[0] if ok else 0.0)
                hi.append(ci[1] - v if ok else 0.0)
            err = [lo, hi]
        ax.bar(x, y, color="#8172B3", yerr=err, capsize=4)
        if m == "delta_ppl_pct":
            ax.axhline(0, color="#555", lw=0.8)
        ax.set_xticks(x, s["label"], rotation=40, ha="right")
        ax.set(title=titles.get(m, m), xlabel="", ylabel="")
    fig.tight_layout()
    return fig


__all__ = [
    "STRATEGY_COLORS",
    "convergence_curve",
    "quality_deltas",
    "quant_error_bars",
    "reldiff_heatmaps",
    "scale_heatmaps",
]
