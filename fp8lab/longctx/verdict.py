"""Study 04's verdict: each field-report claim judged on the tables (:func:`claims`: a ``label`` and the numbers
behind it) and written out, one paragraph per claim (:func:`verdict_markdown`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.longctx.run import LongCtxResult
from fp8lab.longctx.spec import BASELINE
from fp8lab.longctx.tables import Tables


def _k(n: Any) -> str:
    """Tokens as text: 8160 -> '8,160'."""
    return "n/a" if n is None or (isinstance(n, float) and not np.isfinite(n)) or pd.isna(n) else f"{int(n):,}"


def _pct(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:+.1f}%"


def claims(res: LongCtxResult, t: Tables) -> dict[str, dict[str, Any]]:
    """Each field-report claim with a ``label`` and the numbers behind it (the verdict's content)."""
    plan = res.plan
    out: dict[str, dict[str, Any]] = {}
    cands = list(plan.kv_dtypes[1:])

    # 1. bf16 runs out of memory where fp8 keeps going
    b = t.boundary.set_index("kv_dtype")
    longest = {
        dt: (
            b.loc[dt, "longest_measured"]
            if pd.notna(b.loc[dt, "longest_measured"])
            else b.loc[dt, "longest_engine"]
            if pd.notna(b.loc[dt, "longest_engine"])
            else b.loc[dt, "longest_formula"]
        )
        for dt in b.index
    }
    holds = {dt: bool(b.loc[dt, "holds_ramp"]) for dt in b.index}
    conc_ok: dict[str, Any] = {}
    if plan.concurrency > 1:
        r = t.ramp[t.ramp.concurrency == plan.concurrency]
        for dt, g in r.groupby("kv_dtype", sort=False):
            held = g[g.outcome == "held"]
            ran = g.outcome.isin(["ok", "held", "preempted", "serialized"]).any()
            # None: ran and held no length; "not run": the dtype's engine never ran a concurrent request
            conc_ok[dt] = int(held.length.max()) if len(held) else (None if ran else "not run")
    held_len = {dt: v for dt, v in conc_ok.items() if isinstance(v, int)}
    runs_out = (not holds.get(BASELINE, True) and any(holds.get(c) for c in cands)) or any(
        c in held_len and (held_len.get(BASELINE) or 0) < held_len[c] for c in cands
    )
    out["oom"] = {
        "label": "supported" if runs_out else "not seen at this budget",
        "longest": longest,
        "holds_ramp": holds,
        "longest_held_at_concurrency": conc_ok,
    }

    # 2. FP8's gains grow with context length
    sp = t.speed[t.speed.concurrency == 1] if len(t.speed) else t.speed
    g2: dict[str, Any] = {}
    for dt in cands:
        s = sp[sp.kv_dtype == dt].sort_values("length") if len(sp) else sp
        if s is None or not len(s):
            continue
        gr = t.growth.set_index(["kv_dtype", "metric"]) if len(t.growth) else None
        slope = {
            d: (float(gr.loc[(d, "itl_p50_s"), "b"]) if gr is not None and (d, "itl_p50_s") in gr.index else np.nan)
            for d in (BASELINE, dt)
        }
        cx = (
            t.crossover[(t.crossover.kv_dtype == dt) & (t.crossover.metric == "itl_p50_s")]
            if len(t.crossover)
            else t.crossover
        )
        first, last = s.iloc[0], s.iloc[-1]
        # the trend over every length (Spearman's rank correlation of the ratio with length), not two end points
        rho = (
            s.length.rank().corr(s.itl_p50_ratio.rank())
            if len(s) >= 3
            else np.sign(last.itl_p50_ratio - first.itl_p50_ratio)
        )
        falls = bool(rho <= -0.5)
        faster = bool(str(last.itl_label).endswith(" lower") and last.itl_delta < 0)  # resolved, not "no interval"
        g2[dt] = {
            "itl_ratio_shortest": float(first.itl_p50_ratio),
            "itl_ratio_longest": float(last.itl_p50_ratio),
            "ttft_ratio_shortest": float(first.ttft_p50_ratio),
            "ttft_ratio_longest": float(last.ttft_p50_ratio),
            "itl_delta_longest": float(last.itl_delta),
            "itl_ci_longest": (float(last.itl_lo), float(last.itl_hi)),
            "itl_label_longest": last.itl_label,
            "shortest": int(first.length),
            "longest": int(last.length),
            "itl_slope_auto": slope[BASELINE],
            "itl_slope_cand": slope[dt],
            "crossover_measured": cx.measured.iloc[0] if len(cx) else None,
            "crossover_fitted": cx.fitted.iloc[0] if len(cx) else None,
            "ratio_falls": falls,
            "ratio_trend_rho": float(rho),
            "faster_at_longest": faster,
        }
    if not g2:
        label = "not measured"
    elif all(v["ratio_falls"] and v["faster_at_longest"] for v in g2.values()):
        label = "supported"
    elif all(v["ratio_falls"] for v in g2.values()):
        label = "partly: the fp8/auto ITL ratio falls with length, but fp8 is not faster beyond noise at the longest"
    elif all(v["faster_at_longest"] for v in g2.values()):
        label = "partly: fp8 is faster at the longest length, but its ITL ratio does not fall steadily with length"
    else:
        label = "not supported"
    out["gains_grow"] = {"label": label, "by_dtype": g2}

    # 3. block size 256 beats 16 at the longest length
    bs = t.blocksize
    b3: dict[str, Any] = {}
    if len(bs):
        Lmax = int(bs.length.max())
        at = bs[bs.length == Lmax]
        unsupported = sorted({int(x) for x in at[at.outcome == "unsupported"].block_size})
        for dt, g in at[at.outcome == "ok"].groupby("kv_dtype", sort=False):
            best = g.loc[g.e2e_p50_s.idxmin()]
            small = g[g.block_size < 256]
            ref = small.loc[small.block_size.idxmin()] if len(small) else None
            big = g[g.block_size == 256]
            itl_ci = None
            if len(big) and ref is not None:
                from fp8lab import metrics, stats

                rec = res.records
                gaps = [
                    metrics.explode_itl(
                        rec[
                            (rec.role == r.source)
                            & (rec.kv_dtype == dt)
                            & (rec.block_size == r.block_size)
                            & (rec.phase == f"ramp-c1-L{Lmax}")
                        ],
                        ("request",),
                    )
                    for r in (ref, big.iloc[0])
                ]
                # requests resampled whole (their gaps are not independent): one request a side gives no interval
                d = stats.bootstrap_delta(
                    gaps[0].itl_s,
                    gaps[1].itl_s,
                    "median",
                    clusters_a=gaps[0]["request"] if "request" in gaps[0] else None,
                    clusters_b=gaps[1]["request"] if "request" in gaps[1] else None,
                    within=False,
                    n_boot=1000,
                    seed=plan.seed,
                )
                itl_ci = {"delta": d.delta, "lo": d.lo, "hi": d.hi, "label": d.label.replace("B", "256")}
            b3[dt] = {
                "best_block_size": int(best.block_size),
                "length": Lmax,
                "itl_256_vs_smallest_ci": itl_ci,
                "e2e_256_over_smallest": float(big.e2e_p50_s.iloc[0] / ref.e2e_p50_s)
                if len(big) and ref is not None
                else np.nan,
                "itl_256_over_smallest": float(big.itl_p50_s.iloc[0] / ref.itl_p50_s)
                if len(big) and ref is not None
                else np.nan,
                "ttft_256_over_smallest": float(big.ttft_p50_s.iloc[0] / ref.ttft_p50_s)
                if len(big) and ref is not None
                else np.nan,
                "smallest": int(ref.block_size) if ref is not None else None,
            }
        sizes = sorted({int(x) for x in at[at.outcome == "ok"].block_size})
        best256 = bool(b3) and all(v["best_block_size"] == 256 for v in b3.values())
        if not b3 or 256 not in sizes:
            label = "not measured"
        elif 16 in sizes:
            label = "supported" if best256 else "not supported"
        else:  # 16 not measured (e.g. rejected by the backend): say what was compared
            label = f"256 {'fastest' if best256 else 'not fastest'} of {sizes}" + (
                " (16 unsupported)" if 16 in unsupported else ""
            )
        out["block256"] = {"label": label, "by_dtype": b3, "unsupported": unsupported, "sizes": sizes}
    else:
        out["block256"] = {"label": "not measured", "by_dtype": {}, "unsupported": [], "sizes": []}

    # 4. silent failure: divergence along the context, passkey
    tr = t.trend
    s4: dict[str, Any] = {}
    for dt in res.quality_candidates:  # native or emulated (fp8lab.engine.fp8emu): the divergence ran on either
        x = tr[(tr.kv_dtype == dt) & (tr.source == "text")] if len(tr) else tr
        if len(x):
            x = x.iloc[0]
            s4[dt] = {
                "flip_rate": float(x.flip_rate),
                "abs_dlogprob": float(x.abs_dlogprob),
                "kl": float(x.kl),
                "last_over_first": float(x.last_over_first),
                "spearman_rho": float(x.spearman_rho),
                "grows_along_context": bool(x.spearman_rho > 0.5 and x.last_over_first > 1.25),
            }
    pk = t.passkey
    acc = pk.groupby("kv_dtype").correct.mean().to_dict() if len(pk) else {}
    base_can = bool(acc.get(BASELINE, 0) > 0)
    out["silent"] = {
        "label": (
            "divergence grows along the context"
            if any(v["grows_along_context"] for v in s4.values())
            else "no growth along the context"
            if s4
            else "not measured"
        ),
        "by_dtype": s4,
        "passkey_acc": acc,
        "baseline_can_retrieve": base_can,
    }

    # 5. random tokens
    rt = t.random
    r5: dict[str, Any] = {}
    if len(rt):
        tim = rt[rt.what == "timing"]
        dv = rt[rt.what == "divergence"]
        ti = tim.set_index("kv_dtype") if len(tim) else None
        r5 = {
            "timing_ttft_ratio": ti.ttft_ratio.to_dict() if ti is not None else {},
            "timing_itl_ratio": ti.itl_p50_ratio.to_dict() if ti is not None else {},
            "noise_ttft_ratio": ti.noise_ttft_ratio.to_dict() if ti is not None and "noise_ttft_ratio" in ti else {},
            "noise_itl_ratio": ti.noise_itl_p50_ratio.to_dict()
            if ti is not None and "noise_itl_p50_ratio" in ti
            else {},
            "divergence_ratio": dv.set_index("kv_dtype").abs_dlogprob_ratio.to_dict() if len(dv) else {},
            "flip_ratio": dv.set_index("kv_dtype").flip_rate_ratio.to_dict() if len(dv) else {},
        }
    parts5 = []
    if r5.get("divergence_ratio"):
        parts5.append(
            "quality: random tokens show x"
            + "/".join(f"{v:.2f}" for v in r5["divergence_ratio"].values())
            + " of real text's FP8 error"
        )
    if r5.get("timing_ttft_ratio"):
        dev = {d: max(abs(v - 1), abs(r5["timing_itl_ratio"][d] - 1)) for d, v in r5["timing_ttft_ratio"].items()}
        nz = {
            d: max(abs(r5["noise_ttft_ratio"].get(d, np.nan) - 1), abs(r5["noise_itl_ratio"].get(d, np.nan) - 1))
            for d in dev
        }
        r5["timing_within_noise"] = all(np.isfinite(nz[d]) and dev[d] <= max(nz[d], 0.05) for d in dev)
        parts5.append("speed: " + ("the same within noise" if r5["timing_within_noise"] else "differs beyond noise"))
    out["random_tokens"] = {"label": "; ".join(parts5) if parts5 else "not measured", **r5}
    return out


def verdict_markdown(res: LongCtxResult, t: Tables, c: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The verdict, one paragraph per claim, every number from the tables."""
    plan = res.plan
    c = claims(res, t) if c is None else c
    budget = f"{plan.kv_cache_gib:g} GiB" if plan.kv_cache_gib else "vLLM's own sizing"
    lines = ["### Verdict", ""]
    for note in res.notes:  # what was not measured natively on this device, and why
        lines += [f"*{note}*", ""]
    o = c["oom"]
    parts = [f"`{dt}` holds up to {_k(v)} tokens" for dt, v in o["longest"].items()]
    lines.append(
        f'**1. "bf16 runs out of memory where fp8 keeps going" — {o["label"]}.** With a KV budget of {budget} '
        f"and block size {res.block_size}: "
        + "; ".join(parts)
        + f" in one sequence (the ramp needs {_k(plan.max_context)})."
    )
    if o["longest_held_at_concurrency"]:
        parts = [
            f"`{dt}` "
            + (
                "not measured (its engine ran no concurrent request)"
                if v == "not run"
                else (_k(v) + " tokens" if v else "none of the lengths")
            )
            for dt, v in o["longest_held_at_concurrency"].items()
        ]
        lines.append(
            f"At {plan.concurrency} requests at once, the longest length whose requests all ran together without "
            "preemption: " + "; ".join(parts) + "."
        )
    lines.append("")
    g = c["gains_grow"]
    lines.append(f'**2. "FP8\'s gains grow with context length" — {g["label"]}.**')
    for dt, v in g["by_dtype"].items():
        lo, hi = v["itl_ci_longest"]
        cx = v["crossover_measured"]
        lines.append(
            f"- `{dt}` / `auto`, one request at a time: ITL median ratio {v['itl_ratio_shortest']:.3f} at "
            f"{_k(v['shortest'])} tokens, {v['itl_ratio_longest']:.3f} at {_k(v['longest'])} "
            f"({_pct(v['itl_delta_longest'])}, "
            + (
                f"95% CI resampling this run's requests {_pct(lo)} to {_pct(hi)}: {v['itl_label_longest']}; "
                "engine-to-engine variation is not in it); "
                if np.isfinite(lo) and np.isfinite(hi)
                else "no interval: one request per dtype, and a request's gaps are not independent draws); "
            )
            + f"TTFT ratio {v['ttft_ratio_shortest']:.3f} → {v['ttft_ratio_longest']:.3f}; rank correlation of the "
            f"ITL ratio with length over all {len(t.speed[(t.speed.kv_dtype == dt) & (t.speed.concurrency == 1)])} "
            f"lengths {v['ratio_trend_rho']:+.2f}. ITL grows by "
            f"{1e9 * v['itl_slope_auto']:,.0f} (auto) vs {1e9 * v['itl_slope_cand']:,.0f} ({dt}) µs per 1,000 tokens of context. "
            + (
                f"`{dt}` is faster in ITL from {_k(cx)} tokens on (measured)."
                if cx is not None and pd.notna(cx)
                else f"`{dt}` is not faster in ITL at the longest length measured."
            )
        )
    lines.append("")
    b3 = c["block256"]
    lines.append(
        f'**3. "Block size 256 beats 16 at 128K" — {b3["label"]}.** Block sizes that ran: {b3["sizes"]}.'
        + (
            f" Not run: {b3['unsupported']} (refused by the attention backend, or no kernel on this device for the "
            "swept dtype: see the note above)."
            if b3["unsupported"]
            else ""
        )
    )
    for dt, v in b3["by_dtype"].items():
        ci = v.get("itl_256_vs_smallest_ci")
        if v["smallest"] is None or not np.isfinite(v["e2e_256_over_smallest"]):
            lines.append(
                f"- `{dt}` at {_k(v['length'])} tokens: fastest E2E with block size {v['best_block_size']}; no "
                "block size below 256 ran at this length, so there is no ratio to report."
            )
            continue
        lines.append(
            f"- `{dt}` at {_k(v['length'])} tokens: fastest E2E with block size {v['best_block_size']}; 256 vs "
            f"{v['smallest']}: E2E x{v['e2e_256_over_smallest']:.3f}, ITL x{v['itl_256_over_smallest']:.3f}"
            + (f" ({_pct(ci['delta'])}, 95% CI {_pct(ci['lo'])} to {_pct(ci['hi'])}: {ci['label']})" if ci else "")
            + f", TTFT x{v['ttft_256_over_smallest']:.3f} (one request each: no interval)."
        )
    lines.append("")
    s = c["silent"]
    lines.append(f"**4. Silent failure — {s['label']}.**")
    if plan.quality_model is not None and not plan.quality_merged:  # the quality engines ran another model
        lines.append(
            f"- Model: {Path(plan.quality_model).name} (divergence and passkey below; the ramp above ran "
            f"{Path(plan.model).name})."
        )
    scoring = (
        "scored in one pass: one prefill with prompt logprobs per document"
        if plan.divergence_scoring == "one_pass"
        else "scored through the KV cache: one forced decode step per token"
    )
    for dt, v in s["by_dtype"].items():
        lines.append(
            f"- `{dt}` vs `auto`, teacher-forced on real text up to {_k(plan.doc_length)} tokens ({scoring}): "
            "top-1 flips at "
            f"{100 * v['flip_rate']:.2f}% of positions, mean |Δ logprob| {v['abs_dlogprob']:.4f} nats, KL ≥ "
            f"{v['kl']:.2e}; last bin / first bin {v['last_over_first']:.2f}, Spearman ρ with position "
            + (
                f"{v['spearman_rho']:.2f}"
                if math.isfinite(float(v["spearman_rho"]))
                else "undefined (the error is the same in every bin)"
            )
            + ". No error is raised either way: this is the silent part."
        )
    nll = t.trend[t.trend.source == "text"] if len(t.trend) else t.trend
    if len(nll):
        first = t.bypos[(t.bypos.source == "text")].sort_values("pos_bin")
        lines.append(
            f"- The model itself: `auto`'s NLL per token is {nll.nll_base_first.iloc[0]:.2f} nats in the first "
            f"{_k(first.pos_bin.iloc[1]) if len(first) > 1 else ''}-token bin and {nll.nll_base_last.iloc[0]:.2f} "
            "in the last: a model that does not use its far context cannot show what FP8 does to it there."
        )
    for r in t.passkey_paired.to_dict("records") if len(t.passkey_paired) else ():
        what = "passkey" if r["keys"] == 1 else f"{r['keys']}-needle passkey"
        resolved = all(math.isfinite(float(r[k])) for k in ("ci_low", "ci_high", "mde"))
        lines.append(
            f"- {what} at {r['length']:,} tokens, `{r['kv_dtype']}` vs `auto` on the same {r['n']} prompts: "
            f"{100 * r['acc']:.1f}% vs {100 * r['acc_base']:.1f}%, difference {100 * r['diff']:+.1f} points ("
            + (
                f"95% CI {100 * r['ci_low']:+.1f} to {100 * r['ci_high']:+.1f}; "
                if resolved
                else "no interval: too few prompts for one; "
            )
            + f"{r['only_base']} prompts right only with `auto`, {r['only_cand']} only with `{r['kv_dtype']}`"
            + (f"; this many prompts detect {100 * r['mde']:.1f} points with 80% power)." if resolved else ").")
        )
    if s["passkey_acc"]:
        accs = ", ".join(f"`{dt}` {100 * a:.0f}%" for dt, a in s["passkey_acc"].items())
        lines.append(
            f"- Passkey retrieval (lengths {list(plan.passkey_lengths)}, depths {list(plan.passkey_depths)}): {accs}. "
            + (
                ""
                if s["baseline_can_retrieve"]
                else "The baseline itself never retrieves the key, so this model cannot show an FP8 retrieval loss: "
                "the check is kept for real models on a GPU."
            )
        )
    lines.append("")
    r5 = c["random_tokens"]
    lines.append(f'**5. "128K tests with random tokens are worthless" — {r5["label"]}.**')
    if r5.get("timing_ttft_ratio"):
        lines.append(
            "- Timing, random-token prompt / real-text prompt of the same length (run just before and after "
            "it): TTFT "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["timing_ttft_ratio"].items())
            + ", ITL "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["timing_itl_ratio"].items())
            + "; those two real-text runs against each other: TTFT "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["noise_ttft_ratio"].items())
            + ", ITL "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["noise_itl_ratio"].items())
            + ". "
            + (
                "The random-token difference is within that run-to-run noise (or 5%): for speed and memory, "
                "random tokens measure the same thing."
                if r5["timing_within_noise"]
                else "The random-token difference exceeds that run-to-run noise here."
            )
        )
    if r5.get("divergence_ratio"):
        lines.append(
            "- FP8 error measured on random tokens / on real text: |Δ logprob| "
            + ", ".join(f"`{d}` x{v:.2f}" for d, v in r5["divergence_ratio"].items())
            + ", top-1 flips "
            + ", ".join(
                f"`{d}` x{v:.2f}" if math.isfinite(float(v)) else f"`{d}` no ratio (no flip on real text)"
                for d, v in r5["flip_ratio"].items()
            )
            + ": on one document each, with no interval, a ratio away from 1 shows that a random-token test can "
            "misstate the error real text sees, not by how much in general (inconclusive by the claims audit's rule "
            "28, which reads these ratios)."
        )
    return "\n".join(lines)
