"""Export an executed notebook as a self-contained HTML report a reader can use.

What :func:`export_html` does to a copy of the executed notebook (the ``.ipynb`` keeps everything):

- the page opens with the notebook's title, then its **verdict** (the section headed "Verdict", "6. Verdict",
  "Summary and verdict", ...), anchored ``#verdict``, then one **parameters table** (the resolved values: the
  ``parameters`` cell's defaults with papermill's injected values applied) instead of the two parameter cells;
- code inputs are hidden; stderr (warnings, "Loading weights" bars, tqdm), progress widgets and carriage-return
  progress lines are dropped from the outputs;
- long text outputs (the summary JSON that ``record_summary`` prints, reprs) and long tables are folded in
  ``<details>`` (``fp8lab run`` then replaces the summary's fold by a link to the ``.summary.json`` beside the
  page, :func:`fp8lab.report.htmlslim.link_summary_dump`); an empty table says so; long floats in tables are shown to about 3 significant digits;
- every visible text goes through the reader's format (:func:`fp8lab.report.readable.tidy_page`: no NaN/None cells, no
  scientific notation, no negative zero, no raw exception, no machine path); frames and figures were already
  rendered by :mod:`fp8lab.report.readable` in the kernel;
- formulas (``$$...$$``, ``$...$`` in Markdown) become MathML at export time, so nothing loads from a CDN: the
  template (``fp8lab/report/templates/fp8lab``) drops require.js, MathJax, mermaid and widget scripts;
- the tab title is the notebook's title.

:func:`external_references` lists any ``src``/``href`` that would leave the file (tests assert it is empty).
"""

from __future__ import annotations

import ast
import copy
import html
import json
import re
from pathlib import Path
from typing import Any

from fp8lab.report.htmlslim import slim
from fp8lab.report.readable import sig, tidy_page

TEMPLATE_DIR = Path(__file__).with_name("templates")
TEMPLATE_NAME = "fp8lab"

#: A heading that opens a notebook's verdict section.
VERDICT_HEADING = re.compile(r"^#{1,4}\s+(?:\d+[a-z]?\.\s*)?(?:summary and\s+)?verdicts?\b", re.IGNORECASE)
#: Text outputs longer than this many lines, and tables with more rows, are folded.
FOLD_LINES = 15
FOLD_ROWS = 30
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_FLOAT_TD = re.compile(r"(<td[^>]*>)\s*(-?\d+\.\d{5,}(?:e[-+]?\d+)?)\s*(</td>)")
_WIDGET = "application/vnd.jupyter.widget-view+json"
_PATH_REPR = re.compile(r"^(Posix|Windows)Path\(.*\)$")


# ----------------------------------------------------------------------------------------------- math
def latex_to_mathml(tex: str, display: bool) -> str:
    """MathML for a LaTeX formula (``latex2mathml``), or the escaped TeX in ``<code>`` if it cannot convert."""
    try:
        from latex2mathml.converter import convert
    except ImportError:  # pragma: no cover - latex2mathml is a dependency of the lab extra
        return f"<code>{html.escape(tex)}</code>"
    try:
        out = convert(tex.strip(), display="block" if display else "inline")
    except Exception:
        return f"<code>{html.escape(tex)}</code>"
    return out.replace("\\_", "_").replace("\n", " ")


_CODE_SPAN = re.compile(r"(```.*?```|`[^`\n]*`)", re.DOTALL)
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.DOTALL)
_INLINE_MATH = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]+?)(?<=\S)\$(?![\w$])")


def render_math(markdown: str) -> str:
    """``$$...$$`` and ``$...$`` in Markdown (outside code spans) replaced by MathML."""
    parts = _CODE_SPAN.split(markdown)
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        p = _DISPLAY_MATH.sub(lambda m: "\n\n" + latex_to_mathml(m.group(1), True) + "\n\n", parts[i])
        parts[i] = _INLINE_MATH.sub(lambda m: latex_to_mathml(m.group(1), False), p)
    return "".join(parts)


# ----------------------------------------------------------------------------------------- parameters
def _assignments(source: str) -> dict[str, tuple[str, str]]:
    """``NAME = value  # comment`` lines of a parameters cell: name -> (value source, comment)."""
    out: dict[str, tuple[str, str]] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return out
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = ast.get_source_segment(source, node.value) or ""
            rest = lines[node.end_lineno - 1][node.end_col_offset :] if node.end_lineno else ""
            comment = rest.split("#", 1)[1].strip() if "#" in rest else ""
            out[node.targets[0].id] = (value, comment)
    return out


def _short(value: str, limit: int = 160) -> str:
    value = " ".join(value.split())
    return value if len(value) <= limit else value[: limit - 1] + "…"


