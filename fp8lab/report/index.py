"""The report folder's front pages: ``index.html`` (:func:`write_index`: the claims audit's headline and table,
then one block per study with its key numbers, :func:`key_numbers`: by field from the study's typed rows where the
folder has them, else from its flat summary, and the provenance of its engine runs,
:func:`runs_provenance`) and :func:`compare_summaries` (one notebook's key numbers from several report folders side
by side). Split out of :mod:`fp8lab.report.run` (issue 16), which re-exports every name here (``report.write_index``)."""

from __future__ import annotations

import html
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fp8lab import summary_table as st
from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.report.decision import decision_html
from fp8lab.report.htmlexport import notebook_title
from fp8lab.report.readable import tidy_page
from fp8lab.summary_table import StudyRowsError, study_rows

#: Summary key under which the claims audit (notebook 05) records its rows; ``write_index`` renders them.
AUDIT_ROWS_KEY = "audit_rows"


def audit_html(rows: Sequence[dict[str, Any]], notebook_html: str | None = None) -> str:
    """The claims audit as an HTML table: claim, verdict, what was measured, links to the evidence."""
    body = []
    for r in rows:
        links = " ".join(
            f'<a href="{html.escape(x["href"])}">{html.escape(x["label"])}</a>' for x in r.get("links") or []
        )
        on = f"<br><small>{html.escape(r['on_what'])}</small>" if r.get("on_what") else ""
        for label, key in (
            ("setting", "setting"),
            ("setting match", "match"),
            ("smallest detectable effect", "detectable"),
            ("basis", "basis"),
        ):
            if r.get(key):
                on += f"<br><small>{label}: {html.escape(str(r[key]))}</small>"
        verdict = str(r.get("verdict", ""))
        body.append(
            f"<tr><td>{html.escape(str(r.get('id', '')))}</td><td>{html.escape(str(r.get('claim', '')))}"
            f"<br><small>{html.escape(str(r.get('source', '')))}</small></td>"
            f"<td class='v-{verdict.replace(' ', '-')}'>{html.escape(verdict)}</td>"
            f"<td>{html.escape(str(r.get('measured', '')))}{on}</td><td>{links}</td></tr>"
        )
    more = (
        f" Each verdict comes from a rule written next to it, over the recorded numbers: see "
        f'<a href="{html.escape(notebook_html)}">the audit notebook</a>.'
        if notebook_html
        else ""
    )
    return (
        f"<h2>Claims audit</h2><p>What the field reports claimed, and what these records say.{more}</p>"
        "<table class='audit'><tr><th>#</th><th>claim (source)</th><th>verdict</th><th>measured</th>"
        f"<th>evidence</th></tr>{''.join(body)}</table>"
    )


# ------------------------------------------------------------------------------------------------- index
#: Summary key of the claims audit's headline: a list of sentences, shown first on the index.
HEADLINE_KEY = "headline"


