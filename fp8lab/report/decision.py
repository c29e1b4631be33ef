"""The decision box: the product's answer on the first screen of every index, computed from the records.

"Turn FP8 KV on if ..., keep auto if ...", then what FP8 buys and what it costs, each number with its 95% interval
(or "exact" for an integer count), its n and a link to the page that measured it. Missing evidence is said, never
filled in ("quality: not yet measured through the cache on a real model").

Every number is read by field from the studies' typed rows (``<stem>.rows.json``, :mod:`fp8lab.summary_table`) in
the report folder, and from two lists of Study 06's summary that have no rows (its fits and crossovers); nothing is
read from HTML. :func:`decide` returns the items, :func:`decision_html` the box.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import studies
from fp8lab.paths import TINY_MODEL_NAME
from fp8lab.report.readable import fmt_number
from fp8lab.summary_table import StudyRowsError, study_rows


def _page_of(package: str) -> str:
    """The notebook stem of the study in ``package`` (the registry's, :mod:`fp8lab.studies`)."""
    return studies.of_package(package).NAME


@dataclass(frozen=True)
class Item:
    """One line of the box: what (``capacity``), the sentence with its numbers, the page that measured it
    (``None`` when nothing did) and whether it was measured here."""

    what: str
    text: str
    link: str | None = None
    measured: bool = True


@dataclass
class Decision:
    """The rule (``turn_on_if``, ``keep_auto_if``), what FP8 buys and what it costs."""

    turn_on_if: str
    keep_auto_if: str
    buys: list[Item] = field(default_factory=list)
    costs: list[Item] = field(default_factory=list)


def _n(x: float, d: int = 0) -> str:
    return fmt_number(x, d)


def _signed(x: float, d: int = 1) -> str:
    t = _n(x, d)
    return t if t.startswith("-") or set(t) <= set("0.,") else "+" + t


def _rows(out_dir: Path, stem: str) -> list[dict[str, Any]]:
    try:
        return study_rows(out_dir, stem) or []
    except StudyRowsError:
        return []


def _summary(out_dir: Path, stem: str) -> dict[str, Any]:
    p = Path(out_dir) / f"{stem}.summary.json"
    try:
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}
    except ValueError:
        return {}


def _page(out_dir: Path, stem: str) -> str | None:
    return f"{stem}.html#verdict" if (Path(out_dir) / f"{stem}.html").is_file() else None


def _sel(rows: Sequence[Mapping[str, Any]], **f: Any) -> list[Mapping[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in f.items())]


# ----------------------------------------------------------------------------------------------- what it buys
def capacity(out_dir: Path) -> Item:
    """KV capacity x: the engines' block counts at one KV budget (Study 06, else 01, else 04), else the formula."""
    for stem in (_page_of("decode"), _page_of("serving"), _page_of("longctx")):
        rows = _rows(out_dir, stem)
        a = [r for r in _sel(rows, metric="num_blocks", kv_dtype="auto", baseline=None)]
        f = [r for r in _sel(rows, metric="num_blocks", kv_dtype="fp8", baseline=None)]
        if a and f and a[0]["value"] > 0:
            x = f[0]["value"] / a[0]["value"]
            return Item(
                "capacity",
                f"{_n(x, 2)}x the KV tokens at the same KV memory ({_n(a[0]['value'])} → {_n(f[0]['value'])} blocks, "
                f"{a[0]['setting']}; exact: integer block counts of one engine per dtype, n = 1 each, "
                f"{a[0]['device']})",
                _page(out_dir, stem),
            )
    rows = _rows(out_dir, _page_of("capacity"))
    r = _sel(rows, metric="num_blocks_formula", kv_dtype="fp8", baseline="auto")
    if r:
        return Item(
            "capacity",
            f"{_n(r[0]['value'], 2)}x the KV tokens (the formula, {r[0]['setting']}; no engine measured it here)",
            _page(out_dir, _page_of("capacity")),
        )
    return Item("capacity", "capacity: not measured in this report", None, False)


