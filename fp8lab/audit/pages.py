"""The studies the audit reads, each named by its report page's name without the study number (``decode_speed``
for ``06_decode_speed.summary.json``): the audit finds a study's page in a report folder by that name, and the
number it shows readers (``decode speed (06)``, a link's ``h200 06``) is the one the page it found carries. A study
renumbered (its page written as ``16_decode_speed``) is still found, and shown as 16; nothing here knows a number.

Where a report has no page of a study (a profile that does not run it), the number a message about it shows is
the one the report's index (``summary.json``) gives that study's page, else its notebook's (``notebooks/*_<name>.ipynb``).

Standard library and :mod:`fp8lab.paths` only: the audit may not import the study packages or their registry
(:mod:`fp8lab.studies`; the layers are in pyproject.toml)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from fp8lab.paths import NOTEBOOKS_DIR

#: The studies whose records the audit reads, by their pages' names.
KV_MEMORY = "kv_memory_estimation"
SERVING = "kv_dtype_auto_vs_fp8"
CALIBRATION = "calibration_32_tokens"
QUALITY = "quality_token_match"
LONG_CONTEXT = "long_context_ramp_128k"
DECODE = "decode_speed"
PREFIX = "prefix_cache"
DTYPE_MATRIX = "kv_dtype_matrix"

#: What each study is, in messages: ``"decode speed"`` (:func:`label` adds its number).
WHAT: Mapping[str, str] = {
    KV_MEMORY: "KV memory",
    SERVING: "serving",
    CALIBRATION: "calibration",
    QUALITY: "quality",
    LONG_CONTEXT: "long context",
    DECODE: "decode speed",
    PREFIX: "prefix cache",
    DTYPE_MATRIX: "KV dtype matrix",
}


def page_number(stem: str) -> str | None:
    """The study number a page's stem starts with (``06_decode_speed`` -> ``06``), or None (no number)."""
    head, sep, _ = stem.partition("_")
    return head if sep and head.isdigit() else None


def page_name(stem: str) -> str:
    """A page's name without its number (``06_decode_speed`` -> ``decode_speed``); a name without one is itself."""
    return stem.partition("_")[2] if page_number(stem) else stem


def check(study: str) -> str:
    """``study`` if it names a study: a name of :data:`WHAT` or a whole page stem (``06_decode_speed``); a bare
    number or an unknown name raises :class:`KeyError` (a misspelt study would otherwise read as one not run)."""
    if page_number(study) is None and study not in WHAT:
        raise KeyError(f"study {study!r}: the audit names a study by its page's name ({' | '.join(WHAT)}) or stem")
    return study


def find(stems: Iterable[str], study: str) -> str | None:
    """The first (sorted) of ``stems`` that is the page of ``study`` (its name, or a whole page stem: any of
    ``stems`` names itself), or None."""
    stems = sorted(stems)
    if study in stems:
        return study
    check(study)
    return next((s for s in stems if page_name(s) == study), None)


@functools.cache
def notebook_stem(study: str) -> str | None:
    """The stem of ``study``'s notebook (``notebooks/NN_<name>.ipynb``), or None when there is none."""
    return find((p.stem for p in NOTEBOOKS_DIR.glob(f"*_{page_name(study)}.ipynb")), page_name(study))


def number(study: str, *stems: Iterable[str]) -> str | None:
    """The number ``study``'s page shows: that of its page among the first of ``stems`` (a report's summaries, then
    its index's entries, ...) that has one, else that of its notebook; None when nothing names it. A whole page
    stem (one of ``stems``, or a numbered one) shows its own number."""
    groups = [list(g) for g in stems]
    if page_number(study) or any(study in g for g in groups):
        return page_number(study)
    for group in (*groups, [notebook_stem(study) or ""]):
        stem = find(group, study)
        if stem is not None and page_number(stem):
            return page_number(stem)
    return None


def label(study: str, num: str | None) -> str:
    """``decode speed (06)``: what a study is, with the number ``num`` its page shows (none when None)."""
    what = WHAT.get(page_name(study), page_name(study))
    return f"{what} ({num})" if num else what
