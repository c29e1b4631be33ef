"""The study's key numbers on the index (``key_numbers``, :mod:`fp8lab.study`): from its typed rows by field, a
number whose row is missing left out (never looked up in the summary instead); only what rows cannot carry (a
verdict's word, a run parameter) from the flat summary; on a page rendered before rows existed, from the summary by
its keys. Moved from the report's index, which asks each study through :mod:`fp8lab.studies`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab.keynumbers import KeyNumbers, dtypes_of, first_scalars, fmt_number, fmt_row, pair_of, pick, summary_value


def key_numbers(s: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> KeyNumbers:
    """This study's key numbers for the index: from ``rows`` (its typed rows) where the page has them, else from its
    flat summary ``s``."""
    s = dict(s or {})
    if rows is not None:
        return _rows_07(rows, s)
    return _from_summary(s)


def _rows_07(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    base, cand = dtypes_of(rows)
    # the run's block size is a parameter (rows name it only inside their setting, which the index does not parse)
    out: list[tuple[str, str | None]] = [("block_size", summary_value(s, "block_size"))]
    for w in dict.fromkeys(r["subset"] for r in rows if r["metric"] == "prefix_knee_measured"):
        measured = pair_of(rows, base, cand, metric="prefix_knee_measured", subset=w)
        predicted = pair_of(rows, base, cand, metric="prefix_knee_predicted", subset=w)
        knee = measured if predicted is None else f"{measured} (the replay predicts {predicted})"
        out.append((f"{w}: most active conversations that keep their prefix hits, {base} → {cand}", knee))
        gains = [
            r
            for r in rows
            if r["metric"] == "prefix_hit_rate" and r["subset"] == w and r["baseline"] == base and r["kv_dtype"] == cand
        ]
        held = pick(rows, metric="prefix_knee_measured", subset=w, kv_dtype=base)
        inside = [abs(r["value"]) for r in gains if held is not None and r["concurrency"] <= held["value"]]
        if inside:  # where the baseline keeps its hits, fp8 should neither gain nor lose any
            out.append((f"{w}: largest |{cand} − {base}| hit rate while {base} holds", f"{fmt_number(max(inside))} pp"))
        if gains:
            g = max(gains, key=lambda r: r["value"])
            out.append((f"{w}: largest {cand} − {base} hit rate, at {g['concurrency']} active", fmt_row(g)))
    # the claim's verdict and its evidence are words, and the counter turns a check of the run's bookkeeping, not
    # a measured metric: rows carry none of them, so they stay summary keys (labelled as the index showed them)
    words = ("claim_evidence", "claim_verdict", "counter_turns", "counter_turns_complete")
    return out + [(k, summary_value(s, k)) for k in words]


def _from_summary(s: Mapping[str, Any]) -> KeyNumbers:
    return first_scalars(s)
