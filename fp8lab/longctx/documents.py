"""Study 04's inputs: the length grids and passkey-retrieval items, on the long documents of real text cut to exact
token lengths and the random-token prompts of :mod:`fp8lab.workloads` (which Studies 07 and 08 use too). No engine here; :mod:`fp8lab.longctx` runs the study on these.

Documents are the held-out text (``data/text``) concatenated with their paragraph structure, with generated
code blocks and JSON objects inserted every few paragraphs, as the field reports did.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fp8lab.specs import SpecError, check_choice, check_float, check_int, resolve_model
from fp8lab.workloads import document_ids, load_tokenizer, random_ids

GridKind = Literal["geometric", "linear"]
PromptSource = Literal["text", "random"]

#: Passkey retrieval, the wording of Mohtashami & Jaggi (arXiv:2305.16300, appendix), with real text
#: in place of their repeated filler sentences.
PASSKEY_TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n\n"
)
PASSKEY_NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
PASSKEY_QUESTION = "\n\nWhat is the pass key? The pass key is"
PASSKEY_OUTPUT_TOKENS = 8
#: The multi-key variant (MRCR-like: several needles alike but for a label, one asked for): needle and question.
PASSKEY_MULTI_NEEDLE = (
    "\n\nThe pass key for the {label} door is {key}. Remember it. {key} is the {label} door's pass key.\n\n"
)
PASSKEY_MULTI_QUESTION = "\n\nWhat is the pass key for the {label} door? The pass key for the {label} door is"
PASSKEY_LABELS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")


# ============================================================================ length grids
def length_grid(
    kind: GridKind, min_len: int, max_context: int, output_tokens: int, *, step: int = 1024, factor: float = 2.0
) -> tuple[int, ...]:
    """Prompt lengths (tokens) of a ramp whose longest request, prompt + ``output_tokens``, is exactly
    ``max_context`` tokens.

    ``geometric``: ``min_len, min_len * factor, ...`` (rounded) while prompt + output < ``max_context``;
    ``linear`` (the field reports' ramp, ``step`` = 1024: +1K per step): ``min_len, min_len + step, ...``.
    Both end with ``max_context - output_tokens``, the longest prompt that fits.

    >>> length_grid("geometric", 1024, 8192, 32)
    (1024, 2048, 4096, 8160)
    """
    check_choice("LengthGrid", "kind", kind, GridKind)
    check_int("LengthGrid", "output_tokens", output_tokens, 1, 10_000_000)
    check_int("LengthGrid", "min_len", min_len, 1, 10_000_000)
    check_int("LengthGrid", "max_context", max_context, min_len + output_tokens, 10_000_000)
    last = max_context - output_tokens
    out: list[int] = []
    if kind == "geometric":
        check_float("LengthGrid", "factor", factor, 1.0, 1e3, lo_open=True)
        x = float(min_len)
        while round(x) < last:
            if not out or round(x) > out[-1]:
                out.append(int(round(x)))
            x *= factor
    else:
        check_int("LengthGrid", "step", step, 1, 10_000_000)
        out = list(range(min_len, last, step))
    return tuple(out + [last])


# ============================================================================ documents
@dataclass(frozen=True)
class PasskeyItem:
    """One passkey prompt of exactly ``length`` tokens: task, haystack with the needle inserted at
    ``depth`` (fraction of the haystack before it; the needle starts at token ``needle_pos``), question."""

    tag: str
    length: int
    depth: float
    key: str
    prompt: tuple[int, ...]
    needle_pos: int
    keys: int = 1


def insert_at_depth(haystack: Sequence[int], needle: Sequence[int], depth: float) -> tuple[tuple[int, ...], int]:
    """``haystack`` with ``needle`` inserted after ``round(depth * len(haystack))`` of its tokens; returns the
    new sequence and the needle's start index.

    >>> insert_at_depth([1, 2, 3, 4], [9], 0.5)
    ((1, 2, 9, 3, 4), 2)
    """
    check_float("Passkey", "depth", depth, 0.0, 1.0)
    pos = int(round(depth * len(haystack)))
    return tuple(haystack[:pos]) + tuple(needle) + tuple(haystack[pos:]), pos


def passkey_items(
    model: str,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int = 1,
    *,
    haystack: PromptSource = "text",
    seed: int = 0,
    inserts: Sequence[str] = ("code", "json"),
    every: int = 6,
    keys: Sequence[int] = (1,),
) -> list[PasskeyItem]:
    """One item per (keys, length, depth, trial): a seeded 5-digit key, real-text (or random-token) haystack
    from a different place of the long document for every item, prompt exactly ``length`` tokens.

    ``keys`` > 1 is the multi-key variant (MRCR-like): that many needles, alike but for a label
    (:data:`PASSKEY_LABELS`) and each with its own key, spread evenly through the haystack; the one asked for stands
    at ``depth`` and the others at the evenly spaced depths that remain. A model must tell the needles apart, so a
    quantization error that blurs which label goes with which key shows here first. Items with one key keep the
    tags they always had; a multi-key item's tag adds ``-k<keys>``."""
    check_choice("Passkey", "haystack", haystack, PromptSource)
    tok = load_tokenizer(resolve_model(model))
    rng = random.Random(seed)
    items = []
    n = 0
    for k in keys:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= len(PASSKEY_LABELS):
            raise SpecError("Passkey", "keys", k, f"an integer in [1, {len(PASSKEY_LABELS)}]")
        for length in lengths:
            for depth in depths:
                for t in range(trials):
                    items.append(_passkey_item(tok, model, rng, k, length, depth, t, n, haystack, seed, inserts, every))
                    n += 1
    return items


def _passkey_item(
    tok: Any,
    model: str,
    rng: random.Random,
    k: int,
    length: int,
    depth: float,
    t: int,
    n: int,
    haystack: str,
    seed: int,
    inserts: Sequence[str],
    every: int,
) -> PasskeyItem:
    """One passkey prompt (:func:`passkey_items`): ``k`` needles, the asked one at ``depth``."""
    from fp8lab.workloads import model_vocab_size

    task = tok.encode(PASSKEY_TASK, add_special_tokens=False)
    if k == 1:
        key = str(rng.randrange(10_000, 100_000))
        needles = [tok.encode(PASSKEY_NEEDLE.format(key=key), add_special_tokens=False)]
        question = tok.encode(PASSKEY_QUESTION, add_special_tokens=False)
        depths_k = [depth]
        tag = f"pk-L{length}-d{depth:g}-t{t}"
    else:
        labels = rng.sample(PASSKEY_LABELS, k)
        ks = [str(rng.randrange(10_000, 100_000)) for _ in labels]
        key = ks[0]  # the asked needle is the first label, placed at ``depth``
        needles = [
            tok.encode(PASSKEY_MULTI_NEEDLE.format(label=lab, key=kk), add_special_tokens=False)
            for lab, kk in zip(labels, ks, strict=True)
        ]
        question = tok.encode(PASSKEY_MULTI_QUESTION.format(label=labels[0]), add_special_tokens=False)
        others = [d for d in ((i + 0.5) / k for i in range(k)) if abs(d - depth) > 0.5 / k]
        depths_k = [depth] + sorted(others, key=lambda d: abs(d - depth), reverse=True)[: k - 1]
        while len(depths_k) < k:  # fewer free slots than needles: fill the largest gaps
            pts = sorted([0.0, 1.0, *depths_k])
            gap = max(zip(pts[:-1], pts[1:], strict=True), key=lambda ab: ab[1] - ab[0])
            depths_k.append((gap[0] + gap[1]) / 2)
        tag = f"pk-L{length}-d{depth:g}-t{t}-k{k}"
    n_hay = length - len(task) - sum(map(len, needles)) - len(question)
    if n_hay < 1:
        raise SpecError(
            "Passkey",
            "lengths",
            length,
            f"at least {len(task) + sum(map(len, needles)) + len(question) + 1} tokens (task + {k} needle(s) + question)",
        )
    if haystack == "text":
        body = document_ids(model, n_hay, offset=(7919 * n) % 400_000, inserts=inserts, every=every, seed=seed)
    else:
        body = random_ids(model_vocab_size(resolve_model(model)), n_hay, seed=seed + 1000 + n)
    # insert from the deepest needle up, so the shallower positions still count haystack tokens only
    pos_asked = 0
    order = sorted(range(k), key=lambda i: depths_k[i], reverse=True)
    for i in order:
        body, pos = _insert_hay(body, needles[i], depths_k[i], n_hay)
        if i == 0:
            pos_asked = pos
    # positions of needles inserted later (shallower) shift the asked one if they precede it
    shift = sum(len(needles[i]) for i in range(1, k) if depths_k[i] < depths_k[0])
    prompt = tuple(task) + tuple(body) + tuple(question)
    return PasskeyItem(tag, length, float(depth), key, prompt, len(task) + pos_asked + shift, k)


def _insert_hay(body: Sequence[int], needle: Sequence[int], depth: float, n_hay: int) -> tuple[tuple[int, ...], int]:
    """``needle`` inserted into ``body`` after ``round(depth * n_hay)`` of its original haystack tokens, where every
    needle already in ``body`` stands deeper (see :func:`_passkey_item`), so that position is still a haystack
    position."""
    pos = int(round(depth * n_hay))
    return tuple(body[:pos]) + tuple(needle) + tuple(body[pos:]), pos


def passkey_correct(text: str, key: str) -> bool:
    """Whether the generated ``text`` answers ``key``: its first number (digits, spaces between digits
    ignored) is the key.

    >>> passkey_correct(" 71432. Remember", "71432"), passkey_correct(" 7 14 32", "71432"), passkey_correct(" 7143", "71432")
    (True, True, False)
    """
    m = re.search(r"\d+", re.sub(r"(?<=\d) +(?=\d)", "", text or ""))
    return bool(m) and m.group() == key