def fmt_number(v: Any, digits: int = 3) -> str:
    """A number for a reader: ints with thousands separators, floats to ``digits`` significant digits (no
    ``1.3607525825500488``), ``None``/NaN as "n/a", booleans as yes/no."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        mag = math.floor(math.log10(abs(v)))
        if mag >= digits - 1:
            return f"{round(v):,}"
        return f"{v:.{max(digits - 1 - mag, 0)}f}"
    return str(v)


def _get(s: dict[str, Any], key: str) -> Any:
    """``s[key]``, else a dotted path into nested dicts (``bytes_per_token.fp8``); ``None`` when absent."""
    if key in s:
        return s[key]
    cur: Any = s
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _pair(s: dict[str, Any], a: str, b: str, unit: str, digits: int = 3) -> str | None:
    va, vb = _get(s, a), _get(s, b)
    if va is None and vb is None:
        return None
    return f"{fmt_number(va, digits)} → {fmt_number(vb, digits)} {unit}".strip()


def _ci(s: dict[str, Any], est: str, lo: str, hi: str, unit: str = "", digits: int = 3) -> str | None:
    if _get(s, est) is None:
        return None
    u = f" {unit}" if unit else ""
    if _get(s, lo) is None or _get(s, hi) is None:
        return f"{fmt_number(_get(s, est), digits)}{u}"
    return (
        f"{fmt_number(_get(s, est), digits)}{u} (95% CI {fmt_number(_get(s, lo), digits)} to "
        f"{fmt_number(_get(s, hi), digits)})"
    )


def key_numbers(stem: str, s: dict[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> list[tuple[str, str]]:
    """A study's few key numbers for the index, each ``(label with its unit, rounded value)``. With ``rows`` (the
    study's typed rows, :func:`study_rows`) they are read from the rows by field (:func:`key_numbers_from_rows`),
    and a number the rows lack is left out, never looked up in the summary instead; without (a report folder
    rendered before the rows existed) from the flat summary ``s`` by its keys (:func:`key_numbers_from_summary`).
    Missing values are left out."""
    if rows is not None:
        return key_numbers_from_rows(stem, rows, s)
    return key_numbers_from_summary(stem, s)


def key_numbers_from_summary(stem: str, s: dict[str, Any]) -> list[tuple[str, str]]:
    """:func:`key_numbers` from a study's flat summary, by key names (a report without rows files). Studies fp8lab
    does not know get their first scalar numbers."""
    rows: list[tuple[str, str | None]] = []
    if stem.startswith("00_"):
        rows.append(
            (
                "KV per token, auto → fp8 (" + str(s.get("model", "")) + ")",
                _pair(s, "bytes_per_token.auto", "bytes_per_token.fp8", "B/token"),
            )
        )
        rec = s.get("records") or {}
        if rec.get("compared"):
            rows.append(
                (
                    "engines on record whose block count the formula predicted exactly",
                    f"{rec.get('exact')} of {rec.get('compared')} ({', '.join(rec.get('devices') or []) or 'device not recorded'})",
                )
            )
        if s.get("prediction_exact") is not None:
            rows.append(("engines started by this run: formula exact", fmt_number(s.get("prediction_exact"))))
        elif s.get("measured"):
            rows.append(("engines started by this run", "none (predictions only)"))
    elif stem.startswith("01_"):
        rows += [
            ("KV capacity, auto → fp8", _pair(s, "capacity_tokens_auto", "capacity_tokens_fp8", "tokens")),
            (
                "fp8 vs auto output throughput at concurrency " + fmt_number(s.get("headline_concurrency")),
                _ci(s, "throughput_delta_pct", "throughput_delta_lo_pct", "throughput_delta_hi_pct", "%")
                + (
                    f": {s['throughput_delta_label']}"
                    if s.get("throughput_delta_label") and _get(s, "throughput_delta_pct") is not None
                    else ""
                )
                if _get(s, "throughput_delta_pct") is not None
                else None,
            ),
            (
                "noise floor (same config between trials)",
                None if s.get("noise_floor_pct") is None else f"{fmt_number(s.get('noise_floor_pct'), 2)} %",
            ),
            ("ITL p50, auto → fp8", _pair(s, "itl_p50_ms_auto", "itl_p50_ms_fp8", "ms")),
            ("peak device memory, auto → fp8", _pair(s, "mem_peak_gib_auto", "mem_peak_gib_fp8", "GiB", 4)),
            ("trials", fmt_number(s.get("trials")) if s.get("trials") is not None else None),
        ]
    elif stem.startswith("02_"):
        rows += [
            ("the 32-token claim holds", fmt_number(s.get("claim.holds")) if "claim.holds" in s else None),
            (
                "calibration tokens until per-head scales stay within the claim's threshold",
                fmt_number(s.get("tokens_to_threshold.attn_head")) if "tokens_to_threshold.attn_head" in s else None,
            ),
            (
                "largest |Δ logprob|, per-head vs per-tensor scales",
                fmt_number(s.get("head_reduction.max_abs_dlogprob"), 2)
                if "head_reduction.max_abs_dlogprob" in s
                else None,
            ),
        ]
    elif stem.startswith("03_"):
        rows += [
            (
                "fp8: top-3 token match (reports' protocol)",
                _ci(s, "fp8.top3_match", "fp8.top3_ci_lo", "fp8.top3_ci_hi"),
            ),
            (
                "fp8: perplexity change",
                _ci(s, "fp8.delta_ppl_pct", "fp8.delta_ppl_pct_ci_lo", "fp8.delta_ppl_pct_ci_hi", "%"),
            ),
            ("verdicts", ", ".join(f"{k.split('.')[0]}: {v}" for k, v in s.items() if k.endswith(".verdict")) or None),
            ("prompts", fmt_number(s.get("n_prompts")) if s.get("n_prompts") is not None else None),
        ]
    elif stem.startswith("04_"):
        rows += [
            (
                "longest context the engine holds, auto → fp8",
                _pair(s, "auto.longest_engine", "fp8.longest_engine", "tokens"),
            ),
            ("KV budget", None if s.get("kv_cache_gib") is None else f"{fmt_number(s.get('kv_cache_gib'))} GiB"),
        ]
        rows += _claims_04(s)
    elif stem.startswith("06_"):
        pts = [p for p in s.get("points") or [] if isinstance(p, dict)]
        if pts:
            n = len(pts)
            faster = sum(1 for p in pts if p.get("beyond_noise") and (p.get("ratio") or 1) < 1)
            slower = sum(1 for p in pts if p.get("beyond_noise") and (p.get("ratio") or 1) > 1)
            rows.append(("grid points (batch x context) measured by both dtypes", fmt_number(n)))
            rows.append(("fp8 decode step faster / slower beyond noise", f"{faster} / {slower} of {n} points"))
        if s.get("min_detectable_pct") is not None:
            rows.append(
                (
                    "smallest fp8/auto change these runs resolve (median 95% CI half-width)",
                    f"{fmt_number(s['min_detectable_pct'], 2)} %",
                )
            )
        if "capacity_exact" in s:
            rows.append(("KV blocks as the formula predicts", fmt_number(s["capacity_exact"])))
    elif stem.startswith("08_"):
        if s.get("n_rows") is not None:
            rows.append(
                (
                    f"KV formats of vLLM {s.get('vllm_version', '?')}: started / refused / crashed here",
                    f"{s.get('n_started')} / {s.get('n_refused')} / {s.get('n_crashed')} of {s.get('n_rows')}",
                )
            )
            rows.append(("started", ", ".join(s.get("started") or []) or "none"))
            rows.append(
                (
                    "KV blocks as the formula predicts (every format that started)",
                    fmt_number(s.get("capacity_exact_all")),
                )
            )
    elif stem.endswith("claims_audit"):
        counts = s.get("verdict_counts") or {}
        rows.append(("verdicts", ", ".join(f"{v} {k}" for k, v in counts.items()) or None))
    else:
        scalars = [(k, v) for k, v in sorted(s.items()) if isinstance(v, int | float | str) and not isinstance(v, bool)]
        rows += [(k, fmt_number(v)) for k, v in scalars[:6]]
    return [(label, value) for label, value in rows if value is not None]


#: Study 04's claims (summary key ``claim.<name>``: its verdict's label) as the index names them.
_CLAIMS_04: Mapping[str, str] = {
    "claim.gains_grow": "claim: FP8's gains grow with context",
    "claim.oom": "claim: bf16 runs out of memory first",
    "claim.block256": "claim: block size 256 beats 16 at the longest length",
    "claim.silent": "claim: silent quality loss along the context",
    "claim.random_tokens": "random tokens vs real text",
}


def _claims_04(s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """Study 04's claims' labels, from its summary (a verdict is a word; rows carry numbers only)."""
    return [
        (_CLAIMS_04.get(k, k.removeprefix("claim.")), str(v))
        for k, v in s.items()
        if k.startswith("claim.") and isinstance(v, str)
    ]


# ---------------------------------------------------------------------------- key numbers from typed rows
#: How the index writes a row's unit after its number ("" for a plain figure, a fraction or a ratio).
_UNIT_TEXT: Mapping[str, str] = {"1": "", "fraction": "", "ratio": "", "bytes": "B"}


def _unit(row: Mapping[str, Any]) -> str:
    u = _UNIT_TEXT.get(row["unit"], row["unit"])
    return f" {u}" if u else ""


def fmt_row(row: Mapping[str, Any], digits: int = 3) -> str:
    """A row's value for a reader: rounded (:func:`fmt_number`) with its unit; a change against a baseline in % or
    pp signed; with its 95% interval and ``n`` where the row has an interval:
    ``+13.2 % (95% CI +12.7 to +13.6, n = 5)``."""
    signed = row["baseline"] is not None and row["unit"] in ("%", "pp")

    def num(v: float) -> str:
        return ("+" if signed and v > 0 else "") + fmt_number(v, digits)

    text = num(row["value"]) + _unit(row)
    if row["ci_low"] is not None:
        text += f" (95% CI {num(row['ci_low'])} to {num(row['ci_high'])}, n = {fmt_number(row['n'])})"
    return text


def _pick(rows: Sequence[Mapping[str, Any]], **fields: Any) -> Mapping[str, Any] | None:
    """The one row with ``fields`` (:func:`fp8lab.summary_table.one`), or None when none or several have them."""
    try:
        return st.one(rows, **fields)
    except LookupError:
        return None


def _row_pair(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, digits: int = 3) -> str | None:
    """Two rows' values ``a → b unit`` (the unit of either; "n/a" for a missing one); None when both are."""
    if a is None and b is None:
        return None
    unit = _unit(a or b)  # type: ignore[arg-type]
    va, vb = (fmt_number(None if r is None else r["value"], digits) for r in (a, b))
    return f"{va} → {vb}{unit}"


