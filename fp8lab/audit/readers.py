"""The per-study readers the rules call: each reads one study's numbers from a :class:`~fp8lab.audit.evidence.Report`,
by field from its typed rows (:mod:`fp8lab.summary_table`) where the report has them (Studies 01, 02, 03, 06:
``serving_*``, ``calibration_*``, ``quality_top3``, ``decode_grid``), else from its flat summary; plus the ramp's
noise (:func:`ramp_noise`), the bandwidth bound (:func:`physics_step_cut`) and number formatting. A number that is
not recorded raises :class:`~fp8lab.audit.evidence.Missing`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fp8lab import summary_table
from fp8lab.audit import pages
from fp8lab.audit.evidence import Missing, Report
from fp8lab.audit.pages import CALIBRATION, DECODE, LONG_CONTEXT, QUALITY, SERVING
from fp8lab.audit.scale import MAD_SIGMA, MAX_FP8_STEP_CUT, PHYSICS, REFUTED, Z80, Z95, Finding, finding
from fp8lab.engine.fp8emu import emulated_label

#: Study 03's default-scale FP8 config as a report names it: ``fp8`` where the kernel ran, ``fp8 (emulated)`` where a
#: CPU without it ran the emulated engine (the first the report has is read).
FP8_LABELS = ("fp8", emulated_label("fp8"))


# ------------------------------------------------------------------------------------------------ helpers
def finite_key(s: Mapping[str, Any], key: str, what: str = "") -> Any:
    """``s[key]``, finite; raises :class:`Missing` naming ``what`` summary (``Report.label_of``) when it is not."""
    v = s.get(key)
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        raise Missing(f"{what} summary has no '{key}'".strip())
    return v


def fp8_candidate(s: Mapping[str, Any]) -> str:
    """The FP8 dtype a study compared with its baseline: ``fp8`` when present, else the first candidate."""
    cands = list(s.get("kv_dtypes") or [])[1:]
    if not cands:
        raise Missing("no candidate kv dtype recorded")
    return "fp8" if "fp8" in cands else cands[0]


def _delta(rep: Report, metric: str) -> Mapping[str, Any]:
    """The serving study's recorded delta of ``metric`` (``"output tok/s @c=16"``) for the candidate dtype, from
    its flat summary in ``rep``."""
    s = rep.study(SERVING)
    key = f"{fp8_candidate(s)}: {metric}"
    d = (s.get("deltas") or {}).get(key)
    if not d or any(d.get(k) is None for k in ("delta_pct", "lo_pct", "hi_pct")):
        raise Missing(f"{rep.label_of(SERVING)} summary has no delta '{key}'")
    return d


# ------------------------------------------------------------------------------- typed rows (Studies 01, 03)
#: Studies whose typed rows (:mod:`fp8lab.summary_table`) the rules read by field where a report has them; a
#: report rendered before the typed table existed has only the flat summary, which is read as before.
#: By page name (:mod:`fp8lab.audit.pages`), each with its rows' ``study`` field (:data:`fp8lab.summary_table.STUDIES`).
ROW_STUDIES: Mapping[str, str] = {SERVING: "serving", CALIBRATION: "calibration", QUALITY: "quality", DECODE: "decode"}
#: Each Study 01 delta the rules name: its row metric and setting, under the flat summary's name of the delta.
SERVING_DELTAS: Mapping[str, tuple[str, str]] = {
    "output tok/s": ("output_tok_s", "closed loop"),
    "output tok/s (no stream)": ("output_tok_s_no_stream", "closed loop, not streamed"),
    "TTFT P50": ("ttft_p50", "closed loop"),
    "TTFT P99": ("ttft_p99", "closed loop"),
    "TPOT P50": ("tpot_p50", "closed loop"),
    "TPOT P99": ("tpot_p99", "closed loop"),
    "ITL P50": ("itl_p50", "closed loop"),
    "ITL P99": ("itl_p99", "closed loop"),
}
#: Study 03's baseline config label (``fp8lab.quality.BASELINE``; not imported here: it pulls numpy and pandas).
QUALITY_BASELINE = "auto"


def _one_row(rep: Report, rows: Sequence[Mapping[str, Any]], study: str, **sel: Any) -> Mapping[str, Any]:
    try:
        return summary_table.one(rows, study=ROW_STUDIES[study], **sel)
    except LookupError as e:
        raise Missing(f"{rep.label_of(study)} rows: {e}") from None


def _row_pair(rep: Report, rows: Sequence[Mapping[str, Any]], study: str) -> tuple[str, str]:
    """(candidate, baseline) of a study's change rows: ``fp8`` where it is a candidate, else the first one."""
    changes = [r for r in rows if r["study"] == ROW_STUDIES[study] and r["baseline"] is not None]
    if not changes:
        raise Missing(f"{rep.label_of(study)} rows hold no change against a baseline")
    cands = list(dict.fromkeys(r["kv_dtype"] for r in changes))
    cand = "fp8" if "fp8" in cands else cands[0]
    return cand, next(r["baseline"] for r in changes if r["kv_dtype"] == cand)