def parameters_html(defaults_src: str, injected_src: str | None) -> str:
    """One table of the parameters as the notebook ran: name, value (the injected one where papermill set it),
    where the value came from and the parameter's comment."""
    defaults, injected = _assignments(defaults_src), _assignments(injected_src or "")
    rows = []
    for name in list(defaults) + [n for n in injected if n not in defaults]:
        value, comment = defaults.get(name, ("", ""))
        origin = "default"
        if name in injected:
            origin = "run" if injected[name][0] != value else "default"
            value = injected[name][0]
        shown = (
            "<em>not set (the study's default applies)</em>"
            if value == "None"
            else (f"<code>{html.escape(_short(value))}</code>")
        )
        rows.append(
            f"<tr><td><code>{html.escape(name)}</code></td><td>{shown}</td>"
            f"<td>{origin}</td><td>{html.escape(comment)}</td></tr>"
        )
    return (
        '<h2 id="parameters">Parameters</h2>\n<table class="fp8lab-params"><thead><tr><th>parameter</th>'
        "<th>value</th><th>set by</th><th>meaning</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>\n"
    )


# ------------------------------------------------------------------------------------------- outputs
def _text(v: Any) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


def _fold(summary: str, inner_html: str) -> dict[str, Any]:
    import nbformat

    body = f'<details class="fp8lab-fold"><summary>{html.escape(summary)}</summary>{inner_html}</details>'
    return nbformat.v4.new_output("display_data", data={"text/html": body})


def _fold_text(text: str, what: str) -> dict[str, Any]:
    n = text.count("\n") + 1
    label = f"{what} ({n} lines; click to open)"
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            label = f"All {len(parsed)} recorded values as JSON (also in the notebook's .summary.json; click to open)"
    except ValueError:
        pass
    return _fold(label, f"<pre>{html.escape(text)}</pre>")


def _strip_progress(text: str) -> str:
    """Keep what a terminal would show of carriage-return progress lines (the last state)."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def _round_table_floats(table_html: str) -> str:
    def fmt(m: re.Match) -> str:
        return f"{m.group(1)}{sig(float(m.group(2)))}{m.group(3)}"

    return _FLOAT_TD.sub(fmt, table_html)


def clean_outputs(outputs: list[Any]) -> list[Any]:
    """The outputs a reader sees: no stderr, no widgets, progress lines collapsed, long text and tables folded."""
    out = []
    for o in outputs:
        kind = o.get("output_type")
        if kind == "stream":
            if o.get("name") == "stderr":
                continue
            text = _strip_progress(_text(o.get("text", ""))).strip("\n")
            if not text.strip():
                continue
            if text.count("\n") + 1 > FOLD_LINES:
                out.append(_fold_text(text, "Printed output"))
            else:
                o = copy.deepcopy(o)
                o["text"] = text + "\n"
                out.append(o)
            continue
        if kind in ("display_data", "execute_result"):
            data = o.get("data", {})
            if _WIDGET in data:
                continue
            if "text/html" in data:
                h = _text(data["text/html"])
                if "<table" in h:
                    bodies = re.findall(r"<tbody>(.*?)</tbody>", h, re.DOTALL)
                    rows = sum(b.count("<tr") for b in bodies)
                    h = _round_table_floats(h)
                    if bodies and rows == 0:
                        h = "<p><em>(This table has no rows.)</em></p>"
                    o = copy.deepcopy(o)
                    o["data"] = {"text/html": h}
                    if rows > FOLD_ROWS:
                        out.append(_fold(f"Table of {rows} rows (click to open)", h))
                        continue
                    out.append(o)
                    continue
            elif "text/markdown" in data:
                o = copy.deepcopy(o)
                o["data"] = {**data, "text/markdown": render_math(_text(data["text/markdown"]))}
            elif set(data) <= {"text/plain"}:
                text = _text(data.get("text/plain", ""))
                if _PATH_REPR.match(text.strip()):  # a returned path (record_summary's): the kernel's, not the reader's
                    continue
                if text.count("\n") + 1 > FOLD_LINES:
                    out.append(_fold_text(text, "Output"))
                    continue
        out.append(o)
    return out


# ------------------------------------------------------------------------------------------ structure
def _heading(cell: Any) -> tuple[int, str] | None:
    if cell.cell_type != "markdown":
        return None
    first = cell.source.lstrip().split("\n", 1)[0]
    m = _HEADING.match(first)
    return (len(m.group(1)), m.group(2).strip()) if m else None


def notebook_title(nb: Any) -> str | None:
    """The first level-1 heading's text, without Markdown marks."""
    for c in nb.cells:
        h = _heading(c)
        if h and h[0] == 1:
            return re.sub(r"[`*_]", "", h[1]).strip()
    return None


