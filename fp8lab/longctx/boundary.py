"""Boundary arithmetic of Study 04: blocks per sequence, the longest context and the concurrency a pool of KV
blocks holds, the formula's block count for a plan (:func:`fp8lab.kvmath.predict_num_blocks`), and vLLM's own
estimate of the longest ``max_model_len`` read from its start-up error. Arithmetic only, no engine."""

from __future__ import annotations

import re

from fp8lab import kvmath
from fp8lab.longctx.spec import LongCtxPlan
from fp8lab.specs import check_int

#: vLLM keeps one block of the pool back as the null block (``BlockPool.null_block``), so a pool of
#: ``num_blocks`` blocks holds ``num_blocks - 1`` blocks of sequences (also the denominator of vLLM's
#: ``kv_cache_usage_perc``: ``BlockPool.get_usage``).
NULL_BLOCKS = 1
#: vLLM's error when ``max_model_len`` does not fit (``kv_cache_utils._check_enough_kv_cache_memory``).
_ESTIMATE_RE = re.compile(r"estimated maximum model length is (\d+)")


def blocks_for(context: int, block_size: int) -> int:
    """Blocks one sequence of ``context`` tokens holds: ``ceil(context / block_size)``."""
    check_int("Boundary", "context", context, 0, 100_000_000)
    check_int("Boundary", "block_size", block_size, 1, 100_000)
    return -(-context // block_size)


def longest_context(num_blocks: int, block_size: int) -> int:
    """Longest ``max_model_len`` (tokens) a pool of ``num_blocks`` blocks admits:
    ``(num_blocks - 1) * block_size`` (one block is the null block; vLLM's start-up check
    ``_check_enough_kv_cache_memory`` plans against the usable blocks, and its own estimate of the
    maximum model length is exactly this)."""
    check_int("Boundary", "num_blocks", num_blocks, 0, 10**12)
    return max(0, num_blocks - NULL_BLOCKS) * block_size


def max_concurrency_at(num_blocks: int, block_size: int, context: int, max_num_seqs: int | None = None) -> int:
    """How many sequences of ``context`` tokens (prompt + output) the pool holds at once at full length:
    ``(num_blocks - 1) // ceil(context / block_size)``, capped by the scheduler's ``max_num_seqs``."""
    n = max(0, num_blocks - NULL_BLOCKS) // max(1, blocks_for(context, block_size))
    return min(n, max_num_seqs) if max_num_seqs else n


def parse_estimated_max_len(error: str | None) -> int | None:
    """vLLM's own estimate of the longest ``max_model_len`` that fits, from its start-up error
    ("... the estimated maximum model length is N."), or ``None``."""
    m = _ESTIMATE_RE.search(error or "")
    return int(m.group(1)) if m else None


def predicted_num_blocks(
    plan: LongCtxPlan,
    kv_dtype: str,
    block_size: int,
    budget_bytes: int | None = None,
    hybrid_kv_cache_manager: bool = True,
) -> int | None:
    """KV blocks of an engine of ``plan`` by :func:`fp8lab.kvmath.predict_num_blocks`, from ``budget_bytes``
    or the plan's ``kv_cache_gib``; ``None`` when neither is known (vLLM sizes the cache itself)."""
    budget = (
        budget_bytes
        if budget_bytes is not None
        else (int(plan.kv_cache_gib * kvmath.GIB) if plan.kv_cache_gib is not None else None)
    )
    if budget is None:
        return None
    return kvmath.predict_num_blocks(
        plan.model, budget, block_size, kv_dtype, hybrid_kv_cache_manager=hybrid_kv_cache_manager
    )
