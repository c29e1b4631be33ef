"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, fmt_number


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    # its rows hold the scale sets' differences and quality, none of its index numbers: the summary either way
    return _from_summary(dict(s or {}))


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    rows: KeyNumbers = []
    rows += [
        ("the 32-token claim holds", fmt_number(s.get("claim.holds")) if "claim.holds" in s else None),
        (
            "calibration tokens until per-head scales stay within the claim's threshold",
            fmt_number(s.get("tokens_to_threshold.attn_head")) if "tokens_to_threshold.attn_head" in s else None,
        ),
        (
            "largest |Δ logprob|, per-head vs per-tensor scales",
            fmt_number(s.get("head_reduction.max_abs_dlogprob"), 2) if "head_reduction.max_abs_dlogprob" in s else None,
        ),
    ]
    return rows
