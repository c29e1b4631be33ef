"""Build the text corpus for the shipped tiny model from the Python 3.11 documentation sources.

Source: the Debian package ``python3.11-doc`` (PSF License 2.0, see
``/usr/share/doc/python3.11-doc/copyright``), whose reStructuredText sources live in
``/usr/share/doc/python3.11/html/_sources/**/*.rst.txt`` (497 files, about 12 MB): English
technical prose with code examples, API signatures, lists and tables.

What this script does, deterministically (no randomness, files read in sorted order):

1. Light cleanup of each document (:func:`clean_rst`): Sphinx roles such as ``:func:`open```
   become the text a reader sees (````open````), hyperlinks keep their text, and pure markup that
   carries no prose (``.. index::`` blocks, ``.. _label:`` targets, author lines, ``toctree``
   blocks, comments) is dropped. Paragraph structure, code blocks and directives that carry
   content (``.. function:: open(file, mode='r')``, ``.. note::``) are kept verbatim.
2. Split BY DOCUMENT: documents are ordered by ``sha256(relative path)``; walking that order,
   documents go to the held-out set until it holds at least ``--heldout-bytes`` bytes, the rest is
   training text. Inside the held-out set, the first documents in the same order, up to
   ``--val-bytes`` bytes, are the *validation* part (used by the trainer to pick the best
   checkpoint); the remaining held-out documents are the *test* part (used for the reported
   perplexity, prompts and the studies' text).
3. Write ``.corpus/train.txt`` (gitignored, not shipped; documents separated by a line holding
   only :data:`DOC_SEPARATOR`), ``data/text/heldout.tar.xz`` (``heldout/<path>.txt``, one file per held-out
   document, shipped), ``data/text/heldout_manifest.json`` (per document: source path, sha256,
   bytes, role) and ``data/text/README.md``.

Run from the repository root::

    python scripts/build_corpus.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SRC = Path("/usr/share/doc/python3.11/html/_sources")
DEBIAN_PACKAGE = "python3.11-doc"
CORPUS_DIR = REPO_ROOT / ".corpus"
TEXT_DIR = REPO_ROOT / "data" / "text"
HELDOUT_DIR = TEXT_DIR / "heldout"
HELDOUT_ARCHIVE = TEXT_DIR / "heldout.tar.xz"  # what the repository ships: HELDOUT_DIR's files, packed
MANIFEST_PATH = TEXT_DIR / "heldout_manifest.json"

#: Line that separates documents in ``.corpus/train.txt`` (the tokenizer's end-of-text token).
DOC_SEPARATOR = "<|endoftext|>"

#: Held-out target size, bytes of cleaned UTF-8 text. 2.0 MB is about 0.5M tokens under an
#: 8K BPE vocabulary: enough for a 128K-token long document plus a separate >= 100K-token
#: calibration set of >= 500 samples, and under the 2.5 MB shipping budget.
DEFAULT_HELDOUT_BYTES = 2_000_000
#: Validation part of the held-out set (model selection during training), bytes.
DEFAULT_VAL_BYTES = 350_000

# Directives that are pure markup: the directive line and its indented body are dropped.
_DROP_DIRECTIVES = (
    "index",
    "toctree",
    "sectionauthor",
    "moduleauthor",
    "highlight",
    "currentmodule",
    "tabularcolumns",
    "include",
    "literalinclude",
    "only",
    "raw",
    "testsetup",
    "testcleanup",
)
_DIRECTIVE_RE = re.compile(r"^\.\.\s+([A-Za-z0-9:_-]+)::")
_TARGET_RE = re.compile(r"^\.\.\s+_[^:]*:")  # .. _label:  (hyperlink targets)
_COMMENT_RE = re.compile(r"^\.\.(\s|$)")  # any other ".." line is an rst comment
# :role:`text`, :c:func:`text`, with optional "~" or "!" prefixes and "title <target>" forms.
_ROLE_RE = re.compile(r":(?:[a-z]+:)?([a-z]+):`([^`]+)`")
_LINK_RE = re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?")  # `text <url>`_  -> text
# Roles whose text is code (rendered as an inline literal) rather than prose.
_CODE_ROLES = {
    "func",
    "meth",
    "class",
    "mod",
    "data",
    "attr",
    "exc",
    "const",
    "obj",
    "member",
    "macro",
    "type",
    "var",
    "expr",
    "samp",
    "file",
    "envvar",
    "option",
    "program",
    "keyword",
    "opcode",
    "kbd",
    "source",
    "token",
    "mailheader",
    "mimetype",
    "makevar",
    "command",
    "magic",
    "cmdoption",
}


@dataclass(frozen=True)
class Document:
    """One cleaned source document.

    ``relpath`` is relative to the ``_sources`` folder without the ``.rst.txt`` suffix
    (``library/json``); ``key`` is ``sha256(relpath)`` in hex, the split order.
    """

    relpath: str
    text: str

    @property
    def key(self) -> str:
        return hashlib.sha256(self.relpath.encode()).hexdigest()

    @property
    def nbytes(self) -> int:
        """Size of the cleaned text, UTF-8 bytes."""
        return len(self.text.encode("utf-8"))

    @property
    def filename(self) -> str:
        """Flat file name for the shipped copy: ``library/json`` -> ``library__json.txt``."""
        return self.relpath.replace("/", "__") + ".txt"


def _role_text(match: re.Match[str]) -> str:
    role, text = match.group(1), match.group(2)
    title = re.match(r"^(.*?)\s*<[^<>]+>$", text, flags=re.S)
    if title and title.group(1):
        text = title.group(1)
    text = text.lstrip("!")
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    if role == "pep":
        return f"PEP {text}"
    if role == "rfc":
        return f"RFC {text}"
    if role in _CODE_ROLES:
        return f"``{text}``"
    return text


def clean_rst(text: str) -> str:
    """Light, structure-preserving cleanup of one reStructuredText document.

    Args:
        text: the raw ``.rst.txt`` source.

    Returns:
        The cleaned text: blank-line-separated paragraphs, code blocks kept with their
        indentation, at most one blank line in a row, no trailing spaces, ending in one newline.
    """
    lines = text.replace("\r\n", "\n").replace("\t", "    ").split("\n")
    out: list[str] = []
    skipping = False  # inside the indented body of a dropped directive / comment
    for line in lines:
        if skipping:
            if line.strip() == "" or line[:1].isspace():
                continue
            skipping = False
        m = _DIRECTIVE_RE.match(line)
        if m and m.group(1).split(":")[-1] in _DROP_DIRECTIVES:
            skipping = True
            continue
        if not m and (_TARGET_RE.match(line) or _COMMENT_RE.match(line)):
            skipping = True
            continue
        out.append(line.rstrip())
    # Roles and links may span lines (":term:`file objects\n<file object>`"): substitute on
    # the whole text.
    cleaned = _ROLE_RE.sub(_role_text, _LINK_RE.sub(lambda mm: mm.group(1), "\n".join(out)))
    cleaned = re.sub(r"\n{3,}", "\n\n", cleaned).strip("\n")
    return cleaned + "\n"


def read_documents(src: Path) -> list[Document]:
    """Read and clean every ``*.rst.txt`` under ``src``, in sorted path order."""
    paths = sorted(src.rglob("*.rst.txt"))
    if not paths:
        raise SystemExit(f"no *.rst.txt under {src}: apt-get install -y {DEBIAN_PACKAGE}")
    docs = []
    for p in paths:
        rel = p.relative_to(src).as_posix().removesuffix(".rst.txt")
        text = clean_rst(p.read_text(encoding="utf-8"))
        if text.strip():
            docs.append(Document(rel, text))
    return docs


def split_documents(
    docs: list[Document], heldout_bytes: int, val_bytes: int
) -> tuple[list[Document], list[Document], list[Document]]:
    """Split by document: ``(train, val, test)``, each in sorted ``relpath`` order.

    Documents are walked in ``sha256(relpath)`` order; they go to the held-out set until it holds
    at least ``heldout_bytes`` bytes. The first held-out documents (same order) up to
    ``val_bytes`` bytes form the validation part, the rest the test part.
    """
    heldout: list[Document] = []
    total = 0
    for d in sorted(docs, key=lambda d: d.key):
        if total >= heldout_bytes:
            break
        heldout.append(d)
        total += d.nbytes
    val: list[Document] = []
    vbytes = 0
    for d in heldout:
        if vbytes >= val_bytes:
            break
        val.append(d)
        vbytes += d.nbytes
    held_names = {d.relpath for d in heldout}
    val_names = {d.relpath for d in val}
    train = [d for d in docs if d.relpath not in held_names]
    val = [d for d in docs if d.relpath in val_names]
    test = [d for d in docs if d.relpath in held_names and d.relpath not in val_names]
    return train, val, test


def psf_license_text(copyright_file: Path) -> str:
    """The PSF License Version 2 section of the Debian ``copyright`` file (shipped beside the text).

    The license asks that derivative works retain PSF's notice of copyright and license.
    """
    text = copyright_file.read_text(encoding="utf-8")
    start = text.index("PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2")
    end = text.index("BEOPEN.COM LICENSE AGREEMENT", start)
    return text[start:end].rstrip() + "\n"


def package_version(name: str) -> str:
    """Installed Debian version of ``name`` (``dpkg-query``), or ``"unknown"``."""
    try:
        res = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True, check=True)
        return res.stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _readme(
    version: str, train: list[Document], val: list[Document], test: list[Document], heldout_bytes: int, val_bytes: int
) -> str:
    def mb(docs: list[Document]) -> str:
        return f"{sum(d.nbytes for d in docs) / 1e6:.2f} MB"

    return f"""# Text shipped with fp8lab

