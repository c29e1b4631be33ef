"""Study 03's pure per-sequence measures: the reports' top-3 token match, identical prefix, first divergence, greedy
agreement, top-k overlap, a KL lower bound from top-k lists, perplexity and its change."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fp8lab.quality.spec import REPORT_N_TOKENS
from fp8lab.specs import (
    SpecError,
)


def as_ids(x: Any) -> list[int]:
    return [] if x is None else [int(t) for t in list(x)]


def token_match_fraction(reference: Sequence[int], candidate: Sequence[int], n: int = REPORT_N_TOKENS) -> float:
    """Fraction of the first ``n`` generated token ids that agree position by position (the reports'
    "top-3 token match" for ``n = 3``). A missing candidate token counts as a mismatch."""
    ref, cand = as_ids(reference)[:n], as_ids(candidate)[:n]
    if len(ref) < n:
        raise SpecError("token_match_fraction", "reference", len(ref), f"at least n = {n} tokens")
    return sum(1 for i, t in enumerate(ref) if i < len(cand) and cand[i] == t) / n


def identical_prefix_len(reference: Sequence[int], candidate: Sequence[int]) -> int:
    """Number of leading tokens that agree."""
    n = 0
    for a, b in zip(as_ids(reference), as_ids(candidate), strict=False):
        if a != b:
            break
        n += 1
    return n


def first_divergence(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """0-based position of the first disagreeing token, or None when ``candidate`` reproduces all of
    ``reference`` (a shorter candidate diverges where it stops)."""
    ref = as_ids(reference)
    n = identical_prefix_len(ref, candidate)
    return None if n >= len(ref) else n


def agreement_rate(reference: Sequence[int], candidate: Sequence[int]) -> float:
    """Fraction of the reference's positions where the candidate has the same token (after a flip the
    two texts differ, so this mixes FP8 error with cascade: read it with :func:`first_divergence`)."""
    ref, cand = as_ids(reference), as_ids(candidate)
    return sum(1 for i, t in enumerate(ref) if i < len(cand) and cand[i] == t) / len(ref) if ref else float("nan")


def topk_overlap(a_ids: Sequence[int], b_ids: Sequence[int], k: int) -> float:
    """``|top-k(a) ∩ top-k(b)| / k`` of two rank-ordered id lists (k = 1: do the argmaxes agree)."""
    return len(set(as_ids(a_ids)[:k]) & set(as_ids(b_ids)[:k])) / k


def kl_topk(p: Mapping[int, float], q: Mapping[int, float], eps: float = 1e-12) -> float:
    """KL(P || Q) in nats, estimated from partial log-probability lists, remainder mass lumped.

    ``p``, ``q``: ``{token_id: logprob}`` as returned for one position (top-k plus the actual token).
    Over the ids both know, ``S``, and one bucket ``R`` for everything else
    (``P(R) = 1 - Σ_S P``, same for Q): ``Σ_S p log(p/q) + P(R) log(P(R)/Q(R))``. That is the exact KL
    of the two distributions coarse-grained to ``S ∪ {R}``, hence a **lower bound** on the true KL
    (log-sum inequality / data processing, Cover & Thomas, Elements of Information Theory, 2.7.1).
    """
    shared = sorted(set(p) & set(q))
    ps = np.exp(np.array([p[t] for t in shared], dtype=np.float64))
    qs = np.exp(np.array([q[t] for t in shared], dtype=np.float64))
    kl = float(np.sum(ps * (np.log(np.maximum(ps, eps)) - np.log(np.maximum(qs, eps)))))
    pr, qr = max(1.0 - float(ps.sum()), 0.0), max(1.0 - float(qs.sum()), 0.0)
    if pr > eps:
        kl += pr * (math.log(pr) - math.log(max(qr, eps)))
    return max(kl, 0.0)


def perplexity(logprobs: Sequence[float]) -> float:
    """``exp(-mean logprob)`` over the finite entries (natural log; position 0 has none)."""
    a = np.asarray(list(logprobs), dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.exp(-a.mean())) if a.size else float("nan")


def delta_ppl_pct(nll_base: Sequence[float], nll_cand: Sequence[float], n_tokens: Sequence[int]) -> float:
    """Relative perplexity change in %, token-weighted over windows: ``100 (exp((Σ nll_c − Σ nll_b) / Σ n) − 1)``."""
    nb, nc, n = (np.asarray(list(x), dtype=np.float64) for x in (nll_base, nll_cand, n_tokens))
    return float(100.0 * math.expm1((nc.sum() - nb.sum()) / n.sum()))
