"""Study 00's key numbers: :func:`summarize` (the flat dict notebook 00 records and the claims audit reads, from
the tables), :func:`summary` (the same from a run) and :func:`summary_rows` (the same numbers as typed rows,
:mod:`fp8lab.summary_table`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.capacity.check import NOT_RUN
from fp8lab.capacity.records import summarize_records
from fp8lab.capacity.run import CapacityRun
from fp8lab.capacity.tables import tables


def _nested(df: Any, value: str) -> dict[str, dict[str, Any]]:
    """``{model: {kv_dtype: value}}`` from a tidy frame."""
    return {m: dict(zip(g.kv_dtype, g[value], strict=True)) for m, g in df.groupby("model", sort=False)}


def summarize(
    model: str,
    kv_dtypes: Sequence[str],
    formula: Any,
    plan: Any,
    memory: Any,
    check: Any,
    records: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Key numbers of the KV-memory study (notebook 00) for :func:`fp8lab.report.run.record_summary`.

    ``formula``: rows of :func:`kvmath.summary_row`; ``plan``: of :func:`kvmath.plan_capacity`;
    ``memory``: of :func:`kvmath.memory_rows`; ``check``: :func:`capacity_check`'s table; ``records``:
    :func:`summarize_records` of the engines on record, when checked. ``model`` is the name of the measured
    model (its row in ``formula``). Ratios are against the first kv dtype.
    """
    first = kv_dtypes[0]
    bpt = {r.model: {d: int(getattr(r, f"bytes_per_token_{d}")) for d in kv_dtypes} for r in formula.itertuples()}
    ok = check[check.status == "ok"]
    rel = ok.rel_error.dropna().abs()
    ran = bool(len(check)) and not (check.status == NOT_RUN).all()
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
        # None when no engine was started here (MEASURE = False): "not measured", not "failed" (the engines on
        # record are judged in ``records``)
        "measured_ok": (len(ok) == len(check)) if ran else None,
        "max_abs_rel_error": float(rel.max()) if len(rel) else None,
        "prediction_exact": (bool(len(rel)) and float(rel.max()) == 0.0) if ran else None,
        "records": records,
    }


