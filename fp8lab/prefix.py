"""Study 07: FP8 KV and the prefix cache. Does ``fp8`` keep more of the reused prefixes than ``auto``?

The claim under test (a field report): FP8 KV leaves the prefix-cache hit rate unchanged (68.3% -> 67.9% on
multi-turn chat, 54.1% -> 53.7% on JSON generation). The mechanism predicts more: vLLM's block hashes depend on
the token ids only, not on the KV dtype, so at equal KV memory both dtypes hit alike while the cache holds the
working set; once it does not, ``fp8`` holds twice the blocks, so its hit rate should stay up where ``auto``'s
falls, and its time to first token (TTFT) should be lower exactly there.

**Workloads** (:class:`Shape`, real text from ``data/text`` or seeded random ids for dummy weights): ``N``
conversations are active at once and served round robin, turn by turn, at most ``max_in_flight`` requests at a
time (a wave). Turn ``t`` of a conversation sends ``shared + private + u_0 + a_0 + ... + u_t``: the conversation so
far, the model's last answer (its own greedy output) and a new user message. ``chat``: no shared part; ``system``:
every conversation starts with one long shared system prompt; ``json``: a shared JSON-schema template, then a
private JSON record, then extraction requests. ``N`` is swept from well inside to well beyond what the KV budget
holds; each (workload, N, trial) cell starts from an empty prefix cache (``reset_prefix_cache``).

**Prediction** (:func:`simulate`, no engine): vLLM's block pool replayed on the same schedule (LRU free queue,
blocks freed tail first, a block cached once it is full, the null block, hits capped at ``(prompt - 1) // block``
blocks). It gives each cell's hit rate for both block counts, and the knee: the largest ``N`` that loses no hit
against an unbounded cache. :func:`knee_formula` is the same in one line of arithmetic.

**Measurement** (:mod:`fp8lab.prefix_worker`): one engine per KV dtype, both alive, serving the whole sweep,
alternating within every cell pair (AB, BA, ...). Hit rate from vLLM's own prefix-cache counters (the per-step
``prefix_cache_stats`` that vLLM adds to ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``), per-request
``num_cached_tokens``, TTFT, throughput, preemptions and peak KV usage per turn; ``trials`` paired repetitions
(fresh text per trial, the same for both dtypes). Correctness: greedy tokens and logprobs of the same prompt with
a prefix hit against computed cold, within each dtype.

The store keeps one folder per spec (``<runs>/07_prefix/<hash>/``): ``spec.json``, ``rows.jsonl`` (a row per cell
and turn), ``correctness.jsonl``, ``engines.json`` (engine facts, failures with their reason, provenance),
``worker.log`` and ``complete.json`` once done. A complete run is loaded, an incomplete one resumes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from fp8lab import kvmath, stats
from fp8lab.paths import runs_dir
from fp8lab.specs import (
    BLOCK_SIZES,
    EngineSpec,
    KVDtype,
    LoadFormat,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    spec_hash,
)

STUDY = "07_prefix"
PROTOCOL = 1
WorkloadKind = Literal["chat", "system", "json"]
PromptSource = Literal["text", "random"]
CPU_DEFAULT_BLOCK = 128  # vLLM's CPU default block size (vllm-notes section 3); GPU: 16

#: The claim this study judges (the audit's row).
CLAIM = {
    "source": "field report",
    "text": "FP8 KV leaves the prefix-cache hit rate unchanged",
    "auto_hit_rate": {"chat": 0.683, "json": 0.541},
    "fp8_hit_rate": {"chat": 0.679, "json": 0.537},
}


# ====================================================================================== spec
@dataclass(frozen=True)
class Shape:
    """One workload's token shape. ``shared``: tokens every conversation starts with (system prompt, template);
    ``private``: tokens of the conversation's own context before the first message; ``user``: tokens of each user
    message; ``answer``: tokens the model generates per turn (exactly, ``ignore_eos``); ``turns`` per conversation."""

    kind: WorkloadKind
    shared: int
    private: int
    user: int
    answer: int
    turns: int

    def __post_init__(self) -> None:
        check_choice("Shape", "kind", self.kind, WorkloadKind)
        check_int("Shape", "shared", self.shared, 0, 10_000_000)
        check_int("Shape", "private", self.private, 0, 10_000_000)
        check_int("Shape", "user", self.user, 1, 10_000_000)
        check_int("Shape", "answer", self.answer, 2, 100_000)
        check_int("Shape", "turns", self.turns, 2, 1000)

    def prompt_len(self, turn: int) -> int:
        """Prompt tokens of turn ``turn`` (0-based): ``shared + private + (turn + 1) * user + turn * answer``."""
        return self.shared + self.private + (turn + 1) * self.user + turn * self.answer

    @property
    def final_len(self) -> int:
        """Tokens with KV at the end of a conversation (the last generated token is never fed back)."""
        return self.prompt_len(self.turns - 1) + self.answer - 1


def parse_workloads(value: Any) -> tuple[Shape, ...]:
    """``[["chat", shared, private, user, answer, turns], ...]`` (a notebook parameter) -> shapes."""
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError(
            "PrefixSpec",
            "workloads",
            value,
            "a non-empty list of [kind, shared, private, user, answer, turns], kind chat | system | json",
        )
    out = []
    for item in value:
        if isinstance(item, Shape):
            out.append(item)
        elif isinstance(item, dict):
            out.append(Shape(**item))
        elif isinstance(item, (list, tuple)) and len(item) == 6:
            out.append(Shape(*item))
        else:
            raise SpecError("PrefixSpec", "workloads", item, "[kind, shared, private, user, answer, turns]")
    kinds = [s.kind for s in out]
    if len(set(kinds)) != len(kinds):
        raise SpecError("PrefixSpec", "workloads", kinds, "each kind at most once")
    return tuple(out)


@dataclass(frozen=True)
class PrefixSpec:
    """The sweep and the engines that serve it.

    ``active``: numbers of concurrently active conversations (the sweep); ``max_in_flight``: requests the server
    runs at once (a wave); ``trials``: paired repetitions (fresh text each, the same for both dtypes);
    ``kv_cache_gib``: the KV budget of every engine in GiB (the same bytes for both dtypes: required, the
    prediction needs it); ``correctness_prompts``: conversations checked hit vs cold per dtype (0: none);
    ``hold_tolerance``: a cell "holds" while its measured hit rate is within this many percentage points of the
    unbounded-cache prediction.
    """

    model: str
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    workloads: tuple[Shape, ...] = (
        Shape("chat", 0, 0, 96, 16, 3),
        Shape("system", 384, 0, 64, 16, 3),
        Shape("json", 192, 96, 32, 16, 3),
    )
    active: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_in_flight: int = 4
    trials: int = 3
    kv_cache_gib: float = 0.0234375
    prompt_source: PromptSource = "text"
    correctness_prompts: int = 4
    hold_tolerance: float = 0.25
    warmup: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    enforce_eager: bool = True
    load_format: LoadFormat = "auto"
    skip_tokenizer_init: bool = False
    tensor_parallel_size: int = 1
    attention_backend: str | None = None
    concurrent_engines: bool = True
    seed: int = 0
    timeout_s: float = 3600.0
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        obj = "PrefixSpec"
        if not isinstance(self.model, str) or not self.model.strip():
            raise SpecError(obj, "model", self.model, "a model folder, a config.json's folder, or a hub id")
        if (
            not isinstance(self.kv_dtypes, (list, tuple))
            or not self.kv_dtypes
            or len(set(self.kv_dtypes)) != len(self.kv_dtypes)
        ):
            raise SpecError(
                obj, "kv_dtypes", self.kv_dtypes, "a non-empty list of distinct KV dtypes, the baseline first"
            )
        for d in self.kv_dtypes:
            check_choice(obj, "kv_dtypes", d, KVDtype)
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        object.__setattr__(self, "workloads", parse_workloads(self.workloads))
        if not isinstance(self.active, (list, tuple)) or not self.active:
            raise SpecError(obj, "active", self.active, "a non-empty list of integers in [1, 100000]")
        for n in self.active:
            check_int(obj, "active", n, 1, 100_000)
        if len(set(self.active)) != len(self.active):
            raise SpecError(obj, "active", self.active, "distinct values")
        object.__setattr__(self, "active", tuple(sorted(int(n) for n in self.active)))
        check_int(obj, "max_in_flight", self.max_in_flight, 1, 65536)
        check_int(obj, "trials", self.trials, 2, 1000)
        check_float(obj, "kv_cache_gib", self.kv_cache_gib, 0.0, 4096.0, lo_open=True)
        check_choice(obj, "prompt_source", self.prompt_source, PromptSource)
        check_int(obj, "correctness_prompts", self.correctness_prompts, 0, 1000)
        check_float(obj, "hold_tolerance", self.hold_tolerance, 0.0, 100.0)
        check_int(obj, "warmup", self.warmup, 0, 100)
        if self.block_size is not None:
            check_choice(obj, "block_size", self.block_size, BLOCK_SIZES)
        check_bool(obj, "concurrent_engines", self.concurrent_engines)
        check_float(obj, "timeout_s", self.timeout_s, 0.0, 86400.0, lo_open=True)
        if not isinstance(self.engine_args, dict) or not all(isinstance(k, str) for k in self.engine_args):
            raise SpecError(obj, "engine_args", self.engine_args, "a dict of vllm.LLM keyword arguments")
        if not isinstance(self.env, dict):
            raise SpecError(obj, "env", self.env, "a dict of environment variables for the engine workers")
        for d in self.kv_dtypes:  # the engine fields are checked by EngineSpec itself
            self.engine_spec(d)
        limit = self.max_model_len or kvmath.load_layout(self.engine_spec(self.kv_dtypes[0]).model).config.get(
            "max_position_embeddings"
        )
        for s in self.workloads:
            if limit and s.prompt_len(s.turns - 1) + s.answer > limit:
                raise SpecError(
                    obj,
                    "workloads",
                    [s.kind, s.shared, s.private, s.user, s.answer, s.turns],
                    f"conversations of at most max_model_len = {limit} tokens "
                    f"(this one ends at {s.prompt_len(s.turns - 1) + s.answer})",
                )
        bs = self.effective_block_size()
        for d in self.kv_dtypes:
            usable = self.num_blocks(d) - 1
            for s in self.workloads:
                shared_full, own, partial = conversation_blocks(s, bs)
                need = shared_full + self.max_in_flight * (own + partial)
                if need > usable:
                    raise SpecError(
                        obj,
                        "kv_cache_gib",
                        self.kv_cache_gib,
                        f"a budget whose {usable} usable {d} blocks of {bs} tokens hold max_in_flight = "
                        f"{self.max_in_flight} final turns of {s.kind} ({need} blocks): raise it or lower "
                        "max_in_flight",
                    )
            if limit and math.ceil(limit / bs) > usable:  # vLLM refuses to start an engine that cannot hold one
                raise SpecError(  # sequence of max_model_len tokens
                    obj,
                    "max_model_len",
                    self.max_model_len,
                    f"at most {usable * bs} tokens: the {usable} usable {d} blocks of {bs} tokens in "
                    f"kv_cache_gib = {self.kv_cache_gib} (None means the model's {limit})",
                )

    # ---- derived
    def effective_block_size(self) -> int:
        """The block size the engines will use: as given, else vLLM's platform default (16 with an NVIDIA GPU,
        found through NVML without touching CUDA; 128 on CPU). The engines report theirs: the summary compares."""
        if self.block_size:
            return self.block_size
        from fp8lab.devices import gpu_facts

        return 16 if gpu_facts() else CPU_DEFAULT_BLOCK

    def num_blocks(self, kv_dtype: str) -> int:
        """Predicted KV blocks of the engine (``kvmath.predict_num_blocks``; vLLM also keeps one null block)."""
        lay = kvmath.load_layout(self.engine_spec(kv_dtype).model)
        return kvmath.predict_num_blocks(
            lay,
            int(self.kv_cache_gib * 2**30),
            self.effective_block_size(),
            kv_dtype,
            self.tensor_parallel_size,
            hybrid_kv_cache_manager=False,
        )

    def engine_spec(self, kv_dtype: str) -> EngineSpec:
        return EngineSpec(
            model=self.model,
            kv_cache_dtype=kv_dtype,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_gib=float(self.kv_cache_gib),
            max_num_seqs=self.max_in_flight,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
            load_format=self.load_format,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
            enable_prefix_caching=True,
            skip_tokenizer_init=self.skip_tokenizer_init,
            attention_backend=self.attention_backend,
            timeout_s=self.timeout_s,
        )

    def workload(self, kind: str) -> Shape:
        for s in self.workloads:
            if s.kind == kind:
                return s
        raise SpecError("PrefixSpec", "workloads", kind, "one of " + " | ".join(s.kind for s in self.workloads))

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> PrefixSpec:
        """From a notebook's UPPER_CASE parameters (unknown names are ignored; missing ones take defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k.lower(): v for k, v in params.items() if k.lower() in names}
        if "TP" in params:
            kw["tensor_parallel_size"] = params["TP"]
        if isinstance(kw.get("kv_cache_gib"), int) and not isinstance(kw.get("kv_cache_gib"), bool):
            kw["kv_cache_gib"] = float(kw["kv_cache_gib"])
        return cls(**kw)

    def descriptor(self) -> dict[str, Any]:
        """What determines the outcome (hashed to name the run): the spec, the protocol, and the vLLM and torch
        versions and engine-side code (:func:`fp8lab.results.run_versions`)."""
        from fp8lab.results import run_versions

        d = dataclasses.asdict(self)
        d.pop("timeout_s")
        return {"study": STUDY, "protocol": PROTOCOL, **run_versions(), "spec": d}


