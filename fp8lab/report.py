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
    import yaml

    return yaml.safe_load(path.read_text())


def load_profile(name: str, path: Path = PROFILES_FILE) -> dict[str, Any]:
    profiles = load_profiles(path)
    if name not in profiles:
        raise SpecError("Profile", "name", name, "one of " + " | ".join(profiles))
    return profiles[name]


def list_notebooks(names: Sequence[str] | None = None, nb_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Notebooks to run: all ``NN_*.ipynb`` in order, or the named ones (by stem, file name or path)."""
    available = sorted(nb_dir.glob("[0-9][0-9]_*.ipynb"))
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


def parameters_for(notebook: Path, profile: dict[str, Any], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile's parameters that this notebook declares (papermill would warn on the others)."""
    import papermill

    declared = set(papermill.inspect_notebook(str(notebook)))
    merged = dict(profile.get("params", {}))
    merged.update((profile.get("notebooks") or {}).get(notebook.stem, {}) or {})
    merged.update(overrides or {})
    return {k: v for k, v in merged.items() if k in declared}


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
    """Execute one notebook with papermill, export its HTML; never raises for a failing notebook."""
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = notebook.stem
    out_nb, out_html, summary_path = out_dir / f"{stem}.ipynb", out_dir / f"{stem}.html", out_dir / f"{stem}.summary.json"
    summary_path.unlink(missing_ok=True)
    entry: dict[str, Any] = {"notebook": stem, "parameters": params, "status": "ok", "error": None}
    old = os.environ.get("FP8LAB_SUMMARY_PATH")
    os.environ["FP8LAB_SUMMARY_PATH"] = str(summary_path)
    t0 = time.perf_counter()
    try:
        papermill.execute_notebook(str(notebook), str(out_nb), parameters=params, cwd=str(REPO_ROOT),
                                   kernel_name=ensure_kernel(), progress_bar=progress, execution_timeout=timeout_s)
    except Exception as exc:  # papermill raises PapermillExecutionError with the cell's traceback
        entry["status"] = "failed"
        entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:2000]
    finally:
        if old is None:
            os.environ.pop("FP8LAB_SUMMARY_PATH", None)
        else:
            os.environ["FP8LAB_SUMMARY_PATH"] = old
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
    return entry


def run_profile(profile_name: str, out_dir: Path, notebooks: Sequence[str] | None = None,
                overrides: dict[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run notebooks on a profile into ``out_dir``: executed ``.ipynb``, ``.html``, ``index.html``, ``summary.json``."""
    from tqdm.auto import tqdm

    from fp8lab.devices import provenance

    profile = load_profile(profile_name)
    paths = list_notebooks(notebooks)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    bar = tqdm(paths, desc=f"fp8lab run [{profile_name}]", unit="notebook", disable=not progress)
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        entries.append(run_notebook(nb, out_dir, parameters_for(nb, profile, overrides), progress=progress))
    summary = {
        "profile": profile_name,
        "description": profile.get("description", ""),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "provenance": provenance(with_torch=False),
        "notebooks": {e["notebook"]: e for e in entries},
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


def write_index(out_dir: Path, summary: dict[str, Any]) -> Path:
    """``index.html``: one row per notebook (status, time, link) and each notebook's key numbers."""
    rows, details = [], []
    for name, e in summary["notebooks"].items():
        link = f'<a href="{html.escape(e["html"])}">{html.escape(name)}</a>' if e.get("html") else html.escape(name)
        err = f'<br><small>{html.escape(e["error"] or "")}</small>' if e.get("error") else ""
        rows.append(f"<tr><td>{link}</td><td class='{e['status']}'>{e['status']}{err}</td><td>{e.get('wall_s', '')}</td></tr>")
        if e.get("summary"):
            items = "".join(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>" for k, v in sorted(e["summary"].items()))
            details.append(f"<h3>{html.escape(name)}</h3><table>{items}</table>")
    prov = summary.get("provenance", {})
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>fp8lab report: {html.escape(summary['profile'])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}}
.ok{{color:#070}}.failed{{color:#b00}}small{{color:#555}}</style></head><body>
<h1>fp8lab report &mdash; profile <code>{html.escape(summary['profile'])}</code></h1>
<p>{html.escape(summary.get('description', ''))}</p>
<p>Created {html.escape(summary['created_utc'])} on {html.escape(str(prov.get('device', '')))};
fp8lab {html.escape(str(prov.get('fp8lab_commit', ''))[:12])}, vLLM {html.escape(str(prov.get('vllm')))}.</p>
<h2>Studies</h2><table><tr><th>notebook</th><th>status</th><th>wall (s)</th></tr>{''.join(rows)}</table>
<h2>Key numbers (summary.json)</h2>{''.join(details)}
</body></html>"""
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
