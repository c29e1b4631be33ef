"""Study 04: long context, ``auto`` vs ``fp8`` KV cache, on a ramp of context lengths up to 128K.

The field reports say FP8 KV cache is "the key to long context": bf16 runs out of memory where fp8
keeps going, FP8's gains grow with context length, block size 256 beats 16 at 128K, the real danger
is silent failure (no error, worse output) rather than OOM, and most "128K tests" are worthless
because they feed random tokens. This module measures each claim; the notebook
``notebooks/04_long_context_ramp_128k.ipynb`` only calls it.

What runs (one :class:`LongCtxPlan`; every engine through :func:`fp8lab.results.run_cached`, so a
finished run is loaded, a failed one is kept with its reason, and the study goes on):

- **Ramp** (one engine per kv dtype, ``max_model_len`` = the longest prompt + output): a warm-up, then
  for each length of the grid ``requests_per_length`` requests one at a time (``ramp-c1-L<L>``), then
  ``concurrency`` requests at once (``ramp-c<C>-L<L>``), streamed (the ``async`` driver), so TTFT,
  every inter-token gap, E2E, KV usage, device memory and preemptions are recorded per length.
  ``randtok-L<L>`` phases time random-token prompts beside real text at the same length.
- **Block-size sweep** at the longest lengths: one engine per (dtype, block size) other than the
  ramp's; a size the attention backend rejects is recorded as ``unsupported``.
- **Boundary probes** (start-only engines): the formula (:mod:`fp8lab.kvmath`) predicts the longest
  context each dtype holds, ``(num_blocks - 1) * block_size`` (vLLM keeps one block back as the null
  block: ``BlockPool.null_block``); one engine per dtype asks for one block more and must fail at start
  with vLLM's "larger than the available KV cache memory" error (status ``oom``), whose message states
  vLLM's own estimate of the maximum length: that is the measured boundary.
- **Quality along the context** (the shipped model, real weights; merged into the ramp engines when the
  ramp model is the quality model): teacher-forced scoring of whole documents with prompt logprobs
  (Study 03's measure, :func:`fp8lab.quality.topk_overlap` / :func:`fp8lab.quality.kl_topk`) binned by
  position, on real text and on random tokens; and passkey retrieval at several depths
  (Mohtashami & Jaggi, "Landmark Attention", arXiv:2305.16300, appendix: the task's wording).

Prompts (:mod:`fp8lab.longdocs`) are exact-length slices of one long document built from the held-out text (``data/text``):
documents concatenated with their paragraph structure, with generated code blocks and JSON objects
inserted every few paragraphs, as the field reports did. Dummy-weight models (no tokenizer) get
seeded random token ids for the performance part.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp8lab import kvmath
from fp8lab.longdocs import (  # noqa: F401  (re-exported: the study's inputs live in fp8lab.longdocs)
    PASSKEY_NEEDLE,
    PASSKEY_OUTPUT_TOKENS,
    PASSKEY_QUESTION,
    PASSKEY_TASK,
    GridKind,
    InsertKind,
    PasskeyItem,
    PromptSource,
    assemble_document,
    code_block,
    document_ids,
    insert_at_depth,
    json_object,
    length_grid,
    passkey_correct,
    passkey_items,
    random_ids,
)
from fp8lab.specs import (
    BLOCK_SIZES,
    EngineSpec,
    KVDtype,
    LoadFormat,
    Phase,
    Request,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_model_folder,
    resolve_model,
)

STUDY = "04_long_context"
BASELINE = "auto"

#: vLLM keeps one block of the pool back as the null block (``BlockPool.null_block``), so a pool of
#: ``num_blocks`` blocks holds ``num_blocks - 1`` blocks of sequences (also the denominator of vLLM's
#: ``kv_cache_usage_perc``: ``BlockPool.get_usage``).
NULL_BLOCKS = 1
#: vLLM's error when ``max_model_len`` does not fit (``kv_cache_utils._check_enough_kv_cache_memory``).
_ESTIMATE_RE = re.compile(r"estimated maximum model length is (\d+)")


# ============================================================================ the plan
def _tuple(v: Any) -> tuple:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


@dataclass(frozen=True)
class LongCtxPlan:
    """Everything Study 04 runs; checks itself before any engine starts.

    Performance: ``model`` (with ``load_format="dummy"`` a config folder with random weights: prompts
    become random token ids) on the ramp ``lengths`` (prompt tokens; build them with
    :func:`length_grid`), ``output_tokens`` generated per request, ``requests_per_length`` one at a time
    and ``concurrency`` at once (1: no concurrent ramp). Engine knobs: ``block_size`` (``None``: vLLM's
    default, 16 on GPU, 128 on CPU), ``max_num_batched_tokens`` (chunked-prefill budget per step),
    ``max_num_seqs``, ``kv_cache_gib`` (KV budget per engine; ``None``: vLLM sizes it from
    ``gpu_memory_utilization``). ``random_token_lengths``: lengths where a random-token prompt is timed
    beside real text. ``sweep_block_sizes`` x ``sweep_dtypes`` at ``sweep_lengths``: the block-size sweep.
    ``probe_boundary``: one start-only engine per dtype one block beyond the predicted longest context.

    Quality (``quality_model``: real weights and a tokenizer; ``None`` skips it): ``quality_docs``
    real-text and ``quality_random_docs`` random-token documents of ``quality_length`` tokens scored
    teacher-forced with ``top_k`` prompt logprobs; passkey prompts at ``passkey_lengths`` x
    ``passkey_depths`` x ``passkey_trials``. When the quality model is the ramp model (and has real
    weights), the quality phases run on the ramp engines (no extra engine start).
    """

    model: str
    lengths: tuple[int, ...]
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    output_tokens: int = 32
    requests_per_length: int = 1
    concurrency: int = 2
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    kv_cache_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = True
    load_format: LoadFormat = "auto"
    inserts: tuple[str, ...] = ("code", "json")
    insert_every: int = 6
    random_token_lengths: tuple[int, ...] = ()
    sweep_block_sizes: tuple[int, ...] = ()
    sweep_dtypes: tuple[str, ...] = ("auto", "fp8")
    sweep_lengths: tuple[int, ...] = ()
    probe_boundary: bool = True
    quality_model: str | None = None
    quality_kv_cache_gib: float | None = None
    quality_length: int | None = None
    quality_docs: int = 1
    quality_random_docs: int = 1
    top_k: int = 5
    position_bins: int = 16
    passkey_lengths: tuple[int, ...] = ()
    passkey_depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    passkey_trials: int = 1
    seed: int = 0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        setf = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if not isinstance(self.model, str) or not self.model.strip():
            raise SpecError("LongCtxPlan", "model", self.model, "a model folder, a config folder or a hub id")
        setf("model", resolve_model(self.model))
        for name in (
            "lengths",
            "kv_dtypes",
            "inserts",
            "random_token_lengths",
            "sweep_block_sizes",
            "sweep_dtypes",
            "sweep_lengths",
            "passkey_lengths",
            "passkey_depths",
        ):
            setf(name, _tuple(getattr(self, name)))
        setf("lengths", tuple(sorted(set(self.lengths))))
        if not self.lengths:
            raise SpecError("LongCtxPlan", "lengths", self.lengths, "at least one prompt length")
        for v in self.lengths:
            check_int(self, "lengths", v, 1, 10_000_000)
        if not self.kv_dtypes or self.kv_dtypes[0] != BASELINE or len(set(self.kv_dtypes)) != len(self.kv_dtypes):
            raise SpecError(
                "LongCtxPlan", "kv_dtypes", self.kv_dtypes, "distinct kv dtypes, the first 'auto' (the baseline)"
            )
        for d in (*self.kv_dtypes, *self.sweep_dtypes):
            check_choice(self, "kv_dtypes", d, KVDtype)
        check_int(self, "output_tokens", self.output_tokens, 2, 100_000)
        check_int(self, "requests_per_length", self.requests_per_length, 1, 1000)
        check_int(self, "concurrency", self.concurrency, 1, 100_000)
        if self.block_size is not None:
            check_choice(self, "block_size", self.block_size, BLOCK_SIZES)
        for b in self.sweep_block_sizes:
            check_choice(self, "sweep_block_sizes", b, BLOCK_SIZES)
        check_int(self, "max_num_batched_tokens", self.max_num_batched_tokens, 16, 10_000_000, optional=True)
        check_int(self, "max_num_seqs", self.max_num_seqs, 1, 65536, optional=True)
        if self.max_num_seqs is not None and self.concurrency > self.max_num_seqs:
            raise SpecError(
                "LongCtxPlan", "concurrency", self.concurrency, f"at most max_num_seqs = {self.max_num_seqs}"
            )
        check_float(self, "kv_cache_gib", self.kv_cache_gib, 0.0, 4096.0, lo_open=True, optional=True)
        check_float(self, "quality_kv_cache_gib", self.quality_kv_cache_gib, 0.0, 4096.0, lo_open=True, optional=True)
        check_float(self, "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        check_bool(self, "enforce_eager", self.enforce_eager)
        check_bool(self, "probe_boundary", self.probe_boundary)
        check_choice(self, "load_format", self.load_format, LoadFormat)
        for k in self.inserts:
            check_choice(self, "inserts", k, InsertKind)
        check_int(self, "insert_every", self.insert_every, 1, 10_000)
        longest = self.lengths[-1]
        for name in ("random_token_lengths", "sweep_lengths"):
            for v in getattr(self, name):
                check_int(self, name, v, 1, longest)
        if self.quality_model is not None:
            setf(
                "quality_model",
                check_model_folder(
                    self,
                    "quality_model",
                    self.quality_model,
                    "a local model folder with real weights and a tokenizer, or None",
                ),
            )
        check_int(self, "quality_length", self.quality_length, 2, 10_000_000, optional=True)
        check_int(self, "quality_docs", self.quality_docs, 0, 1000)
        check_int(self, "quality_random_docs", self.quality_random_docs, 0, 1000)
        check_int(self, "top_k", self.top_k, 1, 20)
        check_int(self, "position_bins", self.position_bins, 1, 10_000)
        for v in self.passkey_lengths:
            check_int(self, "passkey_lengths", v, 32, 10_000_000)
        for v in self.passkey_depths:
            check_float(self, "passkey_depths", v, 0.0, 1.0)
        check_int(self, "passkey_trials", self.passkey_trials, 1, 1000)
        check_int(self, "seed", self.seed, 0, 2**31 - 1)
        check_float(self, "timeout_s", self.timeout_s, 0.0, 86400.0, lo_open=True)
        limit = kvmath.load_layout(self.model).max_position_embeddings
        if limit and self.max_context > limit:
            raise SpecError(
                "LongCtxPlan",
                "lengths",
                longest,
                f"longest prompt + output_tokens at most the model's max_position_embeddings = {limit}",
            )
        if self.quality_model is not None:
            qlimit = kvmath.load_layout(self.quality_model).max_position_embeddings
            if qlimit and self.quality_context > qlimit:
                raise SpecError(
                    "LongCtxPlan",
                    "quality_length / passkey_lengths",
                    self.quality_context,
                    f"at most the quality model's max_position_embeddings = {qlimit} (with the output tokens)",
                )

    # ---------------------------------------------------------------- derived
    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> LongCtxPlan:
        """The plan from a notebook's UPPER_CASE parameters (see the notebook's ``parameters`` cell)."""
        lengths = length_grid(
            p["LENGTH_GRID"],
            p["MIN_LENGTH"],
            p["MAX_CONTEXT"],
            p["OUTPUT_TOKENS"],
            step=p.get("LENGTH_STEP", 1024),
            factor=p.get("LENGTH_FACTOR", 2.0),
        )
        last = lengths[-1]
        sweep = tuple(last if v == "longest" else v for v in _tuple(p.get("SWEEP_LENGTHS")))
        return cls(
            model=p["MODEL"],
            lengths=lengths,
            kv_dtypes=tuple(p["KV_DTYPES"]),
            output_tokens=p["OUTPUT_TOKENS"],
            requests_per_length=p["REQUESTS_PER_LENGTH"],
            concurrency=p["CONCURRENCY"],
            block_size=p["BLOCK_SIZE"],
            max_num_batched_tokens=p["MAX_NUM_BATCHED_TOKENS"],
            max_num_seqs=p["MAX_NUM_SEQS"],
            kv_cache_gib=p["KV_CACHE_GIB"],
            gpu_memory_utilization=p["GPU_MEMORY_UTILIZATION"],
            enforce_eager=p["ENFORCE_EAGER"],
            load_format=p["LOAD_FORMAT"],
            inserts=tuple(p["INSERTS"]),
            insert_every=p["INSERT_EVERY"],
            random_token_lengths=tuple(last if v == "longest" else v for v in _tuple(p["RANDOM_TOKEN_LENGTHS"])),
            sweep_block_sizes=tuple(p["SWEEP_BLOCK_SIZES"]),
            sweep_dtypes=tuple(p["SWEEP_DTYPES"]),
            sweep_lengths=sweep,
            probe_boundary=p["PROBE_BOUNDARY"],
            quality_model=p["QUALITY_MODEL"],
            quality_kv_cache_gib=p["QUALITY_KV_CACHE_GIB"],
            quality_length=p["QUALITY_LENGTH"],
            quality_docs=p["QUALITY_DOCS"],
            quality_random_docs=p["QUALITY_RANDOM_DOCS"],
            top_k=p["TOP_K"],
            position_bins=p["POSITION_BINS"],
            passkey_lengths=tuple(last if v == "longest" else v for v in _tuple(p["PASSKEY_LENGTHS"])),
            passkey_depths=tuple(p["PASSKEY_DEPTHS"]),
            passkey_trials=p["PASSKEY_TRIALS"],
            seed=p["SEED"],
        )

    @property
    def max_context(self) -> int:
        """Longest request of the ramp, prompt + output tokens (the ramp engines' ``max_model_len``)."""
        return self.lengths[-1] + self.output_tokens

    @property
    def prompt_source(self) -> PromptSource:
        return "random" if self.load_format == "dummy" else "text"

    @property
    def quality_merged(self) -> bool:
        """The quality phases run on the ramp engines (same model, real weights)."""
        return self.quality_model is not None and self.quality_model == self.model and self.load_format != "dummy"

    @property
    def doc_length(self) -> int:
        """Tokens of each teacher-forced document (default: the ramp's longest prompt)."""
        return self.quality_length or self.lengths[-1]

    @property
    def quality_context(self) -> int:
        """``max_model_len`` the quality phases need."""
        need = [self.doc_length + 1] + [n + PASSKEY_OUTPUT_TOKENS for n in self.passkey_lengths]
        return max(need)

    def resolved_block_size(self) -> int:
        """The ramp's block size: ``block_size``, else vLLM's default on this machine."""
        if self.block_size is not None:
            return self.block_size
        from fp8lab.serving import default_block_size

        return default_block_size()

    def engine_spec(
        self, kv_dtype: str, *, block_size: int | None = None, max_model_len: int | None = None, quality: bool = False
    ) -> EngineSpec:
        """The engine of a ramp / sweep / probe (``quality=False``) or a separate quality engine."""
        if quality:
            return EngineSpec(
                model=self.quality_model,
                kv_cache_dtype=kv_dtype,
                block_size=block_size or self.block_size,
                max_model_len=max_model_len or self.quality_context,
                kv_cache_gib=self.quality_kv_cache_gib,
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                enforce_eager=self.enforce_eager,
                seed=self.seed,
                timeout_s=self.timeout_s,
            )
        mml = max_model_len or max(self.max_context, self.quality_context if self.quality_merged else 0)
        return EngineSpec(
            model=self.model,
            kv_cache_dtype=kv_dtype,
            block_size=block_size or self.block_size,
            max_model_len=mml,
            kv_cache_gib=self.kv_cache_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
            load_format=self.load_format,
            skip_tokenizer_init=self.load_format == "dummy",
            seed=self.seed,
            timeout_s=self.timeout_s,
        )

    def to_dict(self) -> dict[str, Any]:
        import dataclasses

        return dataclasses.asdict(self)


# ============================================================================ boundary arithmetic
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


# ============================================================================ phases
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
    """``div-text`` / ``div-random`` (whole documents, ``max_tokens=1``, ``prompt_logprobs=top_k``: one
    prefill that reads the quantized cache, vllm-notes section 6) and ``passkey`` (greedy, 8 tokens);
    one request at a time. Also returns the passkey items (keys, depths) for scoring."""
    if plan.quality_model is None:
        return [], []
    phases = []
    for source, docs in quality_documents(plan).items():
        if docs:
            reqs = tuple(
                Request(d, max_tokens=1, prompt_logprobs=plan.top_k, cls=source, tag=f"{source}-{j}")
                for j, d in enumerate(docs)
            )
            phases.append(Phase(f"div-{source}", reqs, concurrency=1))
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
        )
        phases.append(
            Phase(
                "passkey",
                tuple(Request(it.prompt, PASSKEY_OUTPUT_TOKENS, cls="passkey", tag=it.tag) for it in items),
                concurrency=1,
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


# ============================================================================ running
@dataclass
class LongCtxResult:
    """What :func:`run_study` produced: one entry per engine in ``runs`` (``role``: ramp | sweep | probe |
    quality, ``kv_dtype``, ``block_size`` asked for, ``max_model_len``, ``result``), the ramp's resolved
    block size, the passkey items, and tidy frames: ``engines`` (one row per engine), ``records`` (one
    row per request, with ``role, kv_dtype, block_size, kind, concurrency, length``) and ``phases`` (one
    row per engine and phase, with the sampled peaks)."""

    plan: LongCtxPlan
    runs: list[dict[str, Any]]
    block_size: int
    passkey: list[PasskeyItem]
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)
    records: pd.DataFrame = field(default_factory=pd.DataFrame)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_s: float = 0.0
    emulated: list[str] = field(default_factory=list)  # labels of FP8 dtypes whose quality phases ran emulated
    notes: list[str] = field(default_factory=list)  # what was not measured natively and why (fp8lab.capability)

    def results(self, role: str, kv_dtype: str | None = None) -> list[Any]:
        """The engine results of ``role`` (and ``kv_dtype``), in run order."""
        return [r["result"] for r in self.runs if r["role"] == role and (kv_dtype is None or r["kv_dtype"] == kv_dtype)]


def ramp_max_model_len(plan: LongCtxPlan, kv_dtype: str, block_size: int) -> int:
    """The ramp engine's ``max_model_len``: the plan's, unless the formula says the KV budget cannot hold
    it; then the longest context it holds (when that still fits the shortest ramp request), so the
    engine starts and measures every length that fits instead of crashing into the boundary."""
    mml = plan.engine_spec(kv_dtype).max_model_len
    nb = predicted_num_blocks(plan, kv_dtype, block_size)
    if nb is not None and plan.lengths[0] + plan.output_tokens <= longest_context(nb, block_size) < mml:
        return longest_context(nb, block_size)
    return mml


def plan_table(plan: LongCtxPlan) -> pd.DataFrame:
    """The engines the study will start (before any starts): role, dtype, block size, max_model_len,
    phases and prompt tokens, so the cost is visible up front (probes: start only)."""
    bs = plan.resolved_block_size()
    rows = []
    ramp = ramp_phases(plan) + (quality_phases(plan)[0] if plan.quality_merged else [])
    for dt in plan.kv_dtypes:
        mml = ramp_max_model_len(plan, dt, bs)
        fit = fit_phases(ramp, mml)
        rows.append(
            {
                "role": "ramp",
                "kv_dtype": dt,
                "block_size": bs,
                "max_model_len": mml,
                "phases": len(fit),
                "requests": sum(len(p.requests) for p in fit),
                "prompt_tokens": sum(r.prompt_len for p in fit for r in p.requests),
            }
        )
    sw = sweep_phases(plan)
    for dt in plan.sweep_dtypes:
        for b in plan.sweep_block_sizes:
            if b == bs and dt in plan.kv_dtypes:
                continue
            rows.append(
                {
                    "role": "sweep",
                    "kv_dtype": dt,
                    "block_size": b,
                    "max_model_len": max(plan.sweep_lengths, default=0) + plan.output_tokens,
                    "phases": len(sw),
                    "requests": sum(len(p.requests) for p in sw),
                    "prompt_tokens": sum(r.prompt_len for p in sw for r in p.requests),
                }
            )
    if plan.probe_boundary:
        for dt in plan.kv_dtypes:
            nb = predicted_num_blocks(plan, dt, bs)
            rows.append(
                {
                    "role": "probe",
                    "kv_dtype": dt,
                    "block_size": bs,
                    "max_model_len": longest_context(nb, bs) + bs if nb is not None else None,
                    "phases": 0,
                    "requests": 0,
                    "prompt_tokens": 0,
                }
            )
    if plan.quality_model is not None and not plan.quality_merged:
        qp = quality_phases(plan)[0]
        for dt in plan.kv_dtypes:
            rows.append(
                {
                    "role": "quality",
                    "kv_dtype": dt,
                    "block_size": plan.block_size,
                    "max_model_len": plan.quality_context,
                    "phases": len(qp),
                    "requests": sum(len(p.requests) for p in qp),
                    "prompt_tokens": sum(r.prompt_len for p in qp for r in p.requests),
                }
            )
    return pd.DataFrame(rows)


def run_study(
    plan: LongCtxPlan, study: str = STUDY, runner: Callable[..., Any] | None = None, progress: bool = True
) -> LongCtxResult:
    """Run (or load) every engine of ``plan``: the ramps, the block-size sweep, the boundary probes and the
    separate quality engines, in that order; every failure is kept as an outcome and the study goes on.

    A ramp engine whose dtype cannot hold the ramp's ``max_model_len`` (predicted from the budget, or
    reported by vLLM's start-up error when vLLM sizes the cache) runs at the longest length it holds,
    and the longer lengths become ``over_capacity`` outcomes. ``runner`` replaces
    :func:`fp8lab.results.run_cached` (same signature; tests pass a fake).
    """
    real_engines = runner is None  # a fake runner (tests) cannot emulate: the device's capability is not asked
    if runner is None:
        from fp8lab.results import run_cached as runner
    t_start = time.perf_counter()
    bs = plan.resolved_block_size()
    runs: list[dict[str, Any]] = []
    q_phases, items = quality_phases(plan)

    def run(
        role: str,
        dt: str,
        spec: EngineSpec,
        phases: Sequence[Phase],
        emulate: bool = False,
        driver: str = "async",
        **kw: Any,
    ) -> Any:
        t = time.perf_counter()
        if emulate:  # an FP8 spec on an emulated-FP8 engine (fp8lab.fp8emu), stored apart from native runs
            from fp8lab import fp8emu

            env = fp8emu.env_for(spec.kv_cache_dtype)
            res = runner(
                spec.replace(kv_cache_dtype="auto"),
                list(phases),
                study=f"{study}.fp8emu-{env[fp8emu.ENV]}",
                driver=driver,
                sample_interval_s=0.1,
                env=env,
                **kw,
            )
            res.extra["emulated"] = env[fp8emu.ENV]
        else:
            res = runner(spec, list(phases), study=study, driver=driver, sample_interval_s=0.1, **kw)
        runs.append(
            {
                "role": role,
                "kv_dtype": dt,
                "block_size": spec.block_size or bs,
                "max_model_len": spec.max_model_len,
                "result": res,
            }
        )
        if progress:
            cached = " (cached)" if getattr(res, "extra", {}).get("cached") else ""
            err = f" - {res.error}" if res.status != "ok" else ""
            print(
                f"[{role}] kv_cache_dtype={dt} block_size={spec.block_size or bs} max_model_len={spec.max_model_len}: "
                f"{res.status}{cached} in {time.perf_counter() - t:.0f} s{err[:300]}",
                flush=True,
            )
        return res

    ramp_all = ramp_phases(plan) + (q_phases if plan.quality_merged else [])
    for dt in plan.kv_dtypes:
        spec = plan.engine_spec(dt)
        mml = ramp_max_model_len(plan, dt, bs)
        res = run("ramp", dt, spec.replace(max_model_len=mml), fit_phases(ramp_all, mml))
        est = parse_estimated_max_len(res.error) if res.status == "oom" else None
        if est is not None and plan.lengths[0] + plan.output_tokens <= est < mml:
            run("ramp", dt, spec.replace(max_model_len=est), fit_phases(ramp_all, est))

    if plan.sweep_lengths:
        sw = sweep_phases(plan)
        mml = max(plan.sweep_lengths) + plan.output_tokens
        for dt in plan.sweep_dtypes:
            for b in plan.sweep_block_sizes:
                if b == bs and dt in plan.kv_dtypes:
                    continue  # the ramp engine is this sweep point
                run("sweep", dt, plan.engine_spec(dt, block_size=b, max_model_len=mml), sw)

    if plan.probe_boundary:
        for dt in plan.kv_dtypes:
            ramp_runs = [r for r in runs if r["role"] == "ramp" and r["kv_dtype"] == dt]
            if any(parse_estimated_max_len(r["result"].error) for r in ramp_runs):
                continue  # the ramp itself crossed the boundary (vLLM sized the cache): no probe needed
            nb = predicted_num_blocks(plan, dt, bs)
            ok = [r["result"] for r in ramp_runs if r["result"].status == "ok"]
            if nb is None and ok:
                nb = int(ok[-1].engine["num_blocks"])
            if nb is None:
                continue
            over = longest_context(nb, bs) + bs
            if over > 10_000_000:
                continue
            # the probe is about memory, not positions; it only starts, so the offline driver (on a CPU its engine
            # core runs in the worker: no second process to start, fp8lab.devices.engine_env)
            run(
                "probe",
                dt,
                plan.engine_spec(dt, max_model_len=over),
                (),
                driver="llm",
                env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
            )

    if plan.quality_model is not None and not plan.quality_merged and q_phases:
        for dt in plan.kv_dtypes:
            run("quality", dt, plan.engine_spec(dt, quality=True), q_phases)

    emulated, notes = _run_emulated(plan, q_phases, study, run) if real_engines else ([], [])
    out = LongCtxResult(plan=plan, runs=runs, block_size=bs, passkey=items, emulated=emulated, notes=notes)
    _collect(out)
    out.wall_s = time.perf_counter() - t_start
    return out


EMULATED_ROLE = "quality-emulated"


def _run_emulated(
    plan: LongCtxPlan, q_phases: Sequence[Phase], study: str, run: Callable[..., Any]
) -> tuple[list[str], list[str]]:
    """On a device without the native FP8 KV kernel: the quality phases (divergence, passkey) of each FP8
    dtype again on an emulated-FP8 engine (:mod:`fp8lab.fp8emu`), labelled ``<dtype> (emulated)``; its ramp,
    sweep and probe engines stay ``unsupported`` (speed and capacity are never emulated). Returns the
    emulated labels and the sentences saying what was not measured and why."""
    from fp8lab import fp8emu
    from fp8lab.capability import emulation_note, kv_support

    qmodel = plan.quality_model or plan.model
    missing = [(dt, kv_support(dt, plan.model)) for dt in plan.kv_dtypes]
    missing = [(dt, sup) for dt, sup in missing if not sup.native]
    if not missing:
        return [], []
    notes = [
        f"Not measured: the long-context speed and capacity of kv_cache_dtype {', '.join(d for d, _ in missing)}, "
        f"because {missing[0][1].reason} (capacities shown for it are the formula's prediction)."
    ]
    labels = []
    if q_phases:
        for dt, sup in missing:
            if not sup.emulated or not kv_support(dt, qmodel).emulated:
                continue
            label = fp8emu.emulated_label(dt)
            spec = plan.engine_spec(dt, quality=plan.quality_model is not None)
            # a bf16 cache takes twice the bytes: twice the budget holds the tokens the FP8 engine would
            spec = spec.replace(
                max_model_len=max(r.prompt_len + r.max_tokens for p in q_phases for r in p.requests),
                kv_cache_gib=2 * spec.kv_cache_gib if spec.kv_cache_gib else None,
            )
            run(EMULATED_ROLE, label, spec, q_phases, emulate=True)
            labels.append(label)
        if labels:
            notes.append(emulation_note(labels, missing[0][1].reason) + " Divergence and passkey only.")
    return labels, notes


def _collect(res: LongCtxResult) -> None:
    engines, recs, phases = [], [], []
    for i, run in enumerate(res.runs):
        r = run["result"]
        e = dict(r.engine or {})
        key = {"engine": i, "role": run["role"], "kv_dtype": run["kv_dtype"], "block_size": run["block_size"]}
        engines.append(
            {
                **key,
                "max_model_len_asked": run["max_model_len"],
                "status": r.status,
                "error": r.error,
                "vllm_estimated_max_len": parse_estimated_max_len(r.error),
                "cached": bool(getattr(r, "extra", {}).get("cached")),
                "run_dir": str(getattr(r, "run_dir", "") or ""),
                **{k: v for k, v in e.items() if not isinstance(v, (list, dict))},
            }
        )
        if r.status != "ok":
            continue
        if len(r.records):
            df = r.records.copy()
            for k, v in key.items():
                df[k] = v
            meta = pd.DataFrame([phase_meta(p) for p in df["phase"]], index=df.index)
            recs.append(pd.concat([df, meta], axis=1))
        smp = r.samples if len(r.samples) else pd.DataFrame(columns=["phase"])
        for name, ph in (r.phases or {}).items():
            s = smp[smp["phase"] == name] if "phase" in smp else smp.iloc[0:0]
            phases.append(
                {
                    **key,
                    "phase": name,
                    **phase_meta(name),
                    **{k: v for k, v in ph.items() if not isinstance(v, (list, dict))},
                    "running_peak": float(s["running"].max()) if "running" in s and len(s) else np.nan,
                    "waiting_peak": float(s["waiting"].max()) if "waiting" in s and len(s) else np.nan,
                    "num_blocks": e.get("num_blocks"),
                    "engine_block_size": e.get("block_size"),
                }
            )
    res.engines = pd.DataFrame(engines)
    res.records = pd.concat(recs, ignore_index=True) if recs else pd.DataFrame()
    res.phases = pd.DataFrame(phases)


# ============================================================================ tables: the ramp
def _decode_overlap_peak(g: pd.DataFrame) -> int:
    """Most requests of ``g`` decoding at the same moment, from client timestamps: request ``i`` decodes
    over ``[sent + ttft, sent + e2e]``. ``C`` requests that all held their KV at once overlap ``C``-fold;
    requests the pool could not hold together run one after another."""
    if not {"sent_s", "ttft_s", "e2e_s"} <= set(g.columns) or g.empty:
        return 0
    ev = []
    for s, t, e in zip(g.sent_s, g.ttft_s, g.e2e_s, strict=True):
        if np.isfinite(s) and np.isfinite(t) and np.isfinite(e):
            ev += [(s + t, 1), (s + e, -1)]
    peak = cur = 0
    for _, d in sorted(ev, key=lambda x: (x[0], -x[1])):
        cur += d
        peak = max(peak, cur)
    return peak


def _bytes_per_block(plan: LongCtxPlan, kv_dtype: str, block_size: int) -> int:
    return kvmath.bytes_per_block(plan.model, block_size, kv_dtype, hybrid_kv_cache_manager=False)


def _ramp_engine(res: LongCtxResult, kv_dtype: str) -> tuple[Any | None, str]:
    """The ramp engine that ran for ``kv_dtype`` and, when none did, the status of its first attempt."""
    runs = res.results("ramp", kv_dtype)
    ok = [r for r in runs if r.status == "ok"]
    return (ok[-1] if ok else None), (runs[0].status if runs else "not run")


def _stats(g: pd.DataFrame) -> dict[str, float]:
    from fp8lab import metrics

    itl = metrics.explode_itl(g)["itl_s"].to_numpy() if "itl_s" in g else np.array([])
    pi = metrics.percentiles(itl)
    return {
        "n": len(g),
        "ttft_p50_s": float(g.ttft_s.median()),
        "ttft_mean_s": float(g.ttft_s.mean()),
        "itl_p50_s": pi["p50"],
        "itl_p95_s": pi["p95"],
        "n_itl": pi["n"],
        "tpot_p50_s": float(g.tpot_s.median()),
        "e2e_p50_s": float(g.e2e_s.median()),
        "rec_preemptions": float(g.num_preemptions.sum()) if "num_preemptions" in g else np.nan,
    }


def ramp_table(res: LongCtxResult) -> pd.DataFrame:
    """One row per (kv_dtype, concurrency, length) of the ramp: ``outcome`` and, where it ran, latency
    (seconds: TTFT median/mean, ITL P50/P95 pooled over every gap, TPOT and E2E medians), the phase's
    ``preemptions``, sampled peaks (``kv_usage_peak`` fraction, ``mem_peak_bytes`` device memory or CPU
    RSS, ``running_peak``), ``kv_used_bytes`` (= usage x usable blocks x bytes per block),
    ``decode_overlap_peak`` (most requests decoding at once, from client timestamps).

    ``outcome``: ``ok`` (one at a time), ``held`` (all ``C`` requests ran together, no preemption),
    ``preempted`` (vLLM preempted a request: the pool could not hold them), ``serialized`` (no
    preemption, but their KV was never resident together: they never all decoded at once and the sampled
    KV use never reached ``C`` full prompts; the pool admitted them one after another),
    ``over_capacity`` (longer than the engine's ``max_model_len``: not sent), or the engine's failure
    status (``oom``, ``unsupported``, ...)."""
    plan = res.plan
    rows = []
    recs = res.records
    ph = res.phases
    concs = [1] + ([plan.concurrency] if plan.concurrency > 1 else [])
    for dt in plan.kv_dtypes:
        eng, first_status = _ramp_engine(res, dt)
        for c in concs:
            for L in plan.lengths:
                row: dict[str, Any] = {"kv_dtype": dt, "concurrency": c, "length": L, "context": L + plan.output_tokens}
                if eng is None:
                    rows.append({**row, "outcome": first_status})
                    continue
                mml = int(eng.engine.get("max_model_len") or 0)
                name = f"ramp-c{c}-L{L}"
                sel = (recs.role == "ramp") & (recs.kv_dtype == dt) & (recs.phase == name) if len(recs) else None
                g = recs[sel] if sel is not None else pd.DataFrame()
                if L + plan.output_tokens > mml or g.empty:
                    rows.append(
                        {
                            **row,
                            "outcome": "over_capacity" if L + plan.output_tokens > mml else "missing",
                            "max_model_len": mml,
                        }
                    )
                    continue
                g = g[g.engine == g.engine.max()]
                p = ph[(ph.engine == g.engine.iloc[0]) & (ph.phase == name)].iloc[0]
                nb, ebs = int(p.num_blocks), int(p.engine_block_size)
                # 0 means the sampler (every 0.1 s) caught no step of a short phase: not measured
                usage = float(p.kv_usage_peak) if pd.notna(p.kv_usage_peak) and p.kv_usage_peak > 0 else np.nan
                overlap = _decode_overlap_peak(g)
                preempt = float(p.preemptions)
                blocks_peak = round(usage * (nb - NULL_BLOCKS)) if np.isfinite(usage) else 0
                # co-resident: all C decoded at once, or the pool held C full prompts at once (a short generation
                # can end before the next request's chunked prefill does, without any lack of KV)
                together = overlap >= c or blocks_peak >= c * blocks_for(L, ebs)
                if c == 1:
                    outcome = "ok"
                elif preempt > 0:
                    outcome = "preempted"
                else:
                    outcome = "held" if together else "serialized"
                rows.append(
                    {
                        **row,
                        "outcome": outcome,
                        "max_model_len": mml,
                        **_stats(g),
                        "preemptions": preempt,
                        "kv_usage_peak": usage,
                        "blocks_used_peak": round(usage * (nb - NULL_BLOCKS)) if np.isfinite(usage) else np.nan,
                        "kv_used_bytes": usage * (nb - NULL_BLOCKS) * _bytes_per_block(plan, dt, ebs),
                        "mem_peak_bytes": p.mem_peak_bytes,
                        "running_peak": p.running_peak,
                        "decode_overlap_peak": overlap,
                        "num_blocks": nb,
                        "block_size": ebs,
                    }
                )
    return pd.DataFrame(rows)


def boundary_table(res: LongCtxResult) -> pd.DataFrame:
    """Longest context per dtype: the formula's prediction beside what vLLM did.

    ``num_blocks_formula`` (:func:`predicted_num_blocks`, when the budget is known) and
    ``num_blocks_engine`` (the ramp engine's); ``longest_formula`` / ``longest_engine``
    (:func:`longest_context` of each); ``longest_measured``: vLLM's own estimate from the start-up
    error of the engine that asked for more (the probe, or a ramp attempt), with that engine's
    ``max_model_len_over`` and ``over_status`` (``oom`` confirms the boundary); ``holds_ramp``: whether
    the dtype holds the ramp's longest request; ``model_limit``: the config's max_position_embeddings."""
    plan, bs = res.plan, res.block_size
    limit = kvmath.load_layout(plan.model).max_position_embeddings
    eng = res.engines
    rows = []
    for dt in plan.kv_dtypes:
        ramp, first_status = _ramp_engine(res, dt)
        nb_f = predicted_num_blocks(plan, dt, bs)
        nb_e = int(ramp.engine["num_blocks"]) if ramp is not None else None
        over = (
            eng[(eng.kv_dtype == dt) & eng.role.isin(["probe", "ramp"]) & eng.vllm_estimated_max_len.notna()]
            if len(eng)
            else eng
        )
        probe = eng[(eng.kv_dtype == dt) & (eng.role == "probe")] if len(eng) else eng
        o = over.iloc[-1] if len(over) else (probe.iloc[-1] if len(probe) else None)
        rows.append(
            {
                "kv_dtype": dt,
                "block_size": bs,
                "kv_bytes_per_token": kvmath.kv_bytes_per_token(plan.model, dt),
                "kv_budget_bytes": (ramp.engine.get("kv_budget_bytes") if ramp is not None else None)
                or (int(plan.kv_cache_gib * kvmath.GIB) if plan.kv_cache_gib else None),
                "num_blocks_formula": nb_f,
                "num_blocks_engine": nb_e,
                "longest_formula": longest_context(nb_f, bs) if nb_f is not None else None,
                "longest_engine": longest_context(nb_e, bs) if nb_e is not None else None,
                "longest_measured": o["vllm_estimated_max_len"] if o is not None else None,
                "max_model_len_over": o["max_model_len_asked"] if o is not None else None,
                "over_status": o["status"] if o is not None else None,
                "ramp_status": first_status if ramp is None else "ok",
                "ramp_max_model_len": int(ramp.engine["max_model_len"]) if ramp is not None else None,
                "holds_ramp": (ramp is not None and int(ramp.engine["max_model_len"]) >= plan.max_context),
                "model_limit": limit,
            }
        )
    out = pd.DataFrame(rows)
    for c in (
        "num_blocks_formula",
        "num_blocks_engine",
        "longest_formula",
        "longest_engine",
        "longest_measured",
        "max_model_len_over",
        "ramp_max_model_len",
        "kv_budget_bytes",
    ):
        out[c] = out[c].astype("Int64")
    return out


def capacity_frontier(res: LongCtxResult, ramp: pd.DataFrame | None = None) -> pd.DataFrame:
    """Largest concurrency each dtype holds at each length (prompt + output, every sequence at full
    length): ``max_conc_formula`` (blocks from the formula), ``max_conc_engine`` (the engine's block
    count), ``max_conc_measured`` (usable blocks over the blocks one sequence was measured to hold:
    sampled ``kv_usage`` of the one-at-a-time phase), all capped by the engine's ``max_num_seqs``, and
    ``outcome_c<C>``: what happened when ``C`` requests of that length ran at once."""
    plan, bs = res.plan, res.block_size
    ramp = ramp_table(res) if ramp is None else ramp
    rows = []
    for dt in plan.kv_dtypes:
        eng, _ = _ramp_engine(res, dt)
        nb_f = predicted_num_blocks(plan, dt, bs)
        nb_e = int(eng.engine["num_blocks"]) if eng is not None else None
        seqs = int(eng.engine.get("max_num_seqs") or 0) or plan.max_num_seqs if eng is not None else plan.max_num_seqs
        for L in plan.lengths:
            ctx = L + plan.output_tokens
            r1 = ramp[(ramp.kv_dtype == dt) & (ramp.concurrency == 1) & (ramp.length == L)]
            measured_blocks = r1.blocks_used_peak.iloc[0] if len(r1) and "blocks_used_peak" in r1 else np.nan
            row = {
                "kv_dtype": dt,
                "length": L,
                "context": ctx,
                "blocks_per_seq": blocks_for(ctx, bs),
                "max_conc_formula": max_concurrency_at(nb_f, bs, ctx, seqs) if nb_f is not None else np.nan,
                "max_conc_engine": max_concurrency_at(nb_e, bs, ctx, seqs) if nb_e is not None else np.nan,
                "blocks_per_seq_measured": measured_blocks,
                "max_conc_measured": (
                    min((nb_e - NULL_BLOCKS) // int(measured_blocks), seqs or 10**9)
                    if nb_e is not None and pd.notna(measured_blocks) and measured_blocks > 0
                    else np.nan
                ),
            }
            if plan.concurrency > 1:
                rc = ramp[(ramp.kv_dtype == dt) & (ramp.concurrency == plan.concurrency) & (ramp.length == L)]
                row[f"outcome_c{plan.concurrency}"] = rc.outcome.iloc[0] if len(rc) else None
            rows.append(row)
    return pd.DataFrame(rows)


def frontier_at_budgets(
    model: str,
    kv_dtypes: Sequence[str],
    budgets_gib: Sequence[float],
    lengths: Sequence[int],
    block_size: int,
    output_tokens: int = 0,
) -> pd.DataFrame:
    """Arithmetic only: longest context and concurrency per length for other KV budgets (GiB), e.g. a
    whole GPU's. One row per (budget, kv_dtype, length)."""
    rows = []
    for gib in budgets_gib:
        for dt in kv_dtypes:
            nb = kvmath.predict_num_blocks(model, int(gib * kvmath.GIB), block_size, dt, hybrid_kv_cache_manager=False)
            for L in lengths:
                rows.append(
                    {
                        "kv_gib": gib,
                        "kv_dtype": dt,
                        "length": L,
                        "longest": longest_context(nb, block_size),
                        "max_conc": max_concurrency_at(nb, block_size, L + output_tokens),
                    }
                )
    return pd.DataFrame(rows)


# ============================================================================ growth fits
def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``min |X c - y|`` with ``c >= 0`` for a few columns, exactly: the unconstrained solution
    on every subset of columns (the others held at zero), the best one that is non-negative (the NNLS
    optimum is the unconstrained optimum on its own support; Lawson & Hanson, *Solving Least Squares
    Problems*, 1974, ch. 23)."""
    import itertools

    k = X.shape[1]
    best, best_err = np.zeros(k), float(np.sum(y**2))
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            c, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
            if np.all(c >= 0):
                err = float(np.sum((X[:, cols] @ c - y) ** 2))
                if err < best_err - 1e-15 * max(1.0, best_err):
                    best, best_err = np.zeros(k), err
                    best[list(cols)] = c
    return best


def fit_growth(lengths: Sequence[float], values: Sequence[float], degree: int = 2) -> dict[str, float]:
    """Least squares with non-negative coefficients (:func:`_nnls`, relative errors) of
    ``y = a + b*L (+ c*L^2)``: seconds, seconds per token, seconds per token^2 (``degree`` 1 or 2), with
    ``r2``; and ``exponent``, the log-log slope over the longer half of the lengths (the local growth
    order: 1 for linear, 2 for quadratic). A prefill (TTFT) grows as ``b L`` (weights) plus ``c L^2``
    (attention over the context); a decode step (ITL) as ``a + b L`` (reading L tokens of KV)."""
    x = np.asarray(lengths, dtype=float)
    y = np.asarray(values, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    nan = float("nan")
    out = {"a": nan, "b": nan, "c": nan, "r2": nan, "exponent": nan, "n": int(x.size), "degree": degree}
    if x.size < degree + 1:
        return out
    scale = float(x.max())
    X = np.stack([np.ones_like(x)] + [(x / scale) ** k for k in range(1, degree + 1)], axis=1)
    w = 1.0 / np.maximum(np.abs(y), 1e-12)  # relative error: short lengths count as much as long ones
    coef = _nnls(X * w[:, None], y * w)
    pred = X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    out.update(
        a=float(coef[0]),
        b=float(coef[1] / scale),
        c=float(coef[2] / scale**2) if degree == 2 else 0.0,
        r2=1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else nan,
    )
    upper = x >= np.median(x)
    if upper.sum() >= 2 and np.all(y[upper] > 0):
        out["exponent"] = float(np.polyfit(np.log(x[upper]), np.log(y[upper]), 1)[0])
    return out


def fitted(fit: Mapping[str, float], lengths: Any) -> np.ndarray:
    """The fitted curve ``a + b L + c L^2`` at ``lengths``."""
    L = np.asarray(lengths, dtype=float)
    return fit["a"] + fit["b"] * L + (fit.get("c") or 0.0) * L**2


#: Metric -> polynomial degree of its growth fit.
GROWTH_METRICS = {"ttft_p50_s": 2, "itl_p50_s": 1, "itl_p95_s": 1, "e2e_p50_s": 2}


def growth_table(ramp: pd.DataFrame, concurrency: int = 1) -> pd.DataFrame:
    """One row per (kv_dtype, metric): :func:`fit_growth` of the ramp's one-at-a-time medians, and the
    fitted value at the longest measured length (``at_longest``)."""
    rows = []
    ok = ramp[(ramp.concurrency == concurrency) & ramp.outcome.isin(["ok", "held"])]
    for dt, g in ok.groupby("kv_dtype", sort=False):
        for m, deg in GROWTH_METRICS.items():
            if m not in g:
                continue
            f = fit_growth(g.length, g[m], deg)
            rows.append(
                {
                    "kv_dtype": dt,
                    "metric": m,
                    **f,
                    "longest": int(g.length.max()),
                    "at_longest": float(fitted(f, g.length.max())) if f["n"] > deg else np.nan,
                }
            )
    return pd.DataFrame(rows)


def measured_crossover(lengths: Sequence[int], base: Sequence[float], cand: Sequence[float]) -> int | None:
    """Smallest length from which ``cand < base`` at every measured length up to the longest (``None``
    when ``cand`` is not below ``base`` at the longest length).

    >>> measured_crossover([1, 2, 4, 8], [1, 1, 1, 1], [2, 0.5, 1.5, 0.9])
    8
    """
    pts = sorted((L, b, c) for L, b, c in zip(lengths, base, cand, strict=True) if np.isfinite(b) and np.isfinite(c))
    found = None
    for L, b, c in reversed(pts):
        if c < b:
            found = L
        else:
            break
    return found


def fitted_crossover(
    fit_base: Mapping[str, float], fit_cand: Mapping[str, float], lo: float, hi: float, points: int = 2048
) -> float | None:
    """Smallest length in ``[lo, hi]`` from which the candidate's fitted curve stays below the baseline's
    (on a log-spaced grid of ``points``); ``None`` when it is not below at ``hi``."""
    if not all(np.isfinite([fit_base.get("a", np.nan), fit_cand.get("a", np.nan)])):
        return None
    L = np.geomspace(lo, hi, points)
    d = fitted(fit_cand, L) - fitted(fit_base, L)
    if d[-1] >= 0:
        return None
    above = np.nonzero(d >= 0)[0]
    return float(L[above[-1] + 1]) if above.size else float(L[0])


def speed_table(res: LongCtxResult, ramp: pd.DataFrame | None = None, n_boot: int = 1000) -> pd.DataFrame:
    """Every candidate dtype against ``auto`` at each (concurrency, length) both ran: ratio of TTFT, ITL
    P50/P95, E2E medians (``< 1``: the candidate is faster), and the ITL median's relative delta with a
    bootstrap CI over the pooled gaps (:func:`fp8lab.metrics.bootstrap_delta`; ``itl_label`` says
    ``within noise`` when the interval contains zero)."""
    from fp8lab import metrics

    ramp = ramp_table(res) if ramp is None else ramp
    rec = res.records
    rows = []
    base = ramp[ramp.kv_dtype == BASELINE].set_index(["concurrency", "length"])
    for dt in res.plan.kv_dtypes[1:]:
        cand = ramp[ramp.kv_dtype == dt].set_index(["concurrency", "length"])
        for key in base.index.intersection(cand.index):
            b, c = base.loc[key], cand.loc[key]
            if (
                b.outcome == "over_capacity"
                or c.outcome == "over_capacity"
                or pd.isna(b.get("ttft_p50_s"))
                or pd.isna(c.get("ttft_p50_s"))
            ):
                continue
            row = {
                "kv_dtype": dt,
                "concurrency": key[0],
                "length": key[1],
                "outcome_auto": b.outcome,
                "outcome_cand": c.outcome,
            }
            for m in ("ttft_p50_s", "itl_p50_s", "itl_p95_s", "e2e_p50_s"):
                row[m.replace("_s", "_ratio")] = float(c[m] / b[m]) if b[m] else np.nan
            name = f"ramp-c{key[0]}-L{key[1]}"
            ga = metrics.explode_itl(rec[(rec.role == "ramp") & (rec.kv_dtype == BASELINE) & (rec.phase == name)])
            gb = metrics.explode_itl(rec[(rec.role == "ramp") & (rec.kv_dtype == dt) & (rec.phase == name)])
            d = metrics.bootstrap_delta(ga.itl_s, gb.itl_s, "median", n_boot=n_boot, seed=res.plan.seed)
            row.update(itl_delta=d.delta, itl_lo=d.lo, itl_hi=d.hi, itl_label=d.label.replace("B", dt))
            rows.append(row)
    return pd.DataFrame(rows)


def crossover_table(
    ramp: pd.DataFrame, growth: pd.DataFrame, kv_dtypes: Sequence[str], concurrency: int = 1
) -> pd.DataFrame:
    """Where (if anywhere) each candidate dtype becomes faster than ``auto``, per metric: ``measured``
    (:func:`measured_crossover` on the medians) and ``fitted`` (:func:`fitted_crossover` within the
    measured range); ``ratio_at_longest`` = candidate / auto at the longest length both ran."""
    rows = []
    r = ramp[(ramp.concurrency == concurrency) & (ramp.outcome == "ok")]
    base = r[r.kv_dtype == BASELINE].set_index("length")
    for dt in kv_dtypes[1:]:
        cand = r[r.kv_dtype == dt].set_index("length")
        common = base.index.intersection(cand.index)
        for m in GROWTH_METRICS:
            if not len(common) or m not in base:
                continue
            fb = growth[(growth.kv_dtype == BASELINE) & (growth.metric == m)]
            fc = growth[(growth.kv_dtype == dt) & (growth.metric == m)]
            fx = (
                fitted_crossover(fb.iloc[0], fc.iloc[0], float(common.min()), float(common.max()))
                if len(fb) and len(fc)
                else None
            )
            Lmax = common.max()
            rows.append(
                {
                    "kv_dtype": dt,
                    "concurrency": concurrency,
                    "metric": m,
                    "measured": measured_crossover(list(common), base.loc[common, m], cand.loc[common, m]),
                    "fitted": fx,
                    "ratio_at_longest": float(cand.loc[Lmax, m] / base.loc[Lmax, m]),
                    "longest": int(Lmax),
                }
            )
    return pd.DataFrame(rows)


# ============================================================================ block-size sweep
def blocksize_table(res: LongCtxResult) -> pd.DataFrame:
    """One row per (kv_dtype, block_size, sweep length): ``outcome`` (``ok`` or the engine's failure
    status, e.g. ``unsupported`` for a size the attention backend rejects), the ramp metrics, and
    ``e2e_vs_best`` / ``itl_vs_best`` (ratio to the best block size of that dtype and length). When the
    ramp's block size is one of the sweep sizes, the ramp engine is that sweep point (``source = ramp``:
    measured after the shorter lengths; a sweep engine runs only a warm-up first)."""
    plan = res.plan
    rows = []
    rec = res.records
    sweep = [(r["kv_dtype"], r["block_size"], "sweep") for r in res.runs if r["role"] == "sweep"]
    # the ramp engine runs every sweep length too: it is a point of the sweep at its own block size, also when that
    # size is not among SWEEP_BLOCK_SIZES (the H200 profile sweeps 256 against the ramp's 16)
    points = [
        (dt, res.block_size, "ramp")
        for dt in plan.kv_dtypes
        if dt in plan.sweep_dtypes
        and res.block_size is not None
        and (dt, res.block_size) not in {(d, b) for d, b, _ in sweep}
    ]
    points += sweep
    for dt, b, role in points:
        if role == "ramp":
            r, status = _ramp_engine(res, dt)
        else:
            r = next(
                x["result"] for x in res.runs if x["role"] == "sweep" and x["kv_dtype"] == dt and x["block_size"] == b
            )
            status = r.status
            r = r if r.status == "ok" else None
        for L in plan.sweep_lengths:
            row: dict[str, Any] = {"kv_dtype": dt, "block_size": b, "length": L, "source": role}
            if r is None:
                rows.append({**row, "outcome": status})
                continue
            g = rec[(rec.role == role) & (rec.kv_dtype == dt) & (rec.block_size == b) & (rec.phase == f"ramp-c1-L{L}")]
            if g.empty:
                rows.append({**row, "outcome": "over_capacity"})
                continue
            rows.append({**row, "outcome": "ok", **_stats(g[g.engine == g.engine.max()])})
    out = pd.DataFrame(rows)
    if len(out) and "e2e_p50_s" in out:
        for m, col in (("e2e_p50_s", "e2e_vs_best"), ("itl_p50_s", "itl_vs_best"), ("ttft_p50_s", "ttft_vs_best")):
            out[col] = out[m] / out.groupby(["kv_dtype", "length"])[m].transform("min")
    return out.sort_values(["kv_dtype", "length", "block_size"], ignore_index=True) if len(out) else out


# ============================================================================ quality along the context
def _quality_records(res: LongCtxResult, phase: str) -> dict[str, pd.DataFrame]:
    """Records of ``phase`` per kv dtype (from the ramp engines when merged, else the quality engines)."""
    role = "ramp" if res.plan.quality_merged else "quality"
    rec = res.records
    out = {}
    if rec.empty:
        return out
    for dt in [*res.plan.kv_dtypes, *res.emulated]:
        r = EMULATED_ROLE if dt in res.emulated else role
        g = rec[(rec.role == r) & (rec.kv_dtype == dt) & (rec.phase == phase)]
        if len(g):
            out[dt] = g[g.engine == g.engine.max()].set_index("tag")
    return out


def position_divergence(
    base: Mapping[str, Any], cand: Mapping[str, Any], token_ids: Sequence[int], top_k: int
) -> pd.DataFrame:
    """Per position ``>= 1`` of one teacher-forced document: ``top1`` (do the argmaxes agree),
    ``top<k>`` overlap (:func:`fp8lab.quality.topk_overlap`), ``abs_dlogprob`` of the actual token and
    ``kl`` (:func:`fp8lab.quality.kl_topk`, a lower bound, nats), and each side's ``nll`` of the actual
    token (nats). ``base`` / ``cand``: records with ``prompt_token_logprobs``, ``prompt_topk_ids``,
    ``prompt_topk_logprobs`` (Study 03's measure, applied along the whole context)."""
    from fp8lab.quality import kl_topk, topk_overlap

    bl, cl = (
        np.asarray(list(base["prompt_token_logprobs"]), float),
        np.asarray(list(cand["prompt_token_logprobs"]), float),
    )
    bi, ci = list(base["prompt_topk_ids"]), list(cand["prompt_topk_ids"])
    blp, clp = list(base["prompt_topk_logprobs"]), list(cand["prompt_topk_logprobs"])
    n = min(len(bl), len(cl), len(token_ids))
    rows = {"pos": [], "top1": [], f"top{top_k}": [], "abs_dlogprob": [], "kl": [], "nll_base": [], "nll_cand": []}
    for pos in range(1, n):
        b_ids, c_ids = [int(t) for t in bi[pos]], [int(t) for t in ci[pos]]
        p = dict(zip(b_ids, map(float, blp[pos]), strict=True))
        q = dict(zip(c_ids, map(float, clp[pos]), strict=True))
        tok = int(token_ids[pos])
        p[tok], q[tok] = float(bl[pos]), float(cl[pos])
        rows["pos"].append(pos)
        rows["top1"].append(topk_overlap(b_ids, c_ids, 1))
        rows[f"top{top_k}"].append(topk_overlap(b_ids, c_ids, top_k))
        rows["abs_dlogprob"].append(abs(cl[pos] - bl[pos]))
        rows["kl"].append(kl_topk(p, q))
        rows["nll_base"].append(-bl[pos])
        rows["nll_cand"].append(-cl[pos])
    return pd.DataFrame(rows)


def _has_list(row: Mapping[str, Any], col: str) -> bool:
    v = row.get(col) if hasattr(row, "get") else None
    return v is not None and not isinstance(v, float)


def stored_divergence(
    base: Mapping[str, Any], cand: Mapping[str, Any], token_ids: Sequence[int], top_k: int
) -> pd.DataFrame:
    """:func:`position_divergence` from what a slimmed store keeps instead of the top-k lists
    (``scripts/slim_store.py``): the candidate's ``div_top1`` and ``div_topk`` (overlap counts of the
    argmax and of the top ``div_top_k``), ``div_kl`` (nats), computed by :func:`position_divergence`
    from the lists before they were dropped, and both sides' ``prompt_token_logprobs``. Same frame."""
    stored_k = int(cand.get("div_top_k", top_k))
    if stored_k != top_k:
        raise SpecError("LongCtxPlan", "top_k", top_k, f"{stored_k}: the top-k the stored divergence was computed with")
    bl, cl = (
        np.asarray(list(base["prompt_token_logprobs"]), float),
        np.asarray(list(cand["prompt_token_logprobs"]), float),
    )
    t1, tk, kl = (np.asarray(list(cand[c])) for c in ("div_top1", "div_topk", "div_kl"))
    n = min(len(bl), len(cl), len(token_ids), len(kl))
    pos = np.arange(1, n)
    return pd.DataFrame(
        {
            "pos": pos.tolist(),
            "top1": [int(x) / 1 for x in t1[pos]],
            f"top{top_k}": [int(x) / top_k for x in tk[pos]],
            "abs_dlogprob": [abs(float(cl[i]) - float(bl[i])) for i in pos],
            "kl": [float(x) for x in kl[pos]],
            "nll_base": [-float(bl[i]) for i in pos],
            "nll_cand": [-float(cl[i]) for i in pos],
        }
    )


def divergence_table(res: LongCtxResult) -> pd.DataFrame:
    """:func:`position_divergence` of every candidate dtype against ``auto`` on every teacher-forced
    document, with ``source`` (text | random) and ``doc``; one row per position."""
    docs = quality_documents(res.plan) if res.plan.quality_model is not None else {}
    frames = []
    for source, ids_list in docs.items():
        by = _quality_records(res, f"div-{source}")
        if BASELINE not in by:
            continue
        for dt in [*res.plan.kv_dtypes[1:], *res.emulated]:
            if dt not in by:
                continue
            for j, ids in enumerate(ids_list):
                tag = f"{source}-{j}"
                if tag not in by[BASELINE].index or tag not in by[dt].index:
                    continue
                b, c = by[BASELINE].loc[tag], by[dt].loc[tag]
                if _has_list(c, "div_kl") and not (_has_list(b, "prompt_topk_ids") and _has_list(c, "prompt_topk_ids")):
                    df = stored_divergence(b, c, ids, res.plan.top_k)
                else:
                    df = position_divergence(b, c, ids, res.plan.top_k)
                frames.append(df.assign(kv_dtype=dt, source=source, doc=j))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def divergence_by_position(div: pd.DataFrame, bins: int, length: int) -> pd.DataFrame:
    """Means per (kv_dtype, source, position bin): ``bins`` equal bins over ``[0, length)``
    (``pos_bin`` = bin start, tokens); ``flip_rate`` = 1 - top-1 agreement."""
    if div.empty:
        return div
    width = max(1, -(-length // bins))
    d = div.assign(pos_bin=(div.pos // width) * width)
    g = d.groupby(["kv_dtype", "source", "pos_bin"], sort=True)
    cols = [c for c in d.columns if c.startswith("top")] + ["abs_dlogprob", "kl", "nll_base", "nll_cand"]
    out = g[cols].mean().assign(n=g.size()).reset_index()
    out["flip_rate"] = 1.0 - out["top1"]
    return out


def divergence_trend(bypos: pd.DataFrame) -> pd.DataFrame:
    """Does the divergence grow along the context? Per (kv_dtype, source): the mean over all positions
    (bins weighted by their positions), first and last bin's ``abs_dlogprob`` and ``flip_rate``, their
    ratio, and Spearman's rank correlation of the bin means with position."""
    rows = []
    for (dt, src), g in bypos.groupby(["kv_dtype", "source"], sort=False):
        g = g.sort_values("pos_bin")
        w = g.n / g.n.sum()
        rho = g.pos_bin.rank().corr(g.abs_dlogprob.rank()) if len(g) > 2 else np.nan  # Spearman: Pearson of ranks
        rows.append(
            {
                "kv_dtype": dt,
                "source": src,
                "abs_dlogprob": float((g.abs_dlogprob * w).sum()),
                "flip_rate": float((g.flip_rate * w).sum()),
                "kl": float((g.kl * w).sum()),
                "abs_dlogprob_first": float(g.abs_dlogprob.iloc[0]),
                "abs_dlogprob_last": float(g.abs_dlogprob.iloc[-1]),
                "last_over_first": float(g.abs_dlogprob.iloc[-1] / g.abs_dlogprob.iloc[0])
                if g.abs_dlogprob.iloc[0] > 0
                else np.nan,
                "flip_rate_first": float(g.flip_rate.iloc[0]),
                "flip_rate_last": float(g.flip_rate.iloc[-1]),
                "spearman_rho": float(rho),
                "nll_base_first": float(g.nll_base.iloc[0]),
                "nll_base_last": float(g.nll_base.iloc[-1]),
            }
        )
    return pd.DataFrame(rows)


def passkey_table(res: LongCtxResult) -> pd.DataFrame:
    """One row per (kv_dtype, passkey item): ``length``, ``depth``, ``key``, the ``answer`` (decoded greedy
    tokens) and ``correct`` (:func:`passkey_correct`)."""
    by = _quality_records(res, "passkey")
    if not by or not res.passkey:
        return pd.DataFrame()
    from fp8lab.workloads import _tokenizer

    tok = _tokenizer(res.plan.quality_model)
    rows = []
    for dt, g in by.items():
        for it in res.passkey:
            if it.tag not in g.index:
                continue
            text = tok.decode(list(g.loc[it.tag, "output_token_ids"]), skip_special_tokens=True)
            rows.append(
                {
                    "kv_dtype": dt,
                    "tag": it.tag,
                    "length": it.length,
                    "depth": it.depth,
                    "key": it.key,
                    "answer": text,
                    "correct": passkey_correct(text, it.key),
                }
            )
    return pd.DataFrame(rows)


def passkey_accuracy(pk: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per (kv_dtype, length) over depths and trials (columns: depths, ``all``)."""
    if pk.empty:
        return pk
    t = pk.pivot_table(index=["kv_dtype", "length"], columns="depth", values="correct", aggfunc="mean", sort=False)
    t["all"] = pk.groupby(["kv_dtype", "length"], sort=False).correct.mean()
    t.columns = [c if isinstance(c, str) else f"depth {c:g}" for c in t.columns]
    return t


def random_token_table(res: LongCtxResult, div_trend: pd.DataFrame | None = None) -> pd.DataFrame:
    """The "random tokens" claim, per kv dtype. Timing (``what = timing``): a random-token prompt over the
    mean of the real-text prompt of the same length run just before and just after it (``ttft_ratio``,
    ``itl_p50_ratio``; 1 = no difference), beside the after/before ratio of those two real-text runs
    (``noise_ttft_ratio``, ``noise_itl_p50_ratio``: the run-to-run noise). Divergence (``what = divergence``, per candidate dtype): the teacher-forced FP8
    error on random tokens over that on real text (``abs_dlogprob_ratio``, ``flip_rate_ratio``: how much
    a random-token test over- or under-states it)."""
    rec = res.records
    rows = []
    for L in res.plan.random_token_lengths if res.plan.prompt_source == "text" else ():
        for dt in res.plan.kv_dtypes:
            if rec.empty:
                continue
            ph = rec[(rec.role == "ramp") & (rec.kv_dtype == dt) & (rec.phase == f"randtok-L{L}")]
            ph = ph[ph.engine == ph.engine.max()] if len(ph) else ph
            rt, ta, tb = (ph[ph.tag == f"{k}-L{L}"] for k in ("randtok", "text-a", "text-b"))
            if rt.empty or ta.empty or tb.empty:
                continue
            r, a, b = _stats(rt), _stats(ta), _stats(tb)
            rows.append(
                {
                    "kv_dtype": dt,
                    "what": "timing",
                    "length": L,
                    "ttft_ratio": r["ttft_p50_s"] / ((a["ttft_p50_s"] + b["ttft_p50_s"]) / 2),
                    "itl_p50_ratio": r["itl_p50_s"] / ((a["itl_p50_s"] + b["itl_p50_s"]) / 2),
                    "noise_ttft_ratio": b["ttft_p50_s"] / a["ttft_p50_s"],
                    "noise_itl_p50_ratio": b["itl_p50_s"] / a["itl_p50_s"],
                }
            )
    if div_trend is not None and len(div_trend):
        t = div_trend.set_index(["kv_dtype", "source"])
        for dt in res.plan.kv_dtypes[1:]:
            if (dt, "text") in t.index and (dt, "random") in t.index:
                x, r = t.loc[(dt, "text")], t.loc[(dt, "random")]
                rows.append(
                    {
                        "kv_dtype": dt,
                        "what": "divergence",
                        "length": res.plan.doc_length,
                        "abs_dlogprob_text": x.abs_dlogprob,
                        "abs_dlogprob_random": r.abs_dlogprob,
                        "abs_dlogprob_ratio": r.abs_dlogprob / x.abs_dlogprob if x.abs_dlogprob else np.nan,
                        "flip_rate_text": x.flip_rate,
                        "flip_rate_random": r.flip_rate,
                        "flip_rate_ratio": r.flip_rate / x.flip_rate if x.flip_rate else np.nan,
                    }
                )
    return pd.DataFrame(rows)


# ============================================================================ verdict and summary
@dataclass
class Tables:
    """Every table of the study, computed once (:func:`tables`)."""

    ramp: pd.DataFrame
    boundary: pd.DataFrame
    frontier: pd.DataFrame
    growth: pd.DataFrame
    speed: pd.DataFrame
    crossover: pd.DataFrame
    blocksize: pd.DataFrame
    divergence: pd.DataFrame
    bypos: pd.DataFrame
    trend: pd.DataFrame
    passkey: pd.DataFrame
    random: pd.DataFrame


def tables(res: LongCtxResult) -> Tables:
    ramp = ramp_table(res)
    growth = growth_table(ramp)
    div = divergence_table(res)
    bypos = divergence_by_position(div, res.plan.position_bins, res.plan.doc_length)
    trend = divergence_trend(bypos) if len(bypos) else pd.DataFrame()
    return Tables(
        ramp=ramp,
        boundary=boundary_table(res),
        frontier=capacity_frontier(res, ramp),
        growth=growth,
        speed=speed_table(res, ramp),
        crossover=crossover_table(ramp, growth, res.plan.kv_dtypes),
        blocksize=blocksize_table(res),
        divergence=div,
        bypos=bypos,
        trend=trend,
        passkey=passkey_table(res),
        random=random_token_table(res, trend),
    )


def _k(n: Any) -> str:
    """Tokens as text: 8160 -> '8,160'."""
    return "n/a" if n is None or (isinstance(n, float) and not np.isfinite(n)) or pd.isna(n) else f"{int(n):,}"


def _pct(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:+.1f}%"


def claims(res: LongCtxResult, t: Tables) -> dict[str, dict[str, Any]]:
    """Each field-report claim with a ``label`` and the numbers behind it (the verdict's content)."""
    plan = res.plan
    out: dict[str, dict[str, Any]] = {}
    cands = list(plan.kv_dtypes[1:])

    # 1. bf16 runs out of memory where fp8 keeps going
    b = t.boundary.set_index("kv_dtype")
    longest = {
        dt: (
            b.loc[dt, "longest_measured"]
            if pd.notna(b.loc[dt, "longest_measured"])
            else b.loc[dt, "longest_engine"]
            if pd.notna(b.loc[dt, "longest_engine"])
            else b.loc[dt, "longest_formula"]
        )
        for dt in b.index
    }
    holds = {dt: bool(b.loc[dt, "holds_ramp"]) for dt in b.index}
    conc_ok: dict[str, Any] = {}
    if plan.concurrency > 1:
        r = t.ramp[t.ramp.concurrency == plan.concurrency]
        for dt, g in r.groupby("kv_dtype", sort=False):
            held = g[g.outcome == "held"]
            conc_ok[dt] = int(held.length.max()) if len(held) else None
    runs_out = (not holds.get(BASELINE, True) and any(holds.get(c) for c in cands)) or any(
        conc_ok.get(c) is not None and (conc_ok.get(BASELINE) or 0) < conc_ok[c] for c in cands
    )
    out["oom"] = {
        "label": "supported" if runs_out else "not seen at this budget",
        "longest": longest,
        "holds_ramp": holds,
        "longest_held_at_concurrency": conc_ok,
    }

    # 2. FP8's gains grow with context length
    sp = t.speed[t.speed.concurrency == 1] if len(t.speed) else t.speed
    g2: dict[str, Any] = {}
    for dt in cands:
        s = sp[sp.kv_dtype == dt].sort_values("length") if len(sp) else sp
        if s is None or not len(s):
            continue
        gr = t.growth.set_index(["kv_dtype", "metric"]) if len(t.growth) else None
        slope = {
            d: (float(gr.loc[(d, "itl_p50_s"), "b"]) if gr is not None and (d, "itl_p50_s") in gr.index else np.nan)
            for d in (BASELINE, dt)
        }
        cx = (
            t.crossover[(t.crossover.kv_dtype == dt) & (t.crossover.metric == "itl_p50_s")]
            if len(t.crossover)
            else t.crossover
        )
        first, last = s.iloc[0], s.iloc[-1]
        # the trend over every length (Spearman's rank correlation of the ratio with length), not two end points
        rho = (
            s.length.rank().corr(s.itl_p50_ratio.rank())
            if len(s) >= 3
            else np.sign(last.itl_p50_ratio - first.itl_p50_ratio)
        )
        falls = bool(rho <= -0.5)
        faster = bool(last.itl_label != "within noise" and last.itl_delta < 0)
        g2[dt] = {
            "itl_ratio_shortest": float(first.itl_p50_ratio),
            "itl_ratio_longest": float(last.itl_p50_ratio),
            "ttft_ratio_shortest": float(first.ttft_p50_ratio),
            "ttft_ratio_longest": float(last.ttft_p50_ratio),
            "itl_delta_longest": float(last.itl_delta),
            "itl_ci_longest": (float(last.itl_lo), float(last.itl_hi)),
            "itl_label_longest": last.itl_label,
            "shortest": int(first.length),
            "longest": int(last.length),
            "itl_slope_auto": slope[BASELINE],
            "itl_slope_cand": slope[dt],
            "crossover_measured": cx.measured.iloc[0] if len(cx) else None,
            "crossover_fitted": cx.fitted.iloc[0] if len(cx) else None,
            "ratio_falls": falls,
            "ratio_trend_rho": float(rho),
            "faster_at_longest": faster,
        }
    if not g2:
        label = "not measured"
    elif all(v["ratio_falls"] and v["faster_at_longest"] for v in g2.values()):
        label = "supported"
    elif all(v["ratio_falls"] for v in g2.values()):
        label = "partly: the fp8/auto ITL ratio falls with length, but fp8 is not faster beyond noise at the longest"
    elif all(v["faster_at_longest"] for v in g2.values()):
        label = "partly: fp8 is faster at the longest length, but its ITL ratio does not fall steadily with length"
    else:
        label = "not supported"
    out["gains_grow"] = {"label": label, "by_dtype": g2}

    # 3. block size 256 beats 16 at the longest length
    bs = t.blocksize
    b3: dict[str, Any] = {}
    if len(bs):
        Lmax = int(bs.length.max())
        at = bs[bs.length == Lmax]
        unsupported = sorted({int(x) for x in at[at.outcome == "unsupported"].block_size})
        for dt, g in at[at.outcome == "ok"].groupby("kv_dtype", sort=False):
            best = g.loc[g.e2e_p50_s.idxmin()]
            small = g[g.block_size < 256]
            ref = small.loc[small.block_size.idxmin()] if len(small) else None
            big = g[g.block_size == 256]
            itl_ci = None
            if len(big) and ref is not None:
                from fp8lab import metrics

                rec = res.records
                gaps = [
                    metrics.explode_itl(
                        rec[
                            (rec.role == r.source)
                            & (rec.kv_dtype == dt)
                            & (rec.block_size == r.block_size)
                            & (rec.phase == f"ramp-c1-L{Lmax}")
                        ]
                    ).itl_s
                    for r in (ref, big.iloc[0])
                ]
                d = metrics.bootstrap_delta(gaps[0], gaps[1], "median", n_boot=1000, seed=plan.seed)
                itl_ci = {"delta": d.delta, "lo": d.lo, "hi": d.hi, "label": d.label.replace("B", "256")}
            b3[dt] = {
                "best_block_size": int(best.block_size),
                "length": Lmax,
                "itl_256_vs_smallest_ci": itl_ci,
                "e2e_256_over_smallest": float(big.e2e_p50_s.iloc[0] / ref.e2e_p50_s)
                if len(big) and ref is not None
                else np.nan,
                "itl_256_over_smallest": float(big.itl_p50_s.iloc[0] / ref.itl_p50_s)
                if len(big) and ref is not None
                else np.nan,
                "ttft_256_over_smallest": float(big.ttft_p50_s.iloc[0] / ref.ttft_p50_s)
                if len(big) and ref is not None
                else np.nan,
                "smallest": int(ref.block_size) if ref is not None else None,
            }
        sizes = sorted({int(x) for x in at[at.outcome == "ok"].block_size})
        best256 = bool(b3) and all(v["best_block_size"] == 256 for v in b3.values())
        if not b3 or 256 not in sizes:
            label = "not measured"
        elif 16 in sizes:
            label = "supported" if best256 else "not supported"
        else:  # 16 not measured (e.g. rejected by the backend): say what was compared
            label = f"256 {'fastest' if best256 else 'not fastest'} of {sizes}" + (
                " (16 unsupported)" if 16 in unsupported else ""
            )
        out["block256"] = {"label": label, "by_dtype": b3, "unsupported": unsupported, "sizes": sizes}
    else:
        out["block256"] = {"label": "not measured", "by_dtype": {}, "unsupported": [], "sizes": []}

    # 4. silent failure: divergence along the context, passkey
    tr = t.trend
    s4: dict[str, Any] = {}
    for dt in cands:
        x = tr[(tr.kv_dtype == dt) & (tr.source == "text")] if len(tr) else tr
        if len(x):
            x = x.iloc[0]
            s4[dt] = {
                "flip_rate": float(x.flip_rate),
                "abs_dlogprob": float(x.abs_dlogprob),
                "kl": float(x.kl),
                "last_over_first": float(x.last_over_first),
                "spearman_rho": float(x.spearman_rho),
                "grows_along_context": bool(x.spearman_rho > 0.5 and x.last_over_first > 1.25),
            }
    pk = t.passkey
    acc = pk.groupby("kv_dtype").correct.mean().to_dict() if len(pk) else {}
    base_can = bool(acc.get(BASELINE, 0) > 0)
    out["silent"] = {
        "label": (
            "divergence grows along the context"
            if any(v["grows_along_context"] for v in s4.values())
            else "no growth along the context"
            if s4
            else "not measured"
        ),
        "by_dtype": s4,
        "passkey_acc": acc,
        "baseline_can_retrieve": base_can,
    }

    # 5. random tokens
    rt = t.random
    r5: dict[str, Any] = {}
    if len(rt):
        tim = rt[rt.what == "timing"]
        dv = rt[rt.what == "divergence"]
        ti = tim.set_index("kv_dtype") if len(tim) else None
        r5 = {
            "timing_ttft_ratio": ti.ttft_ratio.to_dict() if ti is not None else {},
            "timing_itl_ratio": ti.itl_p50_ratio.to_dict() if ti is not None else {},
            "noise_ttft_ratio": ti.noise_ttft_ratio.to_dict() if ti is not None and "noise_ttft_ratio" in ti else {},
            "noise_itl_ratio": ti.noise_itl_p50_ratio.to_dict()
            if ti is not None and "noise_itl_p50_ratio" in ti
            else {},
            "divergence_ratio": dv.set_index("kv_dtype").abs_dlogprob_ratio.to_dict() if len(dv) else {},
            "flip_ratio": dv.set_index("kv_dtype").flip_rate_ratio.to_dict() if len(dv) else {},
        }
    parts5 = []
    if r5.get("divergence_ratio"):
        parts5.append(
            "quality: random tokens show x"
            + "/".join(f"{v:.2f}" for v in r5["divergence_ratio"].values())
            + " of real text's FP8 error"
        )
    if r5.get("timing_ttft_ratio"):
        dev = {d: max(abs(v - 1), abs(r5["timing_itl_ratio"][d] - 1)) for d, v in r5["timing_ttft_ratio"].items()}
        nz = {
            d: max(abs(r5["noise_ttft_ratio"].get(d, np.nan) - 1), abs(r5["noise_itl_ratio"].get(d, np.nan) - 1))
            for d in dev
        }
        r5["timing_within_noise"] = all(np.isfinite(nz[d]) and dev[d] <= max(nz[d], 0.05) for d in dev)
        parts5.append("speed: " + ("the same within noise" if r5["timing_within_noise"] else "differs beyond noise"))
    out["random_tokens"] = {"label": "; ".join(parts5) if parts5 else "not measured", **r5}
    return out


def verdict_markdown(res: LongCtxResult, t: Tables, c: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The verdict, one paragraph per claim, every number from the tables."""
    plan = res.plan
    c = claims(res, t) if c is None else c
    budget = f"{plan.kv_cache_gib:g} GiB" if plan.kv_cache_gib else "vLLM's own sizing"
    lines = ["### Verdict", ""]
    for note in res.notes:  # what was not measured natively on this device, and why
        lines += [f"*{note}*", ""]
    o = c["oom"]
    parts = [f"`{dt}` holds up to {_k(v)} tokens" for dt, v in o["longest"].items()]
    lines.append(
        f'**1. "bf16 runs out of memory where fp8 keeps going" — {o["label"]}.** With a KV budget of {budget} '
        f"and block size {res.block_size}: "
        + "; ".join(parts)
        + f" in one sequence (the ramp needs {_k(plan.max_context)})."
    )
    if o["longest_held_at_concurrency"]:
        parts = [
            f"`{dt}` {_k(v) + ' tokens' if v else 'none of the lengths'}"
            for dt, v in o["longest_held_at_concurrency"].items()
        ]
        lines.append(
            f"At {plan.concurrency} requests at once, the longest length whose requests all ran together without "
            "preemption: " + "; ".join(parts) + "."
        )
    lines.append("")
    g = c["gains_grow"]
    lines.append(f'**2. "FP8\'s gains grow with context length" — {g["label"]}.**')
    for dt, v in g["by_dtype"].items():
        lo, hi = v["itl_ci_longest"]
        cx = v["crossover_measured"]
        lines.append(
            f"- `{dt}` / `auto`, one request at a time: ITL median ratio {v['itl_ratio_shortest']:.3f} at "
            f"{_k(v['shortest'])} tokens, {v['itl_ratio_longest']:.3f} at {_k(v['longest'])} "
            f"({_pct(v['itl_delta_longest'])}, 95% CI over this run's inter-token gaps {_pct(lo)} to {_pct(hi)}: "
            f"{v['itl_label_longest']}; engine-to-engine variation is not in it); "
            f"TTFT ratio {v['ttft_ratio_shortest']:.3f} → {v['ttft_ratio_longest']:.3f}; rank correlation of the "
            f"ITL ratio with length over all {len(t.speed[(t.speed.kv_dtype == dt) & (t.speed.concurrency == 1)])} "
            f"lengths {v['ratio_trend_rho']:+.2f}. ITL grows by "
            f"{1e9 * v['itl_slope_auto']:,.0f} (auto) vs {1e9 * v['itl_slope_cand']:,.0f} ({dt}) µs per 1,000 tokens of context. "
            + (
                f"`{dt}` is faster in ITL from {_k(cx)} tokens on (measured)."
                if cx is not None and pd.notna(cx)
                else f"`{dt}` is not faster in ITL at the longest length measured."
            )
        )
    lines.append("")
    b3 = c["block256"]
    lines.append(
        f'**3. "Block size 256 beats 16 at 128K" — {b3["label"]}.** Block sizes that ran: {b3["sizes"]}.'
        + (f" Rejected by the attention backend: {b3['unsupported']}." if b3["unsupported"] else "")
    )
    for dt, v in b3["by_dtype"].items():
        ci = v.get("itl_256_vs_smallest_ci")
        if v["smallest"] is None or not np.isfinite(v["e2e_256_over_smallest"]):
            lines.append(
                f"- `{dt}` at {_k(v['length'])} tokens: fastest E2E with block size {v['best_block_size']}; no "
                "block size below 256 ran at this length, so there is no ratio to report."
            )
            continue
        lines.append(
            f"- `{dt}` at {_k(v['length'])} tokens: fastest E2E with block size {v['best_block_size']}; 256 vs "
            f"{v['smallest']}: E2E x{v['e2e_256_over_smallest']:.3f}, ITL x{v['itl_256_over_smallest']:.3f}"
            + (f" ({_pct(ci['delta'])}, 95% CI {_pct(ci['lo'])} to {_pct(ci['hi'])}: {ci['label']})" if ci else "")
            + f", TTFT x{v['ttft_256_over_smallest']:.3f} (one request each: no interval)."
        )
    lines.append("")
    s = c["silent"]
    lines.append(f"**4. Silent failure — {s['label']}.**")
    for dt, v in s["by_dtype"].items():
        lines.append(
            f"- `{dt}` vs `auto`, teacher-forced on real text up to {_k(plan.doc_length)} tokens: top-1 flips at "
            f"{100 * v['flip_rate']:.2f}% of positions, mean |Δ logprob| {v['abs_dlogprob']:.4f} nats, KL ≥ "
            f"{v['kl']:.2e}; last bin / first bin {v['last_over_first']:.2f}, Spearman ρ with position "
            f"{v['spearman_rho']:.2f}. No error is raised either way: this is the silent part."
        )
    nll = t.trend[t.trend.source == "text"] if len(t.trend) else t.trend
    if len(nll):
        first = t.bypos[(t.bypos.source == "text")].sort_values("pos_bin")
        lines.append(
            f"- The model itself: `auto`'s NLL per token is {nll.nll_base_first.iloc[0]:.2f} nats in the first "
            f"{_k(first.pos_bin.iloc[1]) if len(first) > 1 else ''}-token bin and {nll.nll_base_last.iloc[0]:.2f} "
            "in the last: a model that does not use its far context cannot show what FP8 does to it there."
        )
    if s["passkey_acc"]:
        accs = ", ".join(f"`{dt}` {100 * a:.0f}%" for dt, a in s["passkey_acc"].items())
        lines.append(
            f"- Passkey retrieval (lengths {list(plan.passkey_lengths)}, depths {list(plan.passkey_depths)}): {accs}. "
            + (
                ""
                if s["baseline_can_retrieve"]
                else "The baseline itself never retrieves the key, so this model cannot show an FP8 retrieval loss: "
                "the check is kept for real models on a GPU."
            )
        )
    lines.append("")
    r5 = c["random_tokens"]
    lines.append(f'**5. "128K tests with random tokens are worthless" — {r5["label"]}.**')
    if r5.get("timing_ttft_ratio"):
        lines.append(
            "- Timing, random-token prompt / real-text prompt of the same length (run just before and after "
            "it): TTFT "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["timing_ttft_ratio"].items())
            + ", ITL "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["timing_itl_ratio"].items())
            + "; those two real-text runs against each other: TTFT "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["noise_ttft_ratio"].items())
            + ", ITL "
            + ", ".join(f"`{d}` x{v:.3f}" for d, v in r5["noise_itl_ratio"].items())
            + ". "
            + (
                "The random-token difference is within that run-to-run noise (or 5%): for speed and memory, "
                "random tokens measure the same thing."
                if r5["timing_within_noise"]
                else "The random-token difference exceeds that run-to-run noise here."
            )
        )
    if r5.get("divergence_ratio"):
        lines.append(
            "- FP8 error measured on random tokens / on real text: |Δ logprob| "
            + ", ".join(f"`{d}` x{v:.2f}" for d, v in r5["divergence_ratio"].items())
            + ", top-1 flips "
            + ", ".join(f"`{d}` x{v:.2f}" for d, v in r5["flip_ratio"].items())
            + ": a random-token test does not measure the error real text sees."
        )
    return "\n".join(lines)


def summary_values(res: LongCtxResult, t: Tables, c: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The notebook's machine-readable key numbers (``record_summary``)."""
    plan = res.plan
    c = claims(res, t) if c is None else c
    s: dict[str, Any] = {
        "model": Path(plan.model).name,
        "load_format": plan.load_format,
        "kv_dtypes": list(plan.kv_dtypes),
        "lengths": list(plan.lengths),
        "max_context": plan.max_context,
        "output_tokens": plan.output_tokens,
        "concurrency": plan.concurrency,
        "block_size": res.block_size,
        "kv_cache_gib": plan.kv_cache_gib,
        "engines": len(res.runs),
        "engines_started": int((~res.engines.cached).sum()) if len(res.engines) else 0,
        "engine_statuses": res.engines.groupby(["role", "status"]).size().rename(lambda x: x).to_dict()
        if len(res.engines)
        else {},
        "study_wall_s": res.wall_s,
    }
    s["engine_statuses"] = {f"{k[0]}.{k[1]}": int(v) for k, v in s["engine_statuses"].items()}
    for _, b in t.boundary.iterrows():
        dt = b.kv_dtype
        for col in ("num_blocks_formula", "num_blocks_engine", "longest_formula", "longest_engine", "longest_measured"):
            s[f"{dt}.{col}"] = None if pd.isna(b[col]) else int(b[col])
        s[f"{dt}.over_status"] = b.over_status
        s[f"{dt}.holds_ramp"] = bool(b.holds_ramp)
    for _, r in t.ramp.iterrows():
        key = f"{r.kv_dtype}.c{r.concurrency}.L{r.length}"
        s[f"{key}.outcome"] = r.outcome
        for m in (
            "ttft_p50_s",
            "itl_p50_s",
            "itl_p95_s",
            "e2e_p50_s",
            "preemptions",
            "kv_usage_peak",
            "mem_peak_bytes",
        ):
            if m in r and pd.notna(r[m]):
                s[f"{key}.{m}"] = r[m]
    for _, r in t.frontier.iterrows():
        for m in ("max_conc_formula", "max_conc_engine", "max_conc_measured"):
            if pd.notna(r[m]):
                s[f"{r.kv_dtype}.{m}.L{r.length}"] = int(r[m])
    for _, r in t.growth.iterrows():
        for m in ("a", "b", "c", "r2", "exponent"):
            s[f"{r.kv_dtype}.fit.{r.metric}.{m}"] = r[m]
    for _, r in t.crossover.iterrows():
        s[f"{r.kv_dtype}.crossover.{r.metric}.measured"] = None if pd.isna(r.measured) else int(r.measured)
        s[f"{r.kv_dtype}.crossover.{r.metric}.fitted"] = r.fitted
        s[f"{r.kv_dtype}.ratio_at_longest.{r.metric}"] = r.ratio_at_longest
    for _, r in t.blocksize.iterrows():
        key = f"{r.kv_dtype}.bs{r.block_size}.L{r.length}"
        s[f"{key}.outcome"] = r.outcome
        if r.outcome == "ok":
            for m in ("ttft_p50_s", "itl_p50_s", "e2e_p50_s"):
                s[f"{key}.{m}"] = r[m]
    for _, r in t.trend.iterrows():
        for m in (
            "flip_rate",
            "abs_dlogprob",
            "kl",
            "last_over_first",
            "spearman_rho",
            "nll_base_first",
            "nll_base_last",
        ):
            s[f"{r.kv_dtype}.{r.source}.div.{m}"] = r[m]
    if len(t.passkey):
        for (dt, L), a in t.passkey.groupby(["kv_dtype", "length"]).correct.mean().items():
            s[f"{dt}.passkey.L{L}"] = a
    for k, v in c.items():
        s[f"claim.{k}"] = v["label"]
    s["claim.block256.unsupported"] = c["block256"]["unsupported"]
    s["silent.baseline_can_retrieve"] = c["silent"]["baseline_can_retrieve"]
    for k in ("timing_ttft_ratio", "timing_itl_ratio", "divergence_ratio", "flip_ratio"):
        for dt, v in c["random_tokens"].get(k, {}).items():
            s[f"{dt}.random.{k}"] = v
    if res.notes:
        s["not_measured"] = " ".join(res.notes)
        s["emulated"] = list(res.emulated)
    return s