# ====================================================================================== prompts
def _text_ids(spec: PrefixSpec, length: int, offset: int) -> list[int]:
    from fp8lab.longdocs import document_ids

    return list(document_ids(spec.model, length, offset)) if length else []


def _random_ids(spec: PrefixSpec, length: int, seed: int) -> list[int]:
    from fp8lab.longdocs import random_ids
    from fp8lab.workloads import model_vocab_size

    return list(random_ids(model_vocab_size(spec.engine_spec("auto").model), length, seed)) if length else []


def _exact(ids: list[int], length: int, filler: list[int]) -> list[int]:
    out = (ids + filler)[:length]
    return out + filler[: length - len(out)] if len(out) < length else out


def _template_text(seed: int) -> str:
    """A JSON-schema-like extraction template (instructions + schema), seeded."""
    from fp8lab.longdocs import json_object

    rng = random.Random(seed)
    example = json.loads(json_object(rng))
    props = {
        k: {
            "type": type(v)
            .__name__.replace("str", "string")
            .replace("int", "integer")
            .replace("float", "number")
            .replace("bool", "boolean")
            .replace("list", "array")
            .replace("dict", "object")
        }
        for k, v in example.items()
    }
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": props,
        "required": sorted(props),
    }
    return (
        "You extract records. Answer with one JSON object that validates against this schema, nothing else.\n"
        + json.dumps(schema, indent=2)
        + "\nExample:\n"
        + json.dumps(example, indent=2)
        + "\n"
    )