def serving_candidate(rep: Report) -> str:
    """Study 01's FP8 dtype: from its rows (by field) where it has them, else its flat summary (:func:`fp8_candidate`)."""
    rows = rep.study_rows(SERVING)
    return fp8_candidate(rep.study(SERVING)) if rows is None else _row_pair(rep, rows, SERVING)[0]


def serving_concurrency(rep: Report, setting: str = "closed loop") -> list[int]:
    """Study 01's closed-loop concurrencies (``setting`` ``closed loop, not streamed``: the non-reading client's)."""
    rows = rep.study_rows(SERVING)
    if rows is None:
        s = rep.study(SERVING)
        return (
            _sorted_concurrency(s)
            if setting == "closed loop"
            else sorted(int(c) for c in s.get("naive_concurrency") or [])
        )
    metric = "output_tok_s" if setting == "closed loop" else "output_tok_s_no_stream"
    return sorted(
        {
            int(r["concurrency"])
            for r in summary_table.select(rows, metric=metric, setting=setting)
            if r["concurrency"] is not None
        }
    )


def serving_headline_concurrency(rep: Report) -> int:
    """Study 01's headline concurrency: the largest of its closed-loop sweep."""
    rows = rep.study_rows(SERVING)
    if rows is None:
        return int(finite_key(rep.study(SERVING), "headline_concurrency", rep.label_of(SERVING)))
    cs = serving_concurrency(rep)
    if not cs:
        raise Missing(f"{rep.label_of(SERVING)} rows hold no closed-loop throughput")
    return max(cs)


def serving_delta(rep: Report, name: str, concurrency: int) -> Mapping[str, Any]:
    """Study 01's paired delta ``name`` (a key of :data:`SERVING_DELTAS`) at ``concurrency`` for its FP8 dtype, as
    ``{delta_pct, lo_pct, hi_pct, ...}``: the row selected by field (metric, setting, concurrency, kv dtype,
    baseline) where the report has rows (``read_from: rows``), else the flat summary's ``deltas`` entry."""
    rows = rep.study_rows(SERVING)
    if rows is None:
        return _delta(rep, f"{name} @c={concurrency}")
    metric, setting = SERVING_DELTAS[name]
    cand, base = _row_pair(rep, rows, SERVING)
    r = _one_row(
        rep, rows, SERVING, metric=metric, setting=setting, concurrency=int(concurrency), kv_dtype=cand, baseline=base
    )
    if r["ci_low"] is None:
        raise Missing(f"{rep.label_of(SERVING)} row {metric} @c={concurrency} has no interval")
    return {
        "delta_pct": r["value"],
        "lo_pct": r["ci_low"],
        "hi_pct": r["ci_high"],
        "n": r["n"],
        "detectable_pct": r["detectable"],
        "beyond_noise_floor": r["beyond_noise"],
        "read_from": "rows",
    }