`heldout.tar.xz` holds the **held-out** documents of the corpus that trained the shipped tiny model
(`data/models/fp8lab-tiny-qwen3`). The model never saw them during training. The studies draw
their real-text prompts, long documents and calibration samples from here.

(one `heldout/<name>.txt` per document, packed: `fp8lab.workloads.heldout_documents` reads the archive, or
a `heldout/` folder where one exists). This file and the archive are written by `python scripts/build_corpus.py`; the
numbers below come from that run.

## Source

- Debian package `{DEBIAN_PACKAGE}`, version `{version}`
  (`dpkg-query -W {DEBIAN_PACKAGE}`): the Python 3.11 documentation.
- Files: `/usr/share/doc/python3.11/html/_sources/**/*.rst.txt` (reStructuredText sources).
- License: Python Software Foundation License Version 2 (PSF License 2.0), copyright the Python
  Software Foundation; its text is copied to `LICENSE-PSF-2.0.txt` here from
  `/usr/share/doc/{DEBIAN_PACKAGE}/copyright`. Changes made (the license asks for a summary):
  the cleanup and the split described below; the text is otherwise unmodified.

## Cleanup (light)

Sphinx roles become the text a reader sees (`:func:`open`` -> ``` ``open`` ```, `:pep:`8`` ->
`PEP 8`), hyperlinks keep their text, and markup-only lines are dropped (`.. index::` blocks,
`.. _label:` targets, author lines, `toctree`, comments). Paragraphs, code blocks and content
directives (`.. function:: ...`, `.. note::`) are kept verbatim.

