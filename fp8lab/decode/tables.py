"""Study 06's tables from a stored :class:`~fp8lab.decode.run.DecodeRun` (pure functions of its rows): per point
the paired fp8/auto ratio (:func:`point_table`), per dtype and batch the fitted line (:func:`fit_table`), per batch
the crossover context (:func:`crossover_table`), the bandwidth bound (:func:`roofline_table`), the engines' KV
blocks against the formula (:func:`capacity_table`), and the published fits shown beside them (:data:`ANCHORS`)."""

from __future__ import annotations

import math
from typing import Any

from fp8lab import kvmath, stats
from fp8lab.decode import replication
from fp8lab.decode.run import DecodeRun
from fp8lab.decode.spec import DecodeSpec

#: Published step-time fits, shown beside the measurement with their setting.
ANCHORS: tuple[dict[str, Any], ...] = (
    {
        "source": "vLLM blog, FP8 KV cache study (2026-04), as quoted in fp8lab issue 15",
        "gpu": "H100",
        "model": "Llama-3.1-8B",
        "vllm": "not stated",
        "batch": 1,
        "slope_auto_ms_per_token": 4.37e-5,
        "slope_fp8_ms_per_token": 2.37e-5,
        "break_even_tokens": 7010,
    },
)


def primary_arm(run: DecodeRun) -> str:
    """The arm the headline and the audit read: ``solo`` (one engine at vLLM's defaults, as a user runs it) where
    measured, else ``colocated``."""
    return "solo" if "solo" in (run.spec.get("arms") or ()) else "colocated"


def layers(run: DecodeRun) -> int:
    """The model's layer count (the fixed cost per layer divides by it)."""
    lay = kvmath.load_layout(DecodeSpec(**run.spec).engine_spec(run.spec["kv_dtypes"][0]).model)
    return int(lay.config["num_hidden_layers"])


def point_table(run: DecodeRun, base: str = "auto", other: str = "fp8", arm: str | None = None) -> Any:
    """A replicated run (issue 35): :func:`fp8lab.decode.replication.point_table` of ``arm`` (default
    :func:`primary_arm`), intervals over engine pairs. A run with one engine per dtype: one row per measured (batch, context_len): each dtype's mean step (ms), ``ratio`` = other/base with its
    95% t interval over the pairs, ``n``, ``self_noise_pct`` (the larger of the two dtypes' same-config
    noise), ``beyond_noise`` and ``full_batch`` (every measurement had the whole batch decoding)."""
    import pandas as pd

    m = run.measured()
    rows = []
    if m.empty or not {base, other} <= set(m.kv_dtype):
        return pd.DataFrame(rows)
    if run.replicated:
        return replication.point_table(m, arm or primary_arm(run), base, other)
    for (b, c), g in m.groupby(["batch", "context_len"]):
        w = g.pivot_table(index="rep", columns="kv_dtype", values="step_ms").dropna()
        if base not in w or other not in w or len(w) < 2:
            continue
        r = stats.paired_ratio(w[base], w[other])
        noise = max(stats.self_noise(w[base]), stats.self_noise(w[other]))
        beyond = bool(not r.contains(1.0) and abs(r.estimate - 1) * 100 > noise)
        rows.append(
            {
                "batch": b,
                "context_len": c,
                f"{base}_step_ms": float(w[base].mean()),
                f"{other}_step_ms": float(w[other].mean()),
                "ratio": r.estimate,
                "ratio_ci_low": r.lo,
                "ratio_ci_high": r.hi,
                "n": r.n,
                "ci_half_width_pct": stats.detectable_pct(r),
                "self_noise_pct": noise,
                "beyond_noise": beyond,
                "full_batch": bool(g.full_batch.all()),
            }
        )
    return pd.DataFrame(rows)


def fit_table(run: DecodeRun) -> Any:
    """Per (kv_dtype, batch): ``step_ms = a_ms + b_ms_per_token x context`` over the points' mean steps, with
    95% t intervals; ``b_ms_per_ktoken`` is the slope per 1,000 tokens. A replicated run: per arm,
    :func:`fp8lab.decode.replication.fit_table` (lines per engine, intervals over engines; fixed cost per layer; the
    fp8 - auto difference)."""
    import pandas as pd

    m = run.measured()
    rows = []
    if m.empty:
        return pd.DataFrame(rows)
    if run.replicated:
        return replication.fit_table(m, layers(run))
    means = m.groupby(["kv_dtype", "batch", "context_len"]).step_ms.mean().reset_index()
    for (d, b), g in means.groupby(["kv_dtype", "batch"]):
        if g.context_len.nunique() < 3:
            continue
        f = stats.ols(g.context_len, g.step_ms)
        (alo, ahi), (blo, bhi) = f.interval("a"), f.interval("b")
        rows.append(
            {
                "kv_dtype": d,
                "batch": b,
                "a_ms": f.a,
                "a_ms_ci_low": alo,
                "a_ms_ci_high": ahi,
                "b_ms_per_token": f.b,
                "b_ms_per_token_ci_low": blo,
                "b_ms_per_token_ci_high": bhi,
                "b_ms_per_ktoken": f.b * 1e3,
                "n_points": f.n,
            }
        )
    return pd.DataFrame(rows)


