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

from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT, runs_dir
from fp8lab.specs import SpecError

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")


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


def record_summary(values: dict[str, Any], path: str | Path | None = None) -> Path:
    """Write a notebook's key numbers as JSON and show them.

    The file is ``path``, else ``$FP8LAB_SUMMARY_PATH`` (set by ``fp8lab run``), else
    ``<runs>/summaries/last_summary.json`` (a notebook run by hand). Returns the path written.
    """
    target = Path(path or os.environ.get("FP8LAB_SUMMARY_PATH") or runs_dir() / "summaries" / "last_summary.json")
    target.parent.mkdir(parents=True, exist_ok=True)
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
        raise SpecError("Profile", "file", str(path), "a YAML mapping of profile name -> {description, params, notebooks}")
    for name, prof in data.items():
        for key in ("params", "notebooks"):
            if prof.get(key) is not None and not isinstance(prof[key], dict):
                raise SpecError("Profile", f"{name}.{key}", prof[key], "a mapping of NAME: value")
    return data


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
            raise SpecError("RunSpec", "notebooks", n, "a notebook path or the (prefix of a) name of one of: "
                            + ", ".join(a.stem for a in available))
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
            raise SpecError("Profile", f"notebooks.{notebook.stem}.{k}", v,
                            "not a parameter of that notebook; allowed: " + " | ".join(sorted(declared)))
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
            raise SpecError("RunSpec", k, v, f"not a parameter of {', '.join(nb.stem for nb in notebooks)}; allowed: "
                            + " | ".join(sorted(declared)))
    for nb in notebooks:  # wrong kinds of value, before any notebook starts
        defaults = _defaults(nb)
        for k, v in overrides.items():
            if k in defaults:
                check_parameter_type("RunSpec", k, v, defaults[k])


def resolved_parameters(notebook: Path, profile: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
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
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "fp8lab (this environment)", "language": "python"}
    (kdir / "kernel.json").write_text(json.dumps(spec, indent=1))
    paths = [str(base)] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p and p != str(base)]
    os.environ["JUPYTER_PATH"] = os.pathsep.join(paths)
    return KERNEL_NAME


def export_html(ipynb: Path, html_path: Path) -> Path:
    import nbconvert
    import nbformat

    nb = nbformat.read(str(ipynb), as_version=4)
    body, _ = nbconvert.HTMLExporter(template_name="lab").from_notebook_node(nb)
    html_path.write_text(body, encoding="utf-8")
    return html_path