## Split (by document, deterministic)

Documents are ordered by `sha256(relative path)` (e.g. `sha256("library/json")`). Walking that
order, documents go to the held-out set until it holds at least {heldout_bytes:,} bytes; all
others are training text (`.corpus/train.txt`, not shipped). Inside the held-out set the first
documents in the same order, up to {val_bytes:,} bytes, are the **validation** part (the trainer
picks its best checkpoint on them); the rest is the **test** part (reported perplexity,
prompts). `heldout_manifest.json` lists each held-out file with its role.

| part | documents | cleaned text |
|---|---:|---:|
| train (not shipped) | {len(train)} | {mb(train)} |
| held-out: validation | {len(val)} | {mb(val)} |
| held-out: test | {len(test)} | {mb(test)} |
"""


# --------------------------------------------------------------------------------------------
# Prompt sets (need the tokenizer: called by ``train_tiny_model.py --prepare``)

PROMPTS_DIR = REPO_ROOT / "data" / "prompts"
PROMPT_CATEGORIES = ("prose", "code", "reference", "mixed")
PROMPT_MIN_TOKENS, PROMPT_MAX_TOKENS = 32, 256

#: Reconstruction of the field report's 32-token calibration prompt (three Q&A lines: a fact, a
#: quadratic equation, a translation). The report gave its description, not its text.
CALIB_32_TEXT = (
    "Q: What is the capital of France? A: Paris.\n"
    "Q: Solve x^2 - 5x + 6 = 0. A: x = 2 or x = 3.\n"
    "Q: Translate 'good morning' to Spanish. A: Buenos dias."
)

_REF_DIRECTIVE_RE = re.compile(
    r"^\s*\.\. (?:c:|py:)?(function|method|class|data|attribute|exception|decorator|"
    r"classmethod|staticmethod|opcode|cmdoption|envvar|describe|member|macro|type|var|"
    r"abstractmethod|coroutinefunction|coroutinemethod|pdbcommand)::"
)
_HEADING_RE = re.compile(r"^([=\-~^*#+\"'`])\1{3,}\s*$")
_TABLE_LIST_RE = re.compile(r"^\s*(\* |- |\+-|\+=|\||={3,}|#\. |\d+\. )")


def _blocks(text: str) -> list[str]:
    """Blank-line separated blocks of a document, each without surrounding blank lines."""
    return [b for b in re.split(r"\n\s*\n", text) if b.strip()]


def _kind(block: str, prev: str | None) -> str:
    """Classify one block: ``code``, ``reference``, ``prose`` or ``other``."""
    lines = block.split("\n")
    first = lines[0]
    if prev is not None and prev.rstrip().endswith("::") and first[:1] == " ":
        return "code"
    if first.lstrip().startswith(">>>"):
        return "code"
    if _REF_DIRECTIVE_RE.match(first):
        return "reference"
    if sum(bool(_TABLE_LIST_RE.match(ln)) for ln in lines) >= max(2, len(lines) // 2):
        return "reference"
    if any(_HEADING_RE.match(ln) for ln in lines) or first.lstrip().startswith(".."):
        return "other"
    letters = sum(c.isalpha() or c == " " for c in block)
    if len(lines) >= 2 and letters / len(block) > 0.85:
        return "prose"
    return "other"


def _fit(text: str, count: Any) -> str | None:
    """``text`` cut at a line boundary to at most :data:`PROMPT_MAX_TOKENS` tokens, or ``None``
    when it is shorter than :data:`PROMPT_MIN_TOKENS`."""
    lines = text.split("\n")
    while lines and count("\n".join(lines)) > PROMPT_MAX_TOKENS:
        lines.pop()
    out = "\n".join(lines).rstrip()
    return out if out and count(out) >= PROMPT_MIN_TOKENS else None


def prompt_candidates(doc: str, count: Any) -> dict[str, list[str]]:
    """Candidate prompts of each category in one document (text spans, verbatim).

    - ``prose``: one or two consecutive prose paragraphs;
    - ``code``: a literal/doctest block;
    - ``reference``: an API signature directive with its first description paragraph, or a
      table / list;
    - ``mixed``: a prose paragraph ending in ``::`` with the code block it introduces.
    """
    blocks = _blocks(doc)
    kinds = [_kind(b, blocks[i - 1] if i else None) for i, b in enumerate(blocks)]
    cands: dict[str, list[str]] = {c: [] for c in PROMPT_CATEGORIES}
    for i, (b, k) in enumerate(zip(blocks, kinds, strict=True)):
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        nk = kinds[i + 1] if i + 1 < len(blocks) else None
        span: str | None = None
        if k == "prose" and b.rstrip().endswith("::") and nk == "code":
            span = _fit(f"{b}\n\n{nxt}", count)
            if span and "\n\n" in span:
                cands["mixed"].append(span)
            continue
        if k == "prose":
            span = b if count(b) >= 48 or nk != "prose" else f"{b}\n\n{nxt}"
            span = _fit(span, count)
            if span:
                cands["prose"].append(span)
        elif k == "code":
            span = _fit(b, count)
            if span:
                cands["code"].append(span)
        elif k == "reference":
            span = b if not _REF_DIRECTIVE_RE.match(b) or nxt is None else f"{b}\n\n{nxt}"
            span = _fit(span, count)
            if span:
                cands["reference"].append(span)
    return cands


def write_prompts(tokenizer_json: Path, per_category: int = 10, seed: int = 0) -> None:
    """Write ``data/prompts/quality_prompts.jsonl``, ``calib_32_tokens.txt`` and ``README.md``.

    Quality prompts come from the held-out **test** documents only. Per category, candidates are
    shuffled with ``random.Random(seed)`` and taken at most one per document until
    ``per_category`` are chosen. Token counts are under ``tokenizer_json`` (the shipped
    tokenizer).
    """
    import random
    import statistics

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    manifest = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))
    test_files = [r["file"] for r in manifest["documents"] if r["role"] == "test"]
    pool: dict[str, list[tuple[str, str]]] = {c: [] for c in PROMPT_CATEGORIES}
    for f in test_files:
        doc = heldout_text(f)
        for cat, spans in prompt_candidates(doc, count).items():
            pool[cat].extend((f, s) for s in spans)
    rng = random.Random(seed)
    rows = []
    for cat in PROMPT_CATEGORIES:
        cands = sorted(set(pool[cat]))
        rng.shuffle(cands)
        used: set[str] = set()
        chosen = []
        for f, text in cands:
            if f in used:
                continue
            used.add(f)
            chosen.append((f, text))
            if len(chosen) == per_category:
                break
        if len(chosen) < per_category:
            raise RuntimeError(f"only {len(chosen)} {cat} prompts found")
        for k, (f, text) in enumerate(chosen):
            rows.append({"id": f"{cat}-{k:02d}", "category": cat, "text": text, "source": f, "n_tokens": count(text)})
    PROMPTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(PROMPTS_DIR / "quality_prompts.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    (PROMPTS_DIR / "calib_32_tokens.txt").write_text(CALIB_32_TEXT, encoding="utf-8")

    n_calib = count(CALIB_32_TEXT)
    lens = [r["n_tokens"] for r in rows]
    per_cat = ", ".join(f"{c}: {sum(r['category'] == c for r in rows)}" for c in PROMPT_CATEGORIES)
    (PROMPTS_DIR / "README.md").write_text(
        f"""# Prompt sets

