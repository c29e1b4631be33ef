"""Study 00's measured check: :func:`capacity_check` starts one engine per kv dtype (through
:func:`fp8lab.engine.results.run_cached`, so a finished run is read back, not re-run) with a fixed KV budget, and compares
the engine's block count with :func:`fp8lab.kvmath.predict_num_blocks` computed from the engine's own budget and
block size, so the comparison isolates the page-size formula (vLLM ``get_kv_cache_config_from_groups``:
``num_blocks = kv_budget_bytes // bytes_per_block``). A failed engine becomes a row with its status and error,
never an exception. :func:`prediction_row` is the same comparison for one engine, also for stored ones
(:mod:`fp8lab.capacity.records`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fp8lab import kvmath
from fp8lab.errors import SpecError

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


def hybrid_manager(engine: dict[str, Any]) -> bool:
    """Whether vLLM ran its hybrid KV-cache manager: the engine's own flag when it reports one, else vLLM's
    default for the device (on for GPU, off on CPU, vLLM ``VllmConfig``); only models mixing sliding-window and
    full layers depend on it."""
    if "hybrid_kv_cache_manager" in engine:
        return bool(engine["hybrid_kv_cache_manager"])
    return engine.get("mem_kind", "gpu") == "gpu"


def prediction_row(spec: Any, res: Any, kv_cache_gib: float, block_size: int | None) -> dict[str, Any]:
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
            pred = kvmath.predict_num_blocks(model, int(row["kv_budget_bytes"]), bs, kv_dtype, tp, hybrid_manager(e))
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
    store: Path | None = None,
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
    :func:`fp8lab.engine.results.run_cached` (tests pass a fake engine); ``store`` is its results store (None:
    ``$FP8LAB_RUNS`` or ``runs/``).
    """
    return check_runs(
        model,
        kv_dtypes,
        kv_cache_gib,
        block_size,
        max_model_len=max_model_len,
        measure=measure,
        study=study,
        runner=runner,
        store=store,
        **spec_kwargs,
    )[0]


def check_runs(
    model: str,
    kv_dtypes: Iterable[str] = ("auto", "fp8"),
    kv_cache_gib: float = 1.0,
    block_size: int | None = None,
    *,
    max_model_len: int | None = 2048,
    measure: bool = True,
    study: str = "00_kv_memory",
    runner: Callable[..., Any] | None = None,
    store: Path | None = None,
    **spec_kwargs: Any,
) -> tuple[Any, list[Any]]:
    """:func:`capacity_check`'s table and the engine results it was made from (one per kv dtype, in order; None
    for an engine not started), whose provenance says where each ran."""
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
        from fp8lab.engine.results import run_cached as runner
    rows, results = [], []
    where = {} if store is None else {"root": store}
    for spec in specs:
        res = runner(spec, (), study=study, **where) if measure else None  # type: ignore[misc]
        results.append(res)
        rows.append(prediction_row(spec, res, kv_cache_gib, block_size))
    df = pd.DataFrame(rows, columns=COLUMNS)
    for col, src in (("ratio_vs_auto", "engine_blocks"), ("predicted_ratio_vs_auto", "predicted_blocks")):
        base = df.loc[df.kv_dtype == "auto", src].dropna()
        df[col] = df[src].astype(float) / float(base.iloc[0]) if len(base) and base.iloc[0] else float("nan")
    return df, results


__all__ = ["COLUMNS", "NOT_RUN", "capacity_check", "check_runs", "hybrid_manager", "prediction_row"]
