"""The reader's text check over an HTML report: what a reader should never see on a page.

:func:`problems` lists, for one page, every visible string that breaks the reader's format
(``fp8lab.report.readable`` is the layer that produces pages which pass):

- ``missing``: a table cell or a sentence reading NaN, nan, None, <NA> or NaT instead of "not measured: <reason>";
- ``truncated``: a pandas frame cut for display ("3 rows × 27 columns", a "..." column or row);
- ``scientific``: a number in scientific notation (``4.31e-01``) or with more than six decimals
  (``4069.9173720405943``) outside code spans and folded raw dumps;
- ``negative-zero``: ``-0.0%``, ``+-0.0 pp``, ``-0`` (a rounded value that lost its sign's meaning);
- ``exception``: a raw exception (``TypeError: ...``, a traceback) instead of a sentence and its classified cause;
- ``machine-path``: a path on the machine that rendered the page (``/tmp/...``, ``/work/...``, ``/home/...``).

``python -m fp8lab.report.pagecheck reports`` checks every ``*.html`` below the folders named and exits 1 on a problem.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: A cell that says nothing was recorded, in pandas' words.
MISSING_CELL = re.compile(r"^(?:nan|NaN|None|<NA>|NaT|-nan|inf|-inf)$")
MISSING_PROSE = re.compile(r"<NA>|(?<![\w-])(?:nan|NaT)(?![\w-])")
TRUNCATED = re.compile(r"\d+\s+rows\s*[×x]\s*\d+\s+columns")
SCIENTIFIC = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?[eE][-+]\d+(?![\w])|(?<![\w.])[-+]?\d+\.\d+[eE]\d+(?![\w])")
LONG_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d{7,}(?![\w])")
NEGATIVE_ZERO = re.compile(r"(?<![\w.])(?:\+-|\+−|[-−])0(?:\.0+)?(?![\d.])")
EXCEPTION = re.compile(r"Traceback \(most recent call last\)|(?<![\w])[A-Z]\w*(?:Error|Exception): ")
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:tmp|work|home|root|Users|mnt|scratch|private|var/folders)/[\w.@-]+")


@dataclass(frozen=True)
class Problem:
    """One thing a reader should not see: its kind and the text around it."""

    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.text[:160]!r}"


def _soup(page: str):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, "html.parser")
    for tag in soup(["style", "script", "head", "title"]):
        tag.decompose()
    return soup


def _is_raw(el) -> bool:
    """Inside a code span, a <pre> block or a folded raw dump (the JSON summary): machine text by design."""
    return any(p.name in ("code", "pre") for p in el.parents) or el.name in ("code", "pre")


def _is_summary_dump(el) -> bool:
    """Inside the folded JSON dump of the summary (``record_summary``'s print): the machine-readable record."""
    for p in el.parents:
        if p.name == "details" and "fp8lab-fold" in (p.get("class") or []):
            s = p.find("summary")
            return bool(s and s.get_text().startswith("All ") and "as JSON" in s.get_text())
    return False


def problems(page: str) -> list[Problem]:
    """Every problem on one page (an HTML string), in page order."""
    soup = _soup(page)
    found: list[Problem] = []
    for cell in soup.find_all(["td", "th"]):
        if _is_summary_dump(cell):
            continue
        text = cell.get_text(" ", strip=True)
        if MISSING_CELL.match(text):
            found.append(Problem("missing", f"table cell {text!r}"))
        if text in ("...", "…"):
            found.append(Problem("truncated", "a '...' cell: the frame was cut for display"))
    for node in soup.find_all(string=True):
        text = str(node)
        if not text.strip():
            continue
        raw = _is_raw(node.parent) if node.parent is not None else False
        if node.parent is not None and _is_summary_dump(node.parent):
            continue
        in_cell = node.parent is not None and any(p.name in ("td", "th") for p in node.parents)
        if not in_cell and not raw and MISSING_PROSE.search(text):
            found.append(Problem("missing", text.strip()))
        if TRUNCATED.search(text):
            found.append(Problem("truncated", text.strip()))
        if not raw and (SCIENTIFIC.search(text) or LONG_DECIMAL.search(text)):
            found.append(Problem("scientific", text.strip()))
        if not raw and NEGATIVE_ZERO.search(text):
            found.append(Problem("negative-zero", text.strip()))
        if EXCEPTION.search(text):
            found.append(Problem("exception", text.strip()))
        if MACHINE_PATH.search(text):
            found.append(Problem("machine-path", text.strip()))
    return found


def check_files(paths: Iterable[Path]) -> dict[Path, list[Problem]]:
    """Each page with at least one problem, and its problems."""
    out: dict[Path, list[Problem]] = {}
    for p in paths:
        found = problems(Path(p).read_text(encoding="utf-8"))
        if found:
            out[Path(p)] = found
    return out


def pages_under(*roots: Path | str) -> list[Path]:
    """Every ``*.html`` file below the roots, sorted."""
    return sorted(p for r in roots for p in Path(r).rglob("*.html"))


def main(argv: list[str] | None = None) -> int:
    roots = (argv if argv is not None else sys.argv[1:]) or ["reports"]
    bad = check_files(pages_under(*roots))
    for path, found in bad.items():
        kinds: dict[str, int] = {}
        for f in found:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        print(f"{path}: {', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}")
        for f in found[:8]:
            print(f"    {f}")
    print(f"{len(pages_under(*roots))} pages, {len(bad)} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