def conversation_pool(spec: PrefixSpec, shape: Shape, trial: int, n: int) -> list[dict[str, Any]]:
    """The first ``n`` conversations of a workload in a trial: ``shared`` (the same for every conversation and
    trial), ``private`` and ``users`` (one message per turn), token ids. ``trial = spec.trials`` (one past the
    last) gives the correctness check's conversations. Deterministic in (spec, shape, trial, index)."""
    k = ("chat", "system", "json").index(shape.kind)
    per_conv = shape.private + shape.turns * shape.user
    base_off = 50_000 * k + 7_919 * trial * max(n, 1)
    if spec.prompt_source == "random":
        shared = _random_ids(spec, shape.shared, spec.seed * 1_000 + k)
        pool = []
        for i in range(n):
            s = spec.seed * 1_000_003 + k * 100_003 + trial * 10_007 + i
            ids = _random_ids(spec, per_conv, s)
            pool.append(
                {
                    "shared": shared,
                    "private": ids[: shape.private],
                    "users": [
                        ids[shape.private + t * shape.user : shape.private + (t + 1) * shape.user]
                        for t in range(shape.turns)
                    ],
                }
            )
        return pool
    from fp8lab.longdocs import json_object
    from fp8lab.workloads import _tokenizer

    filler = _text_ids(spec, max(shape.shared, shape.private, 1), 400_000 + 1_000 * k)
    tok = _tokenizer(spec.engine_spec("auto").model)
    if shape.kind == "json":
        shared = _exact(tok.encode(_template_text(spec.seed), add_special_tokens=False), shape.shared, filler)
    else:
        shared = _text_ids(spec, shape.shared, 300_000 + 1_000 * k)
    pool = []
    for i in range(n):
        off = base_off + i * (per_conv + 31)
        if shape.kind == "json":
            rng = random.Random(spec.seed * 1_000_003 + trial * 10_007 + i)
            rec = "Record:\n" + "\n".join(json_object(rng) for _ in range(8))
            private = _exact(tok.encode(rec, add_special_tokens=False), shape.private, filler)
            ask = [
                _exact(
                    tok.encode(f"\nExtract record {j + 1} as JSON.\n", add_special_tokens=False),
                    shape.user,
                    _text_ids(spec, shape.user, off + j * shape.user),
                )
                for j in range(shape.turns)
            ]
        else:
            private = _text_ids(spec, shape.private, off)
            ask = [_text_ids(spec, shape.user, off + shape.private + j * shape.user) for j in range(shape.turns)]
        pool.append({"shared": shared, "private": private, "users": ask})
    return pool


