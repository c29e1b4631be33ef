"""The rules of the long-context claims: long requests' capacity and speed (6a, 6b), block size 256 at 128K (12a,
:func:`block_size_finding`, which Study 04's verdict calls too) and the hit rate (12b), the cuts at 128K (13b),
long requests' TPOT (17), throughput at 128K (22), chunked prefill (23) and random-token prompts (28)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from fp8lab.audit import pages
from fp8lab.audit.evidence import Evidence, Missing, Report, Setting
from fp8lab.audit.pages import DECODE, LONG_CONTEXT, PREFIX, SERVING
from fp8lab.audit.readers import (
    decode_detectable,
    decode_grid,
    fp8_candidate,
    pct,
    physics_step_cut,
    ramp_noise,
    throughput_gain,
)
from fp8lab.audit.rules_serving import CLAIM13
from fp8lab.audit.scale import (
    CONFIRMED,
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTABLE,
    REFUTED,
    UNRESOLVED,
    UNTESTED,
    Finding,
    finding,
    judge,
    outcome_verdict,
    parts_verdict,
    per_report,
    rule,
)
from fp8lab.engine.fp8emu import emulated_label

# ---------------------------------------------------------------------------------------------- claim 6
LIMITED = ("serialized", "preempted", "over_capacity")
CLAIM6_LENGTH, CLAIM6_GAIN = 8192, 18.3


@per_report("6a")
def rule_long_capacity(rep: Report) -> Finding:
    """Study 04's measured frontier at the length nearest 8,192 tokens: auto's largest concurrency without
    preemption below FP8's confirms that auto's KV runs out where FP8's does not; equal limits refute. Else Study
    01: auto preempted where FP8 did not. How it runs out is stated beside the verdict, not judged: vLLM does not
    fail when the KV cache is full, it queues or preempts (recomputes) requests, so "out of memory" is a full KV
    cache, not an error (the outcomes Study 04 recorded beyond auto's limit are shown)."""
    s04, s01 = rep.optional(LONG_CONTEXT), rep.optional(SERVING)
    if s04 is not None:
        c = fp8_candidate(s04)
        lengths = [
            int(x)
            for x in s04.get("lengths") or []
            if s04.get(f"auto.max_conc_measured.L{x}") and s04.get(f"{c}.max_conc_measured.L{x}")
        ]
        if lengths:
            L = min(lengths, key=lambda x: abs(x - CLAIM6_LENGTH))
            a, f = s04[f"auto.max_conc_measured.L{L}"], s04[f"{c}.max_conc_measured.L{L}"]
            outcomes = {str(v) for k, v in s04.items() if k.startswith("auto.") and k.endswith(".outcome")}
            return finding(
                CONFIRMED if f > a else REFUTED,
                f"at {L:,} tokens: auto held {a} requests without preemption, {c} {f}; auto's outcomes beyond its "
                f"limit: {', '.join(sorted(outcomes & set(LIMITED))) or 'none recorded'} ({rep.number(LONG_CONTEXT)})",
                f"between {a + 1} and {f} concurrent requests auto's KV cache is full while FP8 runs them all; vLLM "
                "then queues or preempts (recomputes) requests: no out-of-memory error"
                if f > a
                else "no concurrency where only FP8 fits",
                {"length": L, "auto": a, "fp8": f},
                setting=rep.setting(LONG_CONTEXT),
                detectable="+-1 request",
            )
    if s01 is not None:
        c = fp8_candidate(s01)
        pa, pf = s01.get("preemptions_auto"), s01.get(f"preemptions_{c}")
        if pa is not None and pf is not None and pa > 0 and pf == 0:
            return finding(
                CONFIRMED,
                f"preemptions at c={s01.get('headline_concurrency')}: auto {pa:g}, {c} {pf:g} ({rep.number(SERVING)})",
                "auto's KV cache was full where FP8's was not (vLLM preempts rather than failing)",
                {"preemptions": [pa, pf]},
                setting=rep.setting(SERVING),
                detectable="one preemption",
            )
    raise Missing(f"no frontier ({rep.number(LONG_CONTEXT)}) and no preemption contrast ({rep.number(SERVING)})")


@per_report("6b")
def rule_long_speed(rep: Report) -> Finding:
    """Study 06 (paired decode steps with 95% CIs) at the contexts nearest 8,192 tokens: the throughput gain
    1/ratio - 1 at each measured batch. Confirmed when some batch's CI reaches +18.3% (within 50%) beyond 0;
    refuted when the physics bound rules it out; otherwise inconclusive, since the claim's concurrency is not stated
    and the gain grows with the batch (the largest measured batch's gain is shown). Without Study 06: Study 04's two
    single requests (E2E ratio at its concurrency) with the ramp's detectable effect (ramp_noise)."""
    s06 = rep.optional(DECODE)
    if s06 is not None:
        pts = decode_grid(rep)
        ctx = min({int(p["context_len"]) for p in pts}, key=lambda x: abs(x - CLAIM6_LENGTH))
        at = sorted((p for p in pts if int(p["context_len"]) == ctx), key=lambda p: p["batch"])
        outs = {
            p["batch"]: judge(
                100 * throughput_gain(p["ratio_ci_high"]), 100 * throughput_gain(p["ratio_ci_low"]), CLAIM6_GAIN
            )
            for p in at
        }
        text = ", ".join(
            f"B={p['batch']} {100 * throughput_gain(p['ratio']):+.1f}% [{100 * throughput_gain(p['ratio_ci_high']):+.1f}, "
            f"{100 * throughput_gain(p['ratio_ci_low']):+.1f}]"
            for p in at
        )
        v = CONFIRMED if HOLDS in outs.values() else INCONCLUSIVE
        return finding(
            v,
            f"decode throughput gain at {ctx:,} tokens ({rep.number(DECODE)}): {text} (claimed +18.3%)",
            "a batch reaches the claimed gain"
            if v == CONFIRMED
            else f"the gain grows with the batch and the claim's concurrency is not stated: up to B={at[-1]['batch']} "
            "these runs do not reach +18.3%, larger batches were not measured at this length",
            {"context": ctx, "outcomes": outs},
            setting=rep.setting(DECODE),
            detectable=decode_detectable(rep),
        )
    s04 = rep.study(LONG_CONTEXT)
    c, C = fp8_candidate(s04), s04.get("concurrency")
    held = [
        int(L)
        for L in s04.get("lengths") or []
        if s04.get(f"{c}.c{C}.L{L}.outcome") == "held"
        and s04.get(f"auto.c{C}.L{L}.e2e_p50_s")
        and s04.get(f"{c}.c{C}.L{L}.e2e_p50_s")
    ]
    if not held:
        raise Missing(f"no length where both dtypes ran the long requests ({rep.number(LONG_CONTEXT)})")
    L = min(held, key=lambda x: abs(x - CLAIM6_LENGTH))
    gain = float(s04[f"auto.c{C}.L{L}.e2e_p50_s"]) / float(s04[f"{c}.c{C}.L{L}.e2e_p50_s"]) - 1
    d, dtext = ramp_noise(s04, what=rep.label_of(LONG_CONTEXT))
    out = judge(100 * (gain - d), 100 * (gain + d), CLAIM6_GAIN)
    return finding(
        outcome_verdict(out),
        f"{C} requests of {L:,} tokens: E2E gain {pct(gain)} ({rep.number(LONG_CONTEXT)}, one run)",
        f"judged on one request per dtype: {out}",
        {"gain": gain, "length": L, "detectable": d},
        setting=rep.setting(LONG_CONTEXT),
        detectable=dtext,
    )


# --------------------------------------------------------------------------------------------- claim 12
CLAIM12_RATIO = 5.7 / 12.4
CLAIM12_CONTEXT = 120_000  # "128K": a sweep at 120K tokens or more counts as the claim's length
_BS_KEY = re.compile(r"^(?P<dt>[^.]+)\.bs(?P<b>\d+)\.L(?P<L>\d+)\.outcome$")


@per_report("12a")
def rule_block_size(rep: Report) -> Finding:
    """Study 04's block-size sweep at its longest length (one request each, so P50 = P99): E2E with block 256 over
    E2E with block 16 (the ramp engine's one-at-a-time request counts as its block size's point), as a change
    (ratio - 1) with the ramp's own detectable effect (ramp_noise) either side, judged against the claimed
    x0.46 (-54%) by `judge`. A sweep shorter than 120K tokens is nearest evidence only (inconclusive at best)."""
    return block_size_finding(rep.study(LONG_CONTEXT), rep.setting(LONG_CONTEXT), rep.label_of(LONG_CONTEXT))


def block_size_finding(s: Mapping[str, Any], setting: Setting | None = None, what: str | None = None) -> Finding:
    """Claim 12a judged on one Study 04 summary ``s`` (its ``{dtype}.bs{B}.L{L}.*`` sweep keys, the ramp's
    ``block_size``, ``{dtype}.c1.L{L}.e2e_p50_s`` points and fits), run in ``setting``: :func:`rule_block_size`'s
    text. The one judgment of the claim: the audit applies it to each report's Study 04, and Study 04's own verdict
    (:meth:`fp8lab.longctx.study.Results.verdict`) to the summary it records, so the two cannot disagree on the same
    run. Raises :class:`~fp8lab.audit.evidence.Missing` without a sweep or without the ramp's fits, naming ``what``
    (the study as ``Report.label_of`` shows it; None: as its notebook is numbered)."""
    what = what or pages.label(LONG_CONTEXT, pages.number(LONG_CONTEXT))
    e2e: dict[tuple[str, int], dict[int, float]] = {}
    for k, v in s.items():
        if (m := _BS_KEY.match(k)) and v == "ok" and s.get(f"{m['dt']}.bs{m['b']}.L{m['L']}.e2e_p50_s") is not None:
            e2e.setdefault((m["dt"], int(m["L"])), {})[int(m["b"])] = float(
                s[f"{m['dt']}.bs{m['b']}.L{m['L']}.e2e_p50_s"]
            )
    if not e2e:
        raise Missing(f"{what} ran no block-size sweep")
    d, dtext = ramp_noise(s, what=what)
    ramp_bs = s.get("block_size")
    outs, text, details = {}, [], {}
    for (dt, L), points in sorted(e2e.items()):
        if L != max(x for (dd, x) in e2e if dd == dt):
            continue
        if ramp_bs and ramp_bs not in points and s.get(f"{dt}.c1.L{L}.e2e_p50_s") is not None:
            points = {**points, int(ramp_bs): float(s[f"{dt}.c1.L{L}.e2e_p50_s"])}
        small = sorted(b for b in points if b < 256)
        if 256 not in points or not small:
            continue
        ref = 16 if 16 in points else small[0]
        ch = points[256] / points[ref] - 1
        out = judge(100 * (ch - d), 100 * (ch + d), 100 * (CLAIM12_RATIO - 1))
        if L < CLAIM12_CONTEXT and out != CONTRADICTED:
            out = UNRESOLVED
        outs[dt] = out
        text.append(
            f"{dt} at {L:,} tokens: E2E block 256 {points[256]:.2f} s vs block {ref} {points[ref]:.2f} s "
            f"(x{points[256] / points[ref]:.3f}; claimed x{CLAIM12_RATIO:.2f})"
        )
        details[dt] = {"length": L, "ref_block": ref, "ratio": points[256] / points[ref], "outcome": out}
    if not outs:
        return finding(NOT_TESTABLE, "no block 256 vs smaller pair ran", "", details, setting=setting)
    v = parts_verdict(outs)
    longest = max(x["length"] for x in details.values())
    on = (
        ("at 128K" if longest >= CLAIM12_CONTEXT else f"nearest evidence: {longest:,} tokens, not 128K")
        + "; "
        + ", ".join(f"{k} {o}" for k, o in outs.items())
    )
    return finding(v, "; ".join(text), on, {"parts": outs, **details}, setting=setting, detectable=dtext)


@per_report("12b")
def rule_hit_rate(rep: Report) -> Finding:
    """Two parts. FP8: Study 07 (prefix caching on, both dtypes at the same KV budget, paired trials) records the
    hit rate of both dtypes; FP8's hit rate above auto's beyond the paired interval at some working set holds, no
    gain anywhere contradicts. Block size 256: Study 07 runs one block size, so that part is untested unless it
    ran two. The verdict is the FP8 part's (the block part is named untested). A hit rate needs prefix caching on;
    every other study runs with it off."""
    s = rep.optional(PREFIX)
    if s is None:
        raise Missing(f"no {rep.label_of(PREFIX)} summary; every other study runs with prefix caching off")
    gains = {w: s[f"{w}.gain"] for w in ("chat", "system", "json") if isinstance(s.get(f"{w}.gain"), dict)}
    if not gains:
        raise Missing(f"{rep.label_of(PREFIX)} recorded no hit rate of both dtypes beyond auto's knee")
    up = [w for w, g in gains.items() if (g.get("dhit_pp_ci_low") or 0) > 0]
    parts = {"FP8 raises the hit rate": HOLDS if up else CONTRADICTED, "block 256 raises it": UNTESTED}
    return finding(
        outcome_verdict(parts["FP8 raises the hit rate"]),
        "; ".join(
            f"{w}: {100 * g['auto_hit_rate']:.1f}% -> {100 * g['fp8_hit_rate']:.1f}% ({g['dhit_pp']:+.1f} pp)"
            for w, g in gains.items()
        )
        + f" at block size {s.get('block_size')} ({rep.number(PREFIX)})",
        ", ".join(f"{k} {v}" for k, v in parts.items())
        + "; FP8 holds twice the blocks, so beyond auto's knee it keeps prefixes auto evicts",
        {"parts": parts, "gains": gains},
        setting=rep.setting(PREFIX),
        detectable="the paired intervals shown",
    )


def _physics_13b(ev: Evidence) -> Finding | None:
    """A 65% cut of ITL is more than the 50% any halving of KV bytes allows."""
    return physics_step_cut(1 - CLAIM13["itl_ratio"], "claimed ITL -65% at 128K")


@per_report("13b", physics=_physics_13b)
def rule_cuts_at_128k(rep: Report) -> Finding:
    """ITL part: Study 06's decode step at its longest context and batch 1 (fp8/auto with a 95% CI) against the
    claimed -65% (`judge`); without Study 06, Study 04's ITL ratio at its longest length with the ramp's detectable
    effect. TTFT part: Study 04's TTFT ratio at its longest length (one request each) with the ramp's detectable
    effect (ramp_noise of TTFT) against -47%. Any part contradicted -> refuted."""
    s04, s06 = rep.optional(LONG_CONTEXT), rep.optional(DECODE)
    parts, text, dets, st = {}, [], [], None
    if s06 is not None:
        b1 = [p for p in decode_grid(rep) if int(p["batch"]) == 1]
        if b1:
            p = max(b1, key=lambda p: p["context_len"])
            parts["ITL"] = judge(
                100 * (p["ratio_ci_low"] - 1), 100 * (p["ratio_ci_high"] - 1), 100 * (CLAIM13["itl_ratio"] - 1)
            )
            text.append(
                f"decode step at B=1, {int(p['context_len']):,} tokens: x{p['ratio']:.3f} "
                f"[{p['ratio_ci_low']:.3f}, {p['ratio_ci_high']:.3f}] ({rep.number(DECODE)}; claimed x{CLAIM13['itl_ratio']:.2f})"
            )
            dets.append("ITL " + decode_detectable(rep))
            st = rep.setting(DECODE)
    if s04 is not None:
        c = fp8_candidate(s04)
        L = max(int(x) for x in s04.get("lengths") or [0])
        for m, key, claimed in (("TTFT", "ttft", CLAIM13["ttft_ratio"]), ("ITL", "itl", CLAIM13["itl_ratio"])):
            if m in parts:
                continue
            r = s04.get(f"{c}.ratio_at_longest.{key}_p50_s")
            if r is None:
                continue
            d, dtext = ramp_noise(s04, f"{key}_p50_s", rep.label_of(LONG_CONTEXT))
            parts[m] = judge(100 * (float(r) - 1 - d), 100 * (float(r) - 1 + d), 100 * (claimed - 1))
            if L < CLAIM12_CONTEXT and parts[m] != CONTRADICTED:
                parts[m] = UNRESOLVED
            text.append(
                f"{m} at {L:,} tokens fp8/auto x{float(r):.3f} ({rep.number(LONG_CONTEXT)}, one request each; claimed x{claimed:.2f})"
            )
            dets.append(f"{m} {dtext}")
        st = st or rep.setting(LONG_CONTEXT)
    if not parts:
        raise Missing(
            f"no decode grid ({rep.number(DECODE)}) and no ratios at the longest length ({rep.number(LONG_CONTEXT)})"
        )
    return finding(
        parts_verdict(parts),
        "; ".join(text),
        ", ".join(f"{k} {v}" for k, v in parts.items()),
        {"parts": parts},
        setting=st,
        detectable="; ".join(dets),
    )


# --------------------------------------------------------------------------------------------- claim 17
@per_report("17")
def rule_long_tpot(rep: Report) -> Finding:
    """A long request's TPOT is its decode step at its context. Study 06's paired decode steps at the context
    nearest the reports' long class (8,192 tokens): FP8 faster beyond the CI at the largest measured batch ->
    confirmed; slower beyond the CI at every batch -> refuted; else inconclusive. (Study 01 records no per-class
    TPOT P95; the decode step is the quantity TPOT percentiles are made of.)"""
    pts = decode_grid(rep)
    ctx = min({int(p["context_len"]) for p in pts}, key=lambda x: abs(x - CLAIM6_LENGTH))
    at = sorted((p for p in pts if int(p["context_len"]) == ctx), key=lambda p: p["batch"])
    top = at[-1]
    if top["ratio_ci_high"] < 1:
        v = CONFIRMED
    elif all(p["ratio_ci_low"] > 1 for p in at):
        v = REFUTED
    else:
        v = INCONCLUSIVE
    return finding(
        v,
        f"decode step fp8/auto at {ctx:,} tokens ({rep.number(DECODE)}): "
        + ", ".join(
            f"B={p['batch']} x{p['ratio']:.3f} [{p['ratio_ci_low']:.3f}, {p['ratio_ci_high']:.3f}]" for p in at
        ),
        f"at the largest measured batch (B={top['batch']}) FP8's step is "
        + ("shorter" if v == CONFIRMED else "not shorter beyond its CI"),
        {"context": ctx},
        setting=rep.setting(DECODE),
        detectable=decode_detectable(rep),
    )


# --------------------------------------------------------------------------------------------- claim 22
def _physics_22(ev: Evidence) -> Finding | None:
    """18 -> 42 tok/s is x2.33: a 57% cut of the step, above the 50% a halving of KV bytes allows."""
    return physics_step_cut(1 - 18 / 42, "claimed 18 -> 42 tok/s at 128K")


@per_report("22", physics=_physics_22)
def rule_128k_throughput(rep: Report) -> Finding:
    """Study 06's decode step at its longest context, batch 1: throughput gain 1/ratio - 1 with its 95% CI against
    the claimed +133% (`judge`)."""
    b1 = [p for p in decode_grid(rep) if int(p["batch"]) == 1]
    if not b1:
        raise Missing(f"{rep.label_of(DECODE)} has no batch-1 point")
    p = max(b1, key=lambda p: p["context_len"])
    out = judge(
        100 * throughput_gain(p["ratio_ci_high"]), 100 * throughput_gain(p["ratio_ci_low"]), 100 * (42 / 18 - 1)
    )
    return finding(
        outcome_verdict(out),
        f"batch 1 at {int(p['context_len']):,} tokens: {100 * throughput_gain(p['ratio']):+.1f}% "
        f"[{100 * throughput_gain(p['ratio_ci_high']):+.1f}, {100 * throughput_gain(p['ratio_ci_low']):+.1f}] ({rep.number(DECODE)}; claimed +133%)",
        out,
        {"ratio": p["ratio"]},
        setting=rep.setting(DECODE),
        detectable=decode_detectable(rep),
        headline=f"Decode with FP8 KV on {rep.setting(DECODE).device} (CUDA graphs): "
        f"{100 * throughput_gain(p['ratio']):+.1f}% tokens/s at batch 1 and {int(p['context_len']):,} tokens, not the "
        "reported +133%."
        if out == CONTRADICTED
        else "",
    )


# --------------------------------------------------------------------------------------------- claim 23
@rule("23")
def rule_chunked_prefill(ev: Evidence) -> Finding:
    """A chunked-prefill effect needs runs that differ only in the prefill chunk budget (max_num_batched_tokens):
    not testable here while no Study 04 summary records such a sweep (``*.mnbt*`` keys)."""
    swept = [r.label for r in ev.reports if any(".mnbt" in k for k in (r.optional(LONG_CONTEXT) or {}))]
    return Finding(
        NOT_TESTABLE,
        ("chunked-prefill sweep recorded in " + ", ".join(swept))
        if swept
        else f"no Study {ev.number(LONG_CONTEXT)} summary records a chunked-prefill budget sweep",
        "vLLM's V1 engine always chunks "
        "prefill; a sweep of max_num_batched_tokens at 128K would decide the claimed 42 -> 51 tok/s",
    )


# --------------------------------------------------------------------------------------------- claim 28
def fp8_quality_label(s: Mapping[str, Any], key: str) -> str | None:
    """The label under which Study 04's summary ``s`` holds its FP8 candidate's quality key ``<label>.<key>``:
    ``fp8`` from the native FP8 KV kernel, else ``fp8 (emulated)`` (:func:`fp8lab.engine.fp8emu.emulated_label`: a
    CPU without the kernel runs Study 04's divergence and passkey engines emulated); None when neither is recorded."""
    return next((lab for lab in ("fp8", emulated_label("fp8")) if s.get(f"{lab}.{key}") is not None), None)


@per_report("28")
def rule_random_tokens(rep: Report) -> Finding:
    """Study 04's FP8 divergence from auto on random token ids over the same on real text (one document each), from
    its FP8 candidate native or emulated (:func:`fp8_quality_label`): a ratio far from 1 says random tokens misstate
    FP8's error (below 1 understate it, above 1 overstate it). With one document each and no interval, the ratio
    cannot decide "worthless" (inconclusive); capacity and speed do not depend on token content (the GPU speed
    studies use dummy weights and token ids), so the claim can at most hold for quality."""
    s = rep.study(LONG_CONTEXT)
    lab = fp8_quality_label(s, "random.divergence_ratio")
    if lab is None:
        raise Missing(f"long context ({rep.number(LONG_CONTEXT)}) recorded no random-token divergence")
    r, fr = s[f"{lab}.random.divergence_ratio"], s.get(f"{lab}.random.flip_ratio")
    return finding(
        INCONCLUSIVE,
        ("" if lab == "fp8" else f"{lab}: ")  # an emulated candidate is named as such
        + f"random / real text: FP8 divergence x{float(r):.2f}"
        + (f", top-1 flips x{float(fr):.2f}" if fr is not None else "")
        + f" ({rep.number(LONG_CONTEXT)})",
        f"random tokens {'understate' if float(r) < 1 else 'overstate' if float(r) > 1 else 'match'} FP8's error "
        "here; one document each, no interval",
        {"ratio": r, "label": lab},
        # the divergence ran on Study 04's quality model (the real model where the ramp ran the shipped one)
        setting=dataclasses.replace(
            rep.setting(LONG_CONTEXT), model=str(s.get("quality_model") or rep.setting(LONG_CONTEXT).model)
        ),
        detectable="unknown (one document each, no interval)",
    )
