"""``fp8lab advise``: per KV dtype, what a model on a GPU would get for a workload nobody ran, from measured fits.

For a model config, a GPU (memory and bandwidth, or a preset) and a workload (context and batch, or a request mix),
per kv dtype:

- **capacity and concurrency**: the formula (:func:`fp8lab.kvmath.plan_capacity`: the KV budget after the weights,
  blocks, tokens, and sequences of the context held at once);
- **the decode step**: the measured fits of the reference report's Study 06 (``reports/h200``: step time = fixed
  cost + slope x context, per dtype and batch, least squares over the measured contexts, :func:`fp8lab.stats.ols`),
  carried to another batch by interpolation (fixed cost linear in the batch, per-sequence slope linear in log
  batch) and to another model or GPU through the bandwidth bound (:mod:`fp8lab.roofline`): the fixed cost is split
  into the time to read the weights once at the measured bandwidth, which scales with the weight bytes per step
  over the bandwidth, and the rest (kernel launches, sampling, the scheduler: per layer), which scales with the
  number of layers; the slope scales with the KV bytes per token over the bandwidth. The 95% interval is the
  fit's (intercept, slope and their covariance); a warning says when a prediction leaves the measured contexts or
  batches, or the reference's model or GPU;
- **whether FP8 pays**: the step ratio with its interval, and whether auto can hold the batch at all.

:func:`validate` checks the step model on held-out measured points of the reference (contexts left out of a fit,
one at a time; the longest context; a whole batch) and writes ``advise_validation.csv`` / ``.md`` with every
prediction error: ``python -m fp8lab.advise --validate reports/h200/decode-2026-11``.

GPU presets: the H200 is the reference's own (141 GiB as Study 00 counts it; the copy bandwidth Study 06 measured);
another preset's bandwidth is its data-sheet figure times the H200's measured / data-sheet ratio (4,233 / 4,800).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fp8lab import kvmath, roofline, studies
from fp8lab.errors import SpecError
from fp8lab.paths import REPO_ROOT

if TYPE_CHECKING:  # fp8lab.stats imports numpy and pandas: loaded where a fit is made, so `fp8lab estimate` stays light
    from fp8lab.stats import LinearFit

REFERENCE = REPO_ROOT / "reports" / "h200" / "decode-2026-11"


def _decode_page() -> str:
    """The decode-speed study's page stem (its own ``NAME``, through the registry), whose fits advise reads; asked
    when advise runs, so building the CLI's parser loads no study."""
    return studies.of_package("decode").NAME


H200_SHEET_GBS = 4800.0
#: name -> (memory GiB, data-sheet bandwidth GB/s); the H200's bandwidth is replaced by the reference's measured one.
GPU_PRESETS: dict[str, tuple[float, float]] = {
    "h200": (141.0, H200_SHEET_GBS),
    "h100": (80.0, 3350.0),
    "h100-nvl": (94.0, 3900.0),
    "a100-80gb": (80.0, 2039.0),
    "l40s": (48.0, 864.0),
}
DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class Fit:
    """One measured line: step ms = a + b x context tokens, for one dtype and batch (from ``n`` contexts)."""

    kv_dtype: str
    batch: int
    line: LinearFit
    contexts: tuple[int, ...]


@dataclass
class Reference:
    """The measured fits and what they were measured on (model layout, weight bytes, bandwidth)."""

    fits: dict[tuple[str, int], Fit]
    points: list[dict[str, Any]]
    model: str
    device: str
    bandwidth_gbs: float
    weight_bytes: float
    kv_bytes: dict[str, int]
    source: str
    layers: int = 0

    @property
    def weight_read_ms(self) -> float:
        """The part of every fixed cost that reads the weights once at the reference's measured bandwidth (ms)."""
        return self.weight_bytes / (self.bandwidth_gbs * 1e9) * 1e3

    @property
    def batches(self) -> list[int]:
        return sorted({b for _, b in self.fits})


