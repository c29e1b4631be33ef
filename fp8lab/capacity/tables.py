"""Study 00's tables, arithmetic on a :class:`~fp8lab.capacity.run.CapacityRun`'s layouts (:mod:`fp8lab.kvmath`)
beside its measured tables: :func:`tables` computes them all at once, by name."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fp8lab import kvmath
from fp8lab.capacity.run import CapacityRun

#: The tables :func:`tables` returns, in order.
TABLES = ("formula", "per_layer", "curve", "plan", "memory", "check", "records")


def formula_table(run: CapacityRun) -> pd.DataFrame:
    """One row per model (:func:`fp8lab.kvmath.summary_row`): shape, the formula, ``bytes_per_token_<dtype>``."""
    s = run.spec
    return pd.DataFrame([kvmath.summary_row(lay, list(s.kv_dtypes), s.tp) for lay in run.layouts.values()])


def per_layer_table(run: CapacityRun) -> pd.DataFrame:
    """The measured model, one row per layer and kv dtype (:func:`fp8lab.kvmath.layer_rows`)."""
    s = run.spec
    return pd.DataFrame(kvmath.layer_rows(s.model, list(s.kv_dtypes), s.tp))


def curve_table(run: CapacityRun) -> pd.DataFrame:
    """KV GiB of one sequence per model, kv dtype and context length up to the model's positions
    (:func:`fp8lab.kvmath.kv_gib_vs_context`)."""
    s = run.spec
    return pd.DataFrame(
        [
            r
            for lay in run.layouts.values()
            for r in kvmath.kv_gib_vs_context(
                lay, list(s.context_lens), list(s.kv_dtypes), batch=1, tp=s.tp, within_max_position=True
            )
        ]
    )


def plan_table(run: CapacityRun) -> pd.DataFrame:
    """Capacity on the spec's GPU per model and kv dtype (:func:`fp8lab.kvmath.plan_capacity`)."""
    s = run.spec
    return pd.DataFrame(
        [
            r
            for lay in run.layouts.values()
            for r in kvmath.plan_capacity(
                lay,
                s.gpu_memory_gib,
                list(s.kv_dtypes),
                s.plan_context_len,
                s.block_size,
                s.tp,
                s.gpu_memory_utilization,
                overhead_gib=s.overhead_gib,
            )
        ]
    )


def memory_table(run: CapacityRun) -> pd.DataFrame:
    """Weights + KV at the spec's load per model and kv dtype (:func:`fp8lab.kvmath.memory_rows`)."""
    s = run.spec
    return pd.DataFrame(
        [
            r
            for lay in run.layouts.values()
            for r in kvmath.memory_rows(lay, s.mem_batch, s.mem_context_len, list(s.kv_dtypes), tp=s.tp)
        ]
    )


def tables(run: CapacityRun) -> dict[str, Any]:
    """Every table of :data:`TABLES`: ``formula``, ``per_layer``, ``curve``, ``plan``, ``memory`` (arithmetic),
    ``check`` (the measured engines against the formula) and ``records`` (the engines on record; None without
    ``engine_records``)."""
    return {
        "formula": formula_table(run),
        "per_layer": per_layer_table(run),
        "curve": curve_table(run),
        "plan": plan_table(run),
        "memory": memory_table(run),
        "check": run.check,
        "records": run.records,
    }


__all__ = ["TABLES", "curve_table", "formula_table", "memory_table", "per_layer_table", "plan_table", "tables"]