Written by `python scripts/train_tiny_model.py --prepare` (function `write_prompts` in
`scripts/build_corpus.py`); token counts are under the shipped tokenizer
(`data/models/fp8lab-tiny-qwen3/tokenizer.json`, sha256 `{sha256_of(tokenizer_json)[:16]}...`).

## `quality_prompts.jsonl`

{len(rows)} prompts ({per_cat}), one JSON object per line:
`{{"id", "category", "text", "source", "n_tokens"}}`. The text is a verbatim span of a held-out
**test** document (`data/text/heldout.tar.xz`, role `test` in `data/text/heldout_manifest.json`):
never seen in training nor used to pick the checkpoint.

- `prose`: one or two consecutive paragraphs of running text;
- `code`: a literal or doctest code block;
- `reference`: an API signature directive (`.. function:: ...`) with its first description
  paragraph, or a table / list;
- `mixed`: a paragraph ending in `::` followed by the code block it introduces.

Per category, candidates are shuffled with `random.Random({seed})` and taken at most one per
document. Spans are cut at a line boundary to at most {PROMPT_MAX_TOKENS} tokens and are at least
{PROMPT_MIN_TOKENS}: here {min(lens)} to {max(lens)} tokens, median {statistics.median(lens):g}.

## `calib_32_tokens.txt`

