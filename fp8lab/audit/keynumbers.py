"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, first_rows


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    s = dict(s or {})
    if rows is not None:
        return first_rows(rows)
    return _from_summary(s)


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    rows: KeyNumbers = []
    counts = s.get("verdict_counts") or {}
    rows.append(("verdicts", ", ".join(f"{v} {k}" for k, v in counts.items()) or None))
    return rows
