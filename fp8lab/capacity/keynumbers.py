"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, fmt_number, pair, pair_of, pick


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    s = dict(s or {})
    if rows is not None:
        return _rows_00(rows)
    return _from_summary(s)


def _rows_00(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    check = [r for r in rows if r["metric"] == "num_blocks_formula" and r["baseline"] is None]
    models = {r["model"] for r in check} or {r["model"] for r in rows if r["metric"] == "kv_bytes_per_token"}
    if len(models) == 1:  # the measured model: the one whose engine budget the formula was checked against
        model = models.pop()
        pair = pair_of(rows, "auto", "fp8", metric="kv_bytes_per_token", model=model)
        out.append((f"KV per token, auto → fp8 ({model})", None if pair is None else pair + "/token"))
    share = pick(rows, metric="formula_exact_share")
    if share is not None:
        out.append(
            (
                "engines on record whose block count the formula predicted exactly",
                f"{round(share['value'] * share['n'])} of {share['n']} ({share['device']})",
            )
        )
    engine = [r for r in rows if r["metric"] == "num_blocks" and r["baseline"] is None]
    formula = [pick(check, kv_dtype=r["kv_dtype"], setting=r["setting"], model=r["model"]) for r in engine]
    if engine and all(f is not None for f in formula):  # a prediction missing from the rows: nothing to compare
        exact = all(f["value"] == r["value"] for r, f in zip(engine, formula, strict=True))  # type: ignore[index]
        out.append(("engines started by this run: formula exact", fmt_number(exact)))
    elif not engine:  # this run predicted only (an engine that failed records no blocks either)
        out.append(("engines started by this run", "none (predictions only)"))
    return out


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    rows: KeyNumbers = []
    rows.append(
        (
            "KV per token, auto → fp8 (" + str(s.get("model", "")) + ")",
            pair(s, "bytes_per_token.auto", "bytes_per_token.fp8", "B/token"),
        )
    )
    rec = s.get("records") or {}
    if rec.get("compared"):
        rows.append(
            (
                "engines on record whose block count the formula predicted exactly",
                f"{rec.get('exact')} of {rec.get('compared')} ({', '.join(rec.get('devices') or []) or 'device not recorded'})",
            )
        )
    if s.get("prediction_exact") is not None:
        rows.append(("engines started by this run: formula exact", fmt_number(s.get("prediction_exact"))))
    elif s.get("measured"):
        rows.append(("engines started by this run", "none (predictions only)"))
    return rows