def serving_has_delta(rep: Report, name: str, concurrency: int) -> bool:
    """Whether Study 01 recorded delta ``name`` at ``concurrency`` (a row by field, else a flat summary entry)."""
    if rep.study_rows(SERVING) is None:
        s = rep.study(SERVING)
        return f"{fp8_candidate(s)}: {name} @c={concurrency}" in (s.get("deltas") or {})
    try:
        serving_delta(rep, name, concurrency)
    except Missing:
        return False
    return True


def serving_preemptions(rep: Report) -> dict[int, dict[str, float]]:
    """Study 01's preemptions per closed-loop concurrency and dtype (summed over trials)."""
    rows = rep.study_rows(SERVING)
    if rows is None:
        s = rep.study(SERVING)
        return {int(k): v for k, v in (s.get("preemptions_by_concurrency") or {}).items()}
    out: dict[int, dict[str, float]] = {}
    for r in summary_table.select(rows, study="serving", metric="preemptions", setting="closed loop"):
        out.setdefault(int(r["concurrency"]), {})[r["kv_dtype"]] = float(r["value"])
    return out


def serving_figure(rep: Report, summary_key: str, metric: str, kv_dtype: str, **sel: Any) -> Any:
    """One dtype's own figure of Study 01 (no baseline): the row ``metric`` selected by field where the report has
    rows, else the flat summary's ``summary_key``; None when absent."""
    rows = rep.study_rows(SERVING)
    if rows is None:
        return rep.study(SERVING).get(summary_key)
    hits = summary_table.select(rows, study="serving", metric=metric, kv_dtype=kv_dtype, baseline=None, **sel)
    return hits[0]["value"] if len(hits) == 1 else None


def calibration_scale_diffs(rep: Report, prompt_set: str) -> tuple[dict[str, float], dict[str, Any]]:
    """Study 02's scales from ``prompt_set`` against the large set's: ``({"<format>/<granularity>": mean absolute
    difference}, {same keys: mean relative difference})``, in the flat summary's key order; from its rows by field
    where the report has them, else its flat summary's ``absdiff.*`` / ``reldiff.*`` keys."""
    rows = rep.study_rows(CALIBRATION)
    s = rep.study(CALIBRATION)
    if rows is None:
        pat = re.compile(rf"^absdiff\.{re.escape(prompt_set)}\.(?P<fmt>[^.]+)\.(?P<st>[^.]+)\.mean$")
        means = {f"{m['fmt']}/{m['st']}": float(v) for k, v in s.items() if (m := pat.match(k)) and v is not None}
        return means, {k: s.get(f"reldiff.{prompt_set}.{k.replace('/', '.')}.mean") for k in means}

    def by_key(metric: str) -> dict[str, float]:
        hit = summary_table.select(rows, study="calibration", metric=metric, setting=prompt_set, baseline=None)
        vals = {f"{r['kv_dtype'].removeprefix('fp8_')}/{r['subset']}": float(r["value"]) for r in hit}
        return {k: vals[k] for k in sorted(vals, key=lambda k: k.replace("/", "."))}

    means, rel = by_key("scale_abs_diff"), by_key("scale_rel_diff")
    return means, {k: rel.get(k) for k in means}


def calibration_quality(rep: Report, metric: str, label_prefix: str = "fp8+") -> dict[str, float]:
    """Study 02's end-to-end ``metric`` (``top3_match``; ``ppl``: its % change against auto) of its scale-set
    configs whose label starts with ``label_prefix``, in the flat summary's key order; from its rows by field where
    the report has them, else its flat summary's ``quality.<label>.<metric>`` keys."""
    key = {"top3_match": "top3_match", "ppl": "delta_ppl_pct"}[metric]
    rows = rep.study_rows(CALIBRATION)
    if rows is None:
        s = rep.optional(CALIBRATION) or {}
        head, tail = f"quality.{label_prefix}", f".{key}"
        return {
            k[len("quality.") : -len(tail)]: float(v)
            for k, v in s.items()
            if k.startswith(head) and k.endswith(tail) and v is not None
        }
    base = "auto" if metric == "ppl" else None
    hit = [
        r
        for r in summary_table.select(rows, study="calibration", metric=metric, baseline=base, subset=None)
        if r["setting"].startswith(label_prefix)
    ]
    vals = {r["setting"]: float(r["value"]) for r in hit}
    return {k: vals[k] for k in sorted(vals, key=lambda k: f"quality.{k}.{key}")}