# ====================================================================================== arithmetic
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


# ====================================================================================== run
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return rows


@dataclass
class PrefixRun:
    """A stored run: its descriptor, per-turn rows, correctness rows, engine facts."""

    run_dir: Path
    descriptor: dict[str, Any]
    rows: Any
    correctness: Any
    engines: dict[str, dict[str, Any]]
    provenance: dict[str, Any]
    complete: bool

    @property
    def spec(self) -> PrefixSpec:
        return PrefixSpec(**self.descriptor["spec"])

    def ok_dtypes(self) -> list[str]:
        return [d for d in self.spec.kv_dtypes if self.engines.get(d, {}).get("status") == "ok"]

    def missing_cells(self) -> list[tuple[str, int, int, str]]:
        s = self.spec
        have = set()
        if len(self.rows):
            for k, g in self.rows.groupby(["workload", "n_active", "trial", "kv_dtype"]):
                if g.turn.nunique() == s.workload(k[0]).turns:
                    have.add(tuple(k))
        ok = self.ok_dtypes() or list(s.kv_dtypes)
        return [
            (w.kind, n, t, d)
            for t in range(s.trials)
            for w in s.workloads
            for n in s.active
            for d in ok
            if (w.kind, n, t, d) not in have
        ]


def load(run_dir: Path) -> PrefixRun:
    import pandas as pd

    from fp8lab.results import note_run

    desc = json.loads((run_dir / "spec.json").read_text())
    eng = json.loads((run_dir / "engines.json").read_text()) if (run_dir / "engines.json").exists() else {}
    done = (run_dir / "complete.json").exists()
    if eng.get("provenance"):  # the report names the device and vLLM these rows were measured with
        note_run(run_dir, eng["provenance"], "complete" if done else "partial")
    return PrefixRun(
        run_dir,
        desc,
        pd.DataFrame(_read_jsonl(run_dir / "rows.jsonl")),
        pd.DataFrame(_read_jsonl(run_dir / "correctness.jsonl")),
        eng.get("engines", {}),
        eng.get("provenance", {}),
        (run_dir / "complete.json").exists(),
    )


def run_prefix(spec: PrefixSpec, root: Path | None = None, force: bool = False) -> PrefixRun:
    """Measure (or load, or resume) ``spec`` in the results store ``root`` (default: runs/). One spawned worker
    holds one engine per dtype for the whole sweep. An engine that fails to start is recorded (status and root
    cause) and the others go on; the run is complete when every cell of every engine that started is stored."""
    from fp8lab import results

    desc = spec.descriptor()
    rd = (root or runs_dir()) / STUDY / spec_hash(desc)
    if results.store_only():  # re-rendering from committed stores: load what is there, never start a worker
        kept = rd if (rd / "spec.json").exists() else results.stored_elsewhere(rd, desc)
        if kept is not None:
            return load(kept)
        import pandas as pd

        err = f"not in the results store ({rd}); ${results.STORE_ONLY_ENV} is set, so no engine was started"
        return PrefixRun(
            rd,
            desc,
            pd.DataFrame(),
            pd.DataFrame(),
            {d: {"status": "error", "error": err} for d in spec.kv_dtypes},
            {},
            False,
        )
    for d in spec.kv_dtypes:  # this machine's paths, before the worker starts (a stored spec is not checked)
        spec.engine_spec(d).check_paths()
    if force and rd.exists():
        import shutil

        shutil.rmtree(rd)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "spec.json").write_text(json.dumps(desc, indent=2, sort_keys=True, default=str))
    if (rd / "complete.json").exists():
        return load(rd)
    from fp8lab import prefix_worker
    from fp8lab.engine import _kill_group, _reap_descendants, worker_context

    t0 = time.perf_counter()
    proc = worker_context().Process(
        target=prefix_worker.entry,
        name="fp8lab-prefix",
        args=(
            str(rd / "worker.log"),
            dict(spec.env),
            json.loads(json.dumps(dataclasses.asdict(spec), default=str)),
            str(rd),
        ),
    )
    proc.start()
    proc.join(timeout=spec.timeout_s)
    if proc.is_alive():
        _reap_descendants(proc.pid)
    _kill_group(proc.pid)
    _reap_descendants(proc.pid)
    proc.join(timeout=10)
    run = load(rd)
    # a dtype this device could not run natively leaves the run incomplete, so a device that can fills it in
    refused = any(e.get("status") == "unsupported" for e in run.engines.values())
    failed_all = bool(run.engines) and not run.ok_dtypes() and not refused
    corr_done = spec.correctness_prompts == 0 or (
        len(run.correctness) and set(run.ok_dtypes()) <= set(run.correctness.kv_dtype)
    )
    if failed_all or (run.engines and not refused and not run.missing_cells() and corr_done):
        (rd / "complete.json").write_text(json.dumps({"wall_s": time.perf_counter() - t0}))
        run.complete = True
    return run


