"""Study 01's verdict in prose (:func:`verdict`: Markdown bullets, every number from the tables given) and its
lines: a delta with its interval and noise floor (:func:`delta_line`), the preemptions (:func:`preemption_line`)
and the fidelity check (:func:`fidelity_line`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fp8lab import stats
from fp8lab.serving.run import ServingResult
from fp8lab.serving.tables import throughput_table


def _fmt_ci(r: pd.Series) -> str:
    return f"{r.delta_pct:+.1f}% [{r.lo_pct:+.1f}, {r.hi_pct:+.1f}]"


def _row_delta(r: Any) -> tuple[stats.PairedDelta, stats.NoiseFloor]:
    return (
        stats.PairedDelta(r.a, r.b, r.delta_pct, r.lo_pct, r.hi_pct, int(r.n)),
        stats.NoiseFloor(r.noise_floor_pct, r.noise_floor_q25_pct, r.noise_floor_q75_pct, int(r.noise_pairs)),
    )


def delta_line(r: Any) -> str:
    """One delta row as the verdict states it: the delta, its interval, n, the floor with its IQR, the smallest
    detectable effect and whether it is beyond noise."""
    d, nf = _row_delta(r)
    if r.label == "within noise":
        tail = "within noise"
    else:
        tail = f"{r.label}, beyond noise" if r.beyond_noise_floor else f"{r.label}, but not beyond the noise floor"
    text = stats.delta_sentence(d, nf)
    if getattr(r, "n_engines", None) is not None:  # an engine-level row (issue 35): n counts engine pairs
        text = text.replace(" paired trials", " engine pairs")
    return f"{text}: {tail}"


def tput_point(metric: str) -> str:
    """``output tok/s @c=8`` -> ``c=8``; ``output tok/s (no stream) @c=8`` -> ``c=8 (no stream)``."""
    note, _, point = metric.removeprefix("output tok/s").rpartition("@")
    return f"{point} {note.strip()}".strip()


def fidelity_line(fidelity: dict[str, Any] | None) -> str | None:
    """The verdict's line on :func:`fidelity_check`'s result (None when it did not run or has no ratio)."""
    if not fidelity or fidelity.get("ratio") is None:
        return None
    tol = 100 * fidelity.get("tolerance", 0.03)
    nr = len(fidelity.get("round_ratios") or [])
    msg = (
        f"- **Fidelity.** fp8lab's offline throughput / `vllm bench throughput` = {fidelity['ratio']:.3f} "
        f"({'median of ' + str(nr) + ' rounds' if nr > 1 else 'one round'}; "
        f"{'within' if fidelity.get('within_tolerance') else 'outside'} {tol:.0f}%"
    )
    spread = fidelity.get("spread_pct") or {}
    if spread:
        msg += "; run to run, " + ", ".join(
            f"{'vLLM bench' if w == 'bench' else w} varied by {v:.2f}%" for w, v in sorted(spread.items())
        )
    msg += ")."
    rows = fidelity.get("rows")
    if isinstance(rows, pd.DataFrame) and len(rows) and "status" in rows:
        bad = rows[rows.status != "ok"]
        if len(bad):
            msg += (
                " Not measured: "
                + "; ".join(
                    f"round {int(r['round'])} {'vLLM bench' if r['who'] == 'bench' else r['who']} ({r['status']})"
                    for _, r in bad.iterrows()
                )
                + "."
            )
    if fidelity.get("resolvable") is None:
        msg += (
            " Each tool's own run-to-run spread needs two runs of it, so whether this check resolves "
            f"{tol:.0f}% is not established."
        )
    if fidelity.get("resolvable") is False:
        off = 100 * abs(fidelity["ratio"] - 1)
        msg += (
            f" A tool varied by itself by more than {tol:.0f}%, so runs this short cannot resolve {tol:.0f}% on "
            "this machine (more requests make longer runs); "
            + (
                "the ratio's distance from 1 is within that variation, so it is no verdict on either tool."
                if off <= max(spread.values())
                else "the ratio is farther from 1 than either tool's own variation: the tools disagree."
            )
        )
    return msg


def preemption_line(tp: pd.DataFrame, baseline: str, other: str) -> str | None:
    """A verdict line on the closed-loop preemptions of ``baseline`` and ``other`` (``tp``: rows of
    :func:`throughput_table`: ``kv_dtype, concurrency, trial, preemptions``), or None when neither preempted.
    Where only one dtype preempts, its throughput at that point paid for recomputing preempted requests:
    the difference there is the other dtype's capacity, not faster decoding."""
    if tp.empty or "preemptions" not in tp:
        return None
    t = tp[tp.kv_dtype.isin([baseline, other])]
    per = {}
    for (d, c), g in t.groupby(["kv_dtype", "concurrency"]):
        counts = g.sort_values("trial").preemptions.fillna(0).astype(int).tolist()
        if sum(counts):
            per.setdefault(d, []).append(f"c={int(c)} ({', '.join(map(str, counts))} over {len(counts)} trials)")
    if not per:
        return None
    said = [
        f"`{d}` preempted at {'; '.join(per[d])}" if d in per else f"`{d}` never preempted" for d in (baseline, other)
    ]
    msg = "- **Preemptions (closed loop).** " + "; ".join(said) + "."
    if len(per) == 1:
        msg += (
            f" Only `{next(iter(per))}` ran out of KV cache: at those points the other dtype's throughput gain "
            "is its capacity (no preempted requests recomputed), not faster decoding."
        )
    return msg


