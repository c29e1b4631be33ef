"""The phases (requests) each engine of Study 04 runs: the ramp's prompts of every length, the block-size
sweep's, the teacher-forced documents and passkey prompts of the quality part, and :func:`phase_meta`, which reads
a phase name back (kind, concurrency, length). Prompts come from :mod:`fp8lab.longctx.documents`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from fp8lab.longctx.documents import PASSKEY_OUTPUT_TOKENS, PasskeyItem, passkey_items
from fp8lab.longctx.spec import LongCtxPlan
from fp8lab.scoring import forced_request
from fp8lab.specs import Phase, Request
from fp8lab.workloads import document_ids, random_ids

_PHASE_RE = re.compile(r"^(?:ramp-c(?P<c>\d+)-L(?P<L>\d+)|randtok-L(?P<rL>\d+)|(?P<other>.+))$")


def phase_meta(name: str) -> dict[str, Any]:
    """``kind`` (ramp | randtok | warmup | div-text | div-random | passkey), ``concurrency`` and ``length``
    of a phase name (NaN where they do not apply)."""
    m = _PHASE_RE.match(name)
    if m and m["c"]:
        return {"kind": "ramp", "concurrency": int(m["c"]), "length": int(m["L"])}
    if m and m["rL"]:
        return {"kind": "randtok", "concurrency": 1, "length": int(m["rL"])}
    return {"kind": name, "concurrency": np.nan, "length": np.nan}


def _vocab(model: str) -> int:
    from fp8lab.workloads import model_vocab_size

    return model_vocab_size(model)


def ramp_prompt(plan: LongCtxPlan, length: int, doc: int) -> tuple[int, ...]:
    """Prompt ``doc`` (0, 1, ...) of ``length`` tokens: document ``doc`` of the long held-out text (each
    document starts ``lengths[-1]`` tokens after the previous one, so prompts never overlap), or seeded
    random ids for a dummy-weight model. Prompt ``doc`` at a shorter length is a prefix of it at a longer
    one: the ramp reads the same document ever deeper (prefix caching is off, so nothing is reused)."""
    if plan.prompt_source == "random":
        return random_ids(_vocab(plan.model), length, seed=plan.seed * 1000 + doc)
    return document_ids(
        plan.model, length, offset=doc * plan.lengths[-1], inserts=plan.inserts, every=plan.insert_every, seed=plan.seed
    )


def ramp_phases(plan: LongCtxPlan) -> list[Phase]:
    """The ramp engine's phases: ``warmup``; ``ramp-c1-L<L>`` for every length (and every sweep length);
    ``ramp-c<C>-L<L>`` for every length when ``concurrency > 1``; ``randtok-L<L>`` (real-text models only: the
    first real-text prompt of that length, a random-token prompt, the real-text prompt again; the two real-text
    runs bracket the random one in time and their difference is the run-to-run noise)."""
    out, R, C = plan.output_tokens, plan.requests_per_length, plan.concurrency
    warm = ramp_prompt(plan, min(256, plan.lengths[0]), doc=R + C + 7)
    phases = [Phase("warmup", (Request(warm, max_tokens=4, cls="warmup", tag="warmup"),), concurrency=1)]
    for L in sorted(set(plan.lengths) | set(plan.sweep_lengths)):
        reqs = tuple(Request(ramp_prompt(plan, L, i), out, cls=f"L{L}", tag=f"c1-L{L}-r{i}") for i in range(R))
        phases.append(Phase(f"ramp-c1-L{L}", reqs, concurrency=1))
    if C > 1:
        for L in plan.lengths:
            reqs = tuple(
                Request(ramp_prompt(plan, L, R + i), out, cls=f"L{L}", tag=f"c{C}-L{L}-r{i}") for i in range(C)
            )
            phases.append(Phase(f"ramp-c{C}-L{L}", reqs, concurrency=C))
    if plan.prompt_source == "text":
        for L in plan.random_token_lengths:
            ids = random_ids(_vocab(plan.model), L, seed=plan.seed + 77)
            text = ramp_prompt(plan, L, 0)
            reqs = (
                Request(text, out, cls="text", tag=f"text-a-L{L}"),
                Request(ids, out, cls="random", tag=f"randtok-L{L}"),
                Request(text, out, cls="text", tag=f"text-b-L{L}"),
            )
            phases.append(Phase(f"randtok-L{L}", reqs, concurrency=1))
    return phases


def sweep_phases(plan: LongCtxPlan) -> list[Phase]:
    """A block-size sweep engine's phases: ``warmup`` and ``ramp-c1-L<L>`` at the sweep lengths, with
    exactly the ramp's prompts."""
    keep = {f"ramp-c1-L{L}" for L in plan.sweep_lengths} | {"warmup"}
    return [p for p in ramp_phases(plan) if p.name in keep]


