"""Study 08's flat summary: what the notebook records (:func:`fp8lab.report.run.record_summary`), the index and the claims
audit read. No None or NaN: a figure that does not exist for a row is left out."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fp8lab.dtypes.quality import METHOD
from fp8lab.dtypes.run import MatrixRun


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        v = v.item()
    return v


INT_KEYS = ("block_size", "num_blocks", "formula_blocks")


def summary(run: MatrixRun, table: Any) -> dict[str, Any]:
    """The run's key numbers: device and vLLM, rows by status, every row's status / cause class / backend /
    capacity / prefix / quality figures (``rows.<label>.<figure>``), and whether capacity matched the formula
    exactly for every row that started."""
    prov = {}
    p = run.run_dir / "provenance.json"
    if p.exists():
        import json

        prov = json.loads(p.read_text())
    started = table[table.status == "started"] if len(table) else table
    exact = [bool(x) for x in started.get("blocks_exact", [])] if len(started) else []
    s: dict[str, Any] = {
        "device": prov.get("device") or "unknown",
        "vllm_version": prov.get("vllm") or "unknown",
        "model": Path(run.spec.model).name,
        "kv_cache_gib": run.spec.kv_cache_gib,
        "complete": run.complete,
        "n_rows": int(len(table)),
        "n_started": int((table.status == "started").sum()) if len(table) else 0,
        "n_refused": int((table.status == "refused").sum()) if len(table) else 0,
        "n_crashed": int((table.status == "crashed").sum()) if len(table) else 0,
        "capacity_exact_all": bool(exact) and all(exact),
        "quality_method": next((str(m) for m in table.get("quality_method", []) if isinstance(m, str)), METHOD)
        if len(table)
        else METHOD,
        "started": [str(x) for x in started.label] if len(started) else [],
    }
    keep = (
        "status",
        "cause_class",
        "attention_backend",
        "block_size",
        "num_blocks",
        "formula_blocks",
        "blocks_exact",
        "tokens_per_gib",
        "formula_tokens_per_gib",
        "capacity_x",
        "scales",
        "prefix_hit_equals_cold",
        "dppl_pct",
        "top1_agreement",
        "greedy_identical",
        "dppl_one_pass_pct",
        "cache_sees",
        "one_pass_sees",
    )
    rows: dict[str, Any] = {}
    for rec in table.to_dict("records"):
        d = {}
        for k in (*keep, *[c for c in rec if c.startswith("decode_x@")]):
            v = _clean(rec.get(k))
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                d[k] = int(v) if k in INT_KEYS and isinstance(v, float) else v
        rows[rec["label"]] = d
    s["rows"] = rows
    return s
