"""Workloads: request classes with exact token counts, real-text prompts, arrival processes.

Prompts come from the shipped held-out text (``data/text/heldout``) tokenized with the model's own
tokenizer and cut to exact lengths, so the KV cache holds the statistics of real text. Models with
dummy (random) weights have no meaningful tokenizer: they get seeded random token ids.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from fp8lab.paths import TEXT_DIR
from fp8lab.specs import Request, SpecError, check_choice, check_float, check_int, read_text, resolve_model

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
def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


@lru_cache(maxsize=4)
def heldout_token_stream(model: str, text_dir: str = str(HELDOUT_DIR)) -> tuple[int, ...]:
    """All held-out documents tokenized with ``model``'s tokenizer, joined by its EOS token."""
    tok = load_tokenizer(model)
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


# ---------------------------------------------------------------- long documents and random-token prompts
#: What is inserted between paragraphs of a long document (:func:`assemble_document`).
InsertKind = Literal["code", "json"]


def json_object(rng: random.Random) -> str:
    """A small pretty-printed JSON object (a config/record of the kind documentation shows), seeded."""
    words = ["alpha", "beta", "gamma", "delta", "cache", "block", "token", "layer", "scale", "queue"]
    obj = {
        "id": rng.randrange(1, 100_000),
        "name": f"{rng.choice(words)}_{rng.choice(words)}",
        "enabled": rng.random() < 0.5,
        "ratio": round(rng.random(), 4),
        "tags": rng.sample(words, 3),
        "limits": {"max_items": rng.randrange(1, 4096), "timeout_s": round(rng.uniform(0.1, 60.0), 2)},
    }
    return json.dumps(obj, indent=2)


def code_block(rng: random.Random) -> str:
    """A small fenced Python snippet, seeded (one of a few shapes with random names and numbers), with no
    blank line inside, so it stays one paragraph of the document."""
    name = (
        rng.choice(["load", "parse", "merge", "scan", "emit", "fold"])
        + "_"
        + rng.choice(["items", "rows", "blocks", "tokens", "records"])
    )
    n, k = rng.randrange(2, 64), rng.randrange(1, 9)
    shapes = [
        f"def {name}(data, limit={n}):\n    out = []\n    for i, x in enumerate(data):\n"
        f"        if i >= limit:\n            break\n        out.append(x * {k})\n    return out",
        f"class {name.title().replace('_', '')}:\n    def __init__(self, size={n}):\n        self.size = size\n"
        f"        self.items = [None] * size\n    def get(self, i):\n        return self.items[i % self.size]",
        f"with open('{name}.txt') as f:\n    total = sum(int(line) for line in f if line.strip())\n"
        f"print(total // {k}, total % {n})",
    ]
    return "```python\n" + rng.choice(shapes) + "\n```"


def assemble_document(
    texts: Sequence[str], inserts: Sequence[str] = ("code", "json"), every: int = 6, seed: int = 0
) -> str:
    """One long document: ``texts`` split into paragraphs (blank-line separated, kept verbatim), joined
    with blank lines, with an inserted block after every ``every`` paragraphs, cycling through
    ``inserts`` (``code``: :func:`code_block`, ``json``: :func:`json_object`; seeded by ``seed``).

    >>> assemble_document(["a\\n\\nb", "c"], inserts=(), every=1)
    'a\\n\\nb\\n\\nc'
    """
    for kind in inserts:
        check_choice("LongDocument", "inserts", kind, InsertKind)
    check_int("LongDocument", "every", every, 1, 10_000_000)
    rng = random.Random(seed)
    makers = {"code": code_block, "json": json_object}
    paragraphs: list[str] = []
    count = 0
    for text in texts:
        for para in re.split(r"\n\s*\n", text.strip("\n")):
            if not para.strip():
                continue
            paragraphs.append(para)
            count += 1
            if inserts and count % every == 0:
                paragraphs.append(makers[inserts[(count // every - 1) % len(inserts)]](rng))
    return "\n\n".join(paragraphs)


class _DocumentStream:
    """The held-out documents assembled (:func:`assemble_document`, one document at a time) and tokenized
    lazily, so a 16K-token ramp does not tokenize the whole 2 MB corpus. Each document's inserts are
    seeded by ``seed`` and its index, so the stream does not depend on how far it was read before."""

    def __init__(self, model: str, inserts: tuple[str, ...], every: int, seed: int):
        self.tok = load_tokenizer(model)
        self.docs = [text for _, text in heldout_documents()]
        self.inserts, self.every, self.seed = inserts, every, seed
        self.ids: list[int] = []
        self.next_doc = 0

    def take(self, n: int) -> list[int]:
        """At least the first ``n`` token ids (fewer only when the corpus is exhausted)."""
        while len(self.ids) < n and self.next_doc < len(self.docs):
            i = self.next_doc
            text = assemble_document([self.docs[i]], self.inserts, self.every, seed=self.seed * 100_003 + i)
            self.ids.extend(self.tok.encode(text + "\n\n", add_special_tokens=False))
            self.next_doc += 1
        return self.ids

    @property
    def exhausted(self) -> bool:
        return self.next_doc >= len(self.docs)


_STREAMS: dict[tuple, _DocumentStream] = {}


def document_ids(
    model: str,
    length: int,
    offset: int = 0,
    *,
    inserts: Sequence[str] = ("code", "json"),
    every: int = 6,
    seed: int = 0,
) -> tuple[int, ...]:
    """Exactly ``length`` token ids of the long held-out document, from token ``offset`` (the stream
    wraps around when the corpus is shorter than ``offset + length``: about 0.5M tokens with the shipped
    tokenizer)."""
    check_int("LongDocument", "length", length, 1, 100_000_000)
    check_int("LongDocument", "offset", offset, 0, 100_000_000)
    key = (resolve_model(model), tuple(inserts), every, seed)
    if key not in _STREAMS:
        _STREAMS[key] = _DocumentStream(key[0], key[1], every, seed)
    stream = _STREAMS[key]
    ids = stream.take(offset + length)
    if len(ids) >= offset + length:
        return tuple(ids[offset : offset + length])
    if not ids:
        raise SpecError("LongDocument", "text", "data/text/heldout", "held-out .txt documents to build prompts from")
    reps = (offset + length) // len(ids) + 1  # the corpus repeated: said in the notebook when it happens
    return tuple((ids * reps)[offset : offset + length])


def random_ids(vocab_size: int, length: int, seed: int) -> tuple[int, ...]:
    """Seeded random token ids (for dummy-weight models, and the random-token checks)."""
    return random_prompt(vocab_size, length, random.Random(seed))


# ============================================================================ passkey
