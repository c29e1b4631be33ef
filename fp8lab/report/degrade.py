"""What a study does on a device without the native FP8 KV kernel (:mod:`fp8lab.engine.capability`).

Studies whose question is the speed or the measured capacity of an FP8 KV cache (01 serving, 06 decode)
cannot be answered by emulation (an emulated cache is bf16-sized and the rounding costs time). There the
runner executes a reduced notebook (:func:`notebook_for`): the notebook's own introduction and parameters,
then one cell that says in one sentence what was not measured and why, prints ``fp8lab doctor``'s table,
gives the KV capacity the formula predicts for each dtype (marked ``predicted``, never measured) and
records that as the notebook's summary. Nothing is started that is bound to fail, and the notebook is
``ok``. The numerical studies (02, 03, 04) run their FP8 configurations emulated instead
(:mod:`fp8lab.engine.fp8emu`); 00 records its FP8 engine check as ``unsupported`` beside the formula.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fp8lab import kvmath, studies
from fp8lab.engine.capability import kv_support, report
from fp8lab.specs import resolve_model

DEFAULT_DTYPES = ("auto", "fp8")


def _dtypes(params: dict[str, Any]) -> list[str]:
    d = params.get("KV_DTYPES") or list(DEFAULT_DTYPES)
    return [str(x) for x in d]


def gate(notebook: str | Path, params: dict[str, Any]) -> str | None:
    """The one sentence saying what ``notebook`` will not measure here and why, or None when it runs in full."""
    study = studies.for_page(Path(notebook).stem)
    native_only = getattr(study, "NATIVE_ONLY", None)
    if not native_only:
        return None
    model = resolve_model(str(params["MODEL"])) if params.get("MODEL") else None
    missing = [d for d in _dtypes(params) if not kv_support(d, model).native]
    if not missing:
        return None
    reason = kv_support(missing[0], model).reason
    return (
        f"Not measured: the {native_only} of kv_cache_dtype {', '.join(missing)}, because {reason}; "
        "an emulated FP8 cache cannot stand in for speed or capacity, so this study ran no engine and the "
        "capacities below are the formula's prediction."
    )


def predicted_capacity(model: str, dtypes: list[str], kv_cache_gib: float | None, block_size: int | None) -> list[dict]:
    """Per dtype: the formula's blocks and tokens for a ``kv_cache_gib`` budget (CPU block size 128 by default),
    every row marked ``source = "predicted"``."""
    if kv_cache_gib is None:
        return []
    bs = int(block_size or 128)
    out = []
    for d in dtypes:
        try:
            n = kvmath.predict_num_blocks(model, int(kv_cache_gib * 2**30), bs, d)
        except Exception as exc:  # a config the formula does not cover: say so, keep going
            out.append({"kv_dtype": d, "source": "predicted", "error": f"{type(exc).__name__}: {exc}"})
            continue
        out.append(
            {
                "kv_dtype": d,
                "source": "predicted",
                "kv_cache_gib": kv_cache_gib,
                "block_size": bs,
                "num_blocks": n,
                "kv_capacity_tokens": n * bs,
            }
        )
    return out


def summary(notebook: str, params: dict[str, Any]) -> dict[str, Any]:
    """The summary a reduced notebook records: ``not_measured`` (the sentence), ``<dtype>.status``
    (``unsupported`` or ``not run``), ``<dtype>.predicted_*`` and the capability report."""
    model = resolve_model(str(params.get("MODEL", "")))
    dtypes = _dtypes(params)
    out: dict[str, Any] = {"not_measured": gate(notebook, params), "degraded": True, "capability": report(model)}
    for d in dtypes:
        sup = kv_support(d, model)
        out[f"{d}.status"] = "not run" if sup.native else "unsupported"
        if not sup.native:
            out[f"{d}.unsupported_reason"] = sup.reason
    for row in predicted_capacity(model, dtypes, params.get("KV_CACHE_GIB"), params.get("BLOCK_SIZE")):
        for k in ("num_blocks", "kv_capacity_tokens"):
            if k in row:
                out[f"{row['kv_dtype']}.predicted_{k}"] = row[k]
    return out


_CELL = """# Added by fp8lab.report.degrade: this device has no native FP8 KV kernel, so the study's engines were not started.
import pandas as pd
from IPython.display import Markdown, display

from fp8lab.engine import capability

from fp8lab.report import degrade

from fp8lab.report import run as report

_params = {k: v for k, v in globals().items() if k.isupper()}
NOT_MEASURED = degrade.summary({stem!r}, _params)
display(Markdown("**" + NOT_MEASURED["not_measured"] + "**"))
print(capability.format_report(NOT_MEASURED["capability"]))
display(pd.DataFrame(degrade.predicted_capacity(_params["MODEL"], [str(d) for d in _params.get("KV_DTYPES") or degrade.DEFAULT_DTYPES],
                                                _params.get("KV_CACHE_GIB"), _params.get("BLOCK_SIZE"))))
report.record_summary(NOT_MEASURED);
"""


def notebook_for(notebook: Path, params: dict[str, Any], work_dir: Path) -> Path:
    """``notebook`` itself, or, when :func:`gate` says the device cannot answer it, a reduced copy in
    ``work_dir`` (the cells up to the ``parameters`` cell, then the not-measured cell)."""
    if gate(notebook, params) is None:
        return notebook
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    keep = []
    for cell in nb.cells:
        keep.append(cell)
        if "parameters" in (cell.get("metadata", {}).get("tags") or []):
            break
    keep.append(
        nbformat.v4.new_markdown_cell(
            # the page's verdict (fp8lab.report.htmlexport opens the page with it, anchored #verdict, as the index links it)
            "## Verdict: not measured on this device\n\nThis device has no native FP8 KV kernel (`fp8lab doctor` says "
            "why). The rest of this study measures engines with an FP8 cache, so it was not run: no claim of this study "
            "is judged here; the sentence below says what is missing, and the table gives the formula's capacities "
            "(predicted, not measured)."
        )
    )
    keep.append(nbformat.v4.new_code_cell(_CELL.replace("{stem!r}", json.dumps(Path(notebook).stem))))
    nb.cells = keep
    work_dir.mkdir(parents=True, exist_ok=True)
    out = work_dir / Path(notebook).name
    nbformat.write(nb, str(out))
    return out


__all__ = ["gate", "notebook_for", "predicted_capacity", "summary"]
