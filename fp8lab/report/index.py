"""The report folder's front pages: ``index.html`` (:func:`write_index`: the claims audit's headline and table,
then one block per study with its key numbers, :func:`key_numbers`: by field from the study's typed rows where the
folder has them, else from its flat summary, and the provenance of its engine runs,
:func:`runs_provenance`) and :func:`compare_summaries` (one notebook's key numbers from several report folders side
by side). Split out of :mod:`fp8lab.report.run` (issue 16), which re-exports every name here (``report.write_index``)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fp8lab import studies
from fp8lab.keynumbers import first_rows, first_scalars
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


def key_numbers(stem: str, s: dict[str, Any], rows: Sequence[Mapping[str, Any]] | None = None) -> list[tuple[str, str]]:
    """A page's few key numbers for the index, each ``(label with its unit, rounded value)``: the study's own
    (``key_numbers`` of the study the registry finds for ``stem``, :func:`fp8lab.studies.for_page`), from its typed
    rows (:func:`study_rows`) where the page has them, else from its flat summary ``s``. A page no registered study
    makes, or a study that gives none, shows its first rows or scalars. Missing values are left out."""
    study = studies.for_page(stem)
    if study is not None and hasattr(study, "key_numbers"):
        out = study.key_numbers(s, rows)
    else:
        out = first_rows(rows) if rows is not None else first_scalars(s)
    return [(label, value) for label, value in out if value is not None]


def key_numbers_from_summary(stem: str, s: dict[str, Any]) -> list[tuple[str, str]]:
    """:func:`key_numbers` from a page's flat summary (a report folder rendered before rows files existed)."""
    return key_numbers(stem, s)


def key_numbers_from_rows(
    stem: str, rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any] | None = None
) -> list[tuple[str, str]]:
    """:func:`key_numbers` from a page's typed rows (and, for what rows cannot carry, its summary ``s``)."""
    return key_numbers(stem, dict(s or {}), rows)


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
