"""Study 03's inputs: the prompt set, held-out perplexity windows, copy-task items, and the phases (requests) every KV
config's engine runs (:func:`study_phases`)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp8lab.quality.metrics import as_ids
from fp8lab.quality.spec import QualitySpec
from fp8lab.scoring import forced_request, one_pass_request
from fp8lab.specs import (
    Phase,
    Request,
    SpecError,
    read_text,
)


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_prompt_set(path: str | Path, tokenizer: str, max_per_category: int | None = None) -> pd.DataFrame:
    """The prompt set as a DataFrame: ``id, category, text, token_ids, n_tokens`` (file order; at most
    ``max_per_category`` per category, the first ones)."""
    rows = []
    for i, ln in enumerate(
        read_text("PromptSet", "path", path, 'a UTF-8 JSONL file of {"id", "category", "text"}').splitlines()
    ):
        if ln.strip():
            try:
                rows.append(json.loads(ln))
            except ValueError as err:
                raise SpecError("PromptSet", f"line {i + 1}", ln[:80], f"one JSON object per line ({err})") from None
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise SpecError("PromptSet", f"line {i + 1}", r, 'a JSON object with "id", "category", "text"')
        missing = {"id", "category", "text"} - set(r)
        if missing:
            raise SpecError("PromptSet", f"line {i + 1}", sorted(missing), 'objects with "id", "category", "text"')
    df = pd.DataFrame(rows)[["id", "category", "text"]]
    dup = df.id[df.id.duplicated()].tolist()
    if dup:
        raise SpecError("PromptSet", "id", dup[0], "unique ids (each prompt's results are keyed by its id)")
    if max_per_category is not None:
        df = df.groupby("category", sort=False).head(max_per_category).reset_index(drop=True)
    tok = _tokenizer(tokenizer)
    df["token_ids"] = [tuple(tok.encode(t, add_special_tokens=False)) for t in df.text]
    df["n_tokens"] = df.token_ids.map(len)
    return df


def ppl_windows(tokenizer: str, n: int, length: int) -> list[tuple[int, ...]]:
    """``n`` consecutive, non-overlapping held-out windows of ``length`` tokens (``workloads.text_prompt``)."""
    from fp8lab.workloads import text_prompt

    return [text_prompt(tokenizer, length, offset=i * length) for i in range(n)]


@dataclass(frozen=True)
class CopyItem:
    """One copy-task item: ``prompt`` = passage + cue, ``answer`` = the passage's next tokens after the
    cue's first occurrence; ``depth`` = tokens from the answer's source to the end of the prompt."""

    tag: str
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    depth: int


def copy_task_items(
    tokenizer: str, n: int, context_tokens: int, cue_tokens: int, answer_tokens: int, offset: int = 0, seed: int = 0
) -> list[CopyItem]:
    """``n`` items from held-out passages starting at token ``offset`` (after the perplexity windows).
    The cue's start is drawn uniformly (seeded) among spans that occur once in the passage, so the
    answer is well defined; a passage without such a span is skipped."""
    from fp8lab.workloads import text_prompt

    rng = random.Random(seed)
    items: list[CopyItem] = []
    i = 0
    while len(items) < n and i < 4 * n + 8:
        passage = text_prompt(tokenizer, context_tokens, offset=offset + i * context_tokens)
        i += 1
        spans = [tuple(passage[j : j + cue_tokens]) for j in range(context_tokens - cue_tokens + 1)]
        counts: dict[tuple[int, ...], int] = {}
        for s in spans:
            counts[s] = counts.get(s, 0) + 1
        starts = [j for j in range(context_tokens - cue_tokens - answer_tokens + 1) if counts[spans[j]] == 1]
        if not starts:
            continue
        c = rng.choice(starts)
        cue, ans = passage[c : c + cue_tokens], passage[c + cue_tokens : c + cue_tokens + answer_tokens]
        items.append(
            CopyItem(
                f"copy-{len(items):03d}",
                tuple(passage) + tuple(cue),
                tuple(ans),
                depth=context_tokens - (c + cue_tokens) + cue_tokens,
            )
        )
    return items


def greedy_phase(prompts: pd.DataFrame, spec: QualitySpec) -> Phase:
    return Phase(
        "greedy",
        tuple(
            Request(prompt_token_ids=ids, max_tokens=spec.gen_tokens, logprobs=spec.top_k, cls=cat, tag=pid)
            for pid, cat, ids in zip(prompts.id, prompts.category, prompts.token_ids, strict=True)
        ),
    )


def teacher_phase(prompts: pd.DataFrame, continuations: Mapping[str, Sequence[int]], spec: QualitySpec) -> Phase:
    """Prompt, then the baseline's continuation forced token by token: scored through the KV cache
    (:func:`fp8lab.scoring.forced_request`, ``top_k`` logprobs per continuation position)."""
    return Phase(
        "teacher",
        tuple(
            forced_request(ids, as_ids(continuations[pid]), spec.top_k, cls=cat, tag=pid)
            for pid, cat, ids in zip(prompts.id, prompts.category, prompts.token_ids, strict=True)
        ),
    )


def teacher_one_pass_phase(
    prompts: pd.DataFrame, continuations: Mapping[str, Sequence[int]], spec: QualitySpec
) -> Phase:
    """Prompt + the baseline's continuation scored in one prefill (``prompt_logprobs``): the secondary,
    one-pass column (whether it reads K/V back from the cache depends on the attention backend)."""
    return Phase(
        "teacher_one_pass",
        tuple(
            one_pass_request(ids, as_ids(continuations[pid]), spec.top_k, cls=cat, tag=pid)
            for pid, cat, ids in zip(prompts.id, prompts.category, prompts.token_ids, strict=True)
        ),
    )


def ppl_split(window_tokens: int, scored_tokens: int | None) -> int:
    """Context length of a perplexity window scored through the cache: the window's last ``scored_tokens`` are
    forced (None: all but the first token, the positions one-pass scoring scores)."""
    return 1 if scored_tokens is None else max(1, window_tokens - scored_tokens)


def ppl_phase(windows: Sequence[Sequence[int]], scored_tokens: int | None = None) -> Phase:
    """Each window's first tokens as the prompt, the rest (``scored_tokens``, default all but the first) forced:
    perplexity through the KV cache, one decode step per scored token."""
    return Phase(
        "ppl",
        tuple(
            forced_request(
                w[: ppl_split(len(w), scored_tokens)], w[ppl_split(len(w), scored_tokens) :], 0, "ppl", f"w{i:03d}"
            )
            for i, w in enumerate(windows)
        ),
    )


def ppl_one_pass_phase(windows: Sequence[Sequence[int]]) -> Phase:
    """Each window scored in one prefill (``prompt_logprobs=0``): the secondary, one-pass perplexity."""
    return Phase(
        "ppl_one_pass",
        tuple(
            Request(prompt_token_ids=tuple(w), max_tokens=1, prompt_logprobs=0, cls="ppl", tag=f"w{i:03d}")
            for i, w in enumerate(windows)
        ),
    )


def task_phase(items: Sequence[CopyItem]) -> Phase:
    """The copy task, greedy: generate exactly as many tokens as the answer has."""
    return Phase(
        "task",
        tuple(Request(prompt_token_ids=it.prompt, max_tokens=len(it.answer), cls="copy", tag=it.tag) for it in items),
    )


def task_tf_phase(items: Sequence[CopyItem]) -> Phase:
    """The copy task, teacher-forced through the KV cache: the prompt, then the answer forced (top-1 and the
    answer's logprobs)."""
    return Phase("task_tf", tuple(forced_request(it.prompt, it.answer, 1, "copy", it.tag) for it in items))


def study_phases(
    spec: QualitySpec,
    prompts: pd.DataFrame,
    continuations: Mapping[str, Sequence[int]],
    windows: Sequence[Sequence[int]],
    task: Sequence[CopyItem],
) -> list[Phase]:
    """The phases every measured KV config runs, in order: greedy, teacher (through the cache), teacher_one_pass,
    ppl and ppl_one_pass (if windows), task and task_tf (if items). ``continuations``: the reference run's greedy
    tokens per prompt id."""
    phases = [
        greedy_phase(prompts, spec),
        teacher_phase(prompts, continuations, spec),
        teacher_one_pass_phase(prompts, continuations, spec),
    ]
    if windows:
        phases += [ppl_phase(windows, spec.ppl_scored_tokens), ppl_one_pass_phase(windows)]
    if task:
        phases += [task_phase(task), task_tf_phase(task)]
    return phases
