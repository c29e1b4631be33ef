"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, dtypes_of, fmt_number, pick


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    s = dict(s or {})
    if rows is not None:
        return _rows_06(rows)
    return _from_summary(s)


def _rows_06(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str | None]]:
    base, cand = dtypes_of(rows)
    pts = [r for r in rows if r["metric"] == "decode_step_ms" and r["kv_dtype"] == cand and r["baseline"] == base]
    out: list[tuple[str, str | None]] = []
    if pts:
        n = len(pts)
        faster = sum(1 for r in pts if r["beyond_noise"] and r["value"] < 1)
        slower = sum(1 for r in pts if r["beyond_noise"] and r["value"] > 1)
        out.append(("grid points (batch x context) measured by both dtypes", fmt_number(n)))
        out.append((f"{cand} decode step faster / slower beyond noise", f"{faster} / {slower} of {n} points"))
    hw = [100 * r["detectable"] for r in pts if r["detectable"] is not None]
    if hw:
        out.append(
            (
                f"smallest {cand}/{base} change these runs resolve (median 95% CI half-width)",
                f"{fmt_number(statistics.median(hw), 2)} %",
            )
        )
    engines = [r for r in rows if r["metric"] == "num_blocks" and r["baseline"] is None]
    formula = [pick(rows, metric="num_blocks_formula", kv_dtype=r["kv_dtype"], setting=r["setting"]) for r in engines]
    if engines and all(f is not None for f in formula):  # a prediction missing from the rows: nothing to compare
        exact = all(f["value"] == r["value"] for r, f in zip(engines, formula, strict=True))  # type: ignore[index]
        out.append(("KV blocks as the formula predicts", fmt_number(exact)))
    return out + _rows_06_engines(rows, pts, base, cand)


def _rows_06_engines(
    rows: Sequence[Mapping[str, Any]], pts: Sequence[Mapping[str, Any]], base: str, cand: str
) -> list[tuple[str, str | None]]:
    """An engine-replicated Study 06 (issue 35): in the headline arm (the setting of its point rows), each batch's
    fp8 - auto fixed cost per step and crossover context with their intervals over engine pairs."""
    setting = pts[0]["setting"] if pts else None
    out: list[tuple[str, str | None]] = []

    def ci(r: Mapping[str, Any], digits: int) -> str:
        if r["ci_low"] is None:
            return "no 95% interval within the measured contexts" if r["unit"] == "tokens" else "no interval"
        return f"95% CI {fmt_number(r['ci_low'], digits)} to {fmt_number(r['ci_high'], digits)}"

    for r in rows:
        if r["setting"] != setting or r["kv_dtype"] != cand or r["baseline"] != base:
            continue
        if r["metric"] == "decode_fixed_ms":
            out.append(
                (
                    f"batch {r['batch']}: {cand} − {base} fixed cost per decode step ({r['n']} engine pairs)",
                    f"{fmt_number(r['value'] * 1e3, 3)} µs ({ci({**r, 'ci_low': _us(r['ci_low']), 'ci_high': _us(r['ci_high'])}, 3)})",
                )
            )
        elif r["metric"] == "decode_crossover_tokens":
            out.append(
                (
                    f"batch {r['batch']}: context where {cand}'s step equals {base}'s ({r['n']} engine pairs)",
                    f"{fmt_number(r['value'], 4)} tokens ({ci(r, 4)})",
                )
            )
    return out


def _us(ms: float | None) -> float | None:
    return None if ms is None else ms * 1e3


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    rows: KeyNumbers = []
    pts = [p for p in s.get("points") or [] if isinstance(p, dict)]
    if pts:
        n = len(pts)
        faster = sum(1 for p in pts if p.get("beyond_noise") and (p.get("ratio") or 1) < 1)
        slower = sum(1 for p in pts if p.get("beyond_noise") and (p.get("ratio") or 1) > 1)
        rows.append(("grid points (batch x context) measured by both dtypes", fmt_number(n)))
        rows.append(("fp8 decode step faster / slower beyond noise", f"{faster} / {slower} of {n} points"))
    if s.get("min_detectable_pct") is not None:
        rows.append(
            (
                "smallest fp8/auto change these runs resolve (median 95% CI half-width)",
                f"{fmt_number(s['min_detectable_pct'], 2)} %",
            )
        )
    if "capacity_exact" in s:
        rows.append(("KV blocks as the formula predicts", fmt_number(s["capacity_exact"])))
    return rows