def fit_points(points: Sequence[dict[str, Any]], kv_dtype: str, batch: int) -> Fit:
    """The least-squares line of one dtype and batch over the given Study 06 points."""
    pts = sorted((p for p in points if p["batch"] == batch), key=lambda p: p["context_len"])
    x = [float(p["context_len"]) for p in pts]
    y = [float(p[f"{kv_dtype}_step_ms"]) for p in pts]
    from fp8lab.stats import ols

    return Fit(kv_dtype, batch, ols(x, y), tuple(int(p["context_len"]) for p in pts))


def load_reference(report_dir: str | Path = REFERENCE, points: Sequence[dict[str, Any]] | None = None) -> Reference:
    """The reference's fits from its Study 06 summary (``points``: a subset of its points to fit on instead)."""
    d = Path(report_dir).absolute()
    path = d / f"{_decode_page()}.summary.json"
    if not path.is_file():
        raise SpecError(
            "advise", "reference", str(report_dir), f"a report folder holding {_decode_page()}.summary.json"
        )
    s = json.loads(path.read_text(encoding="utf-8"))
    pts = [p for p in (points if points is not None else s["points"]) if p.get("full_batch", True)]
    fits = {}
    for dt in DTYPES:
        for b in sorted({p["batch"] for p in pts}):
            if len({p["context_len"] for p in pts if p["batch"] == b}) >= 3:
                fits[(dt, b)] = fit_points(pts, dt, b)
    cfg = REPO_ROOT / "data" / "configs" / str(s["model"])
    return Reference(
        fits=fits,
        points=list(s["points"]),
        model=str(s["model"]),
        device=str(s.get("device")),
        bandwidth_gbs=float(s["bandwidth_gbs"]),
        weight_bytes=float(roofline.weight_bytes_per_step(cfg)),
        kv_bytes={dt: kvmath.kv_bytes_per_token(cfg, dt) for dt in DTYPES},
        layers=int(kvmath.load_layout(cfg).num_layers),
        source=str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path.name),
    )


@dataclass(frozen=True)
class Step:
    """A predicted decode step: ms, its 95% interval, and the warnings that apply."""

    ms: float
    lo: float
    hi: float
    warnings: tuple[str, ...] = ()


def _line_at(ref: Reference, kv_dtype: str, batch: int) -> tuple[list[tuple[float, Fit]], list[str]]:
    """The fits a batch is read from, with weights: the batch itself, or its two measured neighbours."""
    bs = [b for b in ref.batches if (kv_dtype, b) in ref.fits]
    if batch in bs:
        return [(1.0, ref.fits[(kv_dtype, batch)])], []
    if batch < bs[0] or batch > bs[-1]:
        near = bs[0] if batch < bs[0] else bs[-1]
        return [(1.0, ref.fits[(kv_dtype, near)])], [
            f"batch {batch} is outside the measured batches {bs}: extrapolated from batch {near}"
        ]
    hi = min(b for b in bs if b > batch)
    lo = max(b for b in bs if b < batch)
    w = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return [(1.0 - w, ref.fits[(kv_dtype, lo)]), (w, ref.fits[(kv_dtype, hi)])], []


