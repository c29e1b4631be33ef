"""Plots of Study 00 (KV-cache memory). Each takes one of the study's tables (:func:`fp8lab.capacity.tables.tables`:
``formula``, ``curve``, ``plan``, ``memory``, ``check``), draws one figure in fp8lab's theme and returns it; nothing
here computes a number that is not in the table it is given. Moved here from :mod:`fp8lab.plots` (issue 16): only
notebook 00 drew them."""

from __future__ import annotations

from typing import Any

from fp8lab.plots import kv_color, kv_palette, theme


def bytes_per_token_bars(summary: Any, kv_dtypes: Any = ("auto", "fp8"), unit: int = 1024) -> Any:
    """Horizontal bars of KV bytes per token (in KiB by default) per model and kv dtype, from rows of
    :func:`fp8lab.kvmath.summary_row` (columns ``model`` and ``bytes_per_token_<dtype>``)."""
    plt, sns = theme()
    long = summary.melt(
        id_vars="model",
        value_vars=[f"bytes_per_token_{d}" for d in kv_dtypes],
        var_name="kv_dtype",
        value_name="bytes_per_token",
    )
    long["kv_dtype"] = long["kv_dtype"].str.removeprefix("bytes_per_token_")
    long["value"] = long["bytes_per_token"] / unit
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(summary) + 1.5))
    sns.barplot(long, y="model", x="value", hue="kv_dtype", palette=kv_palette(kv_dtypes), ax=ax)
    ax.set(xlabel=f"KV cache per token ({'KiB' if unit == 1024 else f'x{unit} B'}; all layers, 1 sequence)", ylabel="")
    fig.tight_layout()
    return fig


def kv_vs_context(rows: Any, models: Any = None) -> Any:
    """KV GiB of a batch vs context length (log-log axes), one line per model, solid/dashed per kv dtype,
    from rows of :func:`fp8lab.kvmath.kv_gib_vs_context`."""
    plt, sns = theme()
    df = rows if models is None else rows[rows.model.isin(models)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sns.lineplot(df, x="context_len", y="kv_gib", hue="model", style="kv_dtype", marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    batch = sorted(df["batch"].unique())
    ax.set(xlabel="context length (tokens)", ylabel=f"KV cache (GiB), batch {', '.join(map(str, batch))}")
    ax.legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize="small")
    fig.tight_layout()
    return fig


def concurrency_bars(plan: Any) -> Any:
    """Max concurrent full-length sequences per model and kv dtype, from rows of
    :func:`fp8lab.kvmath.plan_capacity`; models that do not fit are marked."""
    plt, sns = theme()
    fig, ax = plt.subplots(figsize=(8, 0.45 * plan.model.nunique() + 1.5))
    sns.barplot(plan, y="model", x="max_concurrency", hue="kv_dtype", palette=kv_palette(plan.kv_dtype.unique()), ax=ax)
    for c in ax.containers:
        ax.bar_label(c, fmt="%d", fontsize="x-small", padding=2)
    for i, m in enumerate(plan.model.unique()):
        if not plan[plan.model == m].fits.all():
            ax.text(0, i, "  weights do not fit", va="center", fontsize="small", color="#C44E52")
    ctx = sorted(plan.context_len.unique())
    gpu = sorted(plan.gpu_memory_gib.unique())
    ax.set(
        xlabel=f"sequences of {', '.join(map(str, ctx))} tokens at once ({', '.join(map(str, gpu))} GiB GPU)", ylabel=""
    )
    fig.tight_layout()
    return fig


def memory_stack(mem: Any, ncols: int = 5) -> Any:
    """Stacked bars weights + KV (GiB) per kv dtype, one panel per model (``ncols`` per row), from rows of
    :func:`fp8lab.kvmath.memory_rows`, annotated with the total relative to the first kv dtype."""
    plt, _ = theme()
    models = list(dict.fromkeys(mem.model))
    cols = min(ncols, len(models))
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols + 1, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(models) :]:
        ax.set_visible(False)
    for ax, m in zip(axes.flat, models, strict=False):
        d = mem[mem.model == m]
        ax.bar(d.kv_dtype, d.weight_gib, color="#8C8C8C", label="weights")
        ax.bar(
            d.kv_dtype,
            d.kv_gib,
            bottom=d.weight_gib,
            color=[kv_color(k) for k in d.kv_dtype],
            label="KV cache",
        )
        for x, (tot, rel) in enumerate(zip(d.total_gib, d.total_vs_first, strict=True)):
            ax.text(x, tot, f"{tot:.1f} GiB\n(x{rel:.2f})", ha="center", va="bottom", fontsize="small")
        ax.set_title(m, fontsize="medium")
        ax.set_ylim(0, d.total_gib.max() * 1.3)
    for row in axes:
        row[0].set_ylabel("GiB per GPU rank")
    axes[0][0].legend(loc="lower left", fontsize="small")
    b, n = mem.batch.iloc[0], mem.context_len.iloc[0]
    fig.suptitle(f"weights + KV cache, batch {b} x {n:,} tokens", fontsize="medium")
    fig.tight_layout()
    return fig


def capacity_check_bars(check: Any) -> Any:
    """Predicted vs engine-reported KV blocks per kv dtype, from :func:`fp8lab.capacity.capacity_check`."""
    plt, sns = theme()
    long = check.melt(
        id_vars="kv_dtype", value_vars=["predicted_blocks", "engine_blocks"], var_name="source", value_name="blocks"
    ).dropna()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if len(long):
        sns.barplot(long, x="kv_dtype", y="blocks", hue="source", palette=["#8C8C8C", "#4C72B0"], ax=ax)
        for c in ax.containers:
            ax.bar_label(c, fmt="%d", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no engine figures (see the status column)", ha="center", transform=ax.transAxes)
    ax.set(xlabel="kv_cache_dtype", ylabel="KV blocks")
    fig.tight_layout()
    return fig


__all__ = ["bytes_per_token_bars", "capacity_check_bars", "concurrency_bars", "kv_vs_context", "memory_stack"]
