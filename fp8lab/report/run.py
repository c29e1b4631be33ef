"""Reports: run notebooks headlessly (papermill), export HTML (nbconvert), write an index.

A notebook's last cells call :func:`record_summary` with its key numbers; the runner points each
notebook at its own summary file (``$FP8LAB_SUMMARY_PATH``) and merges them into ``summary.json``,
so tests and the overall report read numbers, never scraped HTML.

Split along clean lines (issue 16): :mod:`fp8lab.profiles` (profiles and a notebook's resolved parameters) and
:mod:`fp8lab.report.index` (``index.html``, key numbers, comparing reports) below this module, which keeps recording
a summary and running notebooks and re-exports every name of both (``report.load_profile``, ``report.write_index``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp8lab import summary_table
from fp8lab.engine.devices import provenance
from fp8lab.engine.procs import share_forkserver
from fp8lab.keynumbers import fmt_number, fmt_row
from fp8lab.paths import REPO_ROOT, runs_dir
from fp8lab.profiles import (
    PROFILES_FILE,
    TEST_PROFILE,
    check_overrides,
    check_parameter_type,
    list_notebooks,
    load_profile,
    load_profiles,
    parameters_for,
    resolved_parameters,
)
from fp8lab.report import htmlexport
from fp8lab.report.degrade import notebook_for
from fp8lab.report.htmlslim import link_summary_dump
from fp8lab.report.index import (
    AUDIT_ROWS_KEY,
    HEADLINE_KEY,
    StudyRowsError,
    audit_html,
    compare_summaries,
    headline_html,
    key_numbers,
    key_numbers_from_rows,
    key_numbers_from_summary,
    runs_provenance,
    study_rows,
    write_index,
)
from fp8lab.summary_table import parquet_path, rows_path


def _clean(o: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN/inf to None, tuples to lists."""
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        try:
            o = o.item()
        except Exception:
            return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, (str, int, float, bool)) or o is None:
        return o
    return str(o)


def record_summary(
    values: dict[str, Any],
    path: str | Path | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    show: bool = True,
) -> Path:
    """Write a notebook's key numbers as JSON and show them.

    The file is ``path``, else ``$FP8LAB_SUMMARY_PATH`` (set by ``fp8lab run``), else
    ``<runs>/summaries/last_summary.json`` (a notebook run by hand). Returns the path written.
    ``rows`` (the study's typed summary rows, :mod:`fp8lab.summary_table`) are validated first (a bad row raises
    before anything is written) and written beside it as ``<stem>.rows.json`` and ``.rows.parquet``; without
    ``rows`` a rows file left there by an earlier run is removed, so it never stands beside a newer summary.
    ``show=False`` prints one line naming the file instead of the JSON (a summary that repeats a page's own table,
    as the claims audit's does, would double the page).
    """
    target = Path(path or os.environ.get("FP8LAB_SUMMARY_PATH") or runs_dir() / "summaries" / "last_summary.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    rows_file = summary_table.rows_path(target)
    if rows is not None:
        summary_table.write_rows(rows, rows_file)
    else:
        rows_file.unlink(missing_ok=True)
        summary_table.parquet_path(rows_file).unlink(missing_ok=True)
    clean = _clean(values)
    target.write_text(json.dumps(clean, sort_keys=True))
    if show:
        print(json.dumps(clean, indent=2, sort_keys=True))
    else:
        print(f"{len(clean)} recorded values written to {target.name} (not repeated here: the tables above hold them)")
    return target


# ----------------------------------------------------------------------------------------- running
KERNEL_NAME = "fp8lab-python"


def ensure_kernel() -> str:
    """Register a Jupyter kernel that runs *this* interpreter and put it first on ``JUPYTER_PATH``.

    papermill's plain ``python3`` kernel can resolve to another environment's Python (a user-level
    kernelspec left by an earlier install); this one is always ``sys.executable``.
    """
    import sys

    base = runs_dir() / ".jupyter"
    kdir = base / "kernels" / KERNEL_NAME
    kdir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [
            sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            # frames and figures in the reader's format (fp8lab.report.readable), in every notebook this kernel runs
            "--IPKernelApp.exec_lines=import fp8lab.report.readable as _fp8lab_readable; _fp8lab_readable.install()",
        ],
        "display_name": "fp8lab (this environment)",
        "language": "python",
    }
    (kdir / "kernel.json").write_text(json.dumps(spec, indent=1))
    paths = [str(base)] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p and p != str(base)]
    os.environ["JUPYTER_PATH"] = os.pathsep.join(paths)
    return KERNEL_NAME


