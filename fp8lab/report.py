"""Reports: run notebooks headlessly (papermill), export HTML (nbconvert), write an index.

A notebook's last cells call :func:`record_summary` with its key numbers; the runner points each
notebook at its own summary file (``$FP8LAB_SUMMARY_PATH``) and merges them into ``summary.json``,
so tests and the overall report read numbers, never scraped HTML.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp8lab.errors import SpecError
from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT, runs_dir

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")
#: The test suite's notebook tier runs on this profile (cpu-tiny with fewer repetitions; profiles.yaml says why).
TEST_PROFILE = "cpu-ci"


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
    values: dict[str, Any], path: str | Path | None = None, rows: Sequence[dict[str, Any]] | None = None
) -> Path:
    """Write a notebook's key numbers as JSON and show them.

    The file is ``path``, else ``$FP8LAB_SUMMARY_PATH`` (set by ``fp8lab run``), else
    ``<runs>/summaries/last_summary.json`` (a notebook run by hand). Returns the path written.
    ``rows`` (the study's typed summary rows, :mod:`fp8lab.summary_table`) are validated first (a bad row raises
    before anything is written) and written beside it as ``<stem>.rows.json`` and ``.rows.parquet``; without
    ``rows`` a rows file left there by an earlier run is removed, so it never stands beside a newer summary.
    """
    from fp8lab import summary_table

    target = Path(path or os.environ.get("FP8LAB_SUMMARY_PATH") or runs_dir() / "summaries" / "last_summary.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    rows_file = summary_table.rows_path(target)
    if rows is not None:
        summary_table.write_rows(rows, rows_file)
    else:
        rows_file.unlink(missing_ok=True)
        summary_table.parquet_path(rows_file).unlink(missing_ok=True)
    clean = _clean(values)
    target.write_text(json.dumps(clean, indent=2, sort_keys=True))
    print(json.dumps(clean, indent=2, sort_keys=True))
    return target


# ----------------------------------------------------------------------------------------- profiles
def load_profiles(path: Path = PROFILES_FILE) -> dict[str, Any]:
    """The profiles file as ``{name: profile}``; a file that is not YAML, or whose entries are not mappings,
    raises :class:`SpecError` naming the file and the problem."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}: {getattr(exc, 'problem', '')})" if mark is not None else f" ({exc})"
        raise SpecError("Profile", "file", str(path), "a UTF-8 YAML mapping of profile names" + at) from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise SpecError(
            "Profile", "file", str(path), "a YAML mapping of profile name -> {description, params, notebooks}"
        )
    for name, prof in data.items():
        for key in ("params", "notebooks"):
            if prof.get(key) is not None and not isinstance(prof[key], dict):
                raise SpecError("Profile", f"{name}.{key}", prof[key], "a mapping of NAME: value")
    return {name: _extended(name, data) for name in data}


def _extended(name: str, data: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Profile ``name`` with its ``extends: BASE`` resolved: the base's ``params`` and each of its notebook entries,
    updated by this profile's own (a notebook entry merges name by name; a value here replaces the base's)."""
    prof = data[name]
    base_name = prof.get("extends")
    if base_name is None:
        return prof
    if base_name not in data or base_name == name:
        raise SpecError(
            "Profile",
            f"{name}.extends",
            base_name,
            "the name of another profile: " + " | ".join(n for n in data if n != name),
        )
    if base_name in seen:
        raise SpecError(
            "Profile",
            f"{name}.extends",
            base_name,
            "a chain without a cycle (" + " -> ".join((*seen, name, base_name)) + ")",
        )
    base = _extended(base_name, data, (*seen, name))
    notebooks = {k: dict(v or {}) for k, v in (base.get("notebooks") or {}).items()}
    for nb, over in (prof.get("notebooks") or {}).items():
        notebooks[nb] = {**notebooks.get(nb, {}), **(over or {})}
    return {
        **base,
        **prof,
        "params": {**(base.get("params") or {}), **(prof.get("params") or {})},
        "notebooks": notebooks,
        "extends": base_name,
    }


def load_profile(name: str, path: Path = PROFILES_FILE) -> dict[str, Any]:
    profiles = load_profiles(path)
    if name not in profiles:
        raise SpecError("Profile", "name", name, "one of " + " | ".join(profiles))
    return profiles[name]


def list_notebooks(names: Sequence[str] | None = None, nb_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Notebooks to run: all ``NN_*.ipynb`` in order, the claims audit last (it reads the others' summaries),
    or the named ones (by stem, file name or path)."""
    available = sorted(nb_dir.glob("[0-9][0-9]_*.ipynb"), key=lambda p: (p.stem.endswith("claims_audit"), p.name))
    if not names:
        return available
    out = []
    for n in names:
        p = Path(n)
        if p.is_file():
            out.append(p.resolve())
            continue
        hits = [a for a in available if a.stem == p.stem or a.stem.startswith(p.stem)]
        if len(hits) != 1:
            raise SpecError(
                "RunSpec",
                "notebooks",
                n,
                "a notebook path or the (prefix of a) name of one of: " + ", ".join(a.stem for a in available),
            )
        out.append(hits[0])
    return out


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "True or False"
    if isinstance(value, (int, float)):
        return "a number" if isinstance(value, float) else "an integer"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "a string" if isinstance(value, str) else type(value).__name__