def predict_step(
    ref: Reference,
    kv_dtype: str,
    batch: int,
    context: float,
    weight_bytes: float | None = None,
    kv_bytes: float | None = None,
    bandwidth_gbs: float | None = None,
    layers: int | None = None,
) -> Step:
    """The decode step (ms) of ``batch`` sequences of ``context`` tokens: the reference's fits, interpolated in
    batch, carried through the bandwidth bound to another model (``weight_bytes``, ``kv_bytes`` per token of
    this dtype, ``layers``) or GPU (``bandwidth_gbs``); None for any of them: the reference's.

    A fit's fixed cost ``a`` is the weights' read at the measured bandwidth (:attr:`Reference.weight_read_ms`,
    scaled by weight bytes over bandwidth) plus the rest (scaled by the number of layers); its variance is the
    rest's, as the read time is arithmetic."""
    parts, warns = _line_at(ref, kv_dtype, batch)
    w_scale = ((weight_bytes or ref.weight_bytes) / ref.weight_bytes) * (
        ref.bandwidth_gbs / (bandwidth_gbs or ref.bandwidth_gbs)
    )
    l_scale = (layers / ref.layers) if layers and ref.layers else 1.0
    k_scale = ((kv_bytes or ref.kv_bytes[kv_dtype]) / ref.kv_bytes[kv_dtype]) * (
        ref.bandwidth_gbs / (bandwidth_gbs or ref.bandwidth_gbs)
    )
    ms = var = 0.0
    df = 10**6
    for w, f in parts:
        # fixed cost: interpolated in batch; slope per sequence (b / batch) interpolated, times this batch
        slope_scale = batch / f.batch
        x = k_scale * slope_scale * context
        read = min(ref.weight_read_ms, f.line.a)
        ms += w * (w_scale * read + l_scale * (f.line.a - read) + x * f.line.b)
        var += w**2 * (l_scale**2 * f.line.var_a + x**2 * f.line.var_b + 2 * l_scale * x * f.line.cov_ab)
        df = min(df, f.line.df)
        if context > max(f.contexts) * 1.001 or context < min(f.contexts) * 0.999:
            warns.append(
                f"{_n(context)} tokens is outside batch {f.batch}'s measured contexts "
                f"({_n(min(f.contexts))} to {_n(max(f.contexts))}): extrapolated"
            )
    if (
        weight_bytes
        and abs(weight_bytes / ref.weight_bytes - 1) > 0.01
        or (kv_bytes and abs(kv_bytes / ref.kv_bytes[kv_dtype] - 1) > 0.01)
    ):
        warns.append(
            f"another model than the reference's {ref.model}: carried through the bandwidth bound and its layer "
            "count (validated on one other measured shape: see the validation table)"
        )
    if bandwidth_gbs and abs(bandwidth_gbs / ref.bandwidth_gbs - 1) > 0.01:
        warns.append(
            f"another GPU than the reference's {ref.device}: the weights' read and the KV slope scaled by bandwidth, "
            "the per-layer rest kept; not validated"
        )
    from fp8lab.stats import t_quantile

    h = t_quantile(df) * math.sqrt(max(var, 0.0)) if df >= 1 else math.inf
    return Step(ms, ms - h, ms + h, tuple(dict.fromkeys(warns)))


def _n(x: float, d: int = 0) -> str:
    from fp8lab.report.readable import fmt_number

    return fmt_number(x, d)


# ------------------------------------------------------------------------------------------------ the advice
@dataclass
class Advice:
    """Per dtype: capacity, concurrency and the predicted step; the verdict and its warnings."""

    model: str
    gpu: str
    memory_gib: float
    bandwidth_gbs: float
    batch: int
    context: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    verdict: str = ""
    warnings: list[str] = field(default_factory=list)


def parse_mix(text: str) -> list[tuple[int, float]]:
    """``"8192:6,1024:4"`` -> [(8192, 6.0), (1024, 4.0)]: contexts (tokens) and their shares of the requests."""
    out = []
    for part in str(text).split(","):
        ctx, _, share = part.partition(":")
        try:
            c, s = int(ctx), float(share or 1)
        except ValueError as exc:
            raise SpecError("advise", "mix", text, "context:share pairs, comma separated, e.g. 8192:6,1024:4") from exc
        if c < 1 or s <= 0:
            raise SpecError("advise", "mix", text, "contexts of 1 token or more with positive shares")
        out.append((c, s))
    return out


