"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, ci, dtypes_of, fmt_number, fmt_row, pick


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    s = dict(s or {})
    if rows is not None:
        return _rows_03(rows, s)
    return _from_summary(s)


def _rows_03(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    base, cand = dtypes_of(rows)
    top3 = pick(rows, metric="top3_match", setting=cand, kv_dtype=cand, subset=None, baseline=None)
    ppl = pick(rows, metric="ppl", setting=cand, kv_dtype=cand, subset=None, baseline=base)
    return [
        (f"{cand}: top-3 token match (reports' protocol)", None if top3 is None else fmt_row(top3)),
        (f"{cand}: perplexity change", None if ppl is None else fmt_row(ppl)),
        # a verdict is a word, not a number: rows carry numbers only, so the verdicts stay summary keys
        ("verdicts", ", ".join(f"{k.split('.')[0]}: {v}" for k, v in s.items() if k.endswith(".verdict")) or None),
        ("prompts", None if top3 is None else fmt_number(top3["n"])),
    ]


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    rows: KeyNumbers = []
    rows += [
        (
            "fp8: top-3 token match (reports' protocol)",
            ci(s, "fp8.top3_match", "fp8.top3_ci_lo", "fp8.top3_ci_hi"),
        ),
        (
            "fp8: perplexity change",
            ci(s, "fp8.delta_ppl_pct", "fp8.delta_ppl_pct_ci_lo", "fp8.delta_ppl_pct_ci_hi", "%"),
        ),
        ("verdicts", ", ".join(f"{k.split('.')[0]}: {v}" for k, v in s.items() if k.endswith(".verdict")) or None),
        ("prompts", fmt_number(s.get("n_prompts")) if s.get("n_prompts") is not None else None),
    ]
    return rows
