"""Study 02's calibration data: the reports' prompt (:func:`prompt_ids`) and the held-out text pool the large set is
drawn from (:func:`calibration_pool`, :func:`draw_samples`), disjoint from Study 03's evaluation data
(:func:`quality_reserved_tokens`). The bottom of the subpackage: it imports none of its other modules."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fp8lab.paths import PROMPTS_DIR, TEXT_DIR
from fp8lab.specs import (
    SpecError,
    check_choice,
    check_int,
    read_text,
    resolve_model,
)

CALIB_PROMPT = PROMPTS_DIR / "calib_32_tokens.txt"
MANIFEST = TEXT_DIR / "heldout_manifest.json"


def _manifest_roles(path: Path = MANIFEST) -> dict[str, str]:
    return {d["file"].removesuffix(".txt"): d["role"] for d in json.loads(path.read_text())["documents"]}


@dataclass(frozen=True)
class CalibrationPool:
    """Held-out text available for calibration: token ``segments`` (pieces of documents between excluded
    spans) and the documents they come from. ``excluded_docs``: documents left out whole (they hold the
    start of the held-out stream, reserved for Study 03); ``excluded_spans``: quality-prompt spans cut out."""

    segments: tuple[tuple[int, ...], ...]
    docs: tuple[str, ...]
    excluded_docs: tuple[str, ...]
    excluded_spans: int
    roles: tuple[str, ...]

    @property
    def n_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    def n_windows(self, length: int) -> int:
        return sum(len(s) // length for s in self.segments)


@lru_cache(maxsize=8)
def _pool(
    tokenizer: str, exclude_texts: tuple[str, ...], reserve_tokens: int, roles: tuple[str, ...]
) -> CalibrationPool:
    from fp8lab.workloads import heldout_documents, load_tokenizer

    tok = load_tokenizer(tokenizer)
    role_of = _manifest_roles()
    sep = 1 if tok.eos_token_id is not None else 0
    segments: list[tuple[int, ...]] = []
    docs, skipped = [], []
    offset, cut = 0, 0
    docs_text = heldout_documents()  # the order of workloads.heldout_token_stream
    lengths = [len(ids) for ids in tok([t for _, t in docs_text], add_special_tokens=False)["input_ids"]]
    for (name, text), n_doc in zip(docs_text, lengths, strict=True):
        start, offset = offset, offset + n_doc + sep
        if start < reserve_tokens:  # holds part of the stream's reserved start (Study 03's windows)
            skipped.append(name)
            continue
        if role_of.get(name) not in roles:
            continue
        pieces = [text]
        for ex in exclude_texts:
            nxt = []
            for p in pieces:
                parts = p.split(ex)
                cut += len(parts) - 1
                nxt.extend(parts)
            pieces = nxt
        pieces = [p for p in pieces if p.strip()]
        if pieces:
            segments.extend(tuple(ids) for ids in tok(pieces, add_special_tokens=False)["input_ids"] if ids)
        docs.append(name)
    return CalibrationPool(tuple(segments), tuple(docs), tuple(skipped), cut, roles)


def calibration_pool(
    tokenizer: str, exclude_texts: Sequence[str] = (), reserve_tokens: int = 0, roles: Sequence[str] = ("val", "test")
) -> CalibrationPool:
    """The held-out text usable for calibration, disjoint from an evaluation's data.

    ``exclude_texts``: verbatim spans cut out of their documents (Study 03's prompts); ``reserve_tokens``:
    documents that overlap the first ``reserve_tokens`` tokens of ``workloads.heldout_token_stream``
    are skipped whole (Study 03's perplexity windows and copy-task passages are read from there;
    :func:`quality_reserved_tokens`); ``roles``: manifest roles to draw from (``val`` | ``test``).
    """
    for r in roles:
        check_choice("calibration_pool", "roles", r, ("val", "test"))
    check_int("calibration_pool", "reserve_tokens", reserve_tokens, 0)
    return _pool(resolve_model(tokenizer), tuple(exclude_texts), int(reserve_tokens), tuple(roles))


def draw_samples(pool: CalibrationPool, n: int, length: int, seed: int = 0) -> list[tuple[int, ...]]:
    """``n`` distinct, non-overlapping windows of exactly ``length`` tokens, drawn at random (seeded)
    from every window the pool's segments hold (a window never crosses a segment's end)."""
    check_int("CalibrationSpec", "sample_tokens", length, 1)
    windows = [(i, j) for i, s in enumerate(pool.segments) for j in range(0, len(s) - length + 1, length)]
    if n > len(windows):
        raise SpecError(
            "CalibrationSpec",
            "calib_samples",
            n,
            f"at most {len(windows)} windows of {length} tokens fit in the calibration pool "
            f"({pool.n_tokens} tokens); use fewer or shorter samples",
        )
    picks = random.Random(seed).sample(windows, n)
    return [pool.segments[i][j : j + length] for i, j in picks]


def prompt_ids(tokenizer: str, n_tokens: int | None = None, path: str | Path = CALIB_PROMPT) -> tuple[int, ...]:
    """The reports' calibration prompt (``data/prompts/calib_32_tokens.txt``, the whole file, no special
    tokens) tokenized, cut to its first ``n_tokens`` token ids (``None``: the whole prompt; under the
    shipped tokenizer it is 71 tokens, see ``data/prompts/README.md``)."""
    from fp8lab.workloads import load_tokenizer

    text = read_text("CalibrationSpec", "prompt", path, "a non-empty UTF-8 text file")
    ids = tuple(load_tokenizer(resolve_model(tokenizer)).encode(text, add_special_tokens=False))
    if n_tokens is not None:
        check_int("CalibrationSpec", "prompt_tokens", n_tokens, 1, len(ids))
        ids = ids[:n_tokens]
    return ids


def quality_reserved_tokens(qspec: Any) -> int:
    """Tokens at the start of the held-out stream that a :class:`fp8lab.quality.QualitySpec` may read:
    its perplexity windows, then its copy-task passages (``copy_task_items`` tries at most ``4n + 8``)."""
    ppl = qspec.ppl_windows * qspec.ppl_window_tokens
    task = (4 * qspec.task_items + 8) * qspec.task_context_tokens if qspec.task_items else 0
    return ppl + task