def gpu_spec(
    gpu: str | None, memory_gib: float | None, bandwidth_gbs: float | None, ref: Reference
) -> tuple[str, float, float]:
    """(name, memory GiB, bandwidth GB/s) from a preset and/or explicit figures."""
    if gpu is not None:
        key = gpu.lower()
        if key not in GPU_PRESETS:
            raise SpecError(
                "advise", "gpu", gpu, " | ".join(GPU_PRESETS) + " (or give --memory-gib and --bandwidth-gbs)"
            )
        mem, sheet = GPU_PRESETS[key]
        bw = ref.bandwidth_gbs if key == "h200" else sheet * ref.bandwidth_gbs / H200_SHEET_GBS
        return key, memory_gib or mem, bandwidth_gbs or bw
    if not memory_gib or not bandwidth_gbs or memory_gib <= 0 or bandwidth_gbs <= 0:
        raise SpecError("advise", "gpu", gpu, "a preset, or both --memory-gib and --bandwidth-gbs as positive numbers")
    return "custom", float(memory_gib), float(bandwidth_gbs)


def advise(
    model: str | Path,
    gpu: str | None = "h200",
    memory_gib: float | None = None,
    bandwidth_gbs: float | None = None,
    context: int | None = 8192,
    batch: int = 8,
    mix: Sequence[tuple[int, float]] | None = None,
    reference: str | Path = REFERENCE,
    gpu_memory_utilization: float = 0.9,
    overhead_gib: float = 4.0,
    weight_dtype: str = "auto",
) -> Advice:
    """The advice for one model, GPU and workload (see the module docstring)."""
    if not isinstance(batch, int) or batch < 1:
        raise SpecError("advise", "batch", batch, "an integer, 1 or more")
    ref = load_reference(reference)
    name, mem, bw = gpu_spec(gpu, memory_gib, bandwidth_gbs, ref)
    lay = kvmath.load_layout(model)
    if mix:
        total = sum(s for _, s in mix)
        ctx = sum(c * s for c, s in mix) / total  # a step reads every sequence's KV: the mean context counts
    elif context and context >= 1:
        ctx = float(context)
    else:
        raise SpecError("advise", "context", context, "a context of 1 token or more, or a request mix")
    w = roofline.weight_bytes_per_step(lay, weight_dtype)
    adv = Advice(str(getattr(lay, "name", model)), name, mem, bw, batch, ctx)
    cap = kvmath.plan_capacity(
        lay, mem, DTYPES, int(math.ceil(ctx)), gpu_memory_utilization=gpu_memory_utilization,
        weight_dtype=weight_dtype, overhead_gib=overhead_gib,
    )  # fmt: skip
    steps = {}
    for row in cap:
        dt = row["kv_dtype"]
        k = kvmath.kv_bytes_per_token(lay, dt)
        st = predict_step(ref, dt, batch, ctx, w, k, bw, lay.num_layers)
        steps[dt] = st
        adv.rows.append(
            {
                "kv_dtype": dt,
                "kv_bytes_per_token": k,
                "kv_budget_gib": row["kv_budget_gib"],
                "capacity_tokens": row["capacity_tokens"],
                "max_concurrency": row["max_concurrency"],
                "holds_batch": row["max_concurrency"] >= batch,
                "step_ms": st.ms,
                "step_ms_ci": (st.lo, st.hi),
                "tok_s_per_sequence": 1000.0 / st.ms if st.ms > 0 else math.nan,
                "tok_s_total": batch * 1000.0 / st.ms if st.ms > 0 else math.nan,
            }
        )
        adv.warnings.extend(x for x in st.warnings if x not in adv.warnings)
    a, f = steps["auto"], steps["fp8"]
    ra, rf = adv.rows
    ratio = f.ms / a.ms
    # interval of the ratio from the two predictions' half-widths (independent fits), delta method
    rel = math.hypot((a.hi - a.ms) / a.ms, (f.hi - f.ms) / f.ms)
    lo, hi = ratio * (1 - rel), ratio * (1 + rel)
    change = f"fp8's step {(ratio - 1) * 100:+.1f}% [{(lo - 1) * 100:+.1f}, {(hi - 1) * 100:+.1f}] against auto"
    if not ra["holds_batch"] and rf["holds_batch"]:
        adv.verdict = (
            f"FP8 pays: auto holds {ra['max_concurrency']} sequences of {_n(ctx)} tokens, fewer than the batch of "
            f"{batch}; fp8 holds {rf['max_concurrency']}. {change}."
        )
    elif ra["kv_budget_gib"] <= 0:
        adv.verdict = (
            f"The weights do not leave any KV memory on this GPU ({mem:g} GiB x {gpu_memory_utilization:g}, "
            f"{overhead_gib:g} GiB overhead): no dtype serves it; use tensor parallelism or a larger GPU."
        )
    elif not rf["holds_batch"]:
        adv.verdict = (
            f"Neither dtype holds {batch} sequences of {_n(ctx)} tokens on this GPU (fp8: {rf['max_concurrency']})."
        )
    elif hi < 1:
        adv.verdict = f"FP8 pays: {change} (faster), and {rf['capacity_tokens'] / max(ra['capacity_tokens'], 1):.2f}x the KV capacity."
    elif lo > 1:
        adv.verdict = (
            f"FP8 costs speed here: {change} (slower); it pays only if you need its capacity "
            f"({rf['max_concurrency']} vs {ra['max_concurrency']} sequences at this context)."
        )
    else:
        adv.verdict = (
            f"No speed difference resolved ({change}); FP8 buys capacity "
            f"({rf['max_concurrency']} vs {ra['max_concurrency']} sequences at this context)."
        )
    return adv


