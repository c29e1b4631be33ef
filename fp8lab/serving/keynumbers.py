"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, ci, dtypes_of, fmt_number, fmt_row, get, pair, pair_of, pick


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    s = dict(s or {})
    if rows is not None:
        return _rows_01(rows, s)
    return _from_summary(s)


def _rows_01(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    base, cand = dtypes_of(rows)
    closed = [r["concurrency"] for r in rows if r["metric"] == "output_tok_s" and r["setting"] == "closed loop"]
    c = max((x for x in closed if x is not None), default=None)
    head = pick(rows, metric="output_tok_s", setting="closed loop", concurrency=c, kv_dtype=cand, baseline=base)
    label = ""
    if head is not None and head["ci_low"] is not None:  # stats.delta_label: throughput, higher is better
        label = (
            ": within noise"
            if head["ci_low"] <= 0 <= head["ci_high"]
            else (": better" if head["value"] > 0 else ": worse")
        )
    trials = pick(rows, metric="output_tok_s", setting="closed loop", concurrency=c, kv_dtype=base, baseline=None)
    return [
        (f"KV capacity, {base} → {cand}", pair_of(rows, base, cand, metric="kv_capacity_tokens", setting="engine")),
        (
            f"{cand} vs {base} output throughput at concurrency {fmt_number(c)}",
            None if head is None else fmt_row(head) + label,
        ),
        # the rows carry each change's interval and smallest detectable change, not the spread between trials of
        # one config: the noise floor stays a summary key
        (
            "noise floor (same config between trials)",
            None if s.get("noise_floor_pct") is None else f"{fmt_number(s.get('noise_floor_pct'), 2)} %",
        ),
        (
            f"ITL p50, {base} → {cand}",
            pair_of(rows, base, cand, metric="itl_p50_pooled", setting="closed loop", concurrency=c),
        ),
        (
            f"peak device memory, {base} → {cand}",
            pair_of(rows, base, cand, 4, metric="mem_peak_gib", setting="engine"),
        ),
        ("trials", None if trials is None else fmt_number(trials["n"])),
    ]


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    rows: KeyNumbers = []
    rows += [
        ("KV capacity, auto → fp8", pair(s, "capacity_tokens_auto", "capacity_tokens_fp8", "tokens")),
        (
            "fp8 vs auto output throughput at concurrency " + fmt_number(s.get("headline_concurrency")),
            ci(s, "throughput_delta_pct", "throughput_delta_lo_pct", "throughput_delta_hi_pct", "%")
            + (
                f": {s['throughput_delta_label']}"
                if s.get("throughput_delta_label") and get(s, "throughput_delta_pct") is not None
                else ""
            )
            if get(s, "throughput_delta_pct") is not None
            else None,
        ),
        (
            "noise floor (same config between trials)",
            None if s.get("noise_floor_pct") is None else f"{fmt_number(s.get('noise_floor_pct'), 2)} %",
        ),
        ("ITL p50, auto → fp8", pair(s, "itl_p50_ms_auto", "itl_p50_ms_fp8", "ms")),
        ("peak device memory, auto → fp8", pair(s, "mem_peak_gib_auto", "mem_peak_gib_fp8", "GiB", 4)),
        ("trials", fmt_number(s.get("trials")) if s.get("trials") is not None else None),
    ]
    return rows