def crossover_table(run: DecodeRun, base: str = "auto", other: str = "fp8") -> Any:
    """Per batch: the context where ``other`` becomes faster than ``base``, from the line fitted to the
    paired difference of mean steps (other - base, ms) against context; Fieller's 95% interval.

    ``status``: ``none`` when the fitted difference does not fall with context (no context from which other
    becomes faster, whatever its sign at the grid's ends: ``diff_at_min_ms``, ``diff_at_max_ms``),
    ``below_grid`` when it crosses before the smallest measured context (other is faster throughout),
    ``above_grid`` past the largest (an extrapolation), else ``in_grid``. A replicated run: per arm and batch,
    :func:`fp8lab.decode.replication.crossover_table` (Fieller over engine pairs, stated within the grid)."""
    import pandas as pd

    if run.replicated:
        m = run.measured()
        parts = [replication.crossover_table(m, a, base, other) for a in run.spec["arms"]] if len(m) else []
        parts = [p for p in parts if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    pts = point_table(run, base, other)
    rows = []
    if pts.empty:
        return pd.DataFrame(rows)
    for b, g in pts.groupby("batch"):
        if len(g) < 3:
            continue
        f = stats.ols(g.context_len, g[f"{other}_step_ms"] - g[f"{base}_step_ms"])
        root = stats.fieller_root(f)
        lo_ctx, hi_ctx = float(g.context_len.min()), float(g.context_len.max())
        # a slope below rounding (parallel lines: ~1e-16 of the steps over the grid) is zero, not a far-off root
        flat = abs(f.b) * (hi_ctx - lo_ctx) <= 1e-9 * float(
            g[[f"{base}_step_ms", f"{other}_step_ms"]].abs().max().max()
        )
        if f.b >= 0 or flat:  # other's slope is the larger (or equal): it never becomes faster as the context grows
            status, x = "none", None
        else:
            x = root.x
            status = "below_grid" if x < lo_ctx else "above_grid" if x > hi_ctx else "in_grid"
        rows.append(
            {
                "batch": b,
                "context_len": x,
                "ci_low": root.lo if root.bounded and x is not None else None,
                "ci_high": root.hi if root.bounded and x is not None else None,
                "status": status,
                "diff_at_min_ms": f.predict(lo_ctx),
                "diff_at_max_ms": f.predict(hi_ctx),
                "diff_slope_ms_per_ktoken": f.b * 1e3,
                "n_points": f.n,
            }
        )
    return pd.DataFrame(rows)


def arm_table(run: DecodeRun, base: str = "auto", other: str = "fp8") -> Any:
    """Co-located against solo: :func:`fp8lab.decode.replication.arm_effect` (empty unless both arms ran)."""
    import pandas as pd

    m = run.measured()
    return replication.arm_effect(m, layers(run), base, other) if run.replicated and len(m) else pd.DataFrame()


def roofline_table(run: DecodeRun, bandwidth_gbs: float) -> Any:
    """Per (kv_dtype, batch, context_len): the bandwidth bound on one step (weights + the batch's KV at the
    measured window's mean context, :func:`fp8lab.roofline.itl_lower_bound`) and ``fraction`` = bound /
    measured mean step (1 would be a step at full memory bandwidth)."""
    import pandas as pd

    from fp8lab import roofline

    m = run.measured()
    if m.empty:
        return pd.DataFrame()
    m = m[m.arm == primary_arm(run)]
    spec = run.spec
    lay = kvmath.load_layout(DecodeSpec(**spec).engine_spec(spec["kv_dtypes"][0]).model)
    tp = spec["tensor_parallel_size"]
    w = roofline.weight_bytes_per_step(lay, "auto", tp)
    rows = []
    for (d, b, c), g in m.groupby(["kv_dtype", "batch", "context_len"]):
        k = kvmath.kv_bytes_per_token(lay, d, tp)
        ctx_mean = c + spec["decode_tokens"] / 2
        bound = roofline.itl_lower_bound(w, b * ctx_mean, k, bandwidth_gbs * 1e9) * 1e3
        rows.append(
            {
                "kv_dtype": d,
                "batch": b,
                "context_len": c,
                "step_ms": g.step_ms.mean(),
                "bound_ms": bound,
                "fraction": bound / g.step_ms.mean(),
            }
        )
    return pd.DataFrame(rows)


def capacity_table(run: DecodeRun) -> Any:
    """Each engine's KV blocks beside the formula's prediction for its budget and block size (per rank)."""
    import pandas as pd

    spec = run.spec
    if spec.get("kv_cache_gib") is None:
        return pd.DataFrame()
    lay = kvmath.load_layout(DecodeSpec(**spec).engine_spec(spec["kv_dtypes"][0]).model)
    rows = []
    engines = run.engines
    if run.starts:  # a replicated run: the co-located arm's engines (the spec's KV budget); all must agree
        engines = {}
        for e in run.starts.values():
            if e.get("arm") == "colocated" and e.get("status") == "ok":
                first = engines.setdefault(e["kv_dtype"], {**e, "all_blocks": set()})
                first["all_blocks"].add(e["num_blocks"])
    for d, e in engines.items():
        if e.get("status") != "ok":
            continue
        pred = kvmath.predict_num_blocks(
            lay, int(spec["kv_cache_gib"] * 2**30), e["block_size"], d, spec["tensor_parallel_size"]
        )
        mem = e.get("mem_per_device_after_start_bytes") or []
        rows.append(
            {
                "kv_dtype": d,
                "num_blocks": e["num_blocks"],
                "predicted_blocks": pred,
                "exact": e["num_blocks"] == pred and e.get("all_blocks", {pred}) == {pred},
                "block_size": e["block_size"],
                "attention_backend": ",".join(e.get("attention_backend") or []) or None,
                "cuda_graphs": e.get("cuda_graphs"),
                "engine_start_s": e.get("engine_start_s"),
                "mem_gib_per_device": [round(x / 2**30, 2) for x in mem],
            }
        )
    return pd.DataFrame(rows)


def table_records(table: Any) -> list[dict[str, Any]]:
    """A table's rows as dicts, a missing value (NaN: pandas' form of a None among numbers) as ``None``."""
    return (
        [
            {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
            for r in table.to_dict("records")
        ]
        if table is not None and not table.empty
        else []
    )