def quality_top3(rep: Report) -> dict[str, Any]:
    """Study 03's top-3 match rates: ``overall`` ``{config label: rate}`` and ``by_category`` ``{label: {category:
    rate}}`` of its candidates (the baseline left out), and ``ci`` (the default-scale FP8 config's 95% CI, native or
    emulated (:data:`FP8_LABELS`), or None); from its rows by field where the report has them, else from its flat
    summary."""
    rows = rep.study_rows(QUALITY)
    if rows is None:
        s03 = rep.study(QUALITY)
        labels = (s03.get("labels") or [])[1:]
        fp8 = next((lab for lab in FP8_LABELS if s03.get(f"{lab}.top3_ci_lo") is not None), "fp8")
        ci = (s03.get(f"{fp8}.top3_ci_lo"), s03.get(f"{fp8}.top3_ci_hi"))
        return {
            "overall": {lab: s03[f"{lab}.top3_match"] for lab in labels if s03.get(f"{lab}.top3_match") is not None},
            "by_category": {
                lab: {c: s03.get(f"{lab}.top3_match.{c}") for c in s03.get("categories") or []} for lab in labels
            },
            "ci": None if None in ci else ci,
        }
    top3 = [
        r for r in summary_table.select(rows, study="quality", metric="top3_match") if r["setting"] != QUALITY_BASELINE
    ]
    overall = {r["setting"]: r["value"] for r in top3 if r["subset"] is None}
    by_cat: dict[str, dict[str, Any]] = {}
    for r in top3:
        if r["subset"] is not None:
            by_cat.setdefault(r["setting"], {})[r["subset"]] = r["value"]
    fp8 = [r for r in top3 if r["subset"] is None and r["setting"] in FP8_LABELS and r["ci_low"] is not None]
    return {
        "overall": overall,
        "by_category": by_cat,
        "ci": (fp8[0]["ci_low"], fp8[0]["ci_high"]) if fp8 else None,
        "read_from": "rows",
    }


def half_width(d: Mapping[str, Any]) -> float:
    """Half the width of a recorded delta's 95% interval (percent): the change it detects only half the time."""
    return (float(d["hi_pct"]) - float(d["lo_pct"])) / 2


def detectable(d: Mapping[str, Any]) -> float:
    """A recorded paired delta's smallest detectable effect (percent): the change its design detects with 80% power
    at two-sided 5% (:func:`fp8lab.stats.detectable_from_interval` on the log ratios, t on ``n - 1`` df; normal
    quantiles when ``n`` is not recorded)."""
    from fp8lab import stats

    lo, hi = 1 + float(d["lo_pct"]) / 100, 1 + float(d["hi_pct"]) / 100
    if lo <= 0:
        return math.nan
    n = d.get("n")
    return 100 * math.expm1(stats.detectable_from_interval(math.log(lo), math.log(hi), int(n) - 1 if n else None))


def detectable_text(ds: Mapping[str, Mapping[str, Any]]) -> str:
    """``"output tok/s 2.1%, ... (detectable at 80% power, paired t, n=5)"`` for named recorded deltas."""
    ns = sorted({int(d["n"]) for d in ds.values() if d.get("n")})
    return (
        ", ".join(f"{k} {detectable(d):.1f}%" for k, d in ds.items())
        + f" (detectable at 80% power, two-sided 5%, paired t{', n=' + '/'.join(map(str, ns)) if ns else ''})"
    )


