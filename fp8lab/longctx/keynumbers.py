"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, fmt_number, pair, pair_of


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    s = dict(s or {})
    if rows is not None:
        return _rows_04(rows, s)
    return _from_summary(s)


def _rows_04(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [
        (
            "longest context the engine holds, auto → fp8",
            pair_of(rows, "auto", "fp8", metric="longest_context", setting="engine blocks"),
        ),
        # the KV budget is a parameter of the run, not a measured number: no row holds it (only the formula rows'
        # setting names it, a string the index does not parse), so it stays a summary key
        ("KV budget", None if s.get("kv_cache_gib") is None else f"{fmt_number(s.get('kv_cache_gib'))} GiB"),
    ]
    # the claims' verdicts are words, not numbers: rows carry numbers only, so they stay summary keys
    return out + _claims_04(s)


#: Study 04's claims (summary key ``claim.<name>``: its verdict's label) as the index names them.
_CLAIMS_04: Mapping[str, str] = {
    "claim.gains_grow": "claim: FP8's gains grow with context",
    "claim.oom": "claim: bf16 runs out of memory first",
    "claim.block256": "claim: block size 256 beats 16 at the longest length",
    "claim.silent": "claim: silent quality loss along the context",
    "claim.random_tokens": "random tokens vs real text",
}


def _claims_04(s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """Study 04's claims' labels, from its summary (a verdict is a word; rows carry numbers only)."""
    return [
        (_CLAIMS_04.get(k, k.removeprefix("claim.")), str(v))
        for k, v in s.items()
        if k.startswith("claim.") and isinstance(v, str)
    ]


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    rows: KeyNumbers = []
    rows += [
        (
            "longest context the engine holds, auto → fp8",
            pair(s, "auto.longest_engine", "fp8.longest_engine", "tokens"),
        ),
        ("KV budget", None if s.get("kv_cache_gib") is None else f"{fmt_number(s.get('kv_cache_gib'))} GiB"),
    ]
    rows += _claims_04(s)
    return rows
