"""Workloads: request classes with exact token counts, real-text prompts, arrival processes.

Prompts come from the shipped held-out text (``data/text/heldout``) tokenized with the model's own
tokenizer and cut to exact lengths, so the KV cache holds the statistics of real text. Models with
dummy (random) weights have no meaningful tokenizer: they get seeded random token ids.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from fp8lab.paths import TEXT_DIR
from fp8lab.specs import Request, SpecError, check_choice, check_float, check_int, read_text

HELDOUT_DIR = TEXT_DIR / "heldout"


@dataclass(frozen=True)
class RequestClass:
    """A request shape: ``input_len`` prompt tokens and exactly ``output_len`` generated tokens."""

    name: str
    input_len: int
    output_len: int
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_int(self, "input_len", self.input_len, 1, 10_000_000)
        check_int(self, "output_len", self.output_len, 1, 10_000_000)
        check_float(self, "weight", self.weight, 0.0, 1e9, lo_open=True)


#: The field reports' 6:3:1 mix of short, medium and long requests.
REPORT_MIX: tuple[RequestClass, ...] = (
    RequestClass("short", 128, 64, 6),
    RequestClass("medium", 1024, 256, 3),
    RequestClass("long", 8192, 512, 1),
)


def parse_mix(mix: Sequence[Sequence] | Sequence[RequestClass]) -> tuple[RequestClass, ...]:
    """``[["short", 128, 64, 6], ...]`` (as a notebook parameter) -> RequestClass tuple."""
    out = []
    for item in mix:
        if isinstance(item, RequestClass):
            out.append(item)
        elif isinstance(item, dict):
            out.append(RequestClass(**item))
        else:
            if len(item) not in (3, 4):
                raise SpecError(
                    "Workload", "mix", item, "[name, input_len, output_len] or [name, input_len, output_len, weight]"
                )
            out.append(RequestClass(*item))
    if not out:
        raise SpecError("Workload", "mix", mix, "at least one request class")
    return tuple(out)


# ------------------------------------------------------------------------------------------- text
def heldout_documents(text_dir: Path = HELDOUT_DIR) -> list[tuple[str, str]]:
    """(name, text) of every held-out document, in a fixed order (by file name): the ``*.txt`` files of
    ``text_dir`` or, where that folder does not exist, of the archive ``<text_dir>.tar.xz`` beside it (the
    repository ships ``data/text/heldout.tar.xz``; the documents are the same bytes either way)."""
    d = Path(text_dir)
    if d.is_dir():
        return [(p.stem, read_text("Workload", "text", p, "a UTF-8 text document")) for p in sorted(d.glob("*.txt"))]
    archive = d.with_name(d.name + ".tar.xz")
    return list(_archive_documents(str(archive))) if archive.is_file() else []


@lru_cache(maxsize=2)
def _archive_documents(archive: str) -> tuple[tuple[str, str], ...]:
    import tarfile

    docs = {}
    with tarfile.open(archive) as tf:
        for m in tf.getmembers():
            name = Path(m.name).name
            if m.isfile() and name.endswith(".txt"):
                docs[name] = tf.extractfile(m).read().decode("utf-8")  # type: ignore[union-attr]
    return tuple((Path(n).stem, docs[n]) for n in sorted(docs))


def heldout_text(file: str, text_dir: Path = HELDOUT_DIR) -> str:
    """The text of one held-out document by its file name (``library__csv.txt``; folder or archive)."""
    docs = dict(heldout_documents(text_dir))
    stem = Path(file).stem
    if stem not in docs:
        raise SpecError("Workload", "heldout file", file, f"one of the {len(docs)} held-out documents of {text_dir}")
    return docs[stem]


@lru_cache(maxsize=4)
def _tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


@lru_cache(maxsize=4)
def heldout_token_stream(model: str, text_dir: str = str(HELDOUT_DIR)) -> tuple[int, ...]:
    """All held-out documents tokenized with ``model``'s tokenizer, joined by its EOS token."""
    tok = _tokenizer(model)
    sep = [tok.eos_token_id] if tok.eos_token_id is not None else []
    ids: list[int] = []
    for _, text in heldout_documents(Path(text_dir)):
        ids.extend(tok.encode(text, add_special_tokens=False))
        ids.extend(sep)
    return tuple(ids)


def text_prompt(model: str, length: int, offset: int = 0) -> tuple[int, ...]:
    """Exactly ``length`` real-text token ids starting at ``offset`` in the held-out stream (wrapping)."""
    check_int("Workload", "length", length, 1, 10_000_000)
    stream = heldout_token_stream(model)
    if not stream:
        raise SpecError("Workload", "text", str(HELDOUT_DIR), "a folder with held-out .txt documents")
    reps = (offset + length) // len(stream) + 1
    if reps > 1:  # longer than the whole held-out set: repeat it (said in the docs of long-context prompts)
        stream = stream * reps
    return tuple(stream[offset : offset + length])


def random_prompt(vocab_size: int, length: int, rng: random.Random) -> tuple[int, ...]:
    """Seeded random token ids (for dummy-weight models only), avoiding the first 16 ids (specials)."""
    return tuple(rng.randrange(16, vocab_size) for _ in range(length))


def model_vocab_size(model: str) -> int:
    cfg = json.loads((Path(model) / "config.json").read_text())
    return int(cfg.get("text_config", cfg)["vocab_size"])


PromptSource = Literal["text", "random"]


def build_requests(
    model: str, mix: Sequence[RequestClass], n: int, *, source: PromptSource = "text", seed: int = 0, stride: int = 997
) -> tuple[Request, ...]:
    """``n`` requests drawn from ``mix`` by weight (seeded), each with exact in/out token counts.

    Text prompts start at different offsets of the held-out stream (``stride`` tokens apart) so no
    two requests share a prefix; with prefix caching off that does not matter, but it keeps KV
    contents realistic.
    """
    check_choice("Workload", "source", source, PromptSource)
    check_int("Workload", "n", n, 0, 10_000_000)
    rng = random.Random(seed)
    classes = list(mix)
    picks = rng.choices(classes, weights=[c.weight for c in classes], k=n)
    vocab = model_vocab_size(model) if source == "random" else 0
    out = []
    for i, c in enumerate(picks):
        ids = (
            text_prompt(model, c.input_len, offset=i * stride)
            if source == "text"
            else random_prompt(vocab, c.input_len, rng)
        )
        out.append(Request(prompt_token_ids=ids, max_tokens=c.output_len, cls=c.name))
    return tuple(out)


def with_arrivals(
    requests: Sequence[Request], rate_per_s: float, process: Literal["constant", "poisson"] = "poisson", seed: int = 0
) -> tuple[Request, ...]:
    """Open-loop schedule: requests arrive at ``rate_per_s`` on average, constant spacing or a Poisson
    process (exponential gaps), whether or not earlier ones have finished."""
    import dataclasses

    check_float("Workload", "rate_per_s", rate_per_s, 0.0, 1e6, lo_open=True)
    check_choice("Workload", "process", process, ("constant", "poisson"))
    rng = random.Random(seed)
    t, out = 0.0, []
    for r in requests:
        out.append(dataclasses.replace(r, arrival_s=t))
        t += (1.0 / rate_per_s) if process == "constant" else rng.expovariate(rate_per_s)
    return tuple(out)