# ====================================================================================== analysis
def cell_table(rows: Any, block_size: int | None = None) -> Any:
    """One row per (workload, n_active, trial, kv_dtype) from per-turn rows: ``queries, hits`` (tokens, summed over
    turns), ``hit_rate = hits / queries``, ``cached_tokens`` (per-request ``num_cached_tokens`` summed),
    ``counter_turns`` / ``counter_turns_complete`` (turns, and turns whose scheduler counters saw every prompt
    token), ``ttft_mean_ms`` (request-weighted over every turn), ``ttft_followup_ms`` (turns after the first),
    ``output_tok_s`` (output tokens / wall seconds of all waves), ``preemptions``, ``kv_usage_max``.

    A turn's ``queries, hits`` are vLLM's scheduler counters when they are complete for it (``queries`` equals the
    prompt tokens sent), else the per-request figures vLLM returned with each output (the prompt tokens and
    ``num_cached_tokens``). vLLM 0.26's ``LLMEngine.step`` records a step's scheduler stats only when the step
    returned outputs: on the H200 with the 6-layer model (eager, steps of milliseconds) 62 of 216 turns lost some
    of their counts, while every turn whose counters were complete had ``hits == num_cached_tokens`` exactly (532
    of 532 turns on the H200, both models)."""
    import pandas as pd

    if rows is None or not len(rows):
        return pd.DataFrame()
    out = []
    rows = rows.copy()
    sent = rows.prompt_tokens if "prompt_tokens" in rows else rows.queries
    rows["_complete"] = rows.queries == sent
    rows["_q"] = sent
    rows["_h"] = rows.hits.where(rows._complete, rows.cached_tokens)
    for (w, n, t, d), g in rows.groupby(["workload", "n_active", "trial", "kv_dtype"], sort=True):
        q, h = float(g._q.sum()), float(g._h.sum())
        fu = g[g.turn > 0]
        out.append(
            {
                "workload": w,
                "n_active": int(n),
                "trial": int(t),
                "kv_dtype": d,
                "queries": int(q),
                "hits": int(h),
                "hit_rate": h / q if q else math.nan,
                "cached_tokens": int(g.cached_tokens.sum()),
                "counter_turns": len(g),
                "counter_turns_complete": int(g._complete.sum()),
                "ttft_mean_ms": float((g.ttft_mean_s * g.requests).sum() / g.requests.sum() * 1e3),
                "ttft_followup_ms": float((fu.ttft_mean_s * fu.requests).sum() / fu.requests.sum() * 1e3)
                if len(fu)
                else math.nan,
                "output_tok_s": float(g.output_tokens.sum() / g.wall_s.sum()) if g.wall_s.sum() > 0 else math.nan,
                "preemptions": int(g.preemptions.sum()),
                "kv_usage_max": float(g.kv_usage_max.max()),
            }
        )
    return pd.DataFrame(out)


def sweep_table(cells: Any, predicted: Any = None, base: str = "auto", other: str = "fp8") -> Any:
    """Per (workload, n_active): each dtype's mean hit rate over trials (and predicted, when ``predicted`` is the
    :func:`plan` table); ``dhit_pp`` = other - base hit rate in percentage points with a paired t interval over
    trials; ``ttft_ratio`` = other / base mean TTFT (geometric mean of per-trial ratios, t interval on the logs,
    :func:`fp8lab.stats.paired_ratio`) with ``ttft_detectable_pct`` (its half-width) and ``ttft_noise_pct`` (the
    base's same-config noise, :func:`fp8lab.stats.self_noise`); ``tput_ratio`` likewise for output tokens/s."""
    import pandas as pd

    if cells is None or not len(cells):
        return pd.DataFrame()
    out = []
    for (w, n), g in cells.groupby(["workload", "n_active"], sort=True):
        row: dict[str, Any] = {"workload": w, "n_active": int(n)}
        for d, gd in g.groupby("kv_dtype"):
            row[f"{d}_hit_rate"] = float(gd.hit_rate.mean())
            row[f"{d}_ttft_ms"] = float(gd.ttft_mean_ms.mean())
            row[f"{d}_preemptions"] = int(gd.preemptions.sum())
            row[f"{d}_kv_usage_max"] = float(gd.kv_usage_max.max())
            if predicted is not None and len(predicted):
                p = predicted[(predicted.workload == w) & (predicted.n_active == n) & (predicted.kv_dtype == d)]
                if len(p):
                    row[f"{d}_hit_rate_pred"] = float(p.hit_rate_pred.iloc[0])
                    row["hit_rate_unbounded"] = float(p.hit_rate_unbounded.iloc[0])
        if {base, other} <= set(g.kv_dtype):
            w_ = g.pivot_table(index="trial", columns="kv_dtype", values=["hit_rate", "ttft_mean_ms", "output_tok_s"])
            w_ = w_.dropna()
            dh = stats.t_interval((w_["hit_rate"][other] - w_["hit_rate"][base]) * 100)
            tr = stats.paired_ratio(w_["ttft_mean_ms"][base], w_["ttft_mean_ms"][other])
            pr = stats.paired_ratio(w_["output_tok_s"][base], w_["output_tok_s"][other])
            row.update(
                {
                    "dhit_pp": dh.estimate,
                    "dhit_pp_ci_low": dh.lo,
                    "dhit_pp_ci_high": dh.hi,
                    "ttft_ratio": tr.estimate,
                    "ttft_ratio_ci_low": tr.lo,
                    "ttft_ratio_ci_high": tr.hi,
                    "ttft_detectable_pct": stats.detectable_pct(tr),
                    "ttft_noise_pct": stats.self_noise(w_["ttft_mean_ms"][base]),
                    "tput_ratio": pr.estimate,
                    "tput_ratio_ci_low": pr.lo,
                    "tput_ratio_ci_high": pr.hi,
                    "n_pairs": tr.n,
                }
            )
        out.append(row)
    return pd.DataFrame(out)