def verdict_span(nb: Any) -> tuple[int, int] | None:
    """``(start, stop)`` of the verdict section's cells: its heading up to the next heading of the same or a
    higher level (or the end)."""
    for i, c in enumerate(nb.cells):
        h = _heading(c)
        if h and VERDICT_HEADING.match(c.source.lstrip().split("\n", 1)[0]):
            j = i + 1
            while j < len(nb.cells):
                h2 = _heading(nb.cells[j])
                if h2 and h2[0] <= h[0]:
                    break
                j += 1
            return i, j
    return None


def prepare(nb: Any) -> Any:
    """A copy of an executed notebook arranged for reading (see the module docstring)."""
    import nbformat

    nb = copy.deepcopy(nb)
    title = notebook_title(nb)
    if title:
        nb.metadata["title"] = title
    # the parameters: one table instead of the defaults cell and papermill's injected cell
    params = next((c for c in nb.cells if "parameters" in c.metadata.get("tags", [])), None)
    injected = next((c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])), None)
    params_cell = None
    if params is not None or injected is not None:
        params_cell = nbformat.v4.new_markdown_cell(
            parameters_html(params.source if params else "", injected.source if injected else None)
        )
    cells = [c for c in nb.cells if c is not params and c is not injected]
    for c in cells:
        if c.cell_type == "code":
            c.outputs = clean_outputs(c.get("outputs", []))
        elif c.cell_type == "markdown":
            c.source = render_math(c.source)
    nb.cells = cells
    # the verdict first: right after the title line
    span = verdict_span(nb)
    head: list[Any] = []
    if nb.cells and (h := _heading(nb.cells[0])) and h[0] == 1:
        first = nb.cells[0]
        title_line, _, rest = first.source.lstrip().partition("\n")
        head.append(nbformat.v4.new_markdown_cell(title_line))
        nb.cells = ([nbformat.v4.new_markdown_cell(rest)] if rest.strip() else []) + nb.cells[1:]
        if span:
            span = (span[0] - 1 + (1 if rest.strip() else 0), span[1] - 1 + (1 if rest.strip() else 0))
    verdict: list[Any] = []
    if span:
        verdict = nb.cells[span[0] : span[1]]
        nb.cells = nb.cells[: span[0]] + nb.cells[span[1] :]
        vh = verdict[0]
        heading_text = re.sub(r"^#+\s*(?:\d+[a-z]?\.\s*)?", "", vh.source.lstrip().split("\n", 1)[0]).strip()
        body = vh.source.lstrip().partition("\n")[2]
        vh.source = f'<h2 id="verdict">{html.escape(heading_text)}</h2>\n\n{body}'
        verdict.append(
            nbformat.v4.new_markdown_cell(
                "<hr>\n\n*The evidence follows: parameters, then each "
                "section as the notebook computed it (code hidden: see the "
                "executed `.ipynb`).*"
            )
        )
    nb.cells = head + verdict + ([params_cell] if params_cell else []) + nb.cells
    return nb


def export_html(ipynb: Path, html_path: Path) -> Path:
    """Write ``html_path``: the executed notebook ``ipynb`` prepared by :func:`prepare`, code hidden, offline."""
    import nbconvert
    import nbformat

    nb = prepare(nbformat.read(str(ipynb), as_version=4))
    exporter = nbconvert.HTMLExporter(
        template_name=TEMPLATE_NAME,
        extra_template_basedirs=[str(TEMPLATE_DIR)],
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": Path(ipynb).stem}})
    refs = external_references(body)
    if refs:
        raise RuntimeError(f"{html_path}: the exported page would load {refs[:3]} from outside the file")
    body = tidy_page(body)  # the reader's format over every visible text (fp8lab.report.readable)
    Path(html_path).write_text(slim(body), encoding="utf-8")  # pruned CSS, palette PNGs (fp8lab.report.htmlslim)
    return Path(html_path)


_REF = re.compile(
    r"""<(script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(src|href)\s*=\s*["']?(https?:)?//""", re.IGNORECASE
)
_CSS_URL = re.compile(r"""(@import|url\()\s*["']?(https?:)?//""", re.IGNORECASE)


def external_references(page: str) -> list[str]:
    """Tags (script, link, img, ...) whose ``src``/``href`` is a network URL, and CSS ``url()``/``@import`` of
    one: what would make a browser leave the file. Links a reader clicks (``<a href>``) are not loads."""
    hits = [m.group(0)[:120] for m in _REF.finditer(page)]
    hits += [page[m.start() : m.start() + 120] for m in _CSS_URL.finditer(page)]
    return hits
