"""Scoring a token sequence, one pass or through the KV cache: the request builders and the per-sequence logprob
vectors every quality table reads.

Two methods score the same positions of ``context + continuation``:

- **through the cache** (:func:`forced_request`; the verdicts use it): the context is the prompt and the
  continuation is forced token by token (:mod:`fp8lab.forcing`, a vLLM logits processor) with ``logprobs=k``. The
  first continuation token is scored from the prefill's last position; every later one is a decode step whose
  attention reads the context's and the earlier continuation tokens' K/V from the KV cache, as written (and, for a
  quantized cache, quantized) by the engine. Cost: one decode step per forced token.
- **one pass** (:func:`one_pass_request`; kept as a secondary column): ``context + continuation`` as one prompt
  with ``prompt_logprobs=k``, scored in one prefill. Whether that prefill reads K/V back from the cache depends on
  the attention backend (vllm-notes sections 6 and 10), and such a request never reads the prefix cache
  (``SamplingParams``: ``prompt_logprobs`` sets ``skip_reading_prefix_cache``, sampling_params.py 32:622-629,
  26:502-506), so "context as a prefix hit" cannot route it through the cache either.

:func:`sequence_logprobs` turns either kind of record into vectors aligned with ``context + continuation``
(position ``i`` scores token ``i`` given tokens ``< i``; NaN / ``[]`` where a method scores nothing), so tables need
not know which method made a record. :func:`cache_check` compares a candidate's scores with ``auto``'s over the
positions both scored: it is how a run shows that its scoring sees the quantization.

No vLLM here: the worker (:mod:`fp8lab.engine.worker`) reads :data:`FORCED_KEY` and :data:`FORCING_FQCN`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fp8lab.specs import Request

FORCED_KEY = "fp8lab_forced"  # SamplingParams.extra_args key: the token ids a request must generate
FORCING_FQCN = "fp8lab.forcing:ForcedTokens"  # vLLM's "<module>:<class>" form of the logits processor

METHODS = ("cache", "one_pass")


def forced_request(
    context: Sequence[int], continuation: Sequence[int], top_k: int, cls: str = "default", tag: str = ""
) -> Request:
    """Score ``continuation`` after ``context`` through the KV cache: ``context`` is the prompt, ``continuation``
    is forced (``max_tokens = len(continuation)``), ``logprobs = top_k`` per forced step."""
    cont = tuple(int(t) for t in continuation)
    return Request(
        prompt_token_ids=tuple(context),
        max_tokens=len(cont),
        forced_token_ids=cont,
        logprobs=top_k,
        cls=cls,
        tag=tag,
    )


def one_pass_request(
    context: Sequence[int], continuation: Sequence[int], top_k: int, cls: str = "default", tag: str = ""
) -> Request:
    """Score ``context + continuation`` in one prefill (``prompt_logprobs = top_k``, ``max_tokens = 1``)."""
    return Request(
        prompt_token_ids=tuple(context) + tuple(int(t) for t in continuation),
        max_tokens=1,
        prompt_logprobs=top_k,
        cls=cls,
        tag=tag,
    )


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple, np.ndarray))


def sequence_logprobs(row: Any) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """``(token_logprobs, topk_ids, topk_logprobs)`` aligned with the scored sequence (prompt, then forced tokens).

    ``row``: one record (a dict or a pandas row) of either method. A forced record's prompt positions hold NaN /
    ``[]`` (unless it also asked for prompt logprobs) and its continuation positions the forced steps' logprobs (NaN
    where ``forced_ok`` is False: the engine did not generate the forced tokens); a one-pass record's are its prompt
    logprobs (position 0: NaN, nothing precedes it)."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    forced = get("forced_token_ids", None)
    p_lp = get("prompt_token_logprobs", None)
    if _is_list(p_lp):
        lps = list(map(float, p_lp))
        ids, tlps = _topk(get("prompt_topk_ids", None), get("prompt_topk_logprobs", None), len(lps))
    else:
        n_prompt = int(get("prompt_tokens"))
        lps, ids, tlps = [float("nan")] * n_prompt, [[] for _ in range(n_prompt)], [[] for _ in range(n_prompt)]
    if _is_list(forced) and len(forced):
        n = len(forced)
        if not bool(get("forced_ok", False)):  # the engine did not generate the forced tokens: nothing scored
            return lps + [float("nan")] * n, ids + [[] for _ in range(n)], tlps + [[] for _ in range(n)]
        lps += list(map(float, get("output_token_logprobs")))
        o_ids, o_lps = _topk(get("output_topk_ids", None), get("output_topk_logprobs", None), n)
        ids += o_ids
        tlps += o_lps
    return lps, ids, tlps


def _topk(ids: Any, lps: Any, n: int) -> tuple[list[list[int]], list[list[float]]]:
    """Top-k lists as plain lists; ``n`` empty ones where a slimmed store dropped them (scripts/slim_store.py keeps
    the actual tokens' scores only)."""
    out_ids = [list(map(int, x)) for x in ids] if _is_list(ids) else [[] for _ in range(n)]
    out_lps = [list(map(float, x)) for x in lps] if _is_list(lps) else [[] for _ in range(n)]
    return out_ids, out_lps


def cache_check(base: Sequence[float], cand: Sequence[float], tol: float = 0.0) -> dict[str, float]:
    """Does the candidate's scoring see its KV quantization? Over the positions where both score the actual token:
    ``positions``, ``max_abs_dlogprob`` and ``mean_abs_dlogprob`` (nats), ``frac_differ`` (share with
    ``|Δ| > tol``). An unquantized read gives 0, 0, 0 on a deterministic backend."""
    b, c = np.asarray(list(base), dtype=float), np.asarray(list(cand), dtype=float)
    ok = np.isfinite(b) & np.isfinite(c)
    d = np.abs(c[ok] - b[ok])
    if not d.size:
        return {
            "positions": 0,
            "max_abs_dlogprob": float("nan"),
            "mean_abs_dlogprob": float("nan"),
            "frac_differ": float("nan"),
        }
    return {
        "positions": int(d.size),
        "max_abs_dlogprob": float(d.max()),
        "mean_abs_dlogprob": float(d.mean()),
        "frac_differ": float((d > tol).mean()),
    }


__all__ = [
    "FORCED_KEY",
    "FORCING_FQCN",
    "METHODS",
    "cache_check",
    "forced_request",
    "one_pass_request",
    "sequence_logprobs",
]