def format_advice(adv: Advice) -> str:
    """The advice as plain text: one line per dtype, the verdict, the warnings."""
    lines = [
        f"{adv.model} on {adv.gpu} ({adv.memory_gib:g} GiB, {_n(adv.bandwidth_gbs)} GB/s), batch {adv.batch}, "
        f"context {_n(adv.context)} tokens:",
    ]
    for r in adv.rows:
        lo, hi = r["step_ms_ci"]
        lines.append(
            f"  {r['kv_dtype']:>4}: {_n(r['kv_bytes_per_token'])} B/token, KV {r['kv_budget_gib']:.1f} GiB = "
            f"{_n(r['capacity_tokens'])} tokens, {_n(r['max_concurrency'])} sequences at this context; decode step "
            f"{r['step_ms']:.2f} ms [{lo:.2f}, {hi:.2f}] -> {_n(r['tok_s_total'])} tokens/s"
        )
    lines.append(adv.verdict)
    lines += [f"warning: {w}" for w in adv.warnings]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- validation
def _row(held: str, p: dict[str, Any], dt: str, st: Step) -> dict[str, Any]:
    """One validation row: measured point ``p`` of dtype ``dt`` against its prediction ``st``, the error in %."""
    meas = float(p[f"{dt}_step_ms"])
    return {
        "held_out": held,
        "kv_dtype": dt,
        "batch": int(p["batch"]),
        "context_len": int(p["context_len"]),
        "measured_ms": meas,
        "predicted_ms": st.ms,
        "ci_low_ms": st.lo,
        "ci_high_ms": st.hi,
        "error_pct": (st.ms / meas - 1) * 100,
        "within_ci": bool(st.lo <= meas <= st.hi),
        "extrapolated": bool(st.warnings),
    }