def export_html(ipynb: Path, html_path: Path) -> Path:
    """The reader's HTML of an executed notebook: verdict first, code hidden, offline (:mod:`fp8lab.report.htmlexport`)."""
    return htmlexport.export_html(ipynb, html_path)


def run_notebook(
    notebook: Path, out_dir: Path, params: dict[str, Any], progress: bool = True, timeout_s: int | None = None
) -> dict[str, Any]:
    """Execute one notebook with papermill, export its HTML; never raises for a failing notebook.

    Nothing already in ``out_dir`` is replaced unless this run succeeds: the notebook and its summary are
    written as ``.<stem>.running.*`` and renamed onto ``<stem>.ipynb`` / ``.html`` / ``.summary.json`` (and the
    typed rows ``.rows.json`` / ``.rows.parquet`` the notebook recorded; none recorded removes older ones) only
    when it ran to its summary; a failed run is kept beside as ``<stem>.failed.ipynb`` / ``.failed.html``
    (``entry["failed_html"]``), and the last good result stays where it was."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = notebook.stem
    final_nb, final_html, final_summary = (
        out_dir / f"{stem}.ipynb",
        out_dir / f"{stem}.html",
        out_dir / f"{stem}.summary.json",
    )
    out_nb, out_html, summary_path = (
        out_dir / f".{stem}.running.ipynb",
        out_dir / f".{stem}.running.html",
        out_dir / f".{stem}.running.summary.json",
    )
    # the typed rows record_summary writes beside the summary (fp8lab.summary_table), renamed with it
    rows_moves = [(rows_path(summary_path), rows_path(final_summary))]
    rows_moves.append((parquet_path(rows_moves[0][0]), parquet_path(rows_moves[0][1])))
    for f in (out_nb, out_html, summary_path, *(src for src, _ in rows_moves)):
        f.unlink(missing_ok=True)
    entry: dict[str, Any] = {"notebook": stem, "parameters": params, "status": "ok", "error": None}
    # the kernel inherits these: where to record the summary, and the report folder the notebook writes into
    # (the claims audit reads its sibling studies' summaries there)
    # and where each engine run it loads or runs notes its provenance (fp8lab.engine.results.note_run)
    runs_log = out_dir / f".{stem}.runs.jsonl"
    runs_log.unlink(missing_ok=True)
    env = {
        "FP8LAB_SUMMARY_PATH": str(summary_path),
        "FP8LAB_REPORT_DIR": str(out_dir.resolve()),
        "FP8LAB_RUNS_LOG": str(runs_log.resolve()),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    t0 = time.perf_counter()
    share_forkserver()  # on a CPU, the kernels of this process's notebooks fork their engine workers from one server
    # a study this device cannot answer (no native FP8 KV kernel) runs reduced: it says what was not measured and why
    notebook = notebook_for(notebook, params, Path(tempfile.mkdtemp(prefix="fp8lab-degraded-")))
    try:
        papermill.execute_notebook(
            str(notebook),
            str(out_nb),
            parameters=params,
            cwd=str(REPO_ROOT),
            kernel_name=ensure_kernel(),
            progress_bar=progress,
            execution_timeout=timeout_s,
        )
    except Exception as exc:  # papermill raises PapermillExecutionError with the cell's traceback
        entry["status"] = "failed"
        entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:2000]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    entry["wall_s"] = round(time.perf_counter() - t0, 1)
    lines = [json.loads(x) for x in runs_log.read_text().splitlines() if x.strip()] if runs_log.exists() else []
    entry["runs"] = runs_provenance(lines)
    runs_log.unlink(missing_ok=True)
    if out_nb.exists():
        try:
            export_html(out_nb, out_html)
            entry["html"] = out_html.name
        except Exception as exc:
            entry["html_error"] = f"{type(exc).__name__}: {exc}"
    entry["summary"] = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if entry["status"] == "ok" and entry["summary"] is None:
        entry["status"], entry["error"] = "failed", "the notebook recorded no summary (record_summary was not reached)"
    if entry["status"] == "ok":  # replace the last result only now, file by file
        for src, dst in ((out_nb, final_nb), (out_html, final_html), (summary_path, final_summary)):
            if src.exists():
                os.replace(src, dst)
        for src, dst in rows_moves:  # a study without rows leaves none: an older rows file would be stale
            if src.exists():
                os.replace(src, dst)
            else:
                dst.unlink(missing_ok=True)
        if final_html.exists() and final_summary.exists():  # the page links the summary beside it, not a copy
            page = final_html.read_text(encoding="utf-8")
            linked = link_summary_dump(page, final_summary)
            if linked != page:
                final_html.write_text(linked, encoding="utf-8")
        entry["html"] = final_html.name if final_html.exists() else None
    else:
        for src, dst in ((out_nb, out_dir / f"{stem}.failed.ipynb"), (out_html, out_dir / f"{stem}.failed.html")):
            if src.exists():
                os.replace(src, dst)
        summary_path.unlink(missing_ok=True)
        for src, _ in rows_moves:
            src.unlink(missing_ok=True)
        entry.pop("html", None)
        if (out_dir / f"{stem}.failed.html").exists():
            entry["failed_html"] = f"{stem}.failed.html"
    return entry


def read_index(out_dir: Path) -> dict[str, Any]:
    """``out_dir/summary.json`` with each notebook's summary read back from its ``<stem>.summary.json`` where the
    index leaves it out (:func:`slim_index`: the file holds it); ``{}`` when there is none."""
    try:
        index = json.loads((Path(out_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(index, dict):
        return {}
    for name, e in (index.get("notebooks") or {}).items():
        f = Path(out_dir) / str(e.get("summary_file") or f"{name}.summary.json")
        if "summary" not in e and (e.get("summary_file") or e.get("status") == "ok") and f.is_file():
            e["summary"] = json.loads(f.read_text())
    return index


def slim_index(out_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` as written to disk: an entry whose ``<stem>.summary.json`` holds its summary names that file
    (``summary_file``) instead of repeating it (the audit's alone is 100 KB); :func:`read_index` reads it back."""
    notebooks = {}
    for name, e in summary["notebooks"].items():
        f = Path(out_dir) / f"{name}.summary.json"
        try:
            same = e.get("summary") is not None and json.loads(f.read_text()) == _clean(e["summary"])
        except (OSError, ValueError):
            same = False
        notebooks[name] = {**{k: v for k, v in e.items() if k != "summary"}, "summary_file": f.name} if same else e
    return {**summary, "notebooks": notebooks}


