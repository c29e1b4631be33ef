"""Plot helpers for the notebooks (seaborn/matplotlib). Each takes a tidy DataFrame, draws one figure and
returns it; nothing here computes a number that is not in the DataFrame it is given.

fp8lab's one plot theme lives here: every ``plots*`` module draws through :func:`theme` and colours a kv dtype
with :func:`kv_color` / :func:`kv_palette`; a new plots module does the same, never its own ``set_theme``."""

from __future__ import annotations

from typing import Any

#: seaborn's theme for every fp8lab figure (:func:`theme`).
THEME: dict[str, str] = {"style": "whitegrid", "context": "notebook"}
#: Colour of a kv dtype (the baseline blue, fp8 orange/red); :data:`OTHER_COLOR` for anything else.
KV_PALETTE = {
    "auto": "#4C72B0",
    "bfloat16": "#4C72B0",
    "float16": "#4C72B0",
    "fp8": "#DD8452",
    "fp8_e4m3": "#DD8452",
    "fp8_e5m2": "#C44E52",
}
OTHER_COLOR = "#55A868"


def theme() -> tuple[Any, Any]:
    """``(pyplot, seaborn)`` with fp8lab's one plot theme (:data:`THEME`) applied: every ``plots*`` function calls
    this before it draws, so each figure draws in the theme whatever a notebook changed before it."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(**THEME)
    return plt, sns


def kv_color(kv_dtype: str) -> str:
    """The colour of one kv dtype (:data:`KV_PALETTE`; :data:`OTHER_COLOR` for one it does not name)."""
    return KV_PALETTE.get(kv_dtype, OTHER_COLOR)


def kv_palette(values: Any) -> dict[str, str]:
    """``{kv dtype: colour}`` for seaborn's ``palette=``, by :func:`kv_color`."""
    return {v: kv_color(v) for v in values}


__all__ = ["KV_PALETTE", "OTHER_COLOR", "THEME", "kv_color", "kv_palette", "theme"]