def run_notebook(notebook: Path, out_dir: Path, params: dict[str, Any], progress: bool = True,
                 timeout_s: int | None = None) -> dict[str, Any]:
    """Execute one notebook with papermill, export its HTML; never raises for a failing notebook.

    Nothing already in ``out_dir`` is replaced unless this run succeeds: the notebook and its summary are
    written as ``.<stem>.running.*`` and renamed onto ``<stem>.ipynb`` / ``.html`` / ``.summary.json`` only
    when it ran to its summary; a failed run is kept beside as ``<stem>.failed.ipynb`` / ``.failed.html``
    (``entry["failed_html"]``), and the last good result stays where it was."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = notebook.stem
    final_nb, final_html, final_summary = (out_dir / f"{stem}.ipynb", out_dir / f"{stem}.html",
                                           out_dir / f"{stem}.summary.json")
    out_nb, out_html, summary_path = (out_dir / f".{stem}.running.ipynb", out_dir / f".{stem}.running.html",
                                      out_dir / f".{stem}.running.summary.json")
    for f in (out_nb, out_html, summary_path):
        f.unlink(missing_ok=True)
    entry: dict[str, Any] = {"notebook": stem, "parameters": params, "status": "ok", "error": None}
    # the kernel inherits these: where to record the summary, and the report folder the notebook writes into
    # (the claims audit reads its sibling studies' summaries there)
    env = {"FP8LAB_SUMMARY_PATH": str(summary_path), "FP8LAB_REPORT_DIR": str(out_dir.resolve())}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    t0 = time.perf_counter()
    from fp8lab.degrade import notebook_for

    # a study this device cannot answer (no native FP8 KV kernel) runs reduced: it says what was not measured and why
    notebook = notebook_for(notebook, params, Path(tempfile.mkdtemp(prefix="fp8lab-degraded-")))
    try:
        papermill.execute_notebook(str(notebook), str(out_nb), parameters=params, cwd=str(REPO_ROOT),
                                   kernel_name=ensure_kernel(), progress_bar=progress, execution_timeout=timeout_s)
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
        entry["html"] = final_html.name if final_html.exists() else None
    else:
        for src, dst in ((out_nb, out_dir / f"{stem}.failed.ipynb"), (out_html, out_dir / f"{stem}.failed.html")):
            if src.exists():
                os.replace(src, dst)
        summary_path.unlink(missing_ok=True)
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
            out[stem] = {"notebook": stem, "status": "ok", "error": None, "wall_s": None, "from": "file",
                         "html": html_file.name if html_file.is_file() else None,
                         "summary": json.loads(f.read_text())}
    return out


def run_profile(profile_name: str, out_dir: Path, notebooks: Sequence[str] | None = None,
                overrides: dict[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
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
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        entry = run_notebook(nb, out_dir, parameters_for(nb, profile, overrides), progress=progress)
        entries.append({**entry, "ran_on": ran_on})  # kept with the entry when a later run keeps it
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


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return html.escape(json.dumps(v)[:200])
    return html.escape(str(v))


#: Summary key under which the claims audit (notebook 05) records its rows; ``write_index`` renders them.
AUDIT_ROWS_KEY = "audit_rows"


def audit_html(rows: Sequence[dict[str, Any]], notebook_html: str | None = None) -> str:
    """The claims audit as an HTML table: claim, verdict, what was measured, links to the evidence."""
    body = []
    for r in rows:
        links = " ".join(f'<a href="{html.escape(x["href"])}">{html.escape(x["label"])}</a>' for x in r.get("links") or [])
        on = f'<br><small>{html.escape(r["on_what"])}</small>' if r.get("on_what") else ""
        verdict = str(r.get("verdict", ""))
        body.append(f"<tr><td>{html.escape(str(r.get('id', '')))}</td><td>{html.escape(str(r.get('claim', '')))}"
                    f"<br><small>{html.escape(str(r.get('source', '')))}</small></td>"
                    f"<td class='v-{verdict.replace(' ', '-')}'>{html.escape(verdict)}</td>"
                    f"<td>{html.escape(str(r.get('measured', '')))}{on}</td><td>{links}</td></tr>")
    more = (f' Each verdict comes from a rule written next to it, over the recorded numbers: see '
            f'<a href="{html.escape(notebook_html)}">the audit notebook</a>.' if notebook_html else "")
    return (f"<h2>Claims audit</h2><p>What the field reports claimed, and what these records say.{more}</p>"
            "<table class='audit'><tr><th>#</th><th>claim (source)</th><th>verdict</th><th>measured</th>"
            f"<th>evidence</th></tr>{''.join(body)}</table>")


def write_index(out_dir: Path, summary: dict[str, Any]) -> Path:
    """``index.html``: the claims audit's table first (when a notebook recorded one), then one row per notebook
    (status, time, link) and each notebook's key numbers."""
    rows, details, audit = [], [], ""
    for name, e in summary["notebooks"].items():
        link = f'<a href="{html.escape(e["html"])}">{html.escape(name)}</a>' if e.get("html") else html.escape(name)
        err = f'<br><small>{html.escape(e["error"] or "")}</small>' if e.get("error") else ""
        if e.get("rerun_failed"):
            fail = e["rerun_failed"]
            fl = f' (<a href="{html.escape(fail["failed_html"])}">failed run</a>)' if fail.get("failed_html") else ""
            err += f'<br><small>a later rerun failed and was not kept{fl}: {html.escape(str(fail.get("error")))}</small>'
        where = e.get("ran_on") or {}
        dirty = " with uncommitted changes" if where.get("fp8lab_dirty") else ""
        origin = (f"{where.get('date_utc')} on {where.get('device')}, fp8lab {str(where.get('fp8lab_commit'))[:12]}{dirty}, "
                  f"vLLM {where.get('vllm')}" if where else "provenance in its engines' records")
        kept = f" <small>(kept from {html.escape(e['from'])}: {html.escape(origin)})</small>" if e.get("from") else ""
        nm = (e.get("summary") or {}).get("not_measured")  # no native FP8 kernel here (fp8lab.capability)
        err += f"<br><small>{html.escape(str(nm))}</small>" if nm else ""
        rows.append(f"<tr><td>{link}</td><td class='{e['status']}'>{e['status']}{kept}{err}</td>"
                    f"<td>{e.get('wall_s') or ''}</td></tr>")
        if e.get("summary"):
            if e["summary"].get(AUDIT_ROWS_KEY) and not audit:
                audit = audit_html(e["summary"][AUDIT_ROWS_KEY], e.get("html"))
            items = "".join(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>"
                            for k, v in sorted(e["summary"].items()) if k != AUDIT_ROWS_KEY)
            details.append(f"<h3>{html.escape(name)}</h3><table>{items}</table>")
    prov = summary.get("provenance", {})
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>fp8lab report: {html.escape(summary['profile'])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}}
.ok{{color:#070}}.failed{{color:#b00}}small{{color:#555}}
.v-confirmed{{background:#d8f0d8}}.v-refuted{{background:#f6d5d5}}.v-depends{{background:#fbeccb}}
.v-not-testable-here{{background:#e6e6e6}}table.audit td:nth-child(3){{font-weight:bold;white-space:nowrap}}</style></head><body>
<h1>fp8lab report &mdash; profile <code>{html.escape(summary['profile'])}</code></h1>
<p>{html.escape(summary.get('description', ''))}</p>
<p>Created {html.escape(summary['created_utc'])} on {html.escape(str(prov.get('device', '')))};
fp8lab {html.escape(str(prov.get('fp8lab_commit', ''))[:12])}, vLLM {html.escape(str(prov.get('vllm')))}
(notebooks marked as kept ran in an earlier call, as noted beside each).</p>
{audit}
<h2>Studies</h2><table><tr><th>notebook</th><th>status</th><th>wall (s)</th></tr>{''.join(rows)}</table>
<h2>Key numbers (summary.json)</h2>{''.join(details)}
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
        cols[Path(d).name] = {k: v for k, v in flat.items()
                              if rx.search(k) and isinstance(v, int | float) and not isinstance(v, bool)}
    return pd.DataFrame(cols).sort_index()
