"""Study 03's numerics: the model's real K/V (and Q) round-tripped through each FP8 format and rounding
(:func:`roundtrip_table`), the error that puts on attention outputs (:func:`attention_error_table`) and the round
trip each KV config's engine applies (:func:`engine_roundtrip`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.quality.spec import KVConfig
from fp8lab.specs import (
    SpecError,
)


def _scale_for(name: Any, x: Any, fmt: Any, layer: int, tensor: str, set_scales: Mapping | None) -> Any:
    """A round trip's scale: a number, ``amax`` (this tensor's max |x| / format max, per layer; the
    best per-tensor scale for this data), or a scale set's per-layer (per-head) k/v scale."""
    if set_scales is not None:
        k, v = set_scales[layer]
        s = k if tensor == "K" else v
        return s.view(1, -1, 1) if s.numel() > 1 else float(s)
    if name == "amax":
        return max(float(x.abs().max()), 1e-12) / fmt.max
    if isinstance(name, (int, float)) and not isinstance(name, bool) and name > 0:
        return float(name)
    raise SpecError("roundtrip_table", "scales", name, "positive numbers or 'amax'")


def roundtrip_table(
    capture: Any,
    formats: Sequence[str] = ("e4m3", "e5m2"),
    roundings: Sequence[str] = ("rne", "rtz"),
    scales: Sequence[Any] = (1.0, "amax"),
    scale_sets: Mapping[str, str] | None = None,
    tensors: Sequence[str] = ("K", "V", "Q"),
) -> pd.DataFrame:
    """Round-trip the captured tensors through every format x rounding x scale: one row per
    (layer, tensor, format, rounding, scale) with :func:`fp8formats.error_stats` columns plus
    ``sq_err``/``sq_norm`` (for pooling over layers) and ``rtz_rne_differ`` (share of values where the
    two roundings store different numbers). ``scale_sets``: ``{label: model folder}``; their k/v
    scales are used for K and V (Q has none: skipped).
    """
    import torch

    from fp8lab import fp8formats as ff
    from fp8lab.kvcapture import read_kv_scales

    sets = {lab: read_kv_scales(p) for lab, p in (scale_sets or {}).items()}
    rows = []
    for tensor in tensors:
        if tensor == "Q" and not capture.queries:
            continue
        for layer in range(capture.num_layers):
            x = capture.tensor(tensor, layer).float()
            for fname in formats:
                fmt = ff.get_format(fname)
                choices = [(str(s), s, None) for s in scales] + [(lab, None, sc) for lab, sc in sets.items()]
                for sname, s, set_scales in choices:
                    if set_scales is not None and tensor == "Q":
                        continue
                    scale = _scale_for(s, x, fmt, layer, tensor, set_scales)
                    enc = {}
                    for rnd in roundings:
                        enc[rnd] = ff.encode(x, fmt, rnd, scale)
                        y = enc[rnd] * torch.as_tensor(scale, dtype=torch.float32)
                        st = ff.error_stats(x, y, fmt, scale)
                        d = (y - x).double()
                        rows.append(
                            {
                                "layer": layer,
                                "tensor": tensor,
                                "format": fname,
                                "rounding": rnd,
                                "scale": sname,
                                "scale_value": float(torch.as_tensor(scale).float().mean()),
                                **st,
                                "sq_err": float((d * d).sum()),
                                "sq_norm": float((x.double() ** 2).sum()),
                            }
                        )
                    if "rne" in enc and "rtz" in enc:
                        frac = float((enc["rne"] != enc["rtz"]).float().mean())
                        for r in rows[-len(roundings) :]:
                            r["rtz_rne_differ"] = frac
    return pd.DataFrame(rows)


def roundtrip_summary(rt: pd.DataFrame) -> pd.DataFrame:
    """Pooled over layers: ``rel_err = sqrt(Σ sq_err / Σ sq_norm)``, mean ``mag_bias``, max ``sat_frac``,
    mean ``zero_frac``; one row per (tensor, format, rounding, scale)."""
    keys = ["tensor", "format", "rounding", "scale"]
    g = rt.groupby(keys, sort=False)
    out = pd.DataFrame(
        {
            "rel_err": np.sqrt(g.sq_err.sum() / g.sq_norm.sum()),
            "mag_bias": g.mag_bias.mean(),
            "zero_frac": g.zero_frac.mean(),
            "sat_frac": g.sat_frac.max(),
            "amax": g.amax.max(),
        }
    )
    if "rtz_rne_differ" in rt:
        out["rtz_rne_differ"] = g.rtz_rne_differ.mean()
    return out.reset_index()


def capture_prompts(prompts: pd.DataFrame, n: int) -> list[tuple[int, ...]]:
    """``n`` prompts' token ids for a K/V capture, taken round-robin over the categories (file order)."""
    groups = [list(g.token_ids) for _, g in prompts.groupby("category", sort=False)]
    out: list[tuple[int, ...]] = []
    i = 0
    while len(out) < n and any(i < len(g) for g in groups):
        out.extend(g[i] for g in groups if i < len(g))
        i += 1
    return out[:n]


