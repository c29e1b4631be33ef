"""Quality against ``auto``, per matrix row: a scorer takes ``auto``'s quality records and a row's and returns
``dppl_pct``, ``top1_agreement``, ``greedy_identical``, ``first_divergence`` and the words ``method`` / ``model``
that the page prints beside every number.

The scorer used now, :func:`engine_prompt_logprobs` (:data:`METHOD`), rests on what the matrix's own engines return:
teacher-forced prompt logprobs (vLLM ``prompt_logprobs``, one pass: perplexity and top-1 agreement per position)
and greedy decode (divergence) on seeded random token prompts. Whether one-pass prompt logprobs read the quantized
cache depends on the backend (vllm-notes section 10: with ``turboquant_k8v4`` they matched ``auto`` to five digits
while greedy decode diverged): the greedy columns read the cache in every backend. A through-the-cache scorer (the
quality study's, on the real model) plugs in with :func:`register_scorer` and is chosen by name
(``MatrixSpec``-level parameter ``QUALITY_SCORER`` in the notebook), without touching the matrix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

METHOD = (
    "one-pass teacher-forced prompt logprobs (perplexity, top-1 agreement) and greedy decode (divergence) on "
    "seeded random token prompts, scored by the matrix's own engines"
)

Scorer = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]
SCORERS: dict[str, Scorer] = {}


def register_scorer(name: str, fn: Scorer) -> None:
    """Make ``fn(auto_records, row_records) -> dict`` available as scorer ``name``."""
    SCORERS[name] = fn


def _ppl(rows: list[dict[str, Any]]) -> float | None:
    lps = [lp for r in rows for lp in r["prompt_logprobs"] if lp is not None]
    return math.exp(-sum(lps) / len(lps)) if lps else None


def engine_prompt_logprobs(auto: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """:data:`METHOD`: ``dppl_pct`` (100 * (ppl / ppl_auto - 1)), ``top1_agreement`` (share of prompt positions whose
    top-1 token equals auto's), ``greedy_identical`` (share of prompts whose greedy tokens equal auto's),
    ``first_divergence`` (mean index of the first differing greedy token; the full length where none differs),
    ``n_prompts``, ``n_positions``."""
    by = {r["prompt"]: r for r in auto}
    pairs = [(by[r["prompt"]], r) for r in rows if r["prompt"] in by]
    if not pairs:
        return {}
    pa, pb = _ppl([a for a, _ in pairs]), _ppl([b for _, b in pairs])
    agree = [x == y for a, b in pairs for x, y in zip(a["top1"], b["top1"], strict=False)]
    firsts = []
    for a, b in pairs:
        ga, gb = a["greedy"], b["greedy"]
        firsts.append(next((i for i in range(min(len(ga), len(gb))) if ga[i] != gb[i]), min(len(ga), len(gb))))
    return {
        "ppl_auto": pa,
        "ppl": pb,
        "dppl_pct": 100.0 * (pb / pa - 1.0) if pa and pb else None,
        "top1_agreement": sum(agree) / len(agree) if agree else None,
        "greedy_identical": sum(a["greedy"] == b["greedy"] for a, b in pairs) / len(pairs),
        "first_divergence": sum(firsts) / len(firsts),
        "n_prompts": len(pairs),
        "n_positions": len(agree),
    }


register_scorer("engine_prompt_logprobs", engine_prompt_logprobs)


CACHE_METHOD = (
    "through the KV cache: each window's continuation forced token by token after its context (every scored position "
    "after the first a decode step reading K/V back from the cache; fp8lab.forcing), perplexity and top-1 agreement "
    "on those positions; greedy decode after the context (divergence); one-pass prompt logprobs beside, as this "
    "backend's check of whether one prefill sees the quantization"
)


def through_cache(auto: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """:data:`CACHE_METHOD`: ``dppl_pct``, ``top1_agreement``, ``greedy_identical``, ``first_divergence`` from the
    forced (through-the-cache) scores; ``dppl_one_pass_pct`` the one-pass twin; ``cache_sees`` / ``one_pass_sees``
    the share of scored positions whose logprob differs from ``auto``'s (:func:`fp8lab.scoring.cache_check`: 0 on a
    deterministic backend means the scoring did not see the quantization); ``source`` the windows' text."""
    from fp8lab.scoring import cache_check

    by = {r["prompt"]: r for r in auto if r.get("forced_ok")}
    pairs = [(by[r["prompt"]], r) for r in rows if r["prompt"] in by and r.get("forced_ok")]
    if not pairs:
        return {}

    def ppl(lps: list[float | None]) -> float | None:
        xs = [x for x in lps if x is not None]
        return math.exp(-sum(xs) / len(xs)) if xs else None

    flat = lambda key, side: [x for p in pairs for x in p[side][key]]  # noqa: E731
    ca, cb = flat("cache_logprobs", 0), flat("cache_logprobs", 1)
    pa, pb = ppl(ca), ppl(cb)
    oa, ob = ppl(flat("prompt_logprobs", 0)), ppl(flat("prompt_logprobs", 1))
    # the one-pass twin only where both sides kept it (a slimmed store drops it: reported as not measured)
    twin = len(flat("prompt_logprobs", 0)) == len(flat("prompt_logprobs", 1)) > 0
    if not twin:
        oa = ob = None
    agree = [x == y for a, b in pairs for x, y in zip(a["cache_top1"][1:], b["cache_top1"][1:], strict=False)]
    firsts = []
    for a, b in pairs:
        ga, gb = a["greedy"], b["greedy"]
        firsts.append(next((i for i in range(min(len(ga), len(gb))) if ga[i] != gb[i]), min(len(ga), len(gb))))
    nan = float("nan")
    seen = cache_check([nan if x is None else x for x in ca], [nan if x is None else x for x in cb])
    seen1 = (
        cache_check(
            [nan if x is None else x for x in flat("prompt_logprobs", 0)],
            [nan if x is None else x for x in flat("prompt_logprobs", 1)],
        )
        if twin
        else {"frac_differ": None}
    )
    return {
        "ppl_auto": pa,
        "ppl": pb,
        "dppl_pct": 100.0 * (pb / pa - 1.0) if pa and pb else None,
        "dppl_one_pass_pct": 100.0 * (ob / oa - 1.0) if oa and ob else None,
        "top1_agreement": sum(agree) / len(agree) if agree else None,
        "greedy_identical": sum(a["greedy"] == b["greedy"] for a, b in pairs) / len(pairs),
        "first_divergence": sum(firsts) / len(firsts),
        "cache_sees": seen["frac_differ"],
        "cache_max_abs_dlogprob": seen["max_abs_dlogprob"],
        "one_pass_sees": seen1["frac_differ"],
        "n_prompts": len(pairs),
        "n_positions": len(agree),
        "source": pairs[0][1].get("source", ""),
    }


register_scorer("through_cache", through_cache)
WORDS = {"engine_prompt_logprobs": METHOD, "through_cache": CACHE_METHOD}


def score(auto: list[dict[str, Any]], rows: list[dict[str, Any]], scorer: str | None = None) -> dict:
    """The scorer ``scorer``'s figures, with ``method`` (its words); ``None``: through the cache where the records
    hold forced scores (this worker's since the forced decode), else the one-pass scorer (older stored runs)."""
    if scorer is None:
        scorer = "through_cache" if any("cache_logprobs" in r for r in rows) else "engine_prompt_logprobs"
    out = SCORERS[scorer](auto, rows)
    return {**out, "method": WORDS.get(scorer, scorer)} if out else {}
