"""KV capacity: the measured check against vLLM, and the key numbers of the KV-memory study.

:func:`capacity_check` starts one engine per kv dtype (through :func:`fp8lab.results.run_cached`, so a
finished run is read back, not re-run) with a fixed KV budget, and compares the engine's block count
with :func:`fp8lab.kvmath.predict_num_blocks` computed from the engine's own budget and block size, so
the comparison isolates the page-size formula (vLLM ``get_kv_cache_config_from_groups``:
``num_blocks = kv_budget_bytes // bytes_per_block``). A failed engine becomes a row with its status and
error, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fp8lab import kvmath
from fp8lab.specs import SpecError

#: Columns of :func:`capacity_check`'s table, in order.
COLUMNS = [
    "model",
    "kv_dtype",
    "status",
    "error",
    "block_size",
    "kv_budget_bytes",
    "predicted_blocks",
    "engine_blocks",
    "predicted_tokens",
    "engine_tokens",
    "rel_error",
    "predicted_ratio_vs_auto",
    "ratio_vs_auto",
]

#: ``status`` of a row whose engine was not started (``measure=False``).
NOT_RUN = "not run"


def _hybrid_manager(engine: dict[str, Any]) -> bool:
    """Whether vLLM ran its hybrid KV-cache manager: the engine's own flag when it reports one, else vLLM's
    default for the device (on for GPU, off on CPU, vLLM ``VllmConfig``); only models mixing sliding-window and
    full layers depend on it."""
    if "hybrid_kv_cache_manager" in engine:
        return bool(engine["hybrid_kv_cache_manager"])
    return engine.get("mem_kind", "gpu") == "gpu"


def _row(spec: Any, res: Any, kv_cache_gib: float, block_size: int | None) -> dict[str, Any]:
    model, kv_dtype = spec.model, spec.kv_cache_dtype
    ok = res is not None and res.status == "ok"
    e = dict(getattr(res, "engine", None) or {})
    row: dict[str, Any] = {
        "model": kvmath.load_layout(model).name,
        "kv_dtype": kv_dtype,
        "status": res.status if res is not None else NOT_RUN,
        "error": res.error if res is not None else None,
        "block_size": e.get("block_size") or block_size or (16 if res is None else None),
        "kv_budget_bytes": e.get("kv_budget_bytes") or int(kv_cache_gib * kvmath.GIB),
        "engine_blocks": e.get("num_blocks") if ok else None,
        "engine_tokens": e.get("kv_capacity_tokens") if ok else None,
        "predicted_blocks": None,
        "predicted_tokens": None,
        "rel_error": None,
    }
    if row["block_size"] is not None:
        bs = int(row["block_size"])
        tp = spec.tensor_parallel_size
        try:
            pred = kvmath.predict_num_blocks(model, int(row["kv_budget_bytes"]), bs, kv_dtype, tp, _hybrid_manager(e))
        except SpecError as exc:  # e.g. kv_dtype "auto" on a config without torch_dtype: a row, not a crash
            row["error"] = row["error"] or f"no prediction: {exc}"
        else:
            row.update(predicted_blocks=pred, predicted_tokens=pred * bs)
    if row["engine_blocks"] and row["predicted_blocks"] is not None:
        row["rel_error"] = (row["predicted_blocks"] - row["engine_blocks"]) / row["engine_blocks"]
    return row


def capacity_check(
    model: str,
    kv_dtypes: Iterable[str] = ("auto", "fp8"),
    kv_cache_gib: float = 1.0,
    block_size: int | None = None,
    *,
    max_model_len: int | None = 2048,
    measure: bool = True,
    study: str = "00_kv_memory",
    runner: Callable[..., Any] | None = None,
    **spec_kwargs: Any,
) -> Any:
    """Start one engine per kv dtype with a ``kv_cache_gib`` GiB KV budget and compare its block count
    with the prediction. Returns a pandas DataFrame with :data:`COLUMNS`:

    - ``predicted_blocks``: :func:`fp8lab.kvmath.predict_num_blocks` on the engine's ``kv_budget_bytes``
      and ``block_size`` (``block_size=None`` lets vLLM choose: 16 on GPU, 128 on CPU);
    - ``engine_blocks`` / ``engine_tokens``: the engine's ``num_blocks`` / ``kv_capacity_tokens``
      (``num_blocks x block_size``); ``predicted_tokens = predicted_blocks x block_size``;
    - ``rel_error = (predicted - engine) / engine`` blocks (0.0 is an exact match);
    - ``ratio_vs_auto`` / ``predicted_ratio_vs_auto``: blocks relative to the ``auto`` row (2.0 means
      FP8 doubles the capacity); NaN without an ``auto`` row.

    ``measure=False`` starts no engine: rows have status ``"not run"`` and only the prediction (for
    ``block_size``, or 16 when None). ``spec_kwargs`` go to :class:`~fp8lab.specs.EngineSpec`; by default
    ``load_format="dummy"`` and ``skip_tokenizer_init=True`` (the check sends no request and weight values
    do not change the KV arithmetic, so config-only folders work). ``runner`` replaces
    :func:`fp8lab.results.run_cached` (tests pass a fake engine).
    """
    import pandas as pd

    from fp8lab.specs import EngineSpec

    # Weights' values do not change the KV arithmetic, and no request is sent: random weights and no tokenizer
    # let any config folder (data/configs/*) be checked, unless the caller says otherwise.
    spec_kwargs = {"load_format": "dummy", "skip_tokenizer_init": True, **spec_kwargs}
    # EngineSpec validates model, kv dtypes, budget and block size, naming the field, before any engine starts.
    specs = [
        EngineSpec(
            model=model,
            kv_cache_dtype=dt,
            kv_cache_gib=kv_cache_gib,
            block_size=block_size,
            max_model_len=max_model_len,
            **spec_kwargs,
        )
        for dt in kv_dtypes
    ]
    if runner is None and measure:
        from fp8lab.results import run_cached as runner
    rows = []
    for spec in specs:
        res = runner(spec, (), study=study) if measure else None  # type: ignore[misc]
        rows.append(_row(spec, res, kv_cache_gib, block_size))
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col, src in (("ratio_vs_auto", "engine_blocks"), ("predicted_ratio_vs_auto", "predicted_blocks")):
        base = df.loc[df.kv_dtype == "auto", src].dropna()
        df[col] = df[src].astype(float) / float(base.iloc[0]) if len(base) and base.iloc[0] else float("nan")
    return df


# --------------------------------------------------------------------------------------------------
# The study's key numbers and verdict
# --------------------------------------------------------------------------------------------------


def _nested(df: Any, value: str) -> dict[str, dict[str, Any]]:
    """``{model: {kv_dtype: value}}`` from a tidy frame."""
    return {m: dict(zip(g.kv_dtype, g[value], strict=True)) for m, g in df.groupby("model", sort=False)}


def summarize(model: str, kv_dtypes: Sequence[str], formula: Any, plan: Any, memory: Any, check: Any) -> dict[str, Any]:
    """Key numbers of the KV-memory study (notebook 00) for :func:`fp8lab.report.record_summary`.

    ``formula``: rows of :func:`kvmath.summary_row`; ``plan``: of :func:`kvmath.plan_capacity`;
    ``memory``: of :func:`kvmath.memory_rows`; ``check``: :func:`capacity_check`'s table. ``model`` is the
    name of the measured model (its row in ``formula``). Ratios are against the first kv dtype.
    """
    first = kv_dtypes[0]
    bpt = {r.model: {d: int(getattr(r, f"bytes_per_token_{d}")) for d in kv_dtypes} for r in formula.itertuples()}
    ok = check[check.status == "ok"]
    rel = ok.rel_error.dropna().abs()
    measured = {
        r.kv_dtype: {
            "status": r.status,
            "error": r.error,
            "block_size": r.block_size,
            "kv_budget_bytes": r.kv_budget_bytes,
            "predicted_blocks": r.predicted_blocks,
            "engine_blocks": r.engine_blocks,
            "rel_error": r.rel_error,
            "ratio_vs_auto": r.ratio_vs_auto,
        }
        for r in check.itertuples()
    }
    return {
        "model": model,
        "kv_dtypes": list(kv_dtypes),
        "bytes_per_token": bpt[model],
        "kv_ratio_vs_first": {d: bpt[model][d] / bpt[model][first] for d in kv_dtypes},
        "configs_bytes_per_token": bpt,
        "gpu_memory_gib": float(plan.gpu_memory_gib.iloc[0]) if len(plan) else None,
        "plan_context_len": int(plan.context_len.iloc[0]) if len(plan) else None,
        "max_concurrency": _nested(plan, "max_concurrency"),
        "capacity_tokens": _nested(plan, "capacity_tokens"),
        "memory_batch": int(memory.batch.iloc[0]) if len(memory) else None,
        "memory_context_len": int(memory.context_len.iloc[0]) if len(memory) else None,
        "total_memory_vs_first": _nested(memory, "total_vs_first"),
        "measured": measured,
        "measured_ok": bool(len(ok)) and len(ok) == len(check),
        "max_abs_rel_error": float(rel.max()) if len(rel) else None,
        "prediction_exact": bool(len(rel)) and float(rel.max()) == 0.0,
    }


def verdict_markdown(s: dict[str, Any]) -> str:
    """A few Markdown bullets rendering :func:`summarize`'s numbers (no number here that is not in ``s``)."""
    dts = s["kv_dtypes"]
    first, rest = dts[0], dts[1:]
    lines = []
    for d in rest:
        lines.append(
            f"- **KV per token** ({s['model']}): `{d}` stores {s['bytes_per_token'][d]:,} B/token vs "
            f"{s['bytes_per_token'][first]:,} for `{first}` (x{s['kv_ratio_vs_first'][d]:.2f}); the same factor holds "
            "for every config, since dtype bytes multiply the whole formula."
        )
        conc = {m: v for m, v in s["max_concurrency"].items() if v.get(first)}
        if conc:
            gains = [v[d] / v[first] for v in conc.values()]
            lines.append(
                f"- **Capacity** on a {s['gpu_memory_gib']:g} GiB GPU at {s['plan_context_len']:,} tokens: `{d}` gives "
                f"x{min(gains):.2f} to x{max(gains):.2f} the concurrent sequences of `{first}` across "
                f"{len(conc)} models whose weights fit (the KV budget is the same, so blocks double; concurrency "
                "follows up to rounding)."
            )
        tot = [v[d] for v in s["total_memory_vs_first"].values() if d in v]
        if tot:
            lines.append(
                f"- **Total memory** (weights + KV, batch {s['memory_batch']} x {s['memory_context_len']:,} tokens) "
                f"shrinks to x{min(tot):.2f} to x{max(tot):.2f} of `{first}`, not to x{s['kv_ratio_vs_first'][d]:.2f}: "
                "the weights do not change, so the smaller the KV share of memory, the less FP8 saves."
            )
    m = s["measured"]
    if m and all(v["status"] == NOT_RUN for v in m.values()):
        lines.append("- **Measured**: no engine was started in this run (`MEASURE = False`): predictions only.")
    elif s["measured_ok"]:
        parts = ", ".join(f"`{d}` {v['engine_blocks']:,} (predicted {v['predicted_blocks']:,})" for d, v in m.items())
        exact = "exactly" if s["prediction_exact"] else f"within {s['max_abs_rel_error']:.2%}"
        lines.append(f"- **Measured** on vLLM: KV blocks {parts}: the formula matches {exact}.")
    else:
        parts = ", ".join(f"`{d}`: {v['status']}" + (f" ({v['error']})" if v["error"] else "") for d, v in m.items())
        lines.append(f"- **Measured**: not every engine gave figures ({parts}).")
    return "\n".join(lines)


__all__ = ["COLUMNS", "NOT_RUN", "capacity_check", "summarize", "verdict_markdown"]