def fd(d: Mapping[str, Any]) -> str:
    return f"{d['delta_pct']:+.1f}% [{d['lo_pct']:+.1f}, {d['hi_pct']:+.1f}]"


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _near(x: float, target: float, tol: float) -> bool:
    return abs(x - target) <= tol * target


def gb(b: float) -> str:
    return f"{b / 1e9:,.1f} GB ({b / 2**30:,.1f} GiB)"


def _sorted_concurrency(s: Mapping[str, Any]) -> list[int]:
    return sorted(int(c) for c in (s.get("concurrency") or []))


def ramp_noise(s04: Mapping[str, Any], metric: str = "e2e_p50_s", what: str | None = None) -> tuple[float, str]:
    """The detectable change (fraction) of a ratio of two single timed requests in Study 04: from the ramp's own
    scatter around its quadratic fits (``{dtype}.fit.{metric}.a/b/c`` over the one-at-a-time points), sigma =
    1.4826 x the median |residual| / value (a robust statistic; it includes any misfit, so it errs large), and a
    ratio of two such runs resolves 1.96 x sqrt(2) x sigma. Raises :class:`Missing` without fits, naming ``what``
    (the study as ``Report.label_of`` shows it; None: as its notebook is numbered)."""
    res = []
    lengths = [int(x) for x in s04.get("lengths") or []]
    for dt in s04.get("kv_dtypes") or []:
        fit = [s04.get(f"{dt}.fit.{metric}.{k}") for k in "abc"]
        if any(v is None or not math.isfinite(float(v)) for v in fit):
            continue
        a, b, c = map(float, fit)
        for L in lengths:
            y = s04.get(f"{dt}.c1.L{L}.{metric}")
            if y:
                res.append(abs(float(y) - (a + b * L + c * L * L)) / float(y))
    if len(res) < 3:
        raise Missing(
            f"{what or pages.label(LONG_CONTEXT, pages.number(LONG_CONTEXT))} summary has no ramp fit of {metric}"
        )
    res.sort()
    med = res[len(res) // 2] if len(res) % 2 else (res[len(res) // 2 - 1] + res[len(res) // 2]) / 2
    d = Z95 * math.sqrt(2) * MAD_SIGMA * med
    power = (Z95 + Z80) * math.sqrt(2) * MAD_SIGMA * med
    return d, (
        f"{100 * power:.0f}% at 80% power (95% interval +-{100 * d:.0f}%; one request per point: sqrt(2) x 1.4826 x "
        f"the median |residual| {100 * med:.1f}% of {len(res)} ramp points around their fits, x (1.96 + 0.84))"
    )


def decode_points(s06: Mapping[str, Any], what: str | None = None) -> list[dict[str, Any]]:
    """Study 06's paired points (fp8/auto step ratio with its 95% t interval); raises :class:`Missing` naming
    ``what`` (the study as ``Report.label_of`` shows it; None: as its notebook is numbered)."""
    pts = [p for p in s06.get("points") or [] if p.get("ratio") is not None and p.get("ratio_ci_low") is not None]
    if not pts:
        raise Missing(f"{what or pages.label(DECODE, pages.number(DECODE))} summary has no paired points")
    return pts


def _decode_detectable(s06: Mapping[str, Any]) -> str:
    """A Study 06 summary's recorded resolution (its median and largest 95% CI half-widths, as a flat summary
    records them) as the change detected with 80% power: half-width x (t_0.975 + t_0.80) / t_0.975 on its
    ``repeats`` - 1 degrees of freedom (normal quantiles when not recorded)."""
    from fp8lab import stats

    md, mx = s06.get("min_detectable_pct"), s06.get("max_ci_half_width_pct")
    if md is None:
        return "the points' 95% CIs"
    n = s06.get("repeats") or s06.get("n")
    df = int(n) - 1 if n else None
    k = stats.detectable_effect(1.0, df) / (stats.t_quantile(df) if df else Z95)
    return (
        f"{k * md:.2f}% step time detectable at 80% power (median over the grid, largest {k * mx:.2f}%; from the "
        f"95% CI half-widths {md:.2f}% / {mx:.2f}%)"
    )


def decode_grid(rep: Report) -> list[dict[str, Any]]:
    """Study 06's paired points (``batch``, ``context_len``, the fp8/auto step ``ratio`` with ``ratio_ci_low`` /
    ``ratio_ci_high``, ``beyond_noise``): its change rows selected by field where the report has rows (in their
    order, the grid's), else its flat summary's ``points`` (:func:`decode_points`); raises :class:`Missing`."""
    rows = rep.study_rows(DECODE)
    if rows is None:
        return decode_points(rep.study(DECODE), rep.label_of(DECODE))
    cand, base = _row_pair(rep, rows, DECODE)
    pts = [
        {
            "batch": r["batch"],
            "context_len": r["context_len"],
            "ratio": r["value"],
            "ratio_ci_low": r["ci_low"],
            "ratio_ci_high": r["ci_high"],
            "beyond_noise": r["beyond_noise"],
            "ci_half_width_pct": 100 * (r["ci_high"] - r["ci_low"]) / 2,
            "n": r["n"],
            "read_from": "rows",
        }
        for r in summary_table.select(rows, study="decode", metric="decode_step_ms", kv_dtype=cand, baseline=base)
        if r["ci_low"] is not None
    ]
    if not pts:
        raise Missing(f"{rep.label_of(DECODE)} rows hold no paired points")
    return pts


def decode_detectable(rep: Report) -> str:
    """Study 06's smallest detectable effect: the change each paired point detects with 80% power (its interval on
    the log ratio, t on n - 1 df), median and largest over the grid, from its rows where the report has them, else
    from its flat summary's points (their half-widths, :func:`_decode_detectable`, where no point has an interval)."""
    from fp8lab import stats

    pts = decode_grid(rep)  # rows by field, else the flat summary's points: both carry each point's interval and n
    det = sorted(
        100
        * math.expm1(
            stats.detectable_from_interval(
                math.log(p["ratio_ci_low"]), math.log(p["ratio_ci_high"]), int(p["n"]) - 1 if p.get("n") else None
            )
        )
        for p in pts
        if p["ratio_ci_low"] and p["ratio_ci_low"] > 0
    )
    if not det:
        return _decode_detectable(rep.study(DECODE)) if rep.study_rows(DECODE) is None else "the points' 95% CIs"
    k = len(det) // 2
    med = det[k] if len(det) % 2 else (det[k - 1] + det[k]) / 2
    ns = sorted({int(p["n"]) for p in pts if p.get("n")})
    return f"{med:.2f}% step time detectable at 80% power (median over the grid, largest {det[-1]:.2f}%; " + (
        f"paired t, n={'/'.join(map(str, ns))} per point)" if ns else "normal quantiles: n not recorded)"
    )


def throughput_gain(ratio: float) -> float:
    """Throughput change (fraction) from a step-time ratio fp8/auto."""
    return 1 / ratio - 1


def physics_step_cut(claimed_cut: float, what: str) -> Finding | None:
    """A claimed cut of a decode step (fraction) above :data:`MAX_FP8_STEP_CUT` refuted by the bandwidth bound."""
    if claimed_cut <= MAX_FP8_STEP_CUT:
        return None
    return finding(
        REFUTED,
        f"{what}: a {100 * claimed_cut:.0f}% cut of the decode step (x{1 / (1 - claimed_cut):.2f} throughput)",
        "halving the bytes a step reads (the KV cache, or weights and KV alike) can at most halve a memory-bound "
        "step, and FP8 math at most doubles a compute-bound one: no model or GPU allows more than a 50% cut (x2 "
        "throughput) at the same batch, without preemption or offload in the baseline",
        {"claimed_cut": claimed_cut},
        detectable="exact (an upper bound)",
        basis=PHYSICS,
    )