def previous_summary(out_dir: Path, profile_name: str) -> dict[str, Any]:
    """``out_dir/summary.json`` (:func:`read_index`) when an earlier run of the same profile wrote it, else ``{}``."""
    prev = read_index(out_dir)
    return prev if prev.get("profile") == profile_name else {}


def previous_entries(out_dir: Path, profile_name: str) -> dict[str, dict[str, Any]]:
    """Notebooks an earlier run left in ``out_dir`` for the same profile, so that running a subset (say the
    claims audit alone, after the studies) keeps the others in ``summary.json`` and the index: the entries of
    an existing ``summary.json`` (an entry without its ``summary`` takes it from ``NN_*.summary.json``: the committed
    reports keep each study's summary in its own file only), plus any ``NN_*.summary.json`` without an entry
    (``"from": "file"``)."""
    prev = previous_summary(out_dir, profile_name)  # each summary read back from its own file (read_index)
    out = {k: {**e, "from": e.get("from") or "earlier run"} for k, e in (prev.get("notebooks") or {}).items()}
    for f in sorted(out_dir.glob("[0-9][0-9]_*.summary.json")):
        stem = f.name.removesuffix(".summary.json")
        if stem not in out:
            html_file = out_dir / f"{stem}.html"
            out[stem] = {
                "notebook": stem,
                "status": "ok",
                "error": None,
                "wall_s": None,
                "from": "file",
                "html": html_file.name if html_file.is_file() else None,
                "summary": json.loads(f.read_text()),
            }
    return out


