"""Slim nbconvert HTML reports: :func:`fp8lab.report.htmlexport.export_html` applies :func:`slim` to every page it
writes, and committed pages are slimmed in place, without re-running their notebooks, by

    python -m fp8lab.report.htmlslim FILE.html [FILE.html ...]

- code cells lose their input (the code); a code cell without output goes entirely. Markdown cells and
  every output (tables, text, figures) stay as they are;
- ``<script>`` elements go: the CDN loaders (require.js, MathJax, mermaid) and MathJax's configuration,
  so the page needs no network (TeX in markdown then shows as its source);
- the stylesheet keeps only the rules whose selectors can match an element of the page (class names
  that occur in it) and the custom properties those rules use, and drops the JupyterLab UI icons
  (``--jp-icon-*`` data URLs); whitespace between the tags of tables goes;
- embedded PNG figures are re-encoded: RGBA with an opaque alpha channel as RGB, then as a palette of 16,
  32, 64, 128 or 256 colours, the smallest whose root-mean-square difference from the original is at most
  ``MAX_RMS`` = 4 of 255 levels (the anti-aliasing shades of a line merge into a neighbouring shade; not
  visible). A figure keeps its original encoding when the new one is not smaller.

- the folded dump of the summary (``record_summary``'s print, "All N recorded values as JSON") becomes a link
  to ``<stem>.summary.json`` beside the page (:func:`link_summary_dump`), only when that file holds exactly the
  same values: ``fp8lab run`` does this once the page and its summary are in place, and the command line does
  it for a page whose summary file lies beside it.

Idempotent: a slimmed file is left byte-identical. Prints each file's size before and after.
"""

from __future__ import annotations

import argparse
import base64
import io
import re
from pathlib import Path

_DIV = re.compile(r"<div\b[^>]*>|</div\s*>", re.I)


def _div_end(html: str, start: int) -> int:
    """Index just past the ``</div>`` that closes the ``<div`` opening at ``start``."""
    depth = 0
    for m in _DIV.finditer(html, start):
        depth += -1 if m.group(0).startswith("</") else 1
        if depth == 0:
            return m.end()
    raise ValueError(f"unbalanced <div> at {start}")


def drop_code_inputs(html: str) -> str:
    out, pos = [], 0
    cell = re.compile(r'<div class="jp-Cell jp-CodeCell[^"]*"[^>]*>')
    while (m := cell.search(html, pos)) is not None:
        end = _div_end(html, m.start())
        body = html[m.start() : end]
        out.append(html[pos : m.start()])
        if "jp-mod-noOutputs" not in m.group(0):
            w = re.search(r'<div class="jp-Cell-inputWrapper"[^>]*>', body)
            if w is not None:
                body = body[: w.start()] + body[_div_end(body, w.start()) :]
            out.append(body)
        pos = end
    out.append(html[pos:])
    return "".join(out)


def drop_scripts(html: str) -> str:
    return re.sub(r"\s*<script\b[^>]*>.*?</script>", "", html, flags=re.S | re.I)


# ---------------------------------------------------------------------------------------------- CSS
def _blocks(css: str) -> list[tuple[str, str]]:
    """Top-level (prelude, body) pairs of a stylesheet without comments; a statement (``@import x;``) has body None."""
    out, i, n = [], 0, len(css)
    while i < n:
        j = css.find("{", i)
        k = css.find(";", i)
        if j < 0:
            break
        if 0 <= k < j and css[i:k].strip().startswith("@"):
            out.append((css[i : k + 1].strip(), None))
            i = k + 1
            continue
        depth, p = 0, j
        while p < n:
            if css[p] == "{":
                depth += 1
            elif css[p] == "}":
                depth -= 1
                if depth == 0:
                    break
            p += 1
        out.append((css[i:j].strip(), css[j + 1 : p]))
        i = p + 1
    return out


def _selector_used(sel: str, classes: set[str]) -> bool:
    sel = re.sub(r":(not|has|is|where)\([^)]*\)", "", sel)
    return all(c in classes for c in re.findall(r"\.(-?[_a-zA-Z][-\w]*)", sel))


def prune_css(css: str, classes: set[str]) -> str:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    out = []
    for prelude, body in _blocks(css):
        if body is None:
            out.append(prelude)
        elif prelude.startswith("@media") or prelude.startswith("@supports"):
            inner = prune_css(body, classes)
            if inner.strip():
                out.append(f"{prelude} {{\n{inner}\n}}")
        elif prelude.startswith("@"):
            out.append(f"{prelude} {{{body}}}")
        else:
            kept = [s.strip() for s in prelude.split(",") if _selector_used(s, classes)]
            body = re.sub(r"--jp-icon-[\w-]+\s*:\s*url\(data:[^)]*\)\s*;?", "", body)
            body = re.sub(r"\n\s*\n+", "\n", body)
            if kept and body.strip():
                out.append(f"{', '.join(kept)} {{{body}}}")
    return "\n".join(out)


_VAR_DEF = re.compile(r"(--[\w-]+)\s*:\s*([^;{}]*);?")