def validate(reference: str | Path = REFERENCE) -> list[dict[str, Any]]:
    """Predictions of held-out measured points of the reference, one row each, with the error in %:

    - ``context (interior)``: each context strictly inside a batch's measured range, left out of that batch's
      fit (the other contexts fit the line), predicted;
    - ``context (longest)``: each batch's longest context left out, predicted by extrapolating the line;
    - ``batch``: each batch strictly between two measured ones left out entirely, predicted by interpolating
      its neighbours' fits (at the contexts both neighbours measured, or the nearer extrapolated)."""
    ref = load_reference(reference)
    pts = [p for p in ref.points if p.get("full_batch", True)]
    out: list[dict[str, Any]] = []

    for b in ref.batches:
        ctxs = sorted({p["context_len"] for p in pts if p["batch"] == b})
        for i, c in enumerate(ctxs):
            interior = 0 < i < len(ctxs) - 1
            if not interior and i != len(ctxs) - 1:
                continue
            rest = [p for p in pts if not (p["batch"] == b and p["context_len"] == c)]
            if len({p["context_len"] for p in rest if p["batch"] == b}) < 3:
                continue
            sub = load_reference(reference, rest)
            p = next(p for p in pts if p["batch"] == b and p["context_len"] == c)
            for dt in DTYPES:
                held = "context (interior)" if interior else "context (longest)"
                out.append(_row(held, p, dt, predict_step(sub, dt, b, float(c))))
    for b in ref.batches[1:-1]:
        rest = [p for p in pts if p["batch"] != b]
        sub = load_reference(reference, rest)
        for p in (p for p in pts if p["batch"] == b):
            for dt in DTYPES:
                out.append(_row("batch", p, dt, predict_step(sub, dt, b, float(p["context_len"]))))
    return out


def validate_shape(reference: str | Path, other: str | Path, model: str | Path | None = None) -> list[dict[str, Any]]:
    """Predictions of another model shape's measured Study 06 points (``other``: a report folder holding its
    ``06_decode_speed.summary.json``; ``model``: its config, folder or name, default the summary's own) from the
    reference's fits alone, carried through the bandwidth bound by that model's weight bytes and KV bytes per token:
    held out ``another model (<name>)``, one row per point and dtype, the error in %."""
    from fp8lab.specs import resolve_model

    ref = load_reference(reference)
    path = Path(other) / f"{_decode_page()}.summary.json"
    if not path.is_file():
        raise SpecError("advise", "shape", str(other), f"a report folder holding {_decode_page()}.summary.json")
    s = json.loads(path.read_text(encoding="utf-8"))
    name = str(model or s["model"])
    cfg = REPO_ROOT / "data" / "configs" / name
    lay = kvmath.load_layout(cfg if cfg.is_dir() else resolve_model(name))
    w = roofline.weight_bytes_per_step(lay)
    out = []
    for p in (p for p in s["points"] if p.get("full_batch", True)):
        for dt in DTYPES:
            if p.get(f"{dt}_step_ms") is None:
                continue
            k = kvmath.kv_bytes_per_token(lay, dt)
            st = predict_step(ref, dt, int(p["batch"]), float(p["context_len"]), w, k, layers=lay.num_layers)
            out.append(_row(f"another model ({Path(name).name})", p, dt, st))
    return out


