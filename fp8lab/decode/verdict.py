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
    if s.get("replicated"):
        return out + _replicated(s, setting)
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


def _replicated(s: dict[str, Any], setting: str) -> list[str]:
    """The headline of an engine-replicated run (issue 35): every interval is over fresh engines."""
    out = []
    pts, arm = s["points"], s["primary_arm"]
    words = {"solo": "one engine at a time", "colocated": "two engines co-located"}
    n_eng = max((p["n_engines"] for p in pts), default=0)
    reps = min((p["reps"] for p in pts), default=0)
    solo = (
        f" (solo: gpu_memory_utilization {s['solo_gpu_memory_utilization']:g}, "
        + ("KV sized by vLLM" if s.get("solo_kv_cache_gib") is None else f"{s['solo_kv_cache_gib']:g} GiB of KV")
        + ")"
        if "solo" in s["arms"]
        else ""
    )
    out.append(
        f"{len(pts)} grid points in {setting}, each measured by {n_eng} fresh engines per dtype started in ABBA "
        f"order, {reps} repetitions per engine; arms: {', '.join(words[a] for a in s['arms'])}{solo}. Every interval "
        f"is over engines (95% t, {n_eng - 1} df), not over repetitions; the headline reads the {words[arm]} arm."
    )
    hw = [p["ci_half_width_pct"] for p in pts if p.get("ci_half_width_pct") is not None]
    rl = [p["rep_level_half_width_pct"] for p in pts if p.get("rep_level_half_width_pct") is not None]
    if hw and rl:
        import statistics

        out.append(
            f"Median 95% CI half-width of a point's fp8/auto ratio: {statistics.median(hw):.2f}% over engines, "
            f"against {statistics.median(rl):.2f}% had the repetitions been treated as independent."
        )
    faster = [p for p in pts if p["beyond_noise"] and p["ratio"] < 1]
    slower = [p for p in pts if p["beyond_noise"] and p["ratio"] > 1]
    for label, ps in (("faster", faster), ("slower", slower)):
        where = ", ".join(f"B={p['batch']} L={p['context_len']:,} ({(p['ratio'] - 1) * 100:+.1f}%)" for p in ps)
        out.append(
            f"fp8 decodes {label} beyond engine-to-engine noise at {len(ps)} of {len(pts)} points"
            + (f": {where}" if ps else "")
            + "."
        )
    for f in s["fits"]:
        if f["arm"] != arm or "-" not in str(f["kv_dtype"]) or f.get("a_ms_ci_low") is None:
            continue
        out.append(
            f"Batch {f['batch']}: fp8's fixed cost per step against auto's is {f['a_ms'] * 1e3:+.1f} us "
            f"[{f['a_ms_ci_low'] * 1e3:+.1f}, {f['a_ms_ci_high'] * 1e3:+.1f}] ({f['a_us_per_layer']:+.2f} us per "
            f"layer), its slope {f['b_ms_per_ktoken'] * 1e3:+.2f} us per 1K tokens "
            f"[{f['b_ms_per_token_ci_low'] * 1e6:+.2f}, {f['b_ms_per_token_ci_high'] * 1e6:+.2f}] "
            f"({f['n_engines']} engine pairs)."
        )
    for c in s["crossovers"]:
        if c["arm"] != arm:
            continue
        if c["status"] in ("in_grid", "above_grid"):
            out.append(
                f"Batch {c['batch']}: fp8's step equals auto's at about {c['context_len']:,.0f} tokens"
                + (" (past the grid: an extrapolation)" if c["status"] == "above_grid" else "")
                + f"; 95% interval over {c['n_engines']} engine pairs: {c['interval_text']}."
            )
        else:
            out.append(f"Batch {c['batch']}: {c['interval_text']}.")
    for e in s.get("arm_effect") or []:
        if "-" not in str(e["kv_dtype"]) or e.get("effect_ms_ci_low") is None:
            continue
        out.append(
            f"Co-location, batch {e['batch']}: fp8's extra fixed cost is {e['colocated_a_ms'] * 1e3:+.1f} us co-located "
            f"and {e['solo_a_ms'] * 1e3:+.1f} us alone; the difference {e['effect_ms'] * 1e3:+.1f} us "
            f"[{e['effect_ms_ci_low'] * 1e3:+.1f}, {e['effect_ms_ci_high'] * 1e3:+.1f}] over {e['n_rounds']} rounds: "
            + ("co-location changes it." if e["resolved"] else "not resolved (the interval holds zero).")
        )
    if s.get("engine_failures"):
        out.append("Engines that failed: " + "; ".join(f"{k} ({v})" for k, v in s["engine_failures"].items()) + ".")
    if s.get("deferred_sets"):
        out.append(f"Incomplete: {s['deferred_sets']} engine sets left for a later call.")
    return out