def prune_variables(styles: list[str]) -> list[str]:
    """``styles`` without the custom properties (``--x: ...``) that no kept rule of any of them uses, directly
    or through another property."""
    joined = "\n".join(styles)
    used = set(re.findall(r"var\((--[\w-]+)", _VAR_DEF.sub("", joined)))
    defs: dict[str, list[str]] = {}
    for name, value in _VAR_DEF.findall(joined):
        defs.setdefault(name, []).append(value)
    todo = list(used)
    while todo:
        for value in defs.get(todo.pop(), []):
            for ref in re.findall(r"var\((--[\w-]+)", value):
                if ref not in used:
                    used.add(ref)
                    todo.append(ref)
    out = []
    for css in styles:
        css = _VAR_DEF.sub(lambda m: m.group(0) if m.group(1) in used else "", css)
        css = re.sub(r"[^{}]*\{\s*\}", "", css)  # rules left empty
        out.append(re.sub(r"\n\s*\n+", "\n", css))
    return out


def slim_styles(html: str) -> str:
    classes = {c for attr in re.findall(r'class="([^"]*)"', html) for c in attr.split()}
    html = re.sub(
        r"(<style[^>]*>)(.*?)(</style>)",
        lambda m: m.group(1) + prune_css(m.group(2), classes) + m.group(3),
        html,
        flags=re.S,
    )
    it = iter(prune_variables(re.findall(r"<style[^>]*>(.*?)</style>", html, flags=re.S)))
    html = re.sub(r"(<style[^>]*>)(.*?)(</style>)", lambda m: m.group(1) + next(it) + m.group(3), html, flags=re.S)
    return re.sub(r"<style[^>]*>\s*</style>\s*", "", html)


def squeeze_tables(html: str) -> str:
    """Whitespace between the tags of tables (pandas indents every cell) collapsed; text and ``<pre>`` kept."""
    return re.sub(r"<table\b.*?</table>", lambda m: re.sub(r">\s+<", "><", m.group(0)), html, flags=re.S)


# ---------------------------------------------------------------------------------------------- PNG
#: Largest root-mean-square difference (0-255 levels, over every pixel and channel) a re-encoded figure may have.
MAX_RMS = 4.0


def slim_png(data: bytes) -> bytes:
    from PIL import Image

    im = Image.open(io.BytesIO(data))
    im.load()
    if im.mode == "P":
        return data  # a palette image already (slimmed before)
    if im.mode == "RGBA" and im.getchannel("A").getextrema() == (255, 255):
        im = im.convert("RGB")
    if im.mode not in ("RGB", "L"):
        return data
    import numpy as np

    ref = np.asarray(im.convert("RGB"), dtype=float)
    for colors in (16, 32, 64, 128, 256):  # the smallest palette that stays within MAX_RMS of the original
        q = im.quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        if np.sqrt(((np.asarray(q.convert("RGB"), dtype=float) - ref) ** 2).mean()) <= MAX_RMS:
            break
    else:
        return data
    buf = io.BytesIO()
    q.save(buf, "PNG", optimize=True, dpi=im.info.get("dpi", (100, 100)))
    new = buf.getvalue()
    return new if len(new) < len(data) else data


def slim_images(html: str) -> str:
    def sub(m: re.Match) -> str:
        data = base64.b64decode(m.group(2))
        return m.group(1) + base64.b64encode(slim_png(data)).decode()

    return re.sub(r'(<img\b[^>]*?src="data:image/png;base64,)([A-Za-z0-9+/=\s]+)', sub, html)


def slim(html: str) -> str:
    return squeeze_tables(slim_images(slim_styles(drop_scripts(drop_code_inputs(html)))))


_SUMMARY_DUMP = re.compile(
    r'<details class="fp8lab-fold"><summary>(All (\d+) recorded values as JSON)[^<]*</summary><pre>(.*?)</pre></details>',
    re.S,
)


def link_summary_dump(html_text: str, summary_path: Path) -> str:
    """``html_text`` with its folded summary dump replaced by a link to ``summary_path`` (a sibling file, linked by
    name), when that file's values equal the dump's; else unchanged (no dump, no file, other values)."""
    import html as html_mod
    import json

    m = _SUMMARY_DUMP.search(html_text)
    if m is None or not summary_path.is_file():
        return html_text
    try:
        same = json.loads(html_mod.unescape(m.group(3))) == json.loads(summary_path.read_text(encoding="utf-8"))
    except ValueError:
        return html_text
    if not same:
        return html_text
    name = html_mod.escape(summary_path.name)
    link = f'<p class="fp8lab-summary-link">{m.group(1)}: <a href="{name}">{name}</a> (beside this page).</p>'
    return html_text[: m.start()] + link + html_text[m.end() :]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    for f in ap.parse_args().files:
        before = f.read_text(encoding="utf-8")
        after = link_summary_dump(slim(before), f.with_name(f.name[: -len(".html")] + ".summary.json"))
        if after != before:
            f.write_text(after, encoding="utf-8")
        print(f"{f}: {len(before.encode()):,} -> {len(after.encode()):,} bytes")


if __name__ == "__main__":
    main()
