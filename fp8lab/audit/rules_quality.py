"""The rules of the numerical claims: the FP8 formats (9, :func:`format_facts`), 32-token calibration (10), the
top-3 match rate (11a, 11b), dynamic per-head scales (14) and values past E4M3's maximum (27)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fp8lab.audit.evidence import Evidence, Missing, Report
from fp8lab.audit.pages import CALIBRATION, QUALITY
from fp8lab.audit.readers import FP8_LABELS, calibration_quality, calibration_scale_diffs, finite_key, quality_top3
from fp8lab.audit.scale import (
    COMPUTATION,
    CONFIRMED,
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    INTROSPECTION,
    NOT_TESTABLE,
    REFUTED,
    UNTESTED,
    Finding,
    finding,
    parts_verdict,
    per_report,
    rule,
)


# ---------------------------------------------------------------------------------------------- claim 9
def format_facts() -> dict[str, dict[str, float]]:
    """E4M3 and E5M2 as torch implements them (``torch.finfo``), checked by casting: mantissa bits from the
    machine epsilon, exponent bits = 8 - 1 - mantissa, smallest subnormal = smallest normal x epsilon (it
    survives a cast; half of it rounds to 0), dynamic range in binades = log2(max / smallest subnormal)."""
    import torch

    out = {}
    for name, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        fi = torch.finfo(dt)
        m = round(-math.log2(fi.eps))
        sub = fi.smallest_normal * fi.eps
        x = torch.tensor([sub, sub / 2, 1 + fi.eps, fi.max], dtype=torch.float32).to(dt).to(torch.float32).tolist()
        if x != [sub, 0.0, 1 + fi.eps, fi.max]:
            raise RuntimeError(f"torch's {dt} does not cast as its finfo says: {x}")
        out[name] = {
            "bits": fi.bits,
            "mantissa_bits": m,
            "exponent_bits": fi.bits - 1 - m,
            "max": fi.max,
            "min_normal": fi.smallest_normal,
            "min_subnormal": sub,
            "eps": fi.eps,
            "range_binades": math.log2(fi.max / sub),
            "normal_range_binades": math.log2(fi.max / fi.smallest_normal),
        }
    return out


@rule("9")
def rule_formats(ev: Evidence) -> Finding:
    """From torch's FP8 dtypes (finfo, checked by casting): E4M3 must have 4 exponent bits; its dynamic range
    (log2 of max / smallest subnormal) must exceed E5M2's; E5M2's epsilon (relative step) must be smaller than
    E4M3's. Any of these false -> refuted, all true -> confirmed. The 448 part is not a verdict input: the
    KV cache stores K/scale and V/scale, which 448 bounds (Study 02 records how often they clip); attention
    scores are computed after dequantization and never stored in the cache."""
    try:
        f = ev.formats if ev.formats is not None else format_facts()
    except ImportError as e:
        return Finding(
            NOT_TESTABLE, f"torch's FP8 dtypes not available: {e}", "install torch (the lab environment has it)"
        )
    e4, e5 = f["e4m3"], f["e5m2"]
    parts = {
        "E4M3 has 4 exponent bits": HOLDS if e4["exponent_bits"] == 4 else CONTRADICTED,
        "E4M3 has the wider dynamic range": HOLDS if e4["range_binades"] > e5["range_binades"] else CONTRADICTED,
        "E5M2 has the higher precision": HOLDS if e5["eps"] < e4["eps"] else CONTRADICTED,
    }
    measured = (
        f"E4M3: {e4['exponent_bits']} exponent + {e4['mantissa_bits']} mantissa bits, max {e4['max']:g}, "
        f"range {e4['range_binades']:.1f} binades, step {e4['eps']:g}; E5M2: {e5['exponent_bits']} + "
        f"{e5['mantissa_bits']}, max {e5['max']:g}, range {e5['range_binades']:.1f} binades, step {e5['eps']:g}"
    )
    on = (
        "448 bounds the stored K/scale and V/scale, not attention scores (computed after dequantization); "
        + ", ".join(f"{k}: {v}" for k, v in parts.items())
    )
    v = parts_verdict(parts)
    return Finding(
        v,
        measured,
        on,
        {"formats": f, "parts": parts},
        {},
        "torch's float8_e4m3fn / float8_e5m2",
        "exact (format definitions)",
        COMPUTATION,
        "E4M3 is the more precise FP8 format, E5M2 the wider: the report that says otherwise has them backwards "
        "(seed 000 states them correctly)."
        if v == REFUTED
        else "",
    )


# --------------------------------------------------------------------------------------------- claim 10
CLAIM10_THRESHOLD = 0.03
#: The bound informs about a format and strategy only where a scale set that knows nothing (all zeros: its |difference|
#: is the scale itself) misses it by this factor, i.e. where the mean scale is at least this many times 0.03.
CLAIM10_MARGIN = 2.0


@per_report("10")
def rule_32_token_calibration(rep: Report) -> Finding:
    """Study 02's mean absolute difference between the 32-token prompt's scales and the large set's, per format and
    strategy (the report's "below 0.03" is an absolute figure). The criterion informs only where it is well below
    the scales themselves (mean scale = mean |difference| / mean relative difference): a set of zeros differs from
    the large set by the scale itself, so where the scale is below :data:`CLAIM10_MARGIN` x 0.03 any scale set
    near zero passes or nearly passes, and that format and strategy cannot test the claim. Judged on the informative
    ones: every mean below 0.03 -> confirmed; none below -> refuted; some -> inconclusive. None informative ->
    inconclusive (vacuous here; the relative difference and the end-to-end quality are the evidence)."""
    s = rep.study(CALIBRATION)
    ps = finite_key(s, "prompt_set", rep.label_of(CALIBRATION))
    means, rel = calibration_scale_diffs(rep, ps)
    if not means:
        raise Missing(f"{rep.label_of(CALIBRATION)} summary has no absdiff.{ps}.*.mean")
    below = {k: v < CLAIM10_THRESHOLD for k, v in means.items()}
    large = (
        f"{s.get('calib_samples')} samples, {s.get('calib_tokens'):,} tokens" if s.get("calib_tokens") else "large set"
    )
    text = [
        f"{ps} vs {large}: mean |difference| " + ", ".join(f"{k} {v:.4f}" for k, v in means.items()),
        "relative " + ", ".join(f"{k} {100 * float(v):.0f}%" for k, v in rel.items() if v is not None),
    ]
    q = calibration_quality(rep, "ppl")
    if q:
        text.append("end to end dppl " + ", ".join(f"{k} {v:+.2f}%" for k, v in q.items()))
    scales = {k: means[k] / float(rel[k]) for k in means if rel.get(k)}
    informative = {k for k in means if k in scales and scales[k] >= CLAIM10_MARGIN * CLAIM10_THRESHOLD}
    shown = "; mean scales " + ", ".join(f"{k} {x:.4f}" for k, x in scales.items())
    details = {"means": means, "below": below, "relative": rel, "scales": scales}
    if scales and not informative:
        top = max(scales.values())
        why = (
            f"the scales themselves are below {CLAIM10_THRESHOLD} (up to {top:.4f}), so an absolute bound of "
            f"{CLAIM10_THRESHOLD} passes any scale set"
            if top < CLAIM10_THRESHOLD
            else f"the scales themselves are at most {top:.4f}, under {CLAIM10_MARGIN:g} x {CLAIM10_THRESHOLD}: a "
            f"set of zeros would differ from the large set by no more than {top:.4f}, so a bound of "
            f"{CLAIM10_THRESHOLD} cannot tell a calibration from none"
        )
        return finding(
            INCONCLUSIVE,
            "; ".join(text) + shown,
            f"vacuous here: {why}; relative to their size the 32-token scales differ by the percentages shown",
            {**details, "vacuous": True},
            setting=rep.setting(CALIBRATION),
            detectable="exact (deterministic scales from recorded K/V)",
        )
    judged = {k: b for k, b in below.items() if k in informative} if scales else below
    v = CONFIRMED if all(judged.values()) else REFUTED if not any(judged.values()) else INCONCLUSIVE
    left = sorted(set(means) - set(judged))
    on = (
        "every strategy within 0.03 absolute; the scales are small numbers, so the relative difference is large "
        "(shown), and it did not move quality end to end"
        if v == CONFIRMED
        else "within 0.03 for " + (", ".join(k for k, b in judged.items() if b) or "none")
    )
    if left:
        on += f" (not judged: {', '.join(left)}, whose scales are under {CLAIM10_MARGIN:g} x {CLAIM10_THRESHOLD})"
    worst = max(means[k] for k in judged)
    rmax = max((float(rel[k]) for k in judged if rel.get(k) is not None), default=float("nan"))
    return finding(
        v,
        "; ".join(text) + (shown if left else ""),
        on,
        {**details, "judged": sorted(judged)} if left else {"means": means, "below": below, "relative": rel},
        setting=rep.setting(CALIBRATION),
        detectable="exact (deterministic scales from recorded K/V)",
        headline=f"Scales from one 32-token prompt are within 0.03 of a large calibration's (mean |difference| "
        f"up to {worst:.4f}), though {100 * rmax:.0f}% off relative to their size."
        if v == CONFIRMED
        else "",
    )


# --------------------------------------------------------------------------------------------- claim 11
CLAIM11_BAND = (0.92, 0.96)
CLAIM11_FAIL = 0.85


def _top3_resolution(rep: Report, top3: Mapping[str, Any] | None) -> tuple[float | None, str]:
    """The resolution of a top-3 rate: half Study 03's 95% bootstrap CI of its ``fp8`` rate (:func:`quality_top3`
    of ``rep``), which the rules use as its interval, and the difference it detects with 80% power (normal
    quantiles)."""
    if top3 and top3.get("ci") is not None:
        from fp8lab import stats

        lo, hi = top3["ci"]
        h = (float(hi) - float(lo)) / 2
        return h, (
            f"{stats.detectable_from_interval(float(lo), float(hi)):.3f} at 80% power (95% bootstrap CI half-width "
            f"{h:.3f} of the top-3 rate over Study {rep.number(QUALITY)}'s prompts)"
        )
    return None, "the prompt set's size (no CI recorded)"


@per_report("11a")
def rule_top3_band(rep: Report) -> Finding:
    """The top-3 match rate with good calibration (Study 02's fp8 with the large set's scales; else Study 03's fp8,
    emulated where the report's CPU ran it so):
    "good calibration gives 0.92-0.96" holds when every rate is at least 0.92 (a rate above the band is no
    refutation of "it works") and is contradicted when a rate's CI (Study 03's half-width) lies below 0.92."""
    s02 = rep.optional(CALIBRATION)
    top3 = quality_top3(rep) if rep.optional(QUALITY) is not None else None
    good = calibration_quality(rep, "top3_match", "fp8+large") if s02 is not None else {}
    src, study = f"{rep.number(CALIBRATION)}, large-set scales", CALIBRATION
    fp8 = next((lab for lab in FP8_LABELS if top3 is not None and top3["overall"].get(lab) is not None), None)
    if not good and fp8 is not None:
        good, src, study = (
            {f"{fp8} (scale 1.0)": float(top3["overall"][fp8])},
            f"{rep.number(QUALITY)}, default scales",
            QUALITY,
        )
    if not good:
        raise Missing(f"no top-3 match rates recorded ({rep.number(CALIBRATION)}, {rep.number(QUALITY)})")
    h, det = _top3_resolution(rep, top3)
    lo = CLAIM11_BAND[0]
    if all(v >= lo for v in good.values()):
        v = CONFIRMED
    elif any(v + (h or 0) < lo for v in good.values()):
        v = REFUTED
    else:
        v = INCONCLUSIVE
    return finding(
        v,
        f"top-3 match with good calibration ({src}): " + ", ".join(f"{k} {x:.3f}" for k, x in good.items()),
        f"claimed band {CLAIM11_BAND[0]}-{CLAIM11_BAND[1]}; at or above it counts as working calibration",
        {"good": good},
        setting=rep.setting(study),
        detectable=det,
    )


@per_report("11b")
def rule_top3_threshold(rep: Report) -> Finding:
    """With one and the same set of scales (Study 03, each FP8 config), the per-category top-3 rates must not
    straddle 0.85: if they do, the threshold would call one calibration failed on some prompts and fine on others
    (refuted: it reacts to the prompts, not to the calibration). No category below 0.85 means no calibration here
    failed by the threshold, which therefore was not tested (not testable here)."""
    rep.study(QUALITY)
    top3 = quality_top3(rep)
    straddle, text = {}, []
    for lab, cats in top3["by_category"].items():
        cats = {c: float(v) for c, v in cats.items() if v is not None}
        if cats:
            text.append(
                f"{lab} per category ({rep.number(QUALITY)}): " + ", ".join(f"{c} {v:.2f}" for c, v in cats.items())
            )
            if min(cats.values()) < CLAIM11_FAIL <= max(cats.values()):
                straddle[lab] = cats
    if not text:
        raise Missing(f"{rep.label_of(QUALITY)} recorded no per-category top-3 rates")
    h, det = _top3_resolution(rep, top3)
    if straddle:
        return finding(
            REFUTED,
            "; ".join(text),
            "with the same scales some prompt categories fall below 0.85 and others do not",
            {"straddle": straddle},
            setting=rep.setting(QUALITY),
            detectable=det,
        )
    return finding(
        NOT_TESTABLE,
        "; ".join(text),
        "no category fell below 0.85 with any scale set: the threshold was not put to the test",
        {"straddle": {}},
        setting=rep.setting(QUALITY),
        detectable=det,
    )


# --------------------------------------------------------------------------------------------- claim 14
DYNAMIC_SCALE_ARGS = ("calculate_kv_scales",)
#: A Study 02 summary key (bool) that would settle the "during decode" part: whether the scales vLLM computed
#: differ between the start of decode and its end. Not recorded yet (the scales stay inside the worker).
DYNAMIC_CHANGES_KEY = "dynamic.scales_change_during_decode"


def _introspect_14(ev: Evidence) -> Finding | None:
    """Introspection of every inspected vLLM version (the installed one and saved option files): a version whose
    EngineArgs have no calculate_kv_scales has no dynamic KV scales at all, so its FP8 KV path cannot update them
    during decode (refuted for that version); None when every version offers them."""
    lacking = [str(i.get("version")) for i in ev.vllm if "calculate_kv_scales" not in (i.get("engine_args") or [])]
    if not ev.vllm or not lacking:
        return None
    having = [str(i.get("version")) for i in ev.vllm if str(i.get("version")) not in lacking]
    return Finding(
        REFUTED,
        f"vLLM {', '.join(lacking)}: no calculate_kv_scales among the EngineArgs fields"
        + (f" (vLLM {', '.join(having)} offers it)" if having else ""),
        "a vLLM without dynamic KV scales uses the checkpoint's or 1.0, fixed for the engine's life",
        {"lacking": lacking, "having": having},
        {},
        f"vLLM {', '.join(str(i.get('version')) for i in ev.vllm)} (introspected)",
        "exact (option lists)",
        INTROSPECTION,
    )


@per_report("14", physics=_introspect_14, label="introspection")
def rule_dynamic_per_head(rep: Report) -> Finding:
    """Per report (Study 02): per-head scales must reach the kernel (the per-head set and its per-tensor twin give
    different logprobs; identical ones mean the backend reduced them to one per layer), and dynamic scales
    (calculate_kv_scales) must be offered and change during decode (only decidable when the study recorded
    dynamic.scales_change_during_decode: vLLM computes them inside the worker). Per-head reduced or dynamic scales
    rejected -> refuted; every part holds -> confirmed; a part the records cannot observe -> not testable here. Only
    GPU runs decide (the CPU build is another kernel)."""
    s = rep.study(CALIBRATION)
    parts, text = {}, []
    reduced, offered = s.get("head_reduction.reduced"), s.get("dynamic.offered")
    if reduced is not None:
        parts["per-head"] = CONTRADICTED if reduced else HOLDS
        text.append(
            f"per-head scales: {s.get('head_reduction.outcome')} (per-head vs per-tensor max |dlogprob| "
            f"{float(s.get('head_reduction.max_abs_dlogprob') or 0):.3g})"
        )
    if offered is not None:
        changes = s.get(DYNAMIC_CHANGES_KEY)
        parts["dynamic during decode"] = (
            CONTRADICTED if not offered else UNTESTED if changes is None else HOLDS if changes else CONTRADICTED
        )
        text.append(f"dynamic scales: {s.get('dynamic.text') or s.get('dynamic.status')}")
    if not parts:
        raise Missing(f"{rep.label_of(CALIBRATION)} recorded no head-reduction or dynamic-scale check")
    on = ", ".join(f"{k} {v}" for k, v in parts.items())
    if parts.get("dynamic during decode") == UNTESTED:
        on += "; vLLM computes the dynamic scales inside the worker and they are not read back"
    return finding(
        parts_verdict(parts),
        "; ".join(text) + f" ({rep.number(CALIBRATION)})",
        on,
        {"parts": parts},
        setting=rep.setting(CALIBRATION),
        detectable="per-head vs per-tensor logprobs: any difference (bit-exact comparison)",
    )


# --------------------------------------------------------------------------------------------- claim 27
@rule("27")
def rule_silent_448(ev: Evidence) -> Finding:
    """Two parts. "A cast past 448 is silent": cast values beyond E4M3's 448 with torch (float32 ->
    float8_e4m3fn): no error and a value other than the input (saturated to 448 or NaN) holds; an error or inf
    contradicts. "It hits attention scores" (the long-context report's setting): vLLM's FP8 KV cache stores K /
    scale and V / scale only; attention scores are computed after dequantization in 16 or 32 bits and never stored
    in FP8, so nothing about scores passes through a 448 bound: contradicted. Any part contradicted -> refuted.
    Study 02's clip rates show how often the model's K exceed 448 x scale."""
    try:
        import torch
    except ImportError as e:
        return Finding(NOT_TESTABLE, f"torch not available: {e}", "install torch")
    xs = [449.0, 1000.0, -1e4]
    try:
        ys = torch.tensor(xs).to(torch.float8_e4m3fn).to(torch.float32).tolist()
    except Exception as e:  # noqa: BLE001 - an error is the finding
        return Finding(
            REFUTED, f"the cast raised {type(e).__name__}", "not silent", {}, {}, "torch", "exact", COMPUTATION
        )
    silent = all(y != x and not math.isinf(y) for x, y in zip(xs, ys, strict=True))
    parts = {"a cast past 448 is silent": HOLDS if silent else CONTRADICTED, "it hits attention scores": CONTRADICTED}
    clips = []
    for rep in ev.reports:
        v = (rep.optional(CALIBRATION) or {}).get("clip_rate.large.e4m3.attn_head.K")
        if v is not None:
            clips.append(f"[{rep.label}] K beyond 448 with the large set's scales: {100 * float(v):.5f}%")
    return Finding(
        parts_verdict(parts),
        "torch casts "
        + ", ".join(f"{x:g} -> {y:g}" for x, y in zip(xs, ys, strict=True))
        + ("; " + "; ".join(clips) if clips else ""),
        ", ".join(f"{k} {v}" for k, v in parts.items())
        + "; the cache holds K and V divided by their scale, so 448 bounds K/scale and V/scale, never the scores",
        {"cast": dict(zip(map(str, xs), ys, strict=True)), "parts": parts},
        {},
        f"torch {torch.__version__} float8_e4m3fn; vLLM's KV cache layout (K and V only)",
        "exact",
        COMPUTATION,
    )
