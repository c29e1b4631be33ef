"""The reader's format: one layer that every table, sentence and chart of a report goes through.

Two halves, one set of rules (checked by :mod:`fp8lab.report.pagecheck`):

- **at the source**, in a notebook's kernel (:func:`install`, called by ``fp8lab.report.run.setup_notebook`` and by
  importing ``fp8lab.report.readable`` in IPython): a pandas frame is shown by :func:`frame_html` (no index column, units
  from the column names, fixed decimals per column, "not measured: <reason>" for a missing value, every row and
  column: nothing cut, a scrolling box that fits the page); a matplotlib figure by :func:`figure_html` (alt text
  built from its title, axes and series; a sentence instead of a chart that has no data);
- **at export**, over the whole page (:func:`tidy_page`, which ``fp8lab.report.htmlexport`` applies, and which also
  re-applies to a page already written): a missing cell, a number in scientific notation or with 16 digits, a
  negative zero, a raw exception (kept as a sentence with its classified cause; the trace stays in the run's log)
  and a machine path are rewritten wherever the source did not already.

Units come from the column-name suffixes of :data:`UNIT_SUFFIXES` (``tpot_ms`` -> "tpot (ms)").
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from typing import Any

from fp8lab.engine.result import classify_failure

#: Column-name suffix -> the unit shown in the header.
UNIT_SUFFIXES: dict[str, str] = {
    "_ms": "ms",
    "_us": "µs",
    "_s": "s",
    "_gib": "GiB",
    "_gb": "GB",
    "_mib": "MiB",
    "_bytes": "bytes",
    "_gbs": "GB/s",
    "_gb_s": "GB/s",
    "_tok_s": "tokens/s",
    "_tps": "tokens/s",
    "_pct": "%",
    "_pp": "pp",
    "_tokens": "tokens",
}
NOT_MEASURED = "not measured"
_REASON_COLUMNS = ("reason", "error", "status_reason", "why", "note", "status")


# --------------------------------------------------------------------------------------------- numbers
def decimals_for(values: list[float]) -> int:
    """Decimals that show about three significant digits of a column's typical (median) magnitude, 0 to 6."""
    mags = sorted(abs(v) for v in values if v is not None and math.isfinite(v) and v != 0)
    if not mags:
        return 1
    typical = mags[len(mags) // 2]
    if typical >= 100:
        return 0
    return max(0, min(6, 2 - math.floor(math.log10(typical))))


def fmt_number(x: float, decimals: int) -> str:
    """``x`` with ``decimals`` fixed decimals and thousands separators; never scientific, never ``-0``."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return NOT_MEASURED
    if float(x) != 0 and abs(float(x)) < 10 ** (-decimals) / 2:  # too small for the column's decimals
        decimals = min(6, -math.floor(math.log10(abs(float(x)))) + 1)
        if abs(float(x)) < 0.5e-6:
            return "< 0.000001" if x > 0 else "> -0.000001"
    text = f"{float(x):,.{decimals}f}"
    if re.fullmatch(r"[-−]0(?:\.0+)?", text):
        text = text[1:]
    return text


def header(name: Any) -> str:
    """A column header with its unit: ``tpot_ms`` -> ``tpot (ms)``; other names unchanged."""
    text = str(name)
    low = text.lower()
    for suffix, unit in sorted(UNIT_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if low.endswith(suffix) and len(text) > len(suffix):
            return f"{text[: -len(suffix)]} ({unit})"
    return text


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        import pandas as pd

        return bool(pd.isna(v)) if not isinstance(v, (list, tuple, dict, set)) else False
    except (TypeError, ValueError):
        return False


def _reason(row: Any) -> str:
    for col in _REASON_COLUMNS:
        if col in row.index and not _is_missing(row[col]) and str(row[col]) not in ("ok", ""):
            return sentence_for_error(str(row[col]), short=True)
    return "not recorded"


# ----------------------------------------------------------------------------------------------- tables
def frame_html(frame: Any) -> str:
    """A pandas frame as the reader's table (see the module docstring); every row and column."""
    import pandas as pd

    df = frame.copy()
    if isinstance(df.columns, pd.MultiIndex):
        df.columns = [" ".join(str(p) for p in c if str(p) and not str(p).startswith("Unnamed")) for c in df.columns]
    default_index = isinstance(df.index, pd.RangeIndex) and df.index.name is None
    if not default_index:
        names = [n if n is not None else "" for n in (df.index.names or [None])]
        df = df.reset_index()
        if all(n == "" for n in names) and "index" in df.columns:
            df = df.rename(columns={"index": ""})
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        s = df[col]
        numeric = pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
        floats = pd.api.types.is_float_dtype(s)
        dec = decimals_for([float(v) for v in s if not _is_missing(v)]) if floats else 0
        cells = []
        for i, v in s.items():
            if _is_missing(v):
                cells.append(f"{NOT_MEASURED}: {_reason(df.loc[i])}")
            elif numeric:
                cells.append(fmt_number(float(v), dec if floats else 0))
            else:
                cells.append(tidy_text(str(v), cell=True))
        out[header(col)] = cells
    body = out.to_html(index=False, escape=True, border=0, classes="dataframe fp8lab-table", na_rep=NOT_MEASURED)
    return f'<div class="fp8lab-table-wrap">{body}</div>'  # scrolls within the page (the template's CSS)


# ---------------------------------------------------------------------------------------------- figures
def figure_has_data(fig: Any) -> bool:
    """Whether any axes of the figure draws data (a line with points, bars, a scatter, an image)."""
    for ax in fig.get_axes():
        if any(len(line.get_xdata()) for line in ax.get_lines()):
            return True
        if any(p.get_height() or p.get_width() for p in ax.patches if hasattr(p, "get_height")):
            return True
        if any(len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets")):
            return True
        if ax.images:
            return True
    return False


def figure_alt(fig: Any) -> str:
    """What the figure shows, in words: its title, each axes' title, y against x, and its series."""
    parts = []
    sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    if sup:
        parts.append(sup.strip())
    for ax in fig.get_axes():
        if not ax.get_visible() or (not ax.get_xlabel() and not ax.get_ylabel() and not ax.get_title()):
            continue
        bit = ax.get_title().strip()
        y, x = ax.get_ylabel().strip(), ax.get_xlabel().strip()
        if y or x:
            axes = f"{y} against {x}" if y and x else (y or f"values against {x}")
            bit = (bit + ": " if bit else "") + axes
        labels = [t for t in ax.get_legend_handles_labels()[1] if t and not t.startswith("_")]
        if labels:
            bit += " for " + ", ".join(dict.fromkeys(labels))
        parts.append(bit)
    text = "; ".join(p for p in parts if p) or "A chart of this section's measurements"
    return " ".join(re.sub(r"\$([^$]*)\$", r"\1", text).split())[:400]


def figure_html(fig: Any) -> str:
    """The figure as an ``<img>`` with alt text from :func:`figure_alt`, or a sentence if it has no data."""
    if not figure_has_data(fig):
        what = figure_alt(fig)
        return f'<p class="fp8lab-nochart"><em>No chart: nothing was measured for it ({html.escape(what)}).</em></p>'
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=fig.dpi)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(figure_alt(fig), quote=True)}" src="data:image/png;base64,{data}">'