def measured_knee(sweep: Any, workload: str, kv_dtype: str, tolerance_pp: float) -> dict[str, Any]:
    """Where a dtype's measured hit rate starts to fall: ``last_held`` = the largest swept ``N`` before the first
    ``N`` whose mean hit rate is more than ``tolerance_pp`` percentage points below the unbounded-cache prediction
    (``first_fallen``; ``None`` when no swept ``N`` falls). The knee lies in ``[last_held, first_fallen)``."""
    g = sweep[sweep.workload == workload].sort_values("n_active")
    col = f"{kv_dtype}_hit_rate"
    if col not in g or "hit_rate_unbounded" not in g:
        return {"last_held": None, "first_fallen": None}
    last, first = None, None
    for r in g.itertuples():
        hr, ideal = getattr(r, col), r.hit_rate_unbounded
        if not math.isfinite(hr):
            continue
        if (ideal - hr) * 100 > tolerance_pp:
            first = int(r.n_active)
            break
        last = int(r.n_active)
    return {"last_held": last, "first_fallen": first}


def knee_table(run_or_spec: Any, sweep: Any) -> Any:
    """Per workload and dtype: the predicted knee (formula, replay) beside the measured interval."""
    import pandas as pd

    spec = run_or_spec.spec if isinstance(run_or_spec, PrefixRun) else run_or_spec
    bs = spec.effective_block_size()
    rows = []
    for s in spec.workloads:
        for d in spec.kv_dtypes:
            nb = spec.num_blocks(d)
            m = (
                measured_knee(sweep, s.kind, d, spec.hold_tolerance)
                if len(sweep)
                else {"last_held": None, "first_fallen": None}
            )
            ks = knee_simulated(
                s,
                nb,
                bs,
                spec.max_in_flight,
                n_max=max(4 * max(spec.active), knee_formula(s, nb, bs, spec.max_in_flight) + 2),
            )
            agree = (
                m["first_fallen"] is not None
                and m["last_held"] is not None
                and m["last_held"] <= ks < m["first_fallen"]
            ) or (m["first_fallen"] is None and m["last_held"] is not None and ks >= m["last_held"])
            rows.append(
                {
                    "workload": s.kind,
                    "kv_dtype": d,
                    "num_blocks": nb,
                    "knee_formula": knee_formula(s, nb, bs, spec.max_in_flight),
                    "knee_simulated": ks,
                    "measured_last_held": m["last_held"],
                    "measured_first_fallen": m["first_fallen"],
                    "prediction_in_interval": bool(agree) if m["last_held"] is not None else None,
                }
            )
    return pd.DataFrame(rows)


def correctness_table(corr: Any) -> Any:
    """Per dtype and kind (``hit_decode``: the prefix written by an earlier turn's prefill and decode;
    ``hit_repeat``: the same prompt again): prompts checked, the fraction with identical greedy tokens, the first
    divergence seen, the largest ``|logprob difference|`` over positions before any divergence, the cached tokens."""
    import pandas as pd

    if corr is None or not len(corr):
        return pd.DataFrame()
    out = []
    for (d, k), g in corr.groupby(["kv_dtype", "kind"], sort=True):
        div = g.first_diff.dropna()
        out.append(
            {
                "kv_dtype": d,
                "kind": k,
                "prompts": len(g),
                "tokens_equal": float(g.tokens_equal.mean()),
                "first_divergence": int(div.min()) if len(div) else None,
                "max_abs_dlogprob": float(g.max_abs_dlogprob.max()),
                "mean_abs_dlogprob": float(g.mean_abs_dlogprob.mean()),
                "cached_tokens_min": int(g.cached_tokens.min()),
                "cold_cached_max": int(g.cold_cached.max()),
            }
        )
    return pd.DataFrame(out)


def compare_outputs(
    a_tokens: Sequence[int], a_lp: Sequence[float], b_tokens: Sequence[int], b_lp: Sequence[float]
) -> dict[str, Any]:
    """Greedy outputs A (hit) vs B (cold): ``tokens_equal``, ``first_diff`` (index of the first differing token or
    ``None``), ``max_abs_dlogprob`` / ``mean_abs_dlogprob`` of the chosen token's logprob over the positions up to
    and including the first difference (after it the contexts differ)."""
    n = min(len(a_tokens), len(b_tokens))
    first = next((i for i in range(n) if a_tokens[i] != b_tokens[i]), None)
    if first is None and len(a_tokens) != len(b_tokens):
        first = n
    upto = n if first is None else min(first + 1, n)
    d = [abs(float(a_lp[i]) - float(b_lp[i])) for i in range(upto)]
    return {
        "tokens_equal": first is None,
        "first_diff": first,
        "max_abs_dlogprob": max(d) if d else 0.0,
        "mean_abs_dlogprob": sum(d) / len(d) if d else 0.0,
    }