def _pair_of(rows: Sequence[Mapping[str, Any]], a: str, b: str, digits: int = 3, **fields: Any) -> str | None:
    """:func:`_row_pair` of the rows with ``fields`` for kv dtypes ``a`` and ``b``, each its own figure."""
    return _row_pair(
        _pick(rows, kv_dtype=a, baseline=None, **fields), _pick(rows, kv_dtype=b, baseline=None, **fields), digits
    )


def _dtypes(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(baseline, candidate) kv dtypes of a study's change rows: ``fp8`` where it is a candidate, else the first
    one; ``("auto", "fp8")`` when the rows hold no change."""
    changes = [r for r in rows if r["baseline"] is not None]
    if not changes:
        return "auto", "fp8"
    cands = list(dict.fromkeys(r["kv_dtype"] for r in changes))
    cand = "fp8" if "fp8" in cands else cands[0]
    return next(r["baseline"] for r in changes if r["kv_dtype"] == cand), cand


def _rows_00(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    check = [r for r in rows if r["metric"] == "num_blocks_formula" and r["baseline"] is None]
    models = {r["model"] for r in check} or {r["model"] for r in rows if r["metric"] == "kv_bytes_per_token"}
    if len(models) == 1:  # the measured model: the one whose engine budget the formula was checked against
        model = models.pop()
        pair = _pair_of(rows, "auto", "fp8", metric="kv_bytes_per_token", model=model)
        out.append((f"KV per token, auto → fp8 ({model})", None if pair is None else pair + "/token"))
    share = _pick(rows, metric="formula_exact_share")
    if share is not None:
        out.append(
            (
                "engines on record whose block count the formula predicted exactly",
                f"{round(share['value'] * share['n'])} of {share['n']} ({share['device']})",
            )
        )
    engine = [r for r in rows if r["metric"] == "num_blocks" and r["baseline"] is None]
    formula = [_pick(check, kv_dtype=r["kv_dtype"], setting=r["setting"], model=r["model"]) for r in engine]
    if engine and all(f is not None for f in formula):  # a prediction missing from the rows: nothing to compare
        exact = all(f["value"] == r["value"] for r, f in zip(engine, formula, strict=True))  # type: ignore[index]
        out.append(("engines started by this run: formula exact", fmt_number(exact)))
    elif not engine:  # this run predicted only (an engine that failed records no blocks either)
        out.append(("engines started by this run", "none (predictions only)"))
    return out


def _rows_01(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    base, cand = _dtypes(rows)
    closed = [r["concurrency"] for r in rows if r["metric"] == "output_tok_s" and r["setting"] == "closed loop"]
    c = max((x for x in closed if x is not None), default=None)
    head = _pick(rows, metric="output_tok_s", setting="closed loop", concurrency=c, kv_dtype=cand, baseline=base)
    label = ""
    if head is not None and head["ci_low"] is not None:  # stats.delta_label: throughput, higher is better
        label = (
            ": within noise"
            if head["ci_low"] <= 0 <= head["ci_high"]
            else (": better" if head["value"] > 0 else ": worse")
        )
    trials = _pick(rows, metric="output_tok_s", setting="closed loop", concurrency=c, kv_dtype=base, baseline=None)
    return [
        (f"KV capacity, {base} → {cand}", _pair_of(rows, base, cand, metric="kv_capacity_tokens", setting="engine")),
        (
            f"{cand} vs {base} output throughput at concurrency {fmt_number(c)}",
            None if head is None else fmt_row(head) + label,
        ),
        # the rows carry each change's interval and smallest detectable change, not the spread between trials of
        # one config: the noise floor stays a summary key
        (
            "noise floor (same config between trials)",
            None if s.get("noise_floor_pct") is None else f"{fmt_number(s.get('noise_floor_pct'), 2)} %",
        ),
        (
            f"ITL p50, {base} → {cand}",
            _pair_of(rows, base, cand, metric="itl_p50_pooled", setting="closed loop", concurrency=c),
        ),
        (
            f"peak device memory, {base} → {cand}",
            _pair_of(rows, base, cand, 4, metric="mem_peak_gib", setting="engine"),
        ),
        ("trials", None if trials is None else fmt_number(trials["n"])),
    ]


def _rows_03(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    base, cand = _dtypes(rows)
    top3 = _pick(rows, metric="top3_match", setting=cand, kv_dtype=cand, subset=None, baseline=None)
    ppl = _pick(rows, metric="ppl", setting=cand, kv_dtype=cand, subset=None, baseline=base)
    return [
        (f"{cand}: top-3 token match (reports' protocol)", None if top3 is None else fmt_row(top3)),
        (f"{cand}: perplexity change", None if ppl is None else fmt_row(ppl)),
        # a verdict is a word, not a number: rows carry numbers only, so the verdicts stay summary keys
        ("verdicts", ", ".join(f"{k.split('.')[0]}: {v}" for k, v in s.items() if k.endswith(".verdict")) or None),
        ("prompts", None if top3 is None else fmt_number(top3["n"])),
    ]


def _rows_04(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [
        (
            "longest context the engine holds, auto → fp8",
            _pair_of(rows, "auto", "fp8", metric="longest_context", setting="engine blocks"),
        ),
        # the KV budget is a parameter of the run, not a measured number: no row holds it (only the formula rows'
        # setting names it, a string the index does not parse), so it stays a summary key
        ("KV budget", None if s.get("kv_cache_gib") is None else f"{fmt_number(s.get('kv_cache_gib'))} GiB"),
    ]
    # the claims' verdicts are words, not numbers: rows carry numbers only, so they stay summary keys
    return out + _claims_04(s)


def _rows_06(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str | None]]:
    base, cand = _dtypes(rows)
    pts = [r for r in rows if r["metric"] == "decode_step_ms" and r["kv_dtype"] == cand and r["baseline"] == base]
    out: list[tuple[str, str | None]] = []
    if pts:
        n = len(pts)
        faster = sum(1 for r in pts if r["beyond_noise"] and r["value"] < 1)
        slower = sum(1 for r in pts if r["beyond_noise"] and r["value"] > 1)
        out.append(("grid points (batch x context) measured by both dtypes", fmt_number(n)))
        out.append((f"{cand} decode step faster / slower beyond noise", f"{faster} / {slower} of {n} points"))
    hw = [100 * r["detectable"] for r in pts if r["detectable"] is not None]
    if hw:
        out.append(
            (
                f"smallest {cand}/{base} change these runs resolve (median 95% CI half-width)",
                f"{fmt_number(statistics.median(hw), 2)} %",
            )
        )
    engines = [r for r in rows if r["metric"] == "num_blocks" and r["baseline"] is None]
    formula = [_pick(rows, metric="num_blocks_formula", kv_dtype=r["kv_dtype"], setting=r["setting"]) for r in engines]
    if engines and all(f is not None for f in formula):  # a prediction missing from the rows: nothing to compare
        exact = all(f["value"] == r["value"] for r, f in zip(engines, formula, strict=True))  # type: ignore[index]
        out.append(("KV blocks as the formula predicts", fmt_number(exact)))
    return out + _rows_06_engines(rows, pts, base, cand)


def _rows_06_engines(
    rows: Sequence[Mapping[str, Any]], pts: Sequence[Mapping[str, Any]], base: str, cand: str
) -> list[tuple[str, str | None]]:
    """An engine-replicated Study 06 (issue 35): in the headline arm (the setting of its point rows), each batch's
    fp8 - auto fixed cost per step and crossover context with their intervals over engine pairs."""
    setting = pts[0]["setting"] if pts else None
    out: list[tuple[str, str | None]] = []

    def ci(r: Mapping[str, Any], digits: int) -> str:
        if r["ci_low"] is None:
            return "no 95% interval within the measured contexts" if r["unit"] == "tokens" else "no interval"
        return f"95% CI {fmt_number(r['ci_low'], digits)} to {fmt_number(r['ci_high'], digits)}"

    for r in rows:
        if r["setting"] != setting or r["kv_dtype"] != cand or r["baseline"] != base:
            continue
        if r["metric"] == "decode_fixed_ms":
            out.append(
                (
                    f"batch {r['batch']}: {cand} − {base} fixed cost per decode step ({r['n']} engine pairs)",
                    f"{fmt_number(r['value'] * 1e3, 3)} µs ({ci({**r, 'ci_low': _us(r['ci_low']), 'ci_high': _us(r['ci_high'])}, 3)})",
                )
            )
        elif r["metric"] == "decode_crossover_tokens":
            out.append(
                (
                    f"batch {r['batch']}: context where {cand}'s step equals {base}'s ({r['n']} engine pairs)",
                    f"{fmt_number(r['value'], 4)} tokens ({ci(r, 4)})",
                )
            )
    return out


def _us(ms: float | None) -> float | None:
    return None if ms is None else ms * 1e3


def _rows_07(rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    base, cand = _dtypes(rows)
    # the run's block size is a parameter (rows name it only inside their setting, which the index does not parse)
    out: list[tuple[str, str | None]] = [("block_size", _summary_value(s, "block_size"))]
    for w in dict.fromkeys(r["subset"] for r in rows if r["metric"] == "prefix_knee_measured"):
        measured = _pair_of(rows, base, cand, metric="prefix_knee_measured", subset=w)
        predicted = _pair_of(rows, base, cand, metric="prefix_knee_predicted", subset=w)
        knee = measured if predicted is None else f"{measured} (the replay predicts {predicted})"
        out.append((f"{w}: most active conversations that keep their prefix hits, {base} → {cand}", knee))
        gains = [
            r
            for r in rows
            if r["metric"] == "prefix_hit_rate" and r["subset"] == w and r["baseline"] == base and r["kv_dtype"] == cand
        ]
        held = _pick(rows, metric="prefix_knee_measured", subset=w, kv_dtype=base)
        inside = [abs(r["value"]) for r in gains if held is not None and r["concurrency"] <= held["value"]]
        if inside:  # where the baseline keeps its hits, fp8 should neither gain nor lose any
            out.append((f"{w}: largest |{cand} − {base}| hit rate while {base} holds", f"{fmt_number(max(inside))} pp"))
        if gains:
            g = max(gains, key=lambda r: r["value"])
            out.append((f"{w}: largest {cand} − {base} hit rate, at {g['concurrency']} active", fmt_row(g)))
    # the claim's verdict and its evidence are words, and the counter turns a check of the run's bookkeeping, not
    # a measured metric: rows carry none of them, so they stay summary keys (labelled as the index showed them)
    words = ("claim_evidence", "claim_verdict", "counter_turns", "counter_turns_complete")
    return out + [(k, _summary_value(s, k)) for k in words]


def _summary_value(s: Mapping[str, Any], key: str) -> str | None:
    """``s[key]`` for a reader (:func:`fmt_number`), None when absent: for what rows do not carry."""
    return None if s.get(key) is None else fmt_number(s[key])


def key_numbers_from_rows(
    stem: str, rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """:func:`key_numbers` read by field from a study's typed rows (:func:`fp8lab.summary_table.one` on metric,
    kv dtype, baseline, setting, concurrency...): each value with the unit of its row, and its 95% interval and
    ``n`` where the row has an interval (:func:`fmt_row`). A number whose row is missing (a producer that renamed
    its metric) is left out; it is never looked up in the summary instead. Only what rows cannot carry (a verdict's
    word, a run parameter) is read from the summary ``s``, each such place commented. Study 02's rows carry its
    scale differences and end-to-end quality, none of its index numbers: its index reads its summary. A study fp8lab
    does not know shows its first rows."""
    s = s or {}
    out: list[tuple[str, str | None]]
    if stem.startswith("00_"):
        out = _rows_00(rows)
    elif stem.startswith("01_"):
        out = _rows_01(rows, s)
    elif stem.startswith("02_"):
        # the 32-token claim's verdict, the tokens to its threshold and the per-head vs per-tensor logprob change
        # are not rows (its rows hold the scale sets' differences and quality): read from the summary
        return key_numbers_from_summary(stem, dict(s))
    elif stem.startswith("03_"):
        out = _rows_03(rows, s)
    elif stem.startswith("04_"):
        out = _rows_04(rows, s)
    elif stem.startswith("06_"):
        out = _rows_06(rows)
    elif stem.startswith("07_"):
        out = _rows_07(rows, s)
    else:
        out = [
            (
                f"{r['metric']}, {r['kv_dtype']}"
                + (f" vs {r['baseline']}" if r["baseline"] else "")
                + f" ({r['setting']})",
                fmt_row(r),
            )
            for r in rows[:6]
        ]
    return [(label, value) for label, value in out if value is not None]


def runs_provenance(lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the engine runs a notebook loaded or ran have in common: their count, devices, vLLM versions and dates
    (from each run's ``provenance.json``, via ``$FP8LAB_RUNS_LOG``)."""
    uniq = {ln.get("run_dir"): ln for ln in lines}.values()

    def values(k: str) -> list[str]:
        return sorted({str(ln[k]) for ln in uniq if ln.get(k)})

    dates = sorted(str(ln["date_utc"])[:10] for ln in uniq if ln.get("date_utc"))
    return {
        "n": len(uniq),
        "devices": values("device"),
        "vllm": values("vllm"),
        "dates": [dates[0], dates[-1]] if dates else [],
    }