def run_profile(
    profile_name: str,
    out_dir: Path,
    notebooks: Sequence[str] | None = None,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run notebooks on a profile into ``out_dir``: executed ``.ipynb``, ``.html``, ``index.html``, ``summary.json``
    (which also lists the notebooks an earlier run of the same profile left there: :func:`previous_entries`)."""
    from tqdm.auto import tqdm

    profile = load_profile(profile_name)
    paths = list_notebooks(notebooks or profile.get("run"))  # a profile's `run:` list: its notebooks by default
    check_overrides(paths, overrides)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    bar = tqdm(paths, desc=f"fp8lab run [{profile_name}]", unit="notebook", disable=not progress)
    prov = provenance(with_torch=False)
    ran_on = {k: prov.get(k) for k in ("date_utc", "device", "fp8lab_commit", "fp8lab_dirty", "vllm")}
    summary: dict[str, Any] = {}
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        entry = run_notebook(nb, out_dir, parameters_for(nb, profile, overrides), progress=progress)
        entries.append({**entry, "ran_on": ran_on})  # kept with the entry when a later run keeps it
        # written after every notebook: a later notebook (the claims audit) reads where this run's studies ran,
        # and a run that dies keeps what finished
        summary = _write_summary(out_dir, profile_name, profile, prov, entries)
    if not entries:
        summary = _write_summary(out_dir, profile_name, profile, prov, entries)
    return summary


def _write_summary(
    out_dir: Path, profile_name: str, profile: dict[str, Any], prov: dict[str, Any], entries: list[dict[str, Any]]
) -> dict[str, Any]:
    """Merge this call's ``entries`` into the folder's ``summary.json`` (a failed rerun keeps the last good
    entry, with a ``rerun_failed`` note) and rewrite it and ``index.html``."""
    merged = previous_entries(out_dir, profile_name)
    for e in entries:
        prev = merged.get(e["notebook"])
        if e["status"] != "ok" and prev and prev.get("status") == "ok" and prev.get("summary"):
            # a failed rerun never replaces the last good result: keep it, and say what failed now
            merged[e["notebook"]] = {**prev, "rerun_failed": {k: e.get(k) for k in ("error", "failed_html", "ran_on")}}
        else:
            merged[e["notebook"]] = e
    summary = {
        "profile": profile_name,
        "description": profile.get("description", ""),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "provenance": prov,
        "notebooks": dict(sorted(merged.items())),
        "ran_now": {e["notebook"]: {"status": e["status"], "error": e["error"]} for e in entries},  # this call's
    }
    (out_dir / "summary.json").write_text(json.dumps(_clean(slim_index(out_dir, summary)), sort_keys=True))
    write_index(out_dir, summary)
    return summary


#: Every public name of this module and of the two split out of it (:mod:`fp8lab.profiles`,
#: :mod:`fp8lab.report.index`): ``report.<name>`` keeps working for each.
__all__ = [
    "AUDIT_ROWS_KEY",
    "HEADLINE_KEY",
    "KERNEL_NAME",
    "PROFILES_FILE",
    "TEST_PROFILE",
    "StudyRowsError",
    "audit_html",
    "check_overrides",
    "check_parameter_type",
    "compare_summaries",
    "ensure_kernel",
    "export_html",
    "fmt_number",
    "fmt_row",
    "headline_html",
    "key_numbers",
    "key_numbers_from_rows",
    "key_numbers_from_summary",
    "list_notebooks",
    "load_profile",
    "load_profiles",
    "parameters_for",
    "previous_entries",
    "previous_summary",
    "record_summary",
    "resolved_parameters",
    "run_notebook",
    "run_profile",
    "runs_provenance",
    "study_rows",
    "write_index",
]
