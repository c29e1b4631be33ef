"""Study 07's verdict: the field report's claim (:data:`CLAIM`) judged on a :func:`~fp8lab.prefix.summary.summary`
(:func:`claim_verdict`), its one line of evidence for the claims audit (:func:`claim_evidence`), and the
headline bullets (:func:`verdict`)."""

from __future__ import annotations

import math
from typing import Any

#: The claim this study judges (the audit's row).
CLAIM = {
    "source": "field report",
    "text": "FP8 KV leaves the prefix-cache hit rate unchanged",
    "auto_hit_rate": {"chat": 0.683, "json": 0.541},
    "fp8_hit_rate": {"chat": 0.679, "json": 0.537},
}


def _kv_size(gib: float) -> str:
    """A KV budget for prose: GiB from 1 GiB up, MiB below (``0.005126953125`` -> ``5.25 MiB``)."""
    return f"{gib:g} GiB" if gib >= 1 else f"{gib * 1024:.3g} MiB"


def claim_evidence(s: dict[str, Any], base: str = "auto", other: str = "fp8") -> str:
    """One line for the claims audit: per workload, the largest |hit-rate difference| inside auto's measured knee
    and the largest fp8 gain beyond it, with the setting."""
    parts = []
    for w in ("chat", "system", "json"):
        inside, gain = s.get(f"{w}.max_abs_dhit_pp_inside"), s.get(f"{w}.gain")
        if inside is None and not gain:
            continue
        txt = f"{w}: |{other} - {base}| <= {inside:.1f} pp while {base} holds" if inside is not None else f"{w}:"
        if gain:
            txt += (
                f"; beyond {base}'s knee, N={gain['n_active']:.0f}: {gain[f'{base}_hit_rate']:.1%} -> "
                f"{gain[f'{other}_hit_rate']:.1%}"
            )
        parts.append(txt)
    return (f"{s['model']} on {s['device']}, {_kv_size(s['kv_cache_gib'])} KV: " + "; ".join(parts)) if parts else ""


def json_records(df: Any) -> list[dict[str, Any]]:
    """A table as JSON-able records: NaN as None, numpy scalars as Python numbers."""
    out = []
    for r in df.to_dict("records") if len(df) else []:
        out.append({k: (None if isnan(v) else v.item() if hasattr(v, "item") else v) for k, v in r.items()})
    return out


def isnan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def claim_verdict(s: dict[str, Any], base: str = "auto", other: str = "fp8") -> str:
    """The field report's claim ("FP8 leaves the hit rate unchanged") judged on this run: ``refuted`` when fp8's hit
    rate exceeds auto's beyond the paired interval at some swept working set of some workload, ``consistent`` when
    every difference's interval lies within 1 percentage point, else ``inconclusive``; ``not measured`` without
    both dtypes. On the CPU analogue this is never decisive for a GPU claim: the caller labels the setting."""
    if s["engines_status"].get(base) != "ok" or s["engines_status"].get(other) != "ok":
        return "not measured"
    sweep = s["sweep"]
    if not sweep:
        return "not measured"
    gains = [
        r
        for r in sweep
        if r.get("dhit_pp_ci_low") is not None and not isnan(r.get("dhit_pp_ci_low")) and r["dhit_pp_ci_low"] > 0
    ]
    exact_gain = [r for r in sweep if isnan(r.get("dhit_pp_ci_low")) and (r.get("dhit_pp") or 0) > 1.0]
    if gains or exact_gain:
        return "refuted"
    within = all(
        (not isnan(r.get("dhit_pp_ci_low")) and r["dhit_pp_ci_low"] >= -1 and r["dhit_pp_ci_high"] <= 1)
        or (isnan(r.get("dhit_pp_ci_low")) and abs(r.get("dhit_pp") or 0) <= 1)
        for r in sweep
    )
    return "consistent" if within else "inconclusive"