def install() -> None:
    """In a running IPython kernel: frames and figures render through this layer, and pandas shows every
    row and column (the exporter folds long tables). Outside IPython it does nothing."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return
    ip = get_ipython()
    if ip is None:
        return
    import pandas as pd

    pd.set_option("display.max_columns", None)
    pd.set_option("display.max_rows", None)
    pd.set_option("display.width", None)
    pd.set_option("display.max_colwidth", None)
    fmt = ip.display_formatter.formatters["text/html"]
    fmt.for_type(pd.DataFrame, frame_html)

    def figures(*_: Any) -> None:
        # matplotlib's inline backend drops every formatter of the Figure class when it activates (on the first
        # pyplot import): registered again before each cell
        if ("matplotlib.figure", "Figure") not in fmt.deferred_printers and not any(
            getattr(t, "__name__", "") == "Figure" for t in fmt.type_printers
        ):
            fmt.for_type_by_name("matplotlib.figure", "Figure", figure_html)

    try:  # activate the inline backend now, so that its activation cannot drop the formatter later
        ip.run_line_magic("matplotlib", "inline")
    except Exception:  # pragma: no cover - no matplotlib: frames only
        pass
    figures()
    if figures.__name__ not in [getattr(f, "__name__", "") for f in ip.events.callbacks["pre_run_cell"]]:
        ip.events.register("pre_run_cell", figures)


# ------------------------------------------------------------------------------------- text and errors
_SCI = re.compile(r"(?<![\w.])([-+]?\d+(?:\.\d+)?[eE][-+]?\d+)(?![\w])")
_LONG = re.compile(r"(?<![\w.])(\d+\.\d{7,})(?![\w])")
_NEG_ZERO = re.compile(r"(?<![\w.])(\+-|\+−|[-−])(0(?:\.0+)?)(?![\d.])")
_EXC = re.compile(r"(?:Traceback \(most recent call last\):.*?)?(?<![\w])([A-Z]\w*(?:Error|Exception)): ", re.DOTALL)
_PATH = re.compile(r"(?<![\w.])/(?:tmp|work|home|root|Users|mnt|scratch|private|var/folders)(?:/[\w.@+-]+)+/?")
_MISSING_CELL = re.compile(r"^\s*(?:nan|NaN|None|<NA>|&lt;NA&gt;|NaT)\s*$")


def sig(x: float) -> str:
    """A number in fixed notation with about three significant digits."""
    if x == 0:
        return "0"
    return fmt_number(x, decimals_for([x]))


def _short_path(m: re.Match) -> str:
    parts = [p for p in m.group(0).split("/") if p]
    for anchor in ("reports", "data", "notebooks", "fp8lab"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) :])
    return "OUT/" + parts[-1] if len(parts) > 2 else "OUT"


def sentence_for_error(text: str, short: bool = False) -> str:
    """A raw exception as a sentence with its classified cause (``fp8lab.engine.result.classify_failure``)."""
    m = _EXC.search(text)
    if not m:
        return tidy_text(text, cell=True) if not short else tidy_text(text, cell=True)[:160]
    cause = classify_failure(text)
    message = text[m.end() :].strip().splitlines()[0] if text[m.end() :].strip() else ""
    message = _PATH.sub(_short_path, message)[:160]
    kind = re.sub(r"(?<!^)(?=[A-Z])", " ", m.group(1)).lower()
    before = text[: m.start()].strip()
    lead = f"{before} " if before and not before.startswith("Traceback") else ""
    return f"{lead}failed ({cause}; a {kind}): {message}".strip()


def tidy_text(text: str, cell: bool = False) -> str:
    """A visible string in the reader's format: no scientific notation or 16-digit decimals, no negative zero,
    no raw exception, no machine path; a whole cell that reads NaN/None becomes "not measured"."""
    if cell and _MISSING_CELL.match(text):
        return f"{NOT_MEASURED}: not recorded"
    if _EXC.search(text):
        text = sentence_for_error(text)
    text = _SCI.sub(lambda m: sig(float(m.group(1))), text)
    text = _LONG.sub(lambda m: sig(float(m.group(1))), text)
    text = _NEG_ZERO.sub(lambda m: ("±" if m.group(1).startswith("+") else "") + m.group(2), text)
    return _PATH.sub(_short_path, text)


_TAG = re.compile(r"(<[^>]+>)")
_RAW_TAGS = ("code", "style", "script", "math", "textarea")


def tidy_page(page: str) -> str:
    """Apply :func:`tidy_text` to every visible text of an HTML page (not inside code, <pre>, styles, scripts or
    MathML; the folded JSON summary dump is kept as recorded). Idempotent."""
    page = page.replace("<td><code>None</code></td>", "<td><em>not set (the study's default applies)</em></td>")
    # a frame cut by pandas on a page rendered before this layer: its "..." cells go, its size line says what
    # happened (a re-render shows the whole frame)
    page = re.sub(r"<t([dh])[^>]*>\s*(?:\.\.\.|…)\s*</t\1>", "", page)
    page = re.sub(
        r"(\d+) rows\s*×\s*(\d+) columns",
        r"A table of \1 rows and \2 columns, shown in part: this page was rendered before tables were shown whole; "
        r"the study's .summary.json has every value",
        page,
    )
    pieces = _TAG.split(page)
    raw_depth = 0
    code_depth = 0  # inside <style> or <script>: left exactly as it is
    dump_depth = 0
    out = []
    for i, piece in enumerate(pieces):
        if i % 2 == 1:  # a tag
            name = re.match(r"</?\s*([a-zA-Z0-9]+)", piece)
            tag = name.group(1).lower() if name else ""
            closing = piece.startswith("</")
            if tag in _RAW_TAGS and not piece.endswith("/>"):
                raw_depth += -1 if closing else 1
                raw_depth = max(raw_depth, 0)
                if tag in ("style", "script"):
                    code_depth = max(code_depth + (-1 if closing else 1), 0)
            if tag == "details" and not closing and dump_depth:
                dump_depth += 1
            elif tag == "details" and closing and dump_depth:
                dump_depth -= 1
            out.append(piece)
            continue
        if piece and raw_depth and not code_depth and not dump_depth:  # code spans: machine paths only
            out.append(_PATH.sub(_short_path, piece))
            continue
        if not piece or raw_depth or dump_depth:
            out.append(piece)
            continue
        if "as JSON" in piece and piece.lstrip().startswith("All ") and out and out[-1].startswith("<summary"):
            dump_depth = 1  # the rest of this <details> is the summary dump
            out.append(piece)
            continue
        prev = out[-1] if out else ""
        nxt = pieces[i + 1] if i + 1 < len(pieces) else ""
        cell = bool(re.match(r"<t[dh][\s>]", prev)) and bool(re.match(r"</t[dh]>", nxt))
        text = html.unescape(piece)
        new = tidy_text(text, cell=cell)
        out.append(piece if new == text else html.escape(new, quote=False))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m fp8lab.report.readable PAGE.html ...``: re-apply :func:`tidy_page` to pages already written."""
    import sys
    from pathlib import Path

    for name in argv if argv is not None else sys.argv[1:]:
        p = Path(name)
        page = p.read_text(encoding="utf-8")
        new = tidy_page(page)
        if new != page:
            p.write_text(new, encoding="utf-8")
            print(f"tidied {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