def roundtrip_points(
    capture: Any,
    layer: int = 0,
    tensor: str = "K",
    formats: Sequence[str] = ("e4m3", "e5m2"),
    roundings: Sequence[str] = ("rne", "rtz"),
    scale: float = 1.0,
    n: int = 4000,
    seed: int = 0,
) -> pd.DataFrame:
    """A seeded sample of ``n`` values of one captured tensor and their round-trip error, long format:
    ``format, rounding, x`` (true value), ``err`` (stored minus true), for :func:`fp8lab.quality.plots.roundtrip_points`."""
    import torch

    from fp8lab import fp8formats as ff

    x = capture.tensor(tensor, layer).float().reshape(-1)
    idx = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))[:n]
    x = x[idx]
    frames = []
    for f in formats:
        for r in roundings:
            y = ff.roundtrip(x, f, r, scale)
            frames.append(pd.DataFrame({"format": f, "rounding": r, "x": x.numpy(), "err": (y - x).numpy()}))
    return pd.concat(frames, ignore_index=True)


def causal_attention(q: Any, k: Any, v: Any, scale: float) -> tuple[Any, Any]:
    """Causal GQA attention in float32: q ``[T, H, D]``, k/v ``[T, H_kv, D]`` -> (out ``[T, H, D]``,
    probs ``[H, T, T]``). Query head h reads KV head ``h // (H / H_kv)`` (transformers' repeat_kv)."""
    import torch

    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.einsum("thd,shd->hts", q, kk) * scale
    t = q.shape[0]
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hts,shd->thd", p, vv), p


def attention_error_table(
    capture: Any,
    formats: Sequence[str] = ("e4m3",),
    roundings: Sequence[str] = ("rne", "rtz"),
    quantize_q: Sequence[bool] = (False, True),
    scale: float = 1.0,
) -> pd.DataFrame:
    """What the round trip does to attention itself, layer by layer, on the captured Q/K/V.

    One row per (format, rounding, quantize_q, layer): ``out_rel_err`` = ||O_fp8 - O|| / ||O|| of the
    attention outputs (before o_proj), ``prob_tv`` = mean total-variation distance between the
    attention distributions of each query (0..1). ``quantize_q`` adds a round trip of Q through the
    same format (FA3 on Hopper does this; CPU does not: vllm-notes section 6).
    """
    from fp8lab import fp8formats as ff

    if not capture.queries:
        raise SpecError("attention_error_table", "capture", "no queries", "a capture made with with_queries=True")
    sm = capture.head_dim**-0.5
    bounds = np.cumsum([0] + list(capture.seq_lens))
    split = lambda t: [t[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]  # noqa: E731
    rows = []
    for layer in range(capture.num_layers):
        q_all, k_all, v_all = (capture.tensor(n, layer).float() for n in ("Q", "K", "V"))
        refs = [causal_attention(q, k, v, sm) for q, k, v in zip(split(q_all), split(k_all), split(v_all), strict=True)]
        for fname in formats:
            for rnd in roundings:
                kq, vq = split(ff.roundtrip(k_all, fname, rnd, scale)), split(ff.roundtrip(v_all, fname, rnd, scale))
                qs = {False: split(q_all), True: split(ff.roundtrip(q_all, fname, rnd, scale))}
                for qq in quantize_q:
                    num = den = tv = n = 0.0
                    for q, k, v, (o_ref, p_ref) in zip(qs[qq], kq, vq, refs, strict=True):
                        o, p = causal_attention(q, k, v, sm)
                        num += float(((o - o_ref) ** 2).sum())
                        den += float((o_ref**2).sum())
                        tv += float(0.5 * (p - p_ref).abs().sum(-1).sum())
                        n += p.shape[0] * p.shape[1]
                    rows.append(
                        {
                            "format": fname,
                            "rounding": rnd,
                            "quantize_q": qq,
                            "layer": layer,
                            "out_rel_err": math.sqrt(num / den) if den else float("nan"),
                            "prob_tv": tv / n,
                        }
                    )
    return pd.DataFrame(rows)


def engine_roundtrip(
    rt_summary: pd.DataFrame, configs: Sequence[KVConfig], rounding: str, quantize_q: bool = False
) -> pd.DataFrame:
    """The round-trip rows that match what each KV config's engine does to K and V: its format
    (``fp8``/``fp8_e4m3`` -> e4m3, ``fp8_e5m2`` -> e5m2), the engine's ``rounding`` and its scale
    (1.0 without a scale set: vLLM's default; a scale set's own scales otherwise); with
    ``quantize_q`` (Hopper FA3) also Q's round trip at scale 1.0 (vLLM's uncalibrated q_scale)."""
    from fp8lab.engine.fp8emu import configured_label
    from fp8lab.fp8formats import KV_DTYPE_FORMAT

    rows = []
    for c in configs:
        if c.kv_cache_dtype not in KV_DTYPE_FORMAT:
            continue
        own = configured_label(c.label)  # an emulated config rounds K and V as its native twin would
        scale = "1.0" if not own.startswith("fp8+") else own
        fmt = (rt_summary.format == KV_DTYPE_FORMAT[c.kv_cache_dtype]) & (rt_summary.rounding == rounding)
        sel = rt_summary[
            fmt
            & (
                ((rt_summary.scale == scale) & rt_summary.tensor.isin(["K", "V"]))
                | ((rt_summary.scale == "1.0") & (rt_summary.tensor == "Q") & quantize_q)
            )
        ]
        for _, r in sel.iterrows():
            rows.append(
                {
                    "label": c.label,
                    "tensor": r.tensor,
                    "format": r.format,
                    "rounding": rounding,
                    "scale": r.scale,
                    "rel_err": r.rel_err,
                    "mag_bias": r.mag_bias,
                }
            )
    return pd.DataFrame(rows)