def concurrency(out_dir: Path, context: int = 32768) -> Item:
    """Requests held at once at one stated context (Study 04's engine block counts)."""
    rows = _rows(out_dir, _page_of("longctx"))
    a = {
        r["context_len"]: r["value"]
        for r in _sel(rows, metric="max_concurrency", kv_dtype="auto", baseline=None)
        if r["setting"] == "engine blocks"
    }
    f = {
        r["context_len"]: r["value"]
        for r in _sel(rows, metric="max_concurrency", kv_dtype="fp8", baseline=None)
        if r["setting"] == "engine blocks"
    }
    both = sorted(set(a) & set(f))
    if not both:  # no engine measured it: the formula of Study 00, said as such
        rows = _rows(out_dir, _page_of("capacity"))
        fa = _sel(rows, metric="max_concurrency_formula", kv_dtype="auto", baseline=None)
        ff = _sel(rows, metric="max_concurrency_formula", kv_dtype="fp8", baseline=None)
        if fa and ff:
            ra, rf = fa[-1], next((r for r in ff if r["model"] == fa[-1]["model"]), ff[-1])
            return Item(
                "concurrency",
                f"at {_n(ra['context_len'] or 0)} tokens per request on {ra['model']}: {_n(ra['value'])} → "
                f"{_n(rf['value'])} requests at once (the formula, {ra['setting']}; no engine measured it here)",
                _page(out_dir, _page_of("capacity")),
            )
        return Item("concurrency", "concurrency at a long context: not measured in this report", None, False)
    ctx = context if context in both else both[len(both) // 2]
    dev = _sel(rows, metric="max_concurrency", kv_dtype="auto")[0]["device"]
    return Item(
        "concurrency",
        f"at {_n(ctx)} tokens per request: {_n(a[ctx])} → {_n(f[ctx])} requests at once without preemption "
        f"(engine block counts, exact, n = 1 engine per dtype, {dev})",
        _page(out_dir, _page_of("longctx")),
    )


def _ratio_rows(out_dir: Path) -> list[Mapping[str, Any]]:
    return [
        r
        for r in _sel(_rows(out_dir, _page_of("decode")), metric="decode_step_ms", kv_dtype="fp8", baseline="auto")
        if r["ci_low"] is not None
    ]


def decode_step(out_dir: Path) -> Item:
    """The decode step's change (fp8 / auto - 1, %) at the shortest and longest context of each batch, paired."""
    rows = _ratio_rows(out_dir)
    if not rows:
        return Item("decode step", "decode step change: not measured in this report", None, False)
    replicated = bool(_summary(out_dir, _page_of("decode")).get("replicated"))
    unit = " engine pairs" if replicated else ""
    parts = []
    for b in sorted({r["batch"] for r in rows}):
        rb = sorted(_sel(rows, batch=b), key=lambda r: r["context_len"])
        for r in (rb[0], rb[-1]) if len(rb) > 1 else rb:
            pct = [(r[k] - 1) * 100 for k in ("value", "ci_low", "ci_high")]
            parts.append(
                f"batch {b}, {_n(r['context_len'])} tokens: {_signed(pct[0])}% "
                f"[{_signed(pct[1])}, {_signed(pct[2])}], n = {r['n']}{unit}"
            )
    over = (
        f"95% CI over fresh engines; {rows[0].get('setting') or 'decode step'}"
        if replicated
        else "95% CI of paired repetitions"
    )
    return Item(
        "decode step",
        f"decode step time, fp8 vs auto (negative: faster; {over}): " + "; ".join(parts),
        _page(out_dir, _page_of("decode")),
    )


def _primary(s: Mapping[str, Any], items: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Study 06's fits or crossovers of the arm its headline reads (a replicated run has two arms), else all."""
    arm = s.get("primary_arm")
    return [x for x in items if x.get("arm") in (None, arm)] if arm else items


def crossovers(out_dir: Path) -> tuple[Item, dict[int, tuple[float, float, float, str]]]:
    """Where fp8's step becomes the faster one, per batch (Study 06's fits), with its interval clamped at 0."""
    s = _summary(out_dir, _page_of("decode"))
    found: dict[int, tuple[float, float, float, str]] = {}
    cross = _primary(s, s.get("crossovers") or [])
    for c in cross:
        if c.get("context_len") is None or not math.isfinite(float(c["context_len"])):
            continue
        lo, hi = c.get("ci_low"), c.get("ci_high")
        found[int(c["batch"])] = (
            max(0.0, float(c["context_len"])),
            max(0.0, float(lo)) if lo is not None else math.nan,
            max(0.0, float(hi)) if hi is not None else math.nan,
            str(c.get("status", "")),
        )
    if not found:
        return Item("crossover", "crossover context: not measured in this report", None, False), found
    n = {
        int(c["batch"]): f"{c['n_engines']} engine pairs over {c.get('n_points')} contexts"
        if c.get("n_engines")
        else f"{c.get('n_points')} contexts"
        for c in cross
    }
    parts = [
        (
            f"batch {b}: at every context measured (the fits cross below the shortest)"
            if v[3] == "below_grid" and v[0] < 1
            else f"batch {b}: {_n(v[0])} tokens"
        )
        + (f" [{_n(v[1])}, {_n(v[2])}]" if math.isfinite(v[1]) else " (no interval: too few points)")
        + (" (below the shortest context measured)" if v[3] == "below_grid" and v[0] >= 1 else "")
        + f", n = {n.get(b)}"
        for b, v in sorted(found.items())
    ]
    return (
        Item(
            "crossover",
            f"fp8's step is the faster one past ({s.get('device', 'device not recorded')}): " + "; ".join(parts),
            _page(out_dir, _page_of("decode")),
        ),
        found,
    )


def saturation(out_dir: Path) -> Item:
    """Output throughput at the highest closed-loop concurrency (Study 01, paired trials)."""
    rows = [
        r
        for r in _sel(_rows(out_dir, _page_of("serving")), metric="output_tok_s", kv_dtype="fp8", baseline="auto")
        if r["ci_low"] is not None and r.get("concurrency")
    ]
    if not rows:
        return Item("throughput at saturation", "throughput at saturation: not measured in this report", None, False)
    r = max(rows, key=lambda r: r["concurrency"])
    return Item(
        "throughput at saturation",
        f"output throughput at {r['concurrency']} requests in flight ({r['setting']}): {_signed(r['value'])}% "
        f"[{_signed(r['ci_low'])}, {_signed(r['ci_high'])}], n = {r['n']} paired trials, {r['device']}",
        _page(out_dir, _page_of("serving")),
    )


def prefix_hits(out_dir: Path) -> Item:
    """The largest prefix-cache hit-rate gain of fp8 (pp) past auto's knee (Study 07), per workload."""
    rows = [
        r
        for r in _sel(_rows(out_dir, _page_of("prefix")), metric="prefix_hit_rate", kv_dtype="fp8", baseline="auto")
        if r["ci_low"] is not None
    ]
    if not rows:
        return Item("prefix hits", "prefix-cache hits past the knee: not measured in this report", None, False)
    parts = []
    for w in sorted({r["subset"] for r in rows}, key=str):
        r = max(_sel(rows, subset=w), key=lambda r: r["value"])
        parts.append(
            f"{w} at {r['concurrency']} conversations: {_signed(r['value'])} pp "
            f"[{_signed(r['ci_low'])}, {_signed(r['ci_high'])}], n = {r['n']}"
        )
    return Item(
        "prefix hits",
        "prefix-cache hit rate past auto's knee, fp8 minus auto (largest gain per workload): " + "; ".join(parts),
        _page(out_dir, _page_of("prefix")),
    )


# ---------------------------------------------------------------------------------------------- what it costs
def quality(out_dir: Path) -> Item:
    """Quality measured through the cache: a real model's rows if any report holds them, else what the shipped
    tiny model shows, said as such."""
    real = []
    for p in sorted(Path(out_dir).glob("*.rows.json")):
        for r in _rows(out_dir, p.name[: -len(".rows.json")]):
            if r["study"] == "quality" and r["baseline"] and r["model"] != TINY_MODEL_NAME and r["ci_low"] is not None:
                real.append((p.name[: -len(".rows.json")], r))
    if real:
        stem, r = real[0]
        return Item(
            "quality",
            f"quality through the cache on {r['model']} ({r['metric']}, {r['setting']}): {_signed(r['value'], 3)} "
            f"{r['unit']} [{_signed(r['ci_low'], 3)}, {_signed(r['ci_high'], 3)}], n = {r['n']}",
            _page(out_dir, stem),
        )
    s = _summary(out_dir, _page_of("quality"))
    figures = ""
    if s.get("fp8.status") == "ok" and s.get("fp8.delta_ppl_pct_ci_lo") is not None:
        figures = (
            f"perplexity {_signed(s['fp8.delta_ppl_pct'], 2)}% "
            f"[{_signed(s['fp8.delta_ppl_pct_ci_lo'], 2)}, {_signed(s['fp8.delta_ppl_pct_ci_hi'], 2)}], top-3 match "
            f"{_n(s['fp8.top3_match'], 2)} [{_n(s['fp8.top3_ci_lo'], 2)}, {_n(s['fp8.top3_ci_hi'], 2)}], "
            f"n = {s.get('n_prompts')} prompts"
        )
    if figures and s.get("model") and s.get("model") != TINY_MODEL_NAME:  # Study 03 on the user's own model
        return Item(
            "quality",
            f"quality through vLLM's FP8 cache on {s['model']} (Study 03, fp8 vs auto): {figures}",
            _page(out_dir, _page_of("quality")),
        )
    tiny = f"; on the shipped tiny model ({s.get('model')}) only: {figures}" if figures else ""
    return Item(
        "quality",
        "quality: not yet measured through the cache on a real model" + tiny,
        _page(out_dir, _page_of("quality")),
        False,
    )


def retrieval(out_dir: Path) -> tuple[Item | None, str | None]:
    """Long-context retrieval on a real model (Study 04's paired passkey differences, fp8 minus auto): the largest
    loss whose interval lies below zero, else the largest loss, with how many (length, needles) cells resolve a loss;
    ``None`` where the report has no such rows (the shipped model's passkey is no measure: it cannot retrieve). Second:
    the resolved loss the rule cites (``-10.6 points [-13.4, -7.7] at 4,096 tokens``), ``None`` when none is."""
    stem = _page_of("longctx")
    rows = [
        r
        for r in _sel(_rows(out_dir, stem), metric="passkey_accuracy_diff")
        if r["model"] != TINY_MODEL_NAME and r["ci_low"] is not None and str(r["kv_dtype"]).startswith("fp8")
    ]
    if not rows:
        return None, None
    lost = [r for r in rows if r["ci_high"] < 0]
    r = min(lost or rows, key=lambda r: r["value"])
    needles = r["setting"].split(", ")[1]
    label = r["kv_dtype"] + (" (emulated)" if r["setting"].endswith(" emulated") else "")  # Study 04's row setting
    loss = (
        f"{_signed(100 * r['value'], 1)} points [{_signed(100 * r['ci_low'], 1)}, {_signed(100 * r['ci_high'], 1)}] "
        f"at {_n(r['context_len'])} tokens"
    )
    item = Item(
        "retrieval",
        f"long-context retrieval on {r['model']} (passkey, {label} minus auto, paired prompts): {loss} with "
        f"{needles}, n = {r['n']}; a loss resolved in {len(lost)} of {len(rows)} length x needle cells",
        _page(out_dir, stem),
    )
    return item, loss if lost else None


def fixed_cost(out_dir: Path) -> Item:
    """The fixed per-step cost at short context: fp8's intercept minus auto's (Study 06's fits at batch 1)."""
    s = _summary(out_dir, _page_of("decode"))
    fits = {(f["kv_dtype"], f["batch"]): f for f in _primary(s, s.get("fits") or [])}
    a, f = fits.get(("auto", 1)), fits.get(("fp8", 1))
    if not (a and f):
        return Item("fixed cost", "fixed per-step cost: not measured in this report", None, False)
    diff = fits.get(("fp8-auto", 1))
    if diff and diff.get("n_engines"):  # a replicated run: the paired difference's own fit, its interval over engines
        d, lo, hi = (1000 * diff[k] for k in ("a_ms", "a_ms_ci_low", "a_ms_ci_high"))
        return Item(
            "fixed cost",
            f"fixed cost per decode step at batch 1 (the fits' intercepts, fp8 minus auto): {_signed(d, 0)} µs "
            f"[{_signed(lo, 0)}, {_signed(hi, 0)}] on {_n(a['a_ms'], 2)} ms, n = {diff['n_engines']} engine pairs over "
            f"{diff['n_points']} contexts (interval over engines)",
            _page(out_dir, _page_of("decode")),
        )
    d = f["a_ms"] - a["a_ms"]
    half = math.hypot(f["a_ms_ci_high"] - f["a_ms"], a["a_ms_ci_high"] - a["a_ms"])
    return Item(
        "fixed cost",
        f"fixed cost per decode step at batch 1 (the fits' intercepts): {_signed(d, 3)} ms "
        f"[{_signed(d - half, 3)}, {_signed(d + half, 3)}] on {_n(a['a_ms'], 2)} ms, n = {a['n_points']} contexts "
        "(interval: the two fits' intervals combined as independent)",
        _page(out_dir, _page_of("decode")),
    )


# ------------------------------------------------------------------------------------------------- the rule
def decide(out_dir: str | Path) -> Decision:
    """The decision for one report folder, from its records."""
    out = Path(out_dir)
    cap = capacity(out)
    cross_item, cross = crossovers(out)
    q = quality(out)
    ret, ret_loss = retrieval(out)
    fixed = fixed_cost(out)
    on = []
    cross = {b: v for b, v in cross.items() if math.isfinite(v[1])}  # a crossover without an interval is no rule
    if cross:
        on.append(
            "your decode runs past the crossover ("
            + ", ".join(
                f"batch {b} at every context measured"
                if v[3] == "below_grid" or v[0] < 1
                else f"batch {b} beyond about {_n(v[0])} tokens"
                for b, v in sorted(cross.items())
            )
            + ")"
        )
    if cap.measured:
        on.append(f"you are short of KV memory ({cap.text.split(' (')[0]})")
    keep = []
    fits = {(f["kv_dtype"], f["batch"]): f for f in _summary(out, _page_of("decode")).get("fits") or []}
    a1, f1 = fits.get(("auto", 1)), fits.get(("fp8", 1))
    resolved = bool(a1 and f1 and (f1["a_ms_ci_low"] > a1["a_ms_ci_high"]))  # fp8's fixed cost above auto's
    if fixed.measured and resolved:
        keep.append(
            f"your contexts are short and batches small (fp8 costs {fixed.text.split(': ', 1)[1].split(' on ')[0]} per step)"
        )
    if not q.measured:
        keep.append("you cannot accept an unmeasured quality change on your model (not yet measured through the cache)")
    else:
        keep.append(f"you cannot accept the quality cost measured here ({q.text.split(': ', 1)[-1]})")
    if ret_loss is not None:
        keep.append(f"your requests retrieve facts from long contexts ({ret_loss})")
    return Decision(
        turn_on_if=" or ".join(on)
        or "not decidable from this report: no capacity measurement and no crossover with an interval",
        keep_auto_if="; or ".join(keep) or "the measured costs above matter to you",
        buys=[cap, concurrency(out), decode_step(out), cross_item, saturation(out), prefix_hits(out)],
        costs=[q, *([ret] if ret is not None else []), fixed],
    )


def _li(it: Item) -> str:
    link = f' <a href="{html.escape(it.link)}">(measured here)</a>' if it.link and it.measured else ""
    if it.link and not it.measured:
        link = f' <a href="{html.escape(it.link)}">(the closest evidence)</a>'
    cls = "" if it.measured else ' class="not-measured"'
    return f"<li{cls}><b>{html.escape(it.what)}</b>: {html.escape(it.text)}{link}</li>"


def decision_html(out_dir: str | Path) -> str:
    """The decision box (``<section id="decision">``) for an index page."""
    d = decide(out_dir)
    return (
        '<section id="decision"><h2>Decision: FP8 KV cache or auto?</h2>'
        f"<p><b>Turn FP8 KV on if</b> {html.escape(d.turn_on_if)}.</p>"
        f"<p><b>Keep auto if</b> {html.escape(d.keep_auto_if)}.</p>"
        "<h3>What FP8 buys</h3><ul>" + "".join(_li(i) for i in d.buys) + "</ul>"
        "<h3>What it costs</h3><ul>" + "".join(_li(i) for i in d.costs) + "</ul>"
        "<p><small>Each number: its 95% interval in brackets and its n, from the study's records in this folder; "
        "'exact' marks integer block counts. The claims audit follows.</small></p></section>"
    )