def validation_markdown(rows: Sequence[dict[str, Any]], ref: Reference, shapes: Sequence[str] = ()) -> str:
    """The validation table with a summary line per held-out kind (largest and median absolute error); ``shapes``
    as given to :func:`write_validation` (named in the command line the file says made it)."""
    import statistics

    command = " ".join(
        ["python -m fp8lab.advise --validate", str(Path(ref.source).parent), *(f"--shape {s}" for s in shapes)]
    )
    lines = [
        f"# fp8lab advise: held-out validation on {ref.model}, {ref.device} ({ref.source})",
        "",
        f"Generated by `{command}` (fp8lab.advise.validate). Each row: one "
        "measured point of Study 06 (mean of its repetitions) left out of the fits it is predicted from. Target: "
        "within 5% on held-out contexts and batches; within 10% on another model shape (`--shape`: that model's "
        "own Study 06 points, predicted from the reference's fits through its weight bytes, layer count and KV "
        "bytes). The 95% interval carries the fits' uncertainty only, not the engine-to-engine spread (about 0.5% "
        "of a step on the H200, Study 06 replicated) nor the step model's form.",
        "",
        "| held out | points | largest abs error (%) | median abs error (%) | within the 95% interval |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind in dict.fromkeys(r["held_out"] for r in rows):
        rs = [r for r in rows if r["held_out"] == kind]
        errs = [abs(r["error_pct"]) for r in rs]
        lines.append(
            f"| {kind} | {len(rs)} | {max(errs):.2f} | {statistics.median(errs):.2f} | "
            f"{sum(r['within_ci'] for r in rs)} of {len(rs)} |"
        )
    worst = sorted(rows, key=lambda r: -abs(r["error_pct"]))[:5]
    lines += [
        "",
        "Every prediction and its error: `advise_validation.csv` beside this file. The five largest errors:",
        "",
        "| held out | kv dtype | batch | context (tokens) | measured (ms) | predicted (ms) | 95% interval (ms) | error (%) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in worst:
        lines.append(
            f"| {r['held_out']} | {r['kv_dtype']} | {r['batch']} | {r['context_len']:,} | {r['measured_ms']:.3f} | "
            f"{r['predicted_ms']:.3f} | {r['ci_low_ms']:.3f} to {r['ci_high_ms']:.3f} | {r['error_pct']:+.2f} |"
        )
    return "\n".join(lines) + "\n"


def write_validation(
    reference: str | Path = REFERENCE, out_dir: str | Path | None = None, shapes: Sequence[str] = ()
) -> tuple[Path, Path]:
    """Write ``advise_validation.csv`` and ``.md`` into ``out_dir`` (default: the reference folder); ``shapes``:
    report folders of other models' Study 06 runs (``DIR`` or ``DIR=MODEL``) added as :func:`validate_shape` rows."""
    import csv

    rows = validate(reference)
    for sh in shapes:
        folder, _, model = sh.partition("=")
        rows += validate_shape(reference, folder, model or None)
    out = Path(out_dir or reference)
    csv_path, md_path = out / "advise_validation.csv", out / "advise_validation.md"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    md_path.write_text(validation_markdown(rows, load_reference(reference), shapes), encoding="utf-8")
    return csv_path, md_path


# ---------------------------------------------------------------------------------------------------- the CLI
def add_advise_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``advise`` on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "advise",
        help="per KV dtype: capacity, concurrency and the predicted decode step for a model, GPU and workload",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("model", nargs="?", help="a config.json, a model folder holding one, or a name in data/configs")
    p.add_argument(
        "--gpu", default=None, help=f"a preset: {' | '.join(GPU_PRESETS)} (default h200 unless --memory-gib)"
    )
    p.add_argument("--memory-gib", type=float, default=None, help="GPU memory in GiB (with --bandwidth-gbs)")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="GPU memory bandwidth in GB/s")
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence (default 8192)")
    p.add_argument("--batch", type=int, default=8, help="sequences decoded together (default 8)")
    p.add_argument("--mix", default=None, help="a request mix instead of --context: context:share,... (8192:6,1024:4)")
    p.add_argument("--reference", default=str(REFERENCE), help="the report folder whose Study 06 fits are used")
    p.add_argument("--validate", action="store_true", help="write advise_validation.csv/.md into --reference")
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        help="with --validate: another model's report folder (DIR or DIR=MODEL) whose Study 06 points are predicted",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_advise)
    return p


def run_advise(args: argparse.Namespace) -> int:
    try:
        if args.validate:
            for path in write_validation(args.reference, shapes=args.shape):
                print(f"wrote {path}")
            return 0
        if not args.model:
            raise SpecError("advise", "model", None, "a config.json, a model folder or a name in data/configs")
        gpu = args.gpu if args.gpu or args.memory_gib else "h200"
        adv = advise(
            args.model, gpu, args.memory_gib, args.bandwidth_gbs, args.context, args.batch,
            parse_mix(args.mix) if args.mix else None, args.reference,
        )  # fmt: skip
    except SpecError as exc:
        print(f"fp8lab advise: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(adv.__dict__, indent=1, default=str))
    else:
        print(format_advice(adv))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp8lab.advise")
    sub = parser.add_subparsers(dest="cmd")
    add_advise_parser(sub)
    args = parser.parse_args(["advise", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