A **reconstruction**, not the original: the field report described its 32-token calibration
prompt as three Q&A lines (a fact, a quadratic equation, a translation) without giving its text.
The file's whole content (no trailing newline) is the prompt:

```
{CALIB_32_TEXT}
```

It is **{n_calib} tokens** under the shipped tokenizer, not 32: the report counted under its own
model's tokenizer, and this small vocabulary (8192 byte-level BPE entries, trained on Python
documentation) splits such text into more pieces. Studies that need exactly 32 tokens should
truncate the token ids, not the text.
""",
        encoding="utf-8",
    )


def sha256_of(path: Path) -> str:
    """sha256 of a file's bytes, hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def heldout_text(file: str) -> str:
    """One held-out document: from ``HELDOUT_DIR`` when it exists, else from ``HELDOUT_ARCHIVE``."""
    if (HELDOUT_DIR / file).is_file():
        return (HELDOUT_DIR / file).read_text(encoding="utf-8")
    import tarfile

    with tarfile.open(HELDOUT_ARCHIVE) as tf:
        return tf.extractfile(f"heldout/{file}").read().decode("utf-8")  # type: ignore[union-attr]


def pack_heldout() -> None:
    """``HELDOUT_DIR`` into ``HELDOUT_ARCHIVE`` (sorted, fixed owner and times: the same files give the same
    bytes), then the folder is removed: the repository ships the archive (``fp8lab.workloads`` reads it)."""
    import lzma
    import tarfile

    with (
        lzma.open(HELDOUT_ARCHIVE, "wb", preset=9 | lzma.PRESET_EXTREME) as xz,
        tarfile.open(fileobj=xz, mode="w", format=tarfile.GNU_FORMAT) as tf,
    ):
        for p in sorted(HELDOUT_DIR.glob("*.txt")):
            ti = tf.gettarinfo(str(p), f"heldout/{p.name}")
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            ti.mtime, ti.mode = 0, 0o644
            with open(p, "rb") as fh:
                tf.addfile(ti, fh)
    shutil.rmtree(HELDOUT_DIR)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC, help="the _sources folder")
    ap.add_argument("--heldout-bytes", type=int, default=DEFAULT_HELDOUT_BYTES)
    ap.add_argument("--val-bytes", type=int, default=DEFAULT_VAL_BYTES)
    args = ap.parse_args(argv)

    docs = read_documents(args.src)
    train, val, test = split_documents(docs, args.heldout_bytes, args.val_bytes)

    CORPUS_DIR.mkdir(exist_ok=True)
    sep = f"\n{DOC_SEPARATOR}\n"
    (CORPUS_DIR / "train.txt").write_text(sep.join(d.text for d in train), encoding="utf-8")

    if HELDOUT_DIR.exists():
        shutil.rmtree(HELDOUT_DIR)
    HELDOUT_DIR.mkdir(parents=True)
    manifest = []
    for role, part in (("val", val), ("test", test)):
        for d in part:
            (HELDOUT_DIR / d.filename).write_text(d.text, encoding="utf-8")
            manifest.append(
                {
                    "file": d.filename,
                    "source": f"{d.relpath}.rst.txt",
                    "sha256_path": d.key,
                    "bytes": d.nbytes,
                    "role": role,
                }
            )
    manifest.sort(key=lambda r: r["file"])
    version = package_version(DEBIAN_PACKAGE)
    (TEXT_DIR / "LICENSE-PSF-2.0.txt").write_text(
        psf_license_text(Path(f"/usr/share/doc/{DEBIAN_PACKAGE}/copyright")), encoding="utf-8"
    )
    MANIFEST_PATH.write_text(
        json.dumps(
            {
                "package": DEBIAN_PACKAGE,
                "version": version,
                "license": "PSF-2.0",
                "heldout_bytes_target": args.heldout_bytes,
                "val_bytes_target": args.val_bytes,
                "documents": manifest,
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    (TEXT_DIR / "README.md").write_text(
        _readme(version, train, val, test, args.heldout_bytes, args.val_bytes), encoding="utf-8"
    )

    pack_heldout()
    for name, part in (("train", train), ("val", val), ("test", test)):
        print(f"{name:5s}: {len(part):4d} docs, {sum(d.nbytes for d in part):>10,d} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
