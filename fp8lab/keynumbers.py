"""The key numbers of a report page, as the index shows them: a study's few numbers, each ``(label with its unit,
value as a reader reads it)``. The formatting every study's ``key_numbers`` (:mod:`fp8lab.study`) uses: numbers
rounded for a reader (:func:`fmt_number`), a typed row with its unit, interval and ``n`` (:func:`fmt_row`), pairs
``auto → fp8`` from rows (:func:`pair_of`) or a flat summary (:func:`pair`, :func:`ci`), and the fallback for a
study that gives none (:func:`first_rows`, :func:`first_scalars`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab import summary_table as st

#: What a study's ``key_numbers`` returns: (label with its unit, the value as text; None: left out).
KeyNumbers = list[tuple[str, str | None]]


def fmt_number(v: Any, digits: int = 3) -> str:
    """A number for a reader: ints with thousands separators, floats to ``digits`` significant digits (no
    ``1.3607525825500488``), ``None``/NaN as "n/a", booleans as yes/no."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        mag = math.floor(math.log10(abs(v)))
        if mag >= digits - 1:
            return f"{round(v):,}"
        return f"{v:.{max(digits - 1 - mag, 0)}f}"
    return str(v)


def get(s: dict[str, Any], key: str) -> Any:
    """``s[key]``, else a dotted path into nested dicts (``bytes_per_token.fp8``); ``None`` when absent."""
    if key in s:
        return s[key]
    cur: Any = s
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def pair(s: dict[str, Any], a: str, b: str, unit: str, digits: int = 3) -> str | None:
    va, vb = get(s, a), get(s, b)
    if va is None and vb is None:
        return None
    return f"{fmt_number(va, digits)} → {fmt_number(vb, digits)} {unit}".strip()


def ci(s: dict[str, Any], est: str, lo: str, hi: str, unit: str = "", digits: int = 3) -> str | None:
    if get(s, est) is None:
        return None
    u = f" {unit}" if unit else ""
    if get(s, lo) is None or get(s, hi) is None:
        return f"{fmt_number(get(s, est), digits)}{u}"
    return (
        f"{fmt_number(get(s, est), digits)}{u} (95% CI {fmt_number(get(s, lo), digits)} to "
        f"{fmt_number(get(s, hi), digits)})"
    )


# ---------------------------------------------------------------------------- key numbers from typed rows
#: How the index writes a row's unit after its number ("" for a plain figure, a fraction or a ratio).
UNIT_TEXT: Mapping[str, str] = {"1": "", "fraction": "", "ratio": "", "bytes": "B"}


def unit_text(row: Mapping[str, Any]) -> str:
    u = UNIT_TEXT.get(row["unit"], row["unit"])
    return f" {u}" if u else ""


def fmt_row(row: Mapping[str, Any], digits: int = 3) -> str:
    """A row's value for a reader: rounded (:func:`fmt_number`) with its unit; a change against a baseline in % or
    pp signed; with its 95% interval and ``n`` where the row has an interval:
    ``+13.2 % (95% CI +12.7 to +13.6, n = 5)``."""
    signed = row["baseline"] is not None and row["unit"] in ("%", "pp")

    def num(v: float) -> str:
        return ("+" if signed and v > 0 else "") + fmt_number(v, digits)

    text = num(row["value"]) + unit_text(row)
    if row["ci_low"] is not None:
        text += f" (95% CI {num(row['ci_low'])} to {num(row['ci_high'])}, n = {fmt_number(row['n'])})"
    return text


def pick(rows: Sequence[Mapping[str, Any]], **fields: Any) -> Mapping[str, Any] | None:
    """The one row with ``fields`` (:func:`fp8lab.summary_table.one`), or None when none or several have them."""
    try:
        return st.one(rows, **fields)
    except LookupError:
        return None


def row_pair(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, digits: int = 3) -> str | None:
    """Two rows' values ``a → b unit`` (the unit of either; "n/a" for a missing one); None when both are."""
    if a is None and b is None:
        return None
    unit = unit_text(a or b)  # type: ignore[arg-type]
    va, vb = (fmt_number(None if r is None else r["value"], digits) for r in (a, b))
    return f"{va} → {vb}{unit}"


def pair_of(rows: Sequence[Mapping[str, Any]], a: str, b: str, digits: int = 3, **fields: Any) -> str | None:
    """:func:`row_pair` of the rows with ``fields`` for kv dtypes ``a`` and ``b``, each its own figure."""
    return row_pair(
        pick(rows, kv_dtype=a, baseline=None, **fields), pick(rows, kv_dtype=b, baseline=None, **fields), digits
    )


def dtypes_of(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(baseline, candidate) kv dtypes of a study's change rows: ``fp8`` where it is a candidate, else the first
    one; ``("auto", "fp8")`` when the rows hold no change."""
    changes = [r for r in rows if r["baseline"] is not None]
    if not changes:
        return "auto", "fp8"
    cands = list(dict.fromkeys(r["kv_dtype"] for r in changes))
    cand = "fp8" if "fp8" in cands else cands[0]
    return next(r["baseline"] for r in changes if r["kv_dtype"] == cand), cand


def summary_value(s: Mapping[str, Any], key: str) -> str | None:
    """``s[key]`` for a reader (:func:`fmt_number`), None when absent: for what rows do not carry."""
    return None if s.get(key) is None else fmt_number(s[key])


def first_rows(rows: Sequence[Mapping[str, Any]]) -> KeyNumbers:
    """A study that gives no key numbers: its first six typed rows."""
    return [
        (
            f"{r['metric']}, {r['kv_dtype']}"
            + (f" vs {r['baseline']}" if r["baseline"] else "")
            + f" ({r['setting']})",
            fmt_row(r),
        )
        for r in rows[:6]
    ]


def first_scalars(s: Mapping[str, Any]) -> KeyNumbers:
    """A study that gives no key numbers, on a page without rows: its summary's first six scalars."""
    scalars = [(k, v) for k, v in sorted(s.items()) if isinstance(v, int | float | str) and not isinstance(v, bool)]
    return [(k, fmt_number(v)) for k, v in scalars[:6]]