def verdict(s: dict[str, Any], base: str = "auto", other: str = "fp8") -> list[str]:
    """Headline bullets from a :func:`summary`."""
    out = []
    reps = (
        f"{s['engines_per_dtype']} fresh engines per dtype and arm, {s['trials']} trial(s) each"
        if s.get("replicated")
        else f"{s['trials']} paired trials"
    )
    setting = (
        f"{s['model']} on {s['device']} (vLLM {s['vllm_version']}, {_kv_size(s['kv_cache_gib'])} of KV per engine, "
        f"blocks of {s['block_size']} tokens, {s['max_in_flight']} requests in flight, {reps}, "
        f"{s['prompt_source']} prompts)"
    )
    if s["engine_errors"]:
        out.append(
            "Not measured: "
            + "; ".join(f"`{d}` ({e})" for d, e in s["engine_errors"].items())
            + ". What follows is the other dtype alone; the auto-vs-fp8 comparison and the claim are left open."
        )
    out.append(
        f"Setting: {setting}. KV blocks: "
        + ", ".join(
            f"{d} {s['num_blocks'].get(d, 'n/a')} (formula {s['num_blocks_formula'][d]})"
            for d in s["num_blocks_formula"]
        )
        + "."
    )
    if s.get("replicated"):
        out += verdict_lines(s, base, other)
    for k in s["knees"]:
        meas = (
            "not measured"
            if k["measured_last_held"] is None and k["measured_first_fallen"] is None
            else (
                f"holds to N={k['measured_last_held']:.0f}"
                if k["measured_last_held"] is not None
                else "holds at no swept N"
            )
            + ", falls from "
            + (f"N={k['measured_first_fallen']:.0f}" if k["measured_first_fallen"] else "no swept N")
        )
        out.append(
            f"{k['workload']} / {k['kv_dtype']}: predicted knee N={k['knee_simulated']} (replay; formula "
            f"{k['knee_formula']}); measured: {meas}"
            + (
                ""
                if k["prediction_in_interval"] is None
                else (
                    " (prediction inside the measured interval)"
                    if k["prediction_in_interval"]
                    else " (prediction OUTSIDE the measured interval)"
                )
            )
            + "."
        )
    for key, g in ((k, v) for k, v in s.items() if k.endswith(".gain") and v):
        w = key.split(".")[0]
        ci = (
            "; deterministic, no interval"
            if g.get("dhit_deterministic")
            else f" [{g['dhit_pp_ci_low']:+.1f}, {g['dhit_pp_ci_high']:+.1f}]"
            if g.get("dhit_pp_ci_low") is not None and not isnan(g.get("dhit_pp_ci_low"))
            else ""
        )
        tt = (
            f"; TTFT {other}/{base} {g['ttft_ratio']:.3f} [{g['ttft_ratio_ci_low']:.3f}, {g['ttft_ratio_ci_high']:.3f}]"
            if g.get("ttft_ratio_ci_low") is not None
            else ""
        )
        out.append(
            f"{w}: largest {other} gain beyond {base}'s knee at N={g['n_active']:.0f}: hit rate "
            f"{g[f'{base}_hit_rate']:.1%} -> {g[f'{other}_hit_rate']:.1%} ({g['dhit_pp']:+.1f} pp{ci}){tt}."
        )
    n_turns, n_full = s.get("counter_turns", 0), s.get("counter_turns_complete", 0)
    if n_full < n_turns:
        out.append(
            f"vLLM's prefix-cache counters missed steps in {n_turns - n_full} of {n_turns} turns (the likely cause: "
            "vLLM 0.26 records a step's scheduler stats only when the step returned outputs); those turns' hits are "
            "the per-request "
            "`num_cached_tokens` vLLM returned, which equal the counters wherever the counters are complete."
        )
    if s.get("ttft_min_detectable_pct") is not None:
        out.append(
            f"The smallest TTFT change these {'engine pairs' if s.get('replicated') else 'trials'} detect with 80% "
            f"power is about {s['ttft_min_detectable_pct']:.1f}% (median over the cells, paired t on the log ratios"
            + (f", n = {s['engines_per_dtype']} engine pairs)" if s.get("replicated") else ")")
            + (
                f"; for the hit rate, {s['dhit_min_detectable_pp']:.2f} percentage points where trials differed"
                if s.get("dhit_min_detectable_pp") is not None
                else ""
            )
            + (
                f"; {s['dhit_deterministic_cells']} cells' hit-rate differences were the same in every trial "
                "(the replay is deterministic: hit counts follow token counts), so they have no interval"
                if s.get("dhit_deterministic_cells")
                else ""
            )
            + "."
        )
    for c in s["correctness"]:
        same = c["tokens_equal"] == 1.0 and c["max_abs_dlogprob"] == 0.0
        out.append(
            f"Correctness {c['kv_dtype']} ({c['kind']}, {c['prompts']} prompts, >= {c['cached_tokens_min']} "
            f"cached tokens): "
            + (
                "hit and cold outputs identical (tokens and logprobs)."
                if same
                else f"{c['tokens_equal']:.0%} identical greedy sequences; the earliest divergence at output token "
                + (f"{c['first_divergence']:.0f}" if c.get("first_divergence") is not None else "n/a")
                + f" (0-based); the chosen tokens' logprobs up to it differ by at most {c['max_abs_dlogprob']:.3f} "
                "nats."
            )
        )
    v = s["claim_verdict"]
    out.append(
        f"Claim '{CLAIM['text']}': **{v}** on this setting"
        + (
            " (a CPU analogue: not evidence about the GPU claim)"
            if "cpu" in str(s.get("device", "")).lower() or s.get("device") in (None, "cpu")
            else ""
        )
        + "."
    )
    return out


def verdict_lines(s: dict[str, Any], base: str = "auto", other: str = "fp8") -> list[str]:
    """The replication's bullets: n and the level every interval is over, and whether co-location matters."""
    arms = " and ".join(s["arms"])
    out = [
        f"Engine-level replication: {s['engines_per_dtype']} fresh engines per dtype and arm ({arms}), started in "
        f"ABBA order; every interval is a t interval over n = {s['engines_per_dtype']} engine pairs (each engine's "
        f"{s['trials']} trial(s) averaged first), not over trials inside one engine. The headline is the "
        f"{s['primary_arm']} arm's"
        + (
            " (one engine at a time at vLLM's default memory setting, what a user deploys)."
            if s["primary_arm"] == "solo"
            else "."
        )
    ]
    if s.get("engines_failed"):
        out.append(f"Engines that failed: {', '.join(s['engines_failed'])} (the others' pairs carry the intervals).")
    colo = s.get("colocation") or []
    if colo:
        eff = [r for r in colo if r.get("effect_ratio_ci_low") is not None]
        spread = (
            f" (co-located/solo ratio of the {other}/{base} TTFT ratios from {min(r['effect_ratio'] for r in eff):.3f} "
            f"to {max(r['effect_ratio'] for r in eff):.3f} over the cells)"
            if eff
            else ""
        )
        out.append(
            f"Co-location: the {other}/{base} TTFT ratio differs between co-located and solo engines beyond its "
            f"interval (n = {colo[0]['n_rounds']} rounds) in {s['colocation_resolved_cells']} of "
            f"{s['colocation_cells']} cells{spread}"
            + (
                "; co-location matters here, so the solo arm is the one to read."
                if s["colocation_resolved_cells"]
                else "; no cell shows that co-location changes fp8's TTFT cost at this n."
            )
        )
    elif "solo" in s["arms"] and "colocated" in s["arms"]:
        out.append("Co-location: not compared (no round has both arms measured).")
    return out
