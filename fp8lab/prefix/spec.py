"""Study 07's spec: the workloads' token shapes (:class:`Shape`, :func:`parse_workloads`) and
:class:`PrefixSpec`, the sweep and the engines that serve it, validated before any engine starts (field, value and
what is allowed, :class:`fp8lab.specs.SpecError`; a KV budget too small for the sweep is refused here, by the
block arithmetic of :mod:`fp8lab.prefix.predict`). Built from a notebook's parameters by
:meth:`PrefixSpec.from_params`; :meth:`PrefixSpec.descriptor` names the run in the store."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from fp8lab import kvmath
from fp8lab.engine.schedule import ARMS, EngineSet, abba_schedule
from fp8lab.prefix.predict import conversation_blocks
from fp8lab.specs import (
    BLOCK_SIZES,
    EngineSpec,
    LoadFormat,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_kv_dtype,
)

STUDY = "07_prefix"
PROTOCOL = 1
WorkloadKind = Literal["chat", "system", "json"]
PromptSource = Literal["text", "random"]
CPU_DEFAULT_BLOCK = 128  # vLLM's CPU default block size (vllm-notes section 3); GPU: 16


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

    Engine-level replication (issue 35; :mod:`fp8lab.engine.schedule`, as Study 06): ``engines``: fresh engines per
    dtype and arm (rounds, started in ABBA order; 1: one engine per dtype serving every trial, the design before issue
    35); ``arms``: ``colocated`` (a round's engines alive together, ``gpu_memory_utilization`` each) and/or ``solo``
    (one engine at a time at ``solo_gpu_memory_utilization``, vLLM's default 0.9). Both arms keep ``kv_cache_gib``:
    the KV budget is the variable this study sweeps against, so an arm differs only in what shares the device. With
    ``engines`` of 2 or more, ``trials`` (per engine) may be 1: the engines carry the interval. ``engine_set``: the
    one engine set (:attr:`fp8lab.engine.schedule.EngineSet.key`) a replicated run's sub-run measures (set by
    :mod:`fp8lab.prefix.replication`, never by a notebook).
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
    engines: int = 1
    arms: tuple[str, ...] = ("colocated",)
    solo_gpu_memory_utilization: float = 0.9
    engine_set: str | None = None

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
            check_kv_dtype(obj, "kv_dtypes", d)
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
        check_int(obj, "engines", self.engines, 1, 100)
        if (
            not isinstance(self.arms, (list, tuple))
            or not self.arms
            or any(a not in ARMS for a in self.arms)
            or len(set(self.arms)) != len(self.arms)
        ):
            raise SpecError(obj, "arms", self.arms, f"a non-empty list of distinct values of {list(ARMS)}")
        object.__setattr__(self, "arms", tuple(self.arms))
        check_float(obj, "solo_gpu_memory_utilization", self.solo_gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        if self.engine_set is not None and not isinstance(self.engine_set, str):
            raise SpecError(obj, "engine_set", self.engine_set, "None or an engine set's key, e.g. 'solo/r0/auto'")
        check_int(obj, "trials", self.trials, 1 if self.engines >= 2 or self.engine_set else 2, 1000)
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
    @property
    def replicated(self) -> bool:
        """The issue-35 design (more than one engine per dtype, or a solo arm), as opposed to one engine per dtype."""
        return self.engines > 1 or self.arms != ("colocated",)

    def schedule(self) -> list[EngineSet]:
        """The engine sets in the order they start (:func:`fp8lab.engine.schedule.abba_schedule`)."""
        return abba_schedule(self.kv_dtypes, self.engines, self.arms, colocate=self.concurrent_engines)

    @property
    def headline_arm(self) -> str:
        """The arm the headline reports: ``solo`` (what a user deploys) where it runs, else ``colocated``."""
        return "solo" if "solo" in self.arms else "colocated"

    def set_spec(self, es: EngineSet) -> PrefixSpec:
        """The spec of one engine set's sub-run: its dtypes in start order (the worker alternates from there), one
        engine each, the arm's memory setting, and ``engine_set`` naming it (its own run in the store)."""
        return dataclasses.replace(
            self,
            kv_dtypes=es.configs,
            engines=1,
            arms=("colocated",),
            engine_set=es.key,
            concurrent_engines=True,
            gpu_memory_utilization=self.solo_gpu_memory_utilization
            if es.arm == "solo"
            else self.gpu_memory_utilization,
        )

    def effective_block_size(self) -> int:
        """The block size the engines will use: as given, else vLLM's platform default (16 with an NVIDIA GPU,
        found through NVML without touching CUDA; 128 on CPU). The engines report theirs: the summary compares."""
        if self.block_size:
            return self.block_size
        from fp8lab.engine.devices import gpu_facts

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
        """What determines the outcome (hashed to name the run): the spec with its model as given
        (:func:`fp8lab.engine.results.model_ref`) and what that model is (``model_digest``), the protocol, and the vLLM and
        torch versions, engine-side code and this study's worker (:func:`fp8lab.engine.results.run_versions`)."""
        from fp8lab.engine.results import study_descriptor

        d = dataclasses.asdict(self)
        d.pop("timeout_s")
        if not self.replicated:  # the design before issue 35 (and one engine set's sub-run): its descriptor as it was
            for k in ("engines", "arms", "solo_gpu_memory_utilization"):
                d.pop(k)
        if self.engine_set is None:
            d.pop("engine_set")
        return study_descriptor(STUDY, PROTOCOL, d, self.model, self.load_format, ("prefix/worker.py",))
