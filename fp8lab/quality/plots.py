"""Plots of Study 03 (notebook 03). Each takes a tidy DataFrame from :mod:`fp8lab.quality`, draws one
figure and returns it; nothing here computes a number that is not in the DataFrame it is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fp8lab.plots import KV_PALETTE, theme

_EXTRA = ["#55A868", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD"]


def palette(labels: Sequence[str]) -> dict[str, str]:
    """One colour per KV config label: fp8lab's kv dtype colours, others (scale sets) from a fixed list."""
    out, extra = {}, iter(_EXTRA * 4)
    for lab in labels:
        out[lab] = KV_PALETTE.get(lab) or next(extra)
    return out


def top3_by_category(greedy: Any, threshold: float = 0.85, band: tuple[float, float] = (0.92, 0.96)) -> Any:
    """Bars: mean top-3 token match per prompt category and KV config (95% bootstrap CI over prompts),
    with the reports' 0.85 "calibration failed" line and their 0.92-0.96 "fine" band."""
    plt, sns = theme()
    labels = list(dict.fromkeys(greedy.label))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.axhspan(*band, color="#55A868", alpha=0.15, label=f"reports' 'fine' {band[0]}-{band[1]}")
    ax.axhline(threshold, color="#C44E52", ls="--", lw=1.5, label=f"reports' threshold {threshold}")
    sns.barplot(
        greedy,
        x="category",
        y="top3_match",
        hue="label",
        palette=palette(labels),
        errorbar=("ci", 95),
        n_boot=1000,
        seed=0,
        ax=ax,
    )
    ax.set(ylim=(0, 1.05), xlabel="prompt category", ylabel="top-3 token match (vs auto)")
    ax.legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize="small")
    fig.tight_layout()
    return fig


def divergence_ecdf(greedy: Any, gen_tokens: int) -> Any:
    """ECDF of the first divergent token position per KV config, over all prompts; prompts that never
    diverge count as ``gen_tokens``, just beyond the axis, so a curve's height at the right edge is the
    fraction that diverged within the generation."""
    plt, sns = theme()
    labels = list(dict.fromkeys(greedy.label))
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.ecdfplot(greedy, x="first_div_censored", hue="label", palette=palette(labels), ax=ax)
    ax.axvline(3, color="#8C8C8C", ls=":", lw=1)
    ax.text(3.2, 0.02, "reports look here (3 tokens)", fontsize="small", color="#555")
    ax.set(
        xlim=(0, gen_tokens - 0.5),
        xlabel=f"first divergent token (of {gen_tokens} generated)",
        ylabel="fraction of prompts diverged by then",
    )
    fig.tight_layout()
    return fig


def teacher_by_position(bypos: Any, bin_tokens: int) -> Any:
    """Three panels over context position (bins of ``bin_tokens``): teacher-forced top-1 agreement,
    mean |delta logprob| of the actual token, mean KL lower bound; one line per candidate."""
    plt, sns = theme()
    labels = list(dict.fromkeys(bypos.label))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, (col, name) in zip(
        axes,
        [
            ("top1", "top-1 agreement"),
            ("abs_dlogprob", "mean |Δ logprob| (nats)"),
            ("kl", "mean KL lower bound (nats)"),
        ],
        strict=True,
    ):
        sns.lineplot(
            bypos, x="pos_bin", y=col, hue="label", palette=palette(labels), marker="o", ax=ax, legend=ax is axes[-1]
        )
        ax.set(xlabel=f"context position (bins of {bin_tokens} tokens)", ylabel=name)
    axes[-1].legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize="small")
    fig.tight_layout()
    return fig


def topk_overlap_curve(curve: Any) -> Any:
    """Mean top-k overlap with the baseline vs k, one line per candidate (teacher-forced)."""
    plt, sns = theme()
    labels = list(dict.fromkeys(curve.label))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    sns.lineplot(curve, x="k", y="overlap", hue="label", palette=palette(labels), marker="o", ax=ax)
    ax.set(xlabel="k", ylabel="|top-k ∩ top-k(auto)| / k", xticks=sorted(curve.k.unique()))
    fig.tight_layout()
    return fig