# ====================================================================================== summary, verdict
def summary(run: PrefixRun, base: str = "auto", other: str = "fp8") -> dict[str, Any]:
    """The study's key numbers (what the notebook records and the audit reads)."""
    spec = run.spec
    pred = plan(spec)
    cells = cell_table(run.rows)
    sweep = sweep_table(cells, pred, base, other)
    knees = knee_table(run, sweep)
    corr = correctness_table(run.correctness)
    prov = run.provenance
    ok = {d: run.engines.get(d, {}).get("status", "not started") for d in spec.kv_dtypes}
    s: dict[str, Any] = {
        "device": prov.get("device"),
        "vllm_version": prov.get("vllm"),
        "fp8lab_commit": prov.get("commit"),
        "model": Path(spec.model).name,
        "load_format": spec.load_format,
        "prompt_source": spec.prompt_source,
        "kv_cache_gib": spec.kv_cache_gib,
        "block_size": spec.effective_block_size(),
        "trials": spec.trials,
        "max_in_flight": spec.max_in_flight,
        "active": list(spec.active),
        "complete": run.complete,
        "engines_status": ok,
        "engine_errors": {d: e.get("error") for d, e in run.engines.items() if e.get("status") != "ok"},
        "num_blocks": {d: e.get("num_blocks") for d, e in run.engines.items() if e.get("status") == "ok"},
        "num_blocks_formula": {d: spec.num_blocks(d) for d in spec.kv_dtypes},
        "knees": _records(knees),
        "sweep": _records(sweep),
        "correctness": _records(corr),
        "counter_turns": int(cells.counter_turns.sum()) if len(cells) else 0,
        "counter_turns_complete": int(cells.counter_turns_complete.sum()) if len(cells) else 0,
    }
    s["num_blocks_exact"] = bool(s["num_blocks"]) and all(
        s["num_blocks"][d] == s["num_blocks_formula"][d] for d in s["num_blocks"]
    )
    if len(sweep) and "ttft_detectable_pct" in sweep:
        hw = sweep.ttft_detectable_pct.dropna()
        s["ttft_min_detectable_pct"] = float(hw.median()) if len(hw) else None
        dh = ((sweep.dhit_pp_ci_high - sweep.dhit_pp_ci_low) / 2).dropna()
        s["dhit_min_detectable_pp"] = float(dh.median()) if len(dh) else None
    # the claim's numbers: hit rates where both hold (inside auto's knee) and where fp8's extra hits show
    for w in spec.workloads:
        g = sweep[sweep.workload == w.kind] if len(sweep) else sweep
        if not len(g) or f"{base}_hit_rate" not in g:
            continue
        s[f"{w.kind}.max_abs_dhit_pp_inside"] = None
        s[f"{w.kind}.gain"] = None
        kb = knees[(knees.workload == w.kind) & (knees.kv_dtype == base)]
        kb_last = kb.measured_last_held.iloc[0] if len(kb) else None
        if "dhit_pp" in g:
            inside = g[g.n_active <= (kb_last if kb_last is not None and not _isnan(kb_last) else 0)]
            if len(inside):
                s[f"{w.kind}.max_abs_dhit_pp_inside"] = float(inside.dhit_pp.abs().max())
            beyond = g[(g.n_active > (kb_last if kb_last is not None and not _isnan(kb_last) else 0))]
            beyond = beyond.dropna(subset=["dhit_pp"])
            if len(beyond):
                best = beyond.loc[beyond.dhit_pp.idxmax()]
                s[f"{w.kind}.gain"] = {
                    k: (None if _isnan(v) else float(v))
                    for k, v in best.items()
                    if k
                    in (
                        "n_active",
                        "dhit_pp",
                        "dhit_pp_ci_low",
                        "dhit_pp_ci_high",
                        f"{base}_hit_rate",
                        f"{other}_hit_rate",
                        "ttft_ratio",
                        "ttft_ratio_ci_low",
                        "ttft_ratio_ci_high",
                        "tput_ratio",
                    )
                }
    s["claim_verdict"] = claim_verdict(s, base, other)
    s["claim_evidence"] = claim_evidence(s, base, other)
    return s


def _kv_size(gib: float) -> str:
    """A KV budget for prose: GiB from 1 GiB up, MiB below (``0.005126953125`` -> ``5.25 MiB``)."""
    return f"{gib:g} GiB" if gib >= 1 else f"{gib * 1024:.3g} MiB"


def claim_evidence(s: dict[str, Any], base: str = "auto", other: str = "fp8") -> str:
    """One line for the claims audit: per workload, the largest |hit-rate difference| inside auto's measured knee
    and the largest fp8 gain beyond it, with the setting."""
    parts = []
    for w in ("chat", "system", "json"):
        inside, gain = s.get(f"{w}.max_abs_dhit_pp_inside"), s.get(f"{w}.gain")
        if inside is None and not gain:
            continue
        txt = f"{w}: |{other} - {base}| <= {inside:.1f} pp while {base} holds" if inside is not None else f"{w}:"
        if gain:
            txt += (
                f"; beyond {base}'s knee, N={gain['n_active']:.0f}: {gain[f'{base}_hit_rate']:.1%} -> "
                f"{gain[f'{other}_hit_rate']:.1%}"
            )
        parts.append(txt)
    return (f"{s['model']} on {s['device']}, {_kv_size(s['kv_cache_gib'])} KV: " + "; ".join(parts)) if parts else ""


def _records(df: Any) -> list[dict[str, Any]]:
    """A table as JSON-able records: NaN as None, numpy scalars as Python numbers."""
    out = []
    for r in df.to_dict("records") if len(df) else []:
        out.append({k: (None if _isnan(v) else v.item() if hasattr(v, "item") else v) for k, v in r.items()})
    return out


def _isnan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def claim_verdict(s: dict[str, Any], base: str = "auto", other: str = "fp8") -> str:
    """The field report's claim ("FP8 leaves the hit rate unchanged") judged on this run: ``refuted`` when fp8's hit
    rate exceeds auto's beyond the paired interval at some swept working set of some workload, ``consistent`` when
    every difference's interval lies within 1 percentage point, else ``inconclusive``; ``not measured`` without
    both dtypes. On the CPU analogue this is never decisive for a GPU claim: the caller labels the setting."""
    if s["engines_status"].get(base) != "ok" or s["engines_status"].get(other) != "ok":
        return "not measured"
    sweep = s["sweep"]
    if not sweep:
        return "not measured"
    gains = [
        r
        for r in sweep
        if r.get("dhit_pp_ci_low") is not None and not _isnan(r.get("dhit_pp_ci_low")) and r["dhit_pp_ci_low"] > 0
    ]
    exact_gain = [r for r in sweep if _isnan(r.get("dhit_pp_ci_low")) and (r.get("dhit_pp") or 0) > 1.0]
    if gains or exact_gain:
        return "refuted"
    within = all(
        (not _isnan(r.get("dhit_pp_ci_low")) and r["dhit_pp_ci_low"] >= -1 and r["dhit_pp_ci_high"] <= 1)
        or (_isnan(r.get("dhit_pp_ci_low")) and abs(r.get("dhit_pp") or 0) <= 1)
        for r in sweep
    )
    return "consistent" if within else "inconclusive"