def check_parameter_type(where: str, name: str, value: Any, default: Any) -> None:
    """A notebook parameter's value must have the kind of the ``parameters`` cell's own default (an integer where
    it has an integer, a list where it has a list, ...; a float default takes an integer too; None, or a None
    default, takes anything): else :class:`SpecError` names it, before any kernel starts. A string where a
    list belongs (``-p KV_DTYPES fp8``) would otherwise be read letter by letter."""
    if value is None or default is None:
        return
    want, got = _kind(default), _kind(value)
    if want == got or (want == "a number" and got == "an integer"):
        return
    raise SpecError(where, name, value, f"{want} like the notebook's default {default!r} (or null)")


def _defaults(notebook: Path) -> dict[str, Any]:
    import ast

    import papermill

    out = {}
    for k, v in papermill.inspect_notebook(str(notebook)).items():
        try:
            out[k] = ast.literal_eval(v["default"])
        except (ValueError, SyntaxError):
            out[k] = None  # not a literal: no type to check against
    return out


def parameters_for(notebook: Path, profile: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile's parameters that this notebook declares (papermill would warn on the others). The shared
    ``params`` and ``overrides`` may name parameters of other notebooks; the notebook's own entry may not: a name
    there that the notebook does not declare (a typo) raises :class:`SpecError` naming it."""
    import papermill

    declared = set(papermill.inspect_notebook(str(notebook)))
    own = (profile.get("notebooks") or {}).get(notebook.stem, {}) or {}
    for k, v in own.items():
        if k not in declared:
            raise SpecError(
                "Profile",
                f"notebooks.{notebook.stem}.{k}",
                v,
                "not a parameter of that notebook; allowed: " + " | ".join(sorted(declared)),
            )
    merged = dict(profile.get("params", {}))
    merged.update(own)
    merged.update(overrides or {})
    defaults = _defaults(notebook)
    for k, v in merged.items():
        if k in declared:
            where = "RunSpec" if k in (overrides or {}) else f"Profile.{notebook.stem}"
            check_parameter_type(where, k, v, defaults.get(k))
    return {k: v for k, v in merged.items() if k in declared}


def check_overrides(notebooks: Sequence[Path], overrides: dict[str, Any] | None) -> None:
    """Each ``-p NAME`` override must be a parameter of at least one of the notebooks to run; else (a typo,
    silently dropped otherwise) :class:`SpecError` names it, before any notebook starts."""
    import papermill

    if not overrides:
        return
    declared = set().union(*(papermill.inspect_notebook(str(nb)) for nb in notebooks))
    for k, v in overrides.items():
        if k not in declared:
            raise SpecError(
                "RunSpec",
                k,
                v,
                f"not a parameter of {', '.join(nb.stem for nb in notebooks)}; allowed: "
                + " | ".join(sorted(declared)),
            )
    for nb in notebooks:  # wrong kinds of value, before any notebook starts
        defaults = _defaults(nb)
        for k, v in overrides.items():
            if k in defaults:
                check_parameter_type("RunSpec", k, v, defaults[k])


def resolved_parameters(
    notebook: Path, profile: dict[str, Any], overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every parameter of the notebook as papermill runs it: the ``parameters`` cell's own values, then the
    profile's (:func:`parameters_for`), then ``overrides`` (for code that builds the notebook's specs itself)."""
    import ast

    import papermill

    params = {k: ast.literal_eval(v["default"]) for k, v in papermill.inspect_notebook(str(notebook)).items()}
    params.update(parameters_for(notebook, profile, overrides))
    return params


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
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fp8lab (this environment)",
        "language": "python",
    }
    (kdir / "kernel.json").write_text(json.dumps(spec, indent=1))
    paths = [str(base)] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p and p != str(base)]
    os.environ["JUPYTER_PATH"] = os.pathsep.join(paths)
    return KERNEL_NAME


