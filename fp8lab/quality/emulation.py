"""Study 03's check of the FP8 emulation against the native kernel (where a device has both): the teacher-forced
phase of each native FP8 configuration again on an emulated engine (:func:`fp8lab.engine.results.run_emulated`),
compared position by position (:func:`compare_with_native`), in a sentence (:func:`comparison_sentence`) and as
summary values (:func:`summary_values`). The plugin itself is :mod:`fp8lab.engine.fp8emu`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fp8lab.engine.capability import kv_support
from fp8lab.engine.results import run_emulated
from fp8lab.scoring import sequence_logprobs


def teacher_vectors(records: Any) -> tuple[Any, Any]:
    """(top-1 token id, logprob of the actual token) at every scored position (through the cache or one pass:
    :func:`fp8lab.scoring.sequence_logprobs`), prompts in tag order."""
    top1, lp = [], []
    for tag in sorted(records.index):
        lps, ids, _ = sequence_logprobs(records.loc[tag])
        for x, i in zip(lps[1:], ids[1:], strict=True):
            if x == x:  # scored here
                top1.append(i[0] if len(i) else -1)
                lp.append(x)
    return np.asarray(top1), np.asarray(lp, dtype=float)


def compare_with_native(runs: Any, study: str = "03_quality") -> Any:
    """Where both exist (native FP8 kernel and the emulation): for each native FP8 configuration of a Study 03
    run (:class:`fp8lab.quality.QualityRuns`, default scales), the teacher-forced phase again on an emulated
    engine, compared position by position with the native run: ``positions``, ``top1_agreement`` (share of
    positions whose argmax tokens agree), ``max_abs_dlogprob`` and ``mean_abs_dlogprob`` (of the actual
    tokens, nats), and ``native_vs_auto_max_abs_dlogprob`` for scale. Empty where either is missing."""
    rows = []
    teacher = [p for p in runs.phases if p.name == "teacher"]
    for cfg in runs.configs:
        if not cfg.kv_cache_dtype.startswith("fp8") or cfg.model != runs.spec.model or not teacher:
            continue
        sup = kv_support(cfg.kv_cache_dtype, cfg.model)
        if not (sup.native and sup.emulated) or not runs.results[cfg.label].ok:
            continue
        emu = run_emulated(runs.spec.engine_spec(cfg), teacher, study=study)
        row = {"label": cfg.label, "kv_cache_dtype": cfg.kv_cache_dtype, "emulated_status": emu.status}
        if emu.ok:
            t_n, lp_n = teacher_vectors(runs.records(cfg.label, "teacher"))
            t_e, lp_e = teacher_vectors(emu.records[emu.records.phase == "teacher"].set_index("tag"))
            _, lp_a = teacher_vectors(runs.records("auto", "teacher"))
            d = np.abs(lp_e - lp_n)
            row.update(
                positions=int(len(d)),
                top1_agreement=float((t_e == t_n).mean()),
                max_abs_dlogprob=float(np.nanmax(d)),
                mean_abs_dlogprob=float(np.nanmean(d)),
                native_vs_auto_max_abs_dlogprob=float(np.nanmax(np.abs(lp_n - lp_a))),
            )
        rows.append(row)
    return pd.DataFrame(rows)


def comparison_sentence(cmp: Any) -> str:
    """One sentence per compared dtype, or why nothing was compared."""
    if cmp is None or len(cmp) == 0:
        return (
            "Emulated vs native FP8: not compared here (it needs both the native FP8 KV kernel and the "
            "emulation on one device)."
        )
    out = []
    for r in cmp.itertuples():
        if getattr(r, "emulated_status", "ok") != "ok" or not hasattr(r, "top1_agreement"):
            out.append(f"Emulated `{r.label}` did not run ({r.emulated_status}).")
            continue
        out.append(
            f"Emulated vs native `{r.label}` on the same teacher-forced prompts: top-1 agreement "
            f"{r.top1_agreement:.4f} over {r.positions} positions, max |Δlogprob| {r.max_abs_dlogprob:.3g} nats "
            f"(mean {r.mean_abs_dlogprob:.2g}; native vs auto: max {r.native_vs_auto_max_abs_dlogprob:.3g})."
        )
    return " ".join(out)


def summary_values(cmp: Any) -> dict[str, Any]:
    """``emulation_vs_native.<label>.<metric>`` for a notebook's summary, plus the sentence."""
    out: dict[str, Any] = {"emulation_vs_native": comparison_sentence(cmp)}
    for r in [] if cmp is None else cmp.to_dict("records"):
        for k in (
            "positions",
            "top1_agreement",
            "max_abs_dlogprob",
            "mean_abs_dlogprob",
            "native_vs_auto_max_abs_dlogprob",
        ):
            if k in r and r[k] == r[k]:
                out[f"emulation_vs_native.{r['label']}.{k}"] = r[k]
    return out