def ppl_and_task(ppl: Any, task: Any) -> Any:
    """Three panels per KV config (means, 95% bootstrap CIs): perplexity per held-out window, copy-task
    greedy token accuracy, copy-task teacher-forced accuracy (when present)."""
    plt, sns = theme()
    labels = list(dict.fromkeys(list(ppl.label) + list(task.label)))
    panels = [(ppl, "ppl", "perplexity per held-out window")]
    if len(task):
        panels.append((task, "token_acc", "copy task: greedy token accuracy"))
        if "tf_acc" in task:
            panels.append((task, "tf_acc", "copy task: teacher-forced accuracy"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (df, col, name) in zip(axes[0], panels, strict=True):
        if not len(df):
            continue
        sns.barplot(
            df, x="label", y=col, hue="label", palette=palette(labels), errorbar=("ci", 95), n_boot=1000, seed=0, ax=ax
        )
        ax.set(xlabel="", ylabel=name, ylim=(df[col].min() * 0.9, None) if col == "ppl" else (0, 1.05))
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return fig


def roundtrip_by_layer(rt: Any, scale: str = "1.0") -> Any:
    """Relative round-trip error of the captured tensors per layer, one panel per tensor (K, V, Q),
    bars per format x rounding, at one scale choice."""
    plt, sns = theme()
    df = rt[rt.scale == scale].assign(setting=lambda d: d.format + " " + d.rounding)
    g = sns.catplot(
        df,
        x="layer",
        y="rel_err",
        hue="setting",
        col="tensor",
        kind="bar",
        height=3.4,
        aspect=1.2,
        palette=["#4C72B0", "#DD8452", "#55A868", "#C44E52"][: df.setting.nunique()],
    )
    g.set_axis_labels("layer", f"‖q(x) − x‖ / ‖x‖  (scale {scale})")
    return g.figure


def roundtrip_points(points: Any) -> Any:
    """What each rounding does to the numbers: stored-minus-true error vs the true value for a sample
    of one tensor, a panel per rounding (rows) and format (columns). RTZ's error always points toward
    zero (and grows with |x|); RNE's is centred on zero and half as wide."""
    plt, sns = theme()
    fmts, rnds = list(dict.fromkeys(points.format)), list(dict.fromkeys(points.rounding))
    fig, axes = plt.subplots(
        len(rnds), len(fmts), figsize=(5.5 * len(fmts), 2.8 * len(rnds)), squeeze=False, sharex=True, sharey="col"
    )
    colours = {"rne": "#4C72B0", "rtz": "#C44E52"}
    for i, r in enumerate(rnds):
        for j, f in enumerate(fmts):
            d = points[(points.format == f) & (points.rounding == r)]
            axes[i][j].scatter(d.x, d.err, s=3, alpha=0.5, color=colours.get(r, "#55A868"), linewidths=0)
            axes[i][j].axhline(0, color="#555", lw=0.8)
            axes[i][j].set(
                title=f"{f}, {r}",
                xlabel="true value" if i == len(rnds) - 1 else "",
                ylabel="stored − true" if j == 0 else "",
            )
    fig.tight_layout()
    return fig


def attention_error(attn: Any) -> Any:
    """Relative error of the attention outputs per layer when K/V (and optionally Q) go through FP8."""
    plt, sns = theme()
    df = attn.assign(setting=lambda d: d.format + " " + d.rounding + d.quantize_q.map({True: " +Q", False: ""}))
    fig, ax = plt.subplots(figsize=(9, 3.8))
    sns.barplot(df, x="layer", y="out_rel_err", hue="setting", ax=ax)
    ax.set(xlabel="layer", ylabel="‖O_fp8 − O‖ / ‖O‖ (attention output)")
    ax.legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize="small")
    fig.tight_layout()
    return fig


__all__ = [
    "attention_error",
    "divergence_ecdf",
    "palette",
    "ppl_and_task",
    "roundtrip_by_layer",
    "roundtrip_points",
    "top3_by_category",
    "teacher_by_position",
    "topk_overlap_curve",
]