def export_html(ipynb: Path, html_path: Path) -> Path:
    """The reader's HTML of an executed notebook: verdict first, code hidden, offline (:mod:`fp8lab.htmlexport`)."""
    from fp8lab import htmlexport

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
    from fp8lab.summary_table import parquet_path, rows_path

    rows_moves = [(rows_path(summary_path), rows_path(final_summary))]
    rows_moves.append((parquet_path(rows_moves[0][0]), parquet_path(rows_moves[0][1])))
    for f in (out_nb, out_html, summary_path, *(src for src, _ in rows_moves)):
        f.unlink(missing_ok=True)
    entry: dict[str, Any] = {"notebook": stem, "parameters": params, "status": "ok", "error": None}
    # the kernel inherits these: where to record the summary, and the report folder the notebook writes into
    # (the claims audit reads its sibling studies' summaries there)
    # and where each engine run it loads or runs notes its provenance (fp8lab.results.note_run)
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
    from fp8lab.engine import share_forkserver

    share_forkserver()  # on a CPU, the kernels of this process's notebooks fork their engine workers from one server
    from fp8lab.degrade import notebook_for

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


def previous_summary(out_dir: Path, profile_name: str) -> dict[str, Any]:
    """``out_dir/summary.json`` when an earlier run of the same profile wrote it, else ``{}``."""
    try:
        prev = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return prev if isinstance(prev, dict) and prev.get("profile") == profile_name else {}


def previous_entries(out_dir: Path, profile_name: str) -> dict[str, dict[str, Any]]:
    """Notebooks an earlier run left in ``out_dir`` for the same profile, so that running a subset (say the
    claims audit alone, after the studies) keeps the others in ``summary.json`` and the index: the entries of
    an existing ``summary.json``, plus any ``NN_*.summary.json`` without an entry (``"from": "file"``)."""
    prev = previous_summary(out_dir, profile_name)
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

    from fp8lab.devices import provenance

    profile = load_profile(profile_name)
    paths = list_notebooks(notebooks)
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
    (out_dir / "summary.json").write_text(json.dumps(_clean(summary), indent=2, sort_keys=True))
    write_index(out_dir, summary)
    return summary


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
        for label, key in (("setting", "setting"), ("smallest detectable effect", "detectable"), ("basis", "basis")):
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


def key_numbers(stem: str, s: dict[str, Any]) -> list[tuple[str, str]]:
    """A study's few key numbers for the index, each ``(label with its unit, rounded value)``. Studies fp8lab
    does not know get their first scalar numbers. Missing values are left out."""
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
        claims = {
            "claim.gains_grow": "claim: FP8's gains grow with context",
            "claim.oom": "claim: bf16 runs out of memory first",
            "claim.block256": "claim: block size 256 beats 16 at the longest length",
            "claim.silent": "claim: silent quality loss along the context",
            "claim.random_tokens": "random tokens vs real text",
        }
        rows += [
            (claims.get(k, k.removeprefix("claim.")), str(v))
            for k, v in s.items()
            if k.startswith("claim.") and isinstance(v, str)
        ]
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
    elif stem.endswith("claims_audit"):
        counts = s.get("verdict_counts") or {}
        rows.append(("verdicts", ", ".join(f"{v} {k}" for k, v in counts.items()) or None))
    else:
        scalars = [(k, v) for k, v in sorted(s.items()) if isinstance(v, int | float | str) and not isinstance(v, bool)]
        rows += [(k, fmt_number(v)) for k, v in scalars[:6]]
    return [(label, value) for label, value in rows if value is not None]


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

    from fp8lab.htmlexport import notebook_title

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
    """``index.html``: the headline, the claims audit's table, then one short block per study (its key numbers,
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
        if s.get("not_measured"):  # no native FP8 kernel here (fp8lab.capability)
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
        nums = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in key_numbers(name, s))
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
#headline{{border-left:4px solid #2a6;padding-left:1em}}#headline li{{margin:.3em 0}}
.failed{{color:#b00}}small,.prov{{color:#555}}section.study{{margin:1.2em 0}}section.study h3{{margin-bottom:.2em}}
.v-confirmed{{background:#d8f0d8}}.v-refuted{{background:#f6d5d5}}.v-depends{{background:#fbeccb}}
.v-not-testable-here{{background:#e6e6e6}}.v-inconclusive{{background:#fbeccb}}table.audit td:nth-child(3){{font-weight:bold;white-space:nowrap}}</style></head><body>
<h1>fp8lab report &mdash; profile <code>{profile}</code></h1>
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
    path.write_text(page, encoding="utf-8")
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