def verdict(s: dict[str, Any], base: str = "auto", other: str = "fp8") -> list[str]:
    """Headline bullets from a :func:`summary`."""
    out = []
    setting = (
        f"{s['model']} on {s['device']} (vLLM {s['vllm_version']}, {_kv_size(s['kv_cache_gib'])} of KV per engine, "
        f"blocks of {s['block_size']} tokens, {s['max_in_flight']} requests in flight, {s['trials']} paired "
        f"trials, {s['prompt_source']} prompts)"
    )
    if s["engine_errors"]:
        out.append(
            "Not measured: "
            + "; ".join(f"`{d}` ({e})" for d, e in s["engine_errors"].items())
            + ". What follows is the other dtype alone; the auto-vs-fp8 comparison and the claim are left open."
        )
    out.append(
        f"Setting: {setting}. KV blocks: "
        + ", ".join(
            f"{d} {s['num_blocks'].get(d, 'n/a')} (formula {s['num_blocks_formula'][d]})"
            for d in s["num_blocks_formula"]
        )
        + "."
    )
    for k in s["knees"]:
        meas = (
            "not measured"
            if k["measured_last_held"] is None and k["measured_first_fallen"] is None
            else (
                f"holds to N={k['measured_last_held']:.0f}"
                if k["measured_last_held"] is not None
                else "holds at no swept N"
            )
            + ", falls from "
            + (f"N={k['measured_first_fallen']:.0f}" if k["measured_first_fallen"] else "no swept N")
        )
        out.append(
            f"{k['workload']} / {k['kv_dtype']}: predicted knee N={k['knee_simulated']} (replay; formula "
            f"{k['knee_formula']}); measured: {meas}"
            + (
                ""
                if k["prediction_in_interval"] is None
                else (
                    " (prediction inside the measured interval)"
                    if k["prediction_in_interval"]
                    else " (prediction OUTSIDE the measured interval)"
                )
            )
            + "."
        )
    for key, g in ((k, v) for k, v in s.items() if k.endswith(".gain") and v):
        w = key.split(".")[0]
        ci = (
            f" [{g['dhit_pp_ci_low']:+.1f}, {g['dhit_pp_ci_high']:+.1f}]" if g.get("dhit_pp_ci_low") is not None else ""
        )
        tt = (
            f"; TTFT {other}/{base} {g['ttft_ratio']:.3f} [{g['ttft_ratio_ci_low']:.3f}, {g['ttft_ratio_ci_high']:.3f}]"
            if g.get("ttft_ratio_ci_low") is not None
            else ""
        )
        out.append(
            f"{w}: largest {other} gain beyond {base}'s knee at N={g['n_active']:.0f}: hit rate "
            f"{g[f'{base}_hit_rate']:.1%} -> {g[f'{other}_hit_rate']:.1%} ({g['dhit_pp']:+.1f} pp{ci}){tt}."
        )
    n_turns, n_full = s.get("counter_turns", 0), s.get("counter_turns_complete", 0)
    if n_full < n_turns:
        out.append(
            f"vLLM's prefix-cache counters missed steps in {n_turns - n_full} of {n_turns} turns (the likely cause: "
            "vLLM 0.26 records a step's scheduler stats only when the step returned outputs); those turns' hits are "
            "the per-request "
            "`num_cached_tokens` vLLM returned, which equal the counters wherever the counters are complete."
        )
    if s.get("ttft_min_detectable_pct") is not None:
        out.append(
            f"The smallest TTFT change these trials resolve is about {s['ttft_min_detectable_pct']:.1f}% "
            "(median 95% CI half-width of the paired ratio)"
            + (
                f"; for the hit rate, {s['dhit_min_detectable_pp']:.2f} percentage points (0 when every trial hit "
                "exactly alike: hit counts depend on token counts, not on the text)."
                if s.get("dhit_min_detectable_pp") is not None
                else "."
            )
        )
    for c in s["correctness"]:
        same = c["tokens_equal"] == 1.0 and c["max_abs_dlogprob"] == 0.0
        out.append(
            f"Correctness {c['kv_dtype']} ({c['kind']}, {c['prompts']} prompts, >= {c['cached_tokens_min']} "
            f"cached tokens): "
            + (
                "hit and cold outputs identical (tokens and logprobs)."
                if same
                else f"{c['tokens_equal']:.0%} identical greedy sequences; the earliest divergence at output token "
                + (f"{c['first_divergence']:.0f}" if c.get("first_divergence") is not None else "n/a")
                + f" (0-based); the chosen tokens' logprobs up to it differ by at most {c['max_abs_dlogprob']:.3f} "
                "nats."
            )
        )
    v = s["claim_verdict"]
    out.append(
        f"Claim '{CLAIM['text']}': **{v}** on this setting"
        + (
            " (a CPU analogue: not evidence about the GPU claim)"
            if "cpu" in str(s.get("device", "")).lower() or s.get("device") in (None, "cpu")
            else ""
        )
        + "."
    )
    return out


__all__ = [
    "CLAIM",
    "BlockPool",
    "PrefixRun",
    "PrefixSpec",
    "Shape",
    "cell_table",
    "claim_verdict",
    "compare_outputs",
    "conversation_blocks",
    "conversation_pool",
    "correctness_table",
    "knee_formula",
    "knee_simulated",
    "knee_table",
    "load",
    "measured_knee",
    "parse_workloads",
    "plan",
    "run_prefix",
    "sim_hit_rate",
    "simulate",
    "summary",
    "sweep_table",
    "verdict",
]
