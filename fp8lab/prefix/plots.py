"""Plots of Study 07 (FP8 KV and the prefix cache). Each draws one figure from the study's tables
(:func:`fp8lab.prefix.sweep_table`, :func:`fp8lab.prefix.plan`); nothing here computes a new number."""

from __future__ import annotations

from typing import Any

from fp8lab.plots import kv_palette, theme


def hit_rate_vs_active(sweep: Any, predicted: Any, kv_dtypes: Any = ("auto", "fp8")) -> Any:
    """Hit rate against the number of active conversations, one panel per workload: measured means (dots),
    the replayed prediction for each dtype's block count (lines) and for an unbounded cache (grey dashes)."""
    plt, _ = theme()
    works = list(dict.fromkeys(predicted.workload))
    fig, axes = plt.subplots(1, len(works), figsize=(4.2 * len(works), 3.6), squeeze=False)
    pal = kv_palette(kv_dtypes)
    for ax, w in zip(axes[0], works, strict=True):
        p = predicted[predicted.workload == w]
        for d in kv_dtypes:
            q = p[p.kv_dtype == d].sort_values("n_active")
            ax.plot(q.n_active, q.hit_rate_pred * 100, "-", color=pal[d], alpha=0.5, label=f"{d} predicted")
            s = sweep[sweep.workload == w].sort_values("n_active") if len(sweep) else sweep
            if len(s) and f"{d}_hit_rate" in s:
                ax.plot(s.n_active, s[f"{d}_hit_rate"] * 100, "o", color=pal[d], label=f"{d} measured")
        u = p[p.kv_dtype == kv_dtypes[0]].sort_values("n_active")
        ax.plot(u.n_active, u.hit_rate_unbounded * 100, "--", color="grey", alpha=0.7, label="unbounded cache")
        ax.set_ylim(0, 100)
        ax.set_xscale("log", base=2)
        ax.set(title=w, xlabel="active conversations N", ylabel="prefix-cache hit rate (%)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def ttft_vs_active(sweep: Any, kv_dtypes: Any = ("auto", "fp8")) -> Any:
    """Mean TTFT (ms) against active conversations per workload, each dtype (means over trials)."""
    plt, _ = theme()
    works = list(dict.fromkeys(sweep.workload))
    fig, axes = plt.subplots(1, len(works), figsize=(4.2 * len(works), 3.6), squeeze=False)
    pal = kv_palette(kv_dtypes)
    for ax, w in zip(axes[0], works, strict=True):
        s = sweep[sweep.workload == w].sort_values("n_active")
        for d in kv_dtypes:
            if f"{d}_ttft_ms" in s:
                ax.plot(s.n_active, s[f"{d}_ttft_ms"], "o-", color=pal[d], label=d)
        ax.set_ylim(bottom=0)
        ax.set_xscale("log", base=2)
        ax.set(title=w, xlabel="active conversations N", ylabel="mean TTFT (ms)")
    axes[0][0].legend()
    fig.tight_layout()
    return fig
