"""Study 07's prediction, no engine: the blocks a conversation holds (:func:`conversation_blocks`), the knee by
arithmetic (:func:`knee_formula`), vLLM's block pool replayed on the study's schedule (:class:`BlockPool`,
:func:`simulate`, :func:`sim_hit_rate`, :func:`knee_simulated`) and the predicted hit rate of every swept cell
(:func:`plan`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: fp8lab.prefix.spec imports this module
    from fp8lab.prefix.spec import PrefixSpec, Shape


def conversation_blocks(shape: Shape, block_size: int) -> tuple[int, int, int]:
    """``(shared_full, own_full, partial)``: blocks every conversation shares (``shared // block``: only blocks
    wholly inside the shared prefix), the full blocks a conversation holds on its own at its end
    (``final_len // block - shared_full``; ``final_len`` = last prompt + answer - 1 tokens: the last generated token
    gets no KV) and whether a partial last block remains (0 or 1). vLLM 0.32 frees a finished request's uncached
    (partial) blocks to the front of the free queue, so only running requests hold one."""
    shared_full = shape.shared // block_size
    return shared_full, shape.final_len // block_size - shared_full, int(shape.final_len % block_size > 0)


def knee_formula(shape: Shape, num_blocks: int, block_size: int, max_in_flight: int = 1) -> int:
    """The most conversations whose blocks all fit the cache at the end of their last turn: the largest ``N`` with
    ``shared_full + N * own_full + min(N, max_in_flight) * partial <= num_blocks - 1`` (:func:`conversation_blocks`;
    one block is vLLM's null block). Beyond it LRU evicts the oldest conversation's blocks before it returns, and
    hits are lost. :func:`simulate` replays the schedule exactly (waves, block fill order); the two may differ by one."""
    shared_full, own, partial = conversation_blocks(shape, block_size)
    usable = num_blocks - 1
    if own <= 0:
        return 10**9
    n = (usable - shared_full) // own
    while n > 0 and shared_full + n * own + min(n, max_in_flight) * partial > usable:
        n -= 1
    return n


def _block_keys(shape: Shape, conv: int, n_tokens: int, block_size: int) -> list[tuple]:
    """Content identities of the full blocks of a conversation's first ``n_tokens`` tokens: blocks that lie within
    the shared prefix are the same for every conversation; every later block is the conversation's own."""
    shared_full = shape.shared // block_size
    return [("s", b) if b < shared_full else ("c", conv, b) for b in range(n_tokens // block_size)]


class BlockPool:
    """vLLM's block pool (v1 ``BlockPool`` / ``FreeKVCacheBlockQueue``), reduced to what decides hits: blocks in an
    LRU free queue (evicted from the front; freed blocks appended tail-first, so a request's last blocks go first),
    a block cached (hashed) once full, a cached block in the queue revived by a hit. Block 0 is the null block."""

    def __init__(self, num_blocks: int | None):
        """``num_blocks = None``: unbounded (a fresh block whenever the queue holds no uncached one)."""
        self.unbounded = num_blocks is None
        self.next_new = 1
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks or 1))
        self.key_of: dict[int, tuple] = {}
        self.block_of: dict[tuple, int] = {}

    def lookup(self, keys: Sequence[tuple]) -> list[int]:
        out = []
        for k in keys:
            b = self.block_of.get(k)
            if b is None:
                break
            out.append(b)
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            self.free.pop(b, None)

    def allocate(self) -> int:
        if self.unbounded:
            self.next_new += 1
            return self.next_new - 1
        if not self.free:
            raise RuntimeError("no free block: the running requests do not fit (the engine would preempt)")
        b, _ = self.free.popitem(last=False)
        k = self.key_of.pop(b, None)
        if k is not None:
            self.block_of.pop(k, None)
        return b

    def cache(self, block: int, key: tuple) -> None:
        if key not in self.block_of:
            self.block_of[key] = block
            self.key_of[block] = key

    def release(self, blocks: Sequence[int]) -> None:
        """Free a request's blocks, tail first: cached ones to the back of the queue (LRU), uncached ones to the
        front, reused first (vLLM 0.32 ``BlockPool.free_blocks``)."""
        first = []
        for b in reversed(blocks):
            if b in self.key_of:
                self.free[b] = None
            else:
                first.append(b)
        for b in reversed(first):
            self.free[b] = None
            self.free.move_to_end(b, last=False)


def simulate(shape: Shape, n_active: int, num_blocks: int, block_size: int, max_in_flight: int) -> list[dict[str, int]]:
    """Replay one cell (``n_active`` conversations, round robin, waves of ``max_in_flight``) on :class:`BlockPool`.

    Returns one row per turn: ``turn, queries`` (prompt tokens), ``hits`` (cached tokens: at most
    ``(prompt - 1) // block`` blocks per request, vLLM always computes a prompt's last token). Within a wave the
    prompts are placed in order, then the answers decode one token per step for all, so blocks fill and are cached
    as the engine does. ``num_blocks = None`` is an unbounded cache."""
    pool = BlockPool(num_blocks or None)
    rows = []
    for t in range(shape.turns):
        L = shape.prompt_len(t)
        q = h = 0
        for w0 in range(0, n_active, max_in_flight):
            wave = list(range(w0, min(w0 + max_in_flight, n_active)))
            held: dict[int, list[int]] = {}
            for c in wave:
                keys = _block_keys(shape, c, L + shape.answer - 1, block_size)
                hit = pool.lookup(keys[: (L - 1) // block_size])
                pool.touch(hit)
                q, h = q + L, h + len(hit) * block_size
                blocks = list(hit)
                for b in range(len(hit), math.ceil(L / block_size)):
                    blocks.append(pool.allocate())
                    if b < len(keys) and (b + 1) * block_size <= L:
                        pool.cache(blocks[-1], keys[b])
                held[c] = blocks
            for pos in range(L, L + shape.answer - 1):  # decode: token pos gets its KV slot this step
                for c in wave:
                    b = pos // block_size
                    if b >= len(held[c]):
                        held[c].append(pool.allocate())
                    if (pos + 1) % block_size == 0:
                        pool.cache(held[c][b], _block_keys(shape, c, pos + 1, block_size)[b])
            for c in wave:
                pool.release(held[c])
        rows.append({"turn": t, "queries": q, "hits": h})
    return rows


@lru_cache(maxsize=4096)
def sim_hit_rate(shape: Shape, n_active: int, num_blocks: int | None, block_size: int, max_in_flight: int) -> float:
    rows = simulate(shape, n_active, num_blocks or 0, block_size, max_in_flight)
    return sum(r["hits"] for r in rows) / sum(r["queries"] for r in rows)


@lru_cache(maxsize=1024)
def knee_simulated(shape: Shape, num_blocks: int, block_size: int, max_in_flight: int, n_max: int = 4096) -> int:
    """The largest ``N`` whose simulated hit rate equals the unbounded cache's (no hit lost to eviction), found by
    walking ``N`` upward to the first loss (``n_max`` when none up to it)."""
    n = 0
    while n < n_max:
        m = n + 1
        ideal = simulate(shape, m, 0, block_size, max_in_flight)
        real = simulate(shape, m, num_blocks, block_size, max_in_flight)
        if sum(r["hits"] for r in real) < sum(r["hits"] for r in ideal):
            return n
        n = m
    return n


def plan(spec: PrefixSpec) -> Any:
    """Per workload and dtype: the block count, the knee by the formula and by the replay, and per swept ``N`` the
    predicted hit rate with this budget and with an unbounded cache. No engine."""
    import pandas as pd

    bs = spec.effective_block_size()
    rows = []
    for s in spec.workloads:
        for d in spec.kv_dtypes:
            nb = spec.num_blocks(d)
            kf = knee_formula(s, nb, bs, spec.max_in_flight)
            ks = knee_simulated(s, nb, bs, spec.max_in_flight, n_max=max(4 * max(spec.active), kf + 2))
            for n in spec.active:
                rows.append(
                    {
                        "workload": s.kind,
                        "kv_dtype": d,
                        "n_active": n,
                        "num_blocks": nb,
                        "block_size": bs,
                        "knee_formula": kf,
                        "knee_simulated": ks,
                        "hit_rate_pred": sim_hit_rate(s, n, nb, bs, spec.max_in_flight),
                        "hit_rate_unbounded": sim_hit_rate(s, n, None, bs, spec.max_in_flight),
                        "working_set_blocks": conversation_blocks(s, bs)[0] + n * sum(conversation_blocks(s, bs)[1:]),
                    }
                )
    return pd.DataFrame(rows)