def _runs_line(e: dict[str, Any]) -> str:
    runs = e.get("runs") or {}
    if runs.get("n"):
        dates = runs.get("dates") or []
        when = (f", {dates[0]}" + (f" to {dates[1]}" if dates[1] != dates[0] else "")) if dates else ""
        return (
            f"{runs['n']} engine run{'s' if runs['n'] != 1 else ''} on {', '.join(runs['devices']) or 'a device not recorded'}, "
            f"vLLM {', '.join(runs['vllm']) or 'not recorded'}{when}"
        )
    where = e.get("ran_on") or {}
    if where:
        what = "no engine run of its own; computed" if "runs" in e else "the notebook ran"
        return f"{what} on {where.get('device')} with vLLM {where.get('vllm')} ({str(where.get('date_utc', ''))[:10]})"
    return "provenance in its engines' records"


def _title(out_dir: Path, stem: str) -> str:
    import nbformat

    for p in (out_dir / f"{stem}.ipynb", NOTEBOOKS_DIR / f"{stem}.ipynb"):
        try:
            t = notebook_title(nbformat.read(str(p), as_version=4))
        except Exception:
            continue
        if t:
            return t
    return stem


def headline_html(summary: dict[str, Any]) -> str:
    """The audit's headline (its summary's ``headline``, a list of sentences), when a notebook recorded one."""
    for e in summary["notebooks"].values():
        lines = (e.get("summary") or {}).get(HEADLINE_KEY)
        if isinstance(lines, str):
            lines = [lines]
        if lines:
            return (
                "<section id='headline'><h2>Headline</h2><ul>"
                + "".join(f"<li>{html.escape(str(x))}</li>" for x in lines)
                + "</ul></section>"
            )
    return (
        "<section id='headline'><h2>Headline</h2><p>No headline recorded: the claims audit did not run in "
        "this folder. Each study's verdict is linked below.</p></section>"
    )