def verdict(
    res: ServingResult,
    deltas: pd.DataFrame,
    capacity: pd.DataFrame,
    search: pd.DataFrame | None = None,
    roof: dict[str, pd.DataFrame] | None = None,
    fidelity: dict[str, Any] | None = None,
) -> str:
    """A short Markdown verdict, every number taken from the tables given (nothing else)."""
    a = res.plan.baseline
    lines = []
    tp = throughput_table(res)  # closed-loop phases of every engine, for the preemption line of each dtype
    for b in res.plan.kv_dtypes[1:]:
        cap = capacity.set_index("kv_dtype")
        if b in cap.index and a in cap.index and cap.loc[b].get("status") == "ok":
            lines.append(
                f"- **Capacity.** With the same KV budget, `{b}` holds {int(cap.loc[b].kv_capacity_tokens):,} tokens "
                f"vs {int(cap.loc[a].kv_capacity_tokens):,} for `{a}` (x{cap.loc[b].ratio_vs_baseline:.2f}, "
                "measured from the engines' block counts)."
            )
        if search is not None and len(search):
            s = search.set_index("kv_dtype")
            if a in s.index and b in s.index:

                def conc(d, s=s):
                    r = s.loc[d]
                    m = "n/a" if r.measured is None or pd.isna(r.measured) else f"{int(r.measured)}"
                    return (
                        f"{'>=' if r.censored else ''}{m} (formula {int(r.predicted)}, "
                        f"vLLM block accounting {int(r.predicted_vllm)})"
                    )

                lines.append(
                    f"- **Concurrency without preemption** ({s.loc[a].capacity_shape}): `{a}` {conc(a)}, `{b}` {conc(b)}."
                )
        if (
            b in cap.index
            and a in cap.index
            and cap.loc[b].get("status") == "ok"
            and pd.notna(cap.loc[a].get("mem_peak_gib"))
            and pd.notna(cap.loc[b].get("mem_peak_gib"))
        ):
            dev = cap.loc[b].get("mem_device_peak_gib")
            shared = dev is not None and pd.notna(dev)
            what = "each engine's own share of the one GPU both ran on" if shared else "peak"
            lines.append(
                f"- **Memory** ({what}): "
                f"`{a}` {cap.loc[a].mem_peak_gib:.2f} GiB, `{b}` {cap.loc[b].mem_peak_gib:.2f} GiB"
                + (f" (the device's peak with both engines: {float(dev):.2f} GiB)" if shared else "")
                + (
                    ". The KV budget is fixed, so FP8 buys capacity here, not memory."
                    if res.plan.engine.kv_cache_gib is not None
                    else "."
                )
            )
        d = deltas[deltas.kv_dtype == b]
        tput = d[d.metric.str.startswith("output tok/s")]
        if len(tput):
            parts = [f"{tput_point(r.metric)}: {delta_line(r)}" for r in tput.itertuples()]
            robust = tput[tput.beyond_noise_floor].metric.tolist()
            how = (
                f"per engine the mean of its {res.plan.trials} trial(s), {res.plan.engines} fresh engines per dtype; "
                "95% t-interval of the log ratios paired by round over n engine pairs; noise floor = median "
                "|difference| between consecutive engines of the same config"
                if res.plan.replicated
                else "per trial one sustained phase per engine, both engines alive, phases interleaved A B / B A; "
                "95% t-interval of the paired log ratios; noise floor = median |difference| between consecutive "
                "trials of the same config"
            )
            lines.append(
                f"- **Throughput** (output tokens/s, `{b}` vs `{a}`; {how}): "
                + "; ".join(parts)
                + ". "
                + (
                    f"Beyond both the interval and the noise floor: {', '.join(robust)}."
                    if robust
                    else "No throughput delta is beyond both its interval and the noise floor."
                )
            )
        pre = preemption_line(tp, a, b)
        if pre:
            lines.append(pre)
        lat = d[d.metric.str.match(r"^(TTFT|TPOT|ITL) P(50|99) @")]
        if len(lat):
            beyond = [
                f"{r.metric} {r.delta_pct:+.1f}% [{r.lo_pct:+.1f}, {r.hi_pct:+.1f}] ({r.label})"
                for r in lat.itertuples()
                if r.beyond_noise_floor
            ]
            det = lat.detectable_pct.dropna()
            n = int(lat.n.max()) if len(lat) else 0
            msg = (
                f"- **Latency** (each percentile taken per trial and engine, then paired over n={n} "
                + ("engine pairs, each engine's trials averaged): " if res.plan.replicated else "trials): ")
                + (f"beyond noise: {'; '.join(beyond)}." if beyond else "no percentile delta is beyond noise.")
                + (
                    f" The smallest latency effect this run could detect ranged from {det.min():.1f}% to "
                    f"{det.max():.1f}% by metric (median {det.median():.1f}%)."
                    if len(det)
                    else ""
                )
            )
            lines.append(msg)
    if roof is not None and len(roof.get("measured", [])):
        m = roof["measured"]
        g = roof["grid"]
        eff = m.bound_over_measured.median()
        top = g[g.kv_dtype != a].speedup_bound_vs_baseline.max()
        lines.append(
            f"- **Roofline.** Measured ITL is {1 / eff:.0f}x the bandwidth bound (median over steps), so "
            + (
                "decode here is far from memory-bound and FP8's byte savings cannot show up in ITL"
                if eff < 0.2
                else "decode is close to memory-bound, where FP8's smaller KV reads pay off"
            )
            + f"; over the grid the bound allows at most x{top:.2f} ITL from FP8 "
            "(largest at long contexts and large batches)."
        )
    fid = fidelity_line(fidelity)
    if fid:
        lines.append(fid)
    if len(res.failed):
        lines.append(
            "- **Failed engines:** "
            + "; ".join(f"{r.kv_dtype} trial {r.trial}: {r.status} ({r.error})" for r in res.failed.itertuples())
        )
    return "\n".join(lines)