def quality_documents(plan: LongCtxPlan) -> dict[str, list[tuple[int, ...]]]:
    """``{"text": [...], "random": [...]}``: the documents scored teacher-forced, ``doc_length`` tokens each.
    Real-text documents start where the ramp's real-text prompts end (at 0 when the ramp uses random ids),
    so they are never the ramp's prompts."""
    model = plan.quality_model
    base = (plan.requests_per_length + plan.concurrency) * plan.lengths[-1] if plan.prompt_source == "text" else 0
    text = [
        document_ids(
            model,
            plan.doc_length,
            offset=base + j * plan.doc_length,
            inserts=plan.inserts,
            every=plan.insert_every,
            seed=plan.seed,
        )
        for j in range(plan.quality_docs)
    ]
    rnd = [
        random_ids(_vocab(model), plan.doc_length, seed=plan.seed * 7919 + 5000 + j)
        for j in range(plan.quality_random_docs)
    ]
    return {"text": text, "random": rnd}


def quality_phases(plan: LongCtxPlan) -> tuple[list[Phase], list[PasskeyItem]]:
    """``div-text`` / ``div-random`` and ``passkey`` (greedy, 8 tokens), ``plan.quality_concurrency`` requests at a
    time (1: one at a time). Also returns the passkey items (keys, depths).

    The divergence documents are scored as ``plan.divergence_scoring`` says: ``cache`` (whole documents through
    the KV cache: the first token as the prompt, the rest forced token by token with ``top_k`` logprobs,
    :func:`fp8lab.scoring.forced_request`, so every position after the first attends over K/V read back from the
    cache; one decode step per token) or ``one_pass`` (the whole document as the prompt, ``max_tokens=1``,
    ``prompt_logprobs=top_k``: one prefill that reads the quantized cache, vllm-notes section 6)."""
    if plan.quality_model is None:
        return [], []
    phases = []
    for source, docs in quality_documents(plan).items():
        if docs:
            if plan.divergence_scoring == "one_pass":
                reqs = tuple(
                    Request(d, max_tokens=1, prompt_logprobs=plan.top_k, cls=source, tag=f"{source}-{j}")
                    for j, d in enumerate(docs)
                )
            else:
                reqs = tuple(
                    forced_request(d[:1], d[1:], plan.top_k, cls=source, tag=f"{source}-{j}")
                    for j, d in enumerate(docs)
                )
            phases.append(Phase(f"div-{source}", reqs, concurrency=min(plan.quality_concurrency, len(reqs))))
    items: list[PasskeyItem] = []
    if plan.passkey_lengths:
        items = passkey_items(
            plan.quality_model,
            plan.passkey_lengths,
            plan.passkey_depths,
            plan.passkey_trials,
            seed=plan.seed,
            inserts=plan.inserts,
            every=plan.insert_every,
            keys=plan.passkey_keys,
        )
        phases.append(
            Phase(
                "passkey",
                tuple(Request(it.prompt, PASSKEY_OUTPUT_TOKENS, cls="passkey", tag=it.tag) for it in items),
                concurrency=min(plan.quality_concurrency, len(items)),
            )
        )
    return phases, items


def fit_phases(phases: Sequence[Phase], max_model_len: int) -> list[Phase]:
    """``phases`` without the requests longer than ``max_model_len`` (prompt + max_tokens); empty phases
    dropped. Those lengths are recorded as ``over_capacity`` outcomes, not sent."""
    out = []
    for p in phases:
        reqs = tuple(r for r in p.requests if r.prompt_len + r.max_tokens <= max_model_len)
        if reqs:
            out.append(Phase(p.name, reqs, p.concurrency if p.concurrency is None else min(p.concurrency, len(reqs))))
    return out