def summary(run: CapacityRun, t: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`summarize` of a run's tables (``t``: :func:`~fp8lab.capacity.tables.tables` of ``run``, computed when
    None): what notebook 00 records."""
    t = tables(run) if t is None else t
    s = run.spec
    rec = summarize_records(t["records"], list(s.engine_records)) if t["records"] is not None else None
    return summarize(s.model_name, list(s.kv_dtypes), t["formula"], t["plan"], t["memory"], t["check"], rec)


def _num(v: Any) -> float | None:
    """A finite number, or None (None, NaN, pandas' NA)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


#: ``device`` of a row computed from a config alone (no engine).
ARITHMETIC = "any (arithmetic on config.json)"


def summary_rows(run: CapacityRun, t: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The study's typed rows (:mod:`fp8lab.summary_table`, study ``kv_memory``), from its tables. Evidence
    ``computed`` (``device`` :data:`ARITHMETIC`, ``n`` 1) for the formula on every config (``model``): each kv
    dtype's ``kv_bytes_per_token`` (bytes) and its ratio to the first dtype's (``baseline``); on the spec's GPU the
    ``kv_capacity_tokens_formula`` and ``max_concurrency_formula`` at ``context_len`` = the plan's length; the
    ``total_memory_gib_formula`` of ``batch`` x ``context_len`` tokens and its ratio. The measured check (setting:
    the engines' KV budget and block size): ``num_blocks_formula`` and ``kv_capacity_tokens_formula`` from the
    engine's own budget (computed), the engine's ``num_blocks`` and ``kv_capacity_tokens`` (evidence of the
    engine's device), and each dtype's blocks against the first's (``baseline``, unit ``ratio``), engine and
    formula. The engines on record: ``formula_exact_share`` (``n`` the engines compared, ``device`` theirs)."""
    from fp8lab import summary_table as st

    t = tables(run) if t is None else t
    s = run.spec
    first = s.kv_dtypes[0]
    rows: list[dict[str, Any]] = []
    computed = {"study": "kv_memory", "evidence": "computed", "device": ARITHMETIC, "n": 1}

    def add(**fields: Any) -> None:
        if _num(fields["value"]) is not None:
            rows.append(st.make_row(**{**computed, **fields, "value": _num(fields["value"])}))

    for r in t["formula"].to_dict("records"):
        base = r[f"bytes_per_token_{first}"]
        for d in s.kv_dtypes:
            at = {"metric": "kv_bytes_per_token", "kv_dtype": d, "setting": f"formula, TP {s.tp}", "model": r["model"]}
            add(**at, value=r[f"bytes_per_token_{d}"], unit="bytes")
            if d != first and base:
                add(**at, baseline=first, value=r[f"bytes_per_token_{d}"] / base, unit="ratio")
    plan_setting = (
        f"formula, a {s.gpu_memory_gib:g} GiB GPU x {s.gpu_memory_utilization:g}, {s.overhead_gib:g} GiB overhead"
    )
    for r in t["plan"].to_dict("records"):
        at = {
            "kv_dtype": r["kv_dtype"],
            "setting": f"{plan_setting}, block {r['block_size']}",
            "model": r["model"],
            "context_len": int(r["context_len"]),
        }
        add(**at, metric="kv_capacity_tokens_formula", value=r["capacity_tokens"], unit="tokens")
        add(**at, metric="max_concurrency_formula", value=r["max_concurrency"], unit="requests")
    mem = t["memory"]
    for m, g in mem.groupby("model", sort=False):
        base = g[g.kv_dtype == first].total_gib
        for r in g.to_dict("records"):
            at = {
                "metric": "total_memory_gib_formula",
                "kv_dtype": r["kv_dtype"],
                "setting": f"formula, weights + KV, TP {s.tp}",
                "model": m,
                "batch": int(r["batch"]),
                "context_len": int(r["context_len"]),
            }
            add(**at, value=r["total_gib"], unit="GiB")
            if r["kv_dtype"] != first and len(base):
                add(**at, baseline=first, value=r["total_gib"] / float(base.iloc[0]), unit="ratio")
    device = run.device or "unknown"
    measured = {**computed, "evidence": st.evidence_of(run.device, s.model_name), "device": device}
    chk = t["check"].to_dict("records")
    by_dtype = {r["kv_dtype"]: r for r in chk}
    for r in chk:
        if _num(r["block_size"]) is None:
            continue
        setting = f"{_num(r['kv_budget_bytes']) / 2**30:g} GiB of KV, block {int(r['block_size'])}"
        at = {"kv_dtype": r["kv_dtype"], "setting": setting, "model": r["model"]}
        b0 = by_dtype.get(first, {})
        add(**at, metric="num_blocks_formula", value=r["predicted_blocks"], unit="blocks")
        add(**at, metric="kv_capacity_tokens_formula", value=r["predicted_tokens"], unit="tokens")
        if r["kv_dtype"] != first and _num(b0.get("predicted_blocks")):
            add(
                **at,
                metric="num_blocks_formula",
                baseline=first,
                value=_num(r["predicted_blocks"]) / _num(b0["predicted_blocks"]),  # type: ignore[operator]
                unit="ratio",
            )
        if r["status"] != "ok":
            continue
        for metric, col, unit in (
            ("num_blocks", "engine_blocks", "blocks"),
            ("kv_capacity_tokens", "engine_tokens", "tokens"),
        ):
            if _num(r[col]) is not None:
                rows.append(st.make_row(**measured, **at, metric=metric, value=_num(r[col]), unit=unit))
        engine_base = _num(b0.get("engine_blocks")) if b0.get("status") == "ok" else None
        if r["kv_dtype"] != first and engine_base and _num(r["engine_blocks"]) is not None:
            rows.append(
                st.make_row(
                    **measured,
                    **at,
                    metric="num_blocks",
                    baseline=first,
                    value=_num(r["engine_blocks"]) / engine_base,  # type: ignore[operator]
                    unit="ratio",
                )
            )
    rec = t["records"]
    if rec is not None:
        rs = summarize_records(rec, list(s.engine_records))
        if rs["compared"]:
            devices = rs["devices"] or ["unknown"]
            kinds = {st.evidence_of(d, None) for d in devices}
            rows.append(
                st.make_row(
                    study="kv_memory",
                    metric="formula_exact_share",
                    kv_dtype=first,
                    setting="engines on record, every kv dtype",
                    value=rs["exact"] / rs["compared"],
                    n=rs["compared"],
                    unit="fraction",
                    evidence=kinds.pop() if len(kinds) == 1 else "unknown",
                    device=", ".join(devices),
                    model=", ".join(rs["models"]) or "unknown",
                )
            )
    return rows


__all__ = ["ARITHMETIC", "summarize", "summary", "summary_rows"]
