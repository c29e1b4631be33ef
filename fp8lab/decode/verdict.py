"""Study 06's verdict in prose: the headline bullets (:func:`verdict`), every number from a
:func:`~fp8lab.decode.summary.summary`."""

from __future__ import annotations

from typing import Any


def verdict(s: dict[str, Any]) -> list[str]:
    """Headline bullets computed from a :func:`summary`."""
    out = []
    setting = (
        f"{s['model']} on {s['device']} (vLLM {s['vllm_version']}, "
        f"{'CUDA graphs' if s['cuda_graphs'] else 'no CUDA graphs (eager or CPU)'}, TP={s['tensor_parallel_size']}, "
        f"{'interleaved engines' if s['concurrent_engines'] else 'engines one after the other'})"
    )
    failed = s["engine_errors"]
    if failed:
        out.append(
            "Not measured: "
            + "; ".join(f"`{d}` ({e})" for d, e in failed.items())
            + ". The grid below has no fp8/auto comparison where an engine is missing."
        )
    pts = s["points"]
    if not pts:
        out.append(f"No point was measured by both dtypes in {setting}.")
        return out
    n = s["n_reps"]
    faster = [p for p in pts if p["beyond_noise"] and p["ratio"] < 1]
    slower = [p for p in pts if p["beyond_noise"] and p["ratio"] > 1]
    out.append(
        f"{len(pts)} grid points, {n} paired repetitions each, in {setting}. The smallest fp8/auto change "
        f"these runs resolve is about {s['min_detectable_pct']:.1f}% (median 95% CI half-width; "
        f"largest {s['max_ci_half_width_pct']:.1f}%)."
    )

    def where(ps: list[dict[str, Any]]) -> str:
        return ", ".join(f"B={p['batch']} L={p['context_len']:,} ({(p['ratio'] - 1) * 100:+.1f}%)" for p in ps)

    out.append(
        f"fp8 decodes faster beyond noise at {len(faster)} of {len(pts)} points"
        + (f": {where(faster)}" if faster else "")
        + "."
    )
    out.append(
        f"fp8 decodes slower beyond noise at {len(slower)} of {len(pts)} points"
        + (f": {where(slower)}" if slower else "")
        + "."
    )
    for c in s["crossovers"]:
        if c["status"] == "in_grid" or c["status"] == "above_grid":
            ci = f" [{c['ci_low']:,.0f}, {c['ci_high']:,.0f}]" if c["ci_low"] is not None else " (interval unbounded)"
            out.append(
                f"Batch {c['batch']}: fp8 becomes faster from about {c['context_len']:,.0f} tokens{ci}"
                + (" (past the grid: an extrapolation)" if c["status"] == "above_grid" else "")
                + "."
            )
        elif c["status"] == "below_grid":
            out.append(f"Batch {c['batch']}: fp8 is faster at every measured context by the fit.")
        elif (c.get("diff_at_max_ms") or 0) < 0:
            out.append(
                f"Batch {c['batch']}: fp8 is faster at every measured context by the fit, but its advantage "
                "does not grow with context: no crossover."
            )
        elif (c.get("diff_at_min_ms") or 0) < 0:
            out.append(
                f"Batch {c['batch']}: fp8 is faster at the shortest contexts only: the fitted fp8-auto difference "
                "grows with context and turns positive within the grid, so no crossover."
            )
        else:
            out.append(f"Batch {c['batch']}: the fitted fp8-auto difference does not fall with context: no crossover.")
    if s["roofline"]:
        import pandas as pd

        r = pd.DataFrame(s["roofline"]).groupby("kv_dtype").fraction.agg(["min", "max"])
        out.append(
            "Fraction of the memory-bandwidth bound reached: "
            + "; ".join(f"{d} {row['min']:.0%}-{row['max']:.0%}" for d, row in r.iterrows())
            + "."
        )
    if s["capacity"]:
        out.append(
            "KV blocks match the formula exactly for every engine."
            if s["capacity_exact"]
            else "KV blocks differ from the formula for some engine: see the capacity table."
        )
    return out