def write_index(out_dir: Path, summary: dict[str, Any]) -> Path:
    """``index.html``: the decision box (:func:`fp8lab.report.decision.decision_html`), the headline, the claims audit's table, then one short block per study (its key numbers,
    rounded, with units; a link to its verdict; the device and vLLM of the runs it shows)."""
    out_dir = Path(out_dir)
    audit, blocks = "", []
    for name, e in summary["notebooks"].items():
        s = e.get("summary") or {}
        if s.get(AUDIT_ROWS_KEY) and not audit:
            audit = audit_html(s[AUDIT_ROWS_KEY], e.get("html"))
        title = html.escape(_title(out_dir, name))
        head = f'<a href="{html.escape(e["html"])}">{title}</a>' if e.get("html") else title
        status = "" if e.get("status") == "ok" else f" <span class='failed'>{html.escape(str(e.get('status')))}</span>"
        err = f"<p class='failed'>{html.escape(e['error'])}</p>" if e.get("error") else ""
        if e.get("rerun_failed"):  # the last good result is shown; the failed rerun is linked
            fail = e["rerun_failed"]
            fl = f' (<a href="{html.escape(fail["failed_html"])}">failed run</a>)' if fail.get("failed_html") else ""
            err += (
                f"<p class='failed'>Shown: the last good result; a later rerun failed and was not kept{fl}: "
                f"{html.escape(str(fail.get('error')))}</p>"
            )
        if s.get("not_measured"):  # no native FP8 kernel here (fp8lab.engine.capability)
            err += f"<p class='failed'>{html.escape(str(s['not_measured']))}</p>"
        where = e.get("ran_on") or {}
        dirty = " with uncommitted changes" if where.get("fp8lab_dirty") else ""
        origin = (
            f"{where.get('date_utc')} on {where.get('device')}, fp8lab {str(where.get('fp8lab_commit'))[:12]}{dirty}, "
            f"vLLM {where.get('vllm')}"
            if where
            else "provenance in its engines' records"
        )
        kept = f" <small>(kept from {html.escape(e['from'])}: {html.escape(origin)})</small>" if e.get("from") else ""
        # the key numbers: by field from the study's typed rows where this folder has them, else (a report rendered
        # before the rows existed) from its flat summary's keys; a rows file that does not fit the schema shows why
        # and no numbers, never the summary's instead
        try:
            numbers = key_numbers(name, s, study_rows(out_dir, name))
        except StudyRowsError as exc:
            numbers = []
            err += f"<p class='failed'>Key numbers not shown: {html.escape(str(exc))}</p>"
        nums = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in numbers)
        links = [f'<a href="{html.escape(e["html"])}#verdict">verdict</a>'] if e.get("html") else []
        if (out_dir / f"{name}.summary.json").exists():
            links.append(f'<a href="{html.escape(name)}.summary.json">all {len(s)} recorded values (JSON)</a>')
        blocks.append(
            f"<section class='study' id='{html.escape(name)}'><h3>{head}{status}</h3>{err}"
            f"<p class='prov'>Runs shown: {html.escape(_runs_line(e))}.{kept}</p>"
            + (f"<table class='nums'>{nums}</table>" if nums else "")
            + f"<p>{' · '.join(links)}</p></section>"
        )
    prov = summary.get("provenance", {})
    profile = html.escape(summary["profile"])
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fp8lab report: {profile}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.4}}
table{{border-collapse:collapse;margin:.5em 0 1em}}td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}}
table.nums th{{font-weight:normal;color:#333;background:#f6f6f6}}
#headline{{border-left:4px solid #2a6;padding-left:1em}}
#decision{{border:2px solid #2a6;border-radius:6px;padding:.2em 1em;background:#f4fbf4}}#decision li{{margin:.3em 0}}
#decision li.not-measured{{color:#6a4b00}}#headline li{{margin:.3em 0}}
.failed{{color:#b00}}small,.prov{{color:#555}}section.study{{margin:1.2em 0}}section.study h3{{margin-bottom:.2em}}
.v-confirmed{{background:#d8f0d8}}.v-refuted{{background:#f6d5d5}}.v-depends{{background:#fbeccb}}
.v-not-testable-here{{background:#e6e6e6}}.v-not-reproduced-here{{background:#dde6f6}}.v-inconclusive{{background:#fbeccb}}table.audit td:nth-child(3){{font-weight:bold;white-space:nowrap}}</style></head><body>
<h1>fp8lab report &mdash; profile <code>{profile}</code></h1>
{decision_html(out_dir)}
{headline_html(summary)}
<p>{html.escape(summary.get("description", ""))}</p>
{audit}
<h2>Studies</h2>
<p><small>Each study names the device and vLLM of the engine runs it shows (from their provenance). This page was
rendered {html.escape(str(summary.get("created_utc", "")))} by fp8lab {html.escape(str(prov.get("fp8lab_commit", ""))[:12])};
all numbers: <a href="summary.json">summary.json</a>.</small></p>
{"".join(blocks)}
</body></html>"""
    path = out_dir / "index.html"
    path.write_text(tidy_page(page), encoding="utf-8")  # the reader's format (fp8lab.report.readable)
    return path


def compare_summaries(report_dirs: Sequence[str | Path], notebook: str, pattern: str = ".") -> Any:
    """The numeric key numbers of one notebook across report folders (e.g. ``reports/cpu-tiny`` and
    ``reports/h200``), side by side: a DataFrame indexed by summary key (those matching the regular
    expression ``pattern``), one column per folder (its name). Keys missing in a folder are NaN."""
    import re

    import pandas as pd

    rx = re.compile(pattern)
    cols = {}
    for d in report_dirs:
        path = Path(d) / f"{notebook}.summary.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no summary of {notebook} in {d}")
        flat = json.loads(path.read_text())
        cols[Path(d).name] = {
            k: v for k, v in flat.items() if rx.search(k) and isinstance(v, int | float) and not isinstance(v, bool)
        }
    return pd.DataFrame(cols).sort_index()
