"""Study 06's spec: :class:`DecodeSpec` (the decode grid and the engines that measure it, validated,
``from_params``, ``descriptor``), the grid as a table (:func:`plan`: which points are measured, and why not) and each
point's extra tokens (:func:`margin`). The bottom of the study: it imports no other module of
:mod:`fp8lab.decode`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from fp8lab import kvmath
from fp8lab.engine.schedule import ARMS, EngineSet, abba_schedule
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

STUDY = "06_decode"


PROTOCOL = 1  # bump when the measurement changes, so stored runs of the old protocol are not reused


def _ints(obj: str, name: str, values: Any, lo: int, hi: int) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)) or not values:
        raise SpecError(obj, name, values, f"a non-empty list of integers in [{lo}, {hi}]")
    for v in values:
        check_int(obj, name, v, lo, hi)
    if len(set(values)) != len(values):
        raise SpecError(obj, name, values, "distinct values")
    return tuple(sorted(int(v) for v in values))


@dataclass(frozen=True)
class DecodeSpec:
    """The decode grid and the engines that measure it.

    ``contexts``: prompt lengths in tokens; ``batches``: sequences decoding together; ``reps``: paired
    repetitions per point (at least 3; 5 or more for an interval worth reporting); ``decode_tokens``: the
    measured generation's length (its ``n - 1`` steps are averaged); ``kv_cache_gib``: KV budget of each
    engine in GiB (``None``: vLLM sizes it); ``max_prefill_tokens``: points with ``batch x context`` above
    it are not measured (prefill would dominate the run's time); ``concurrent_engines``: keep every dtype's
    engine alive at once and interleave them (needs memory for two engines); ``gpu_groups``: GPU index
    lists, one worker each, the grid's batches shared among them (``None``: one worker, devices as visible);
    ``engine_args``: further ``vllm.LLM`` keyword arguments, as given (e.g. ``disable_custom_all_reduce``).

    Engine-level replication (issue 35; :mod:`fp8lab.engine.schedule`): ``engines``: fresh engines per dtype and
    arm (rounds, started in ABBA order; 1: one engine per dtype, its repetitions the only replication, the design
    before issue 35); ``arms``: ``colocated`` (a round's engines alive together with the memory settings above, or
    one after the other with ``concurrent_engines`` off) and/or ``solo`` (one engine at a time with
    ``solo_gpu_memory_utilization`` and ``solo_kv_cache_gib``: by default vLLM's own, 0.9 and sized by vLLM).
    With ``engines`` of 3 or more, ``reps`` may be 2 (the engines carry the interval).
    """

    model: str
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    contexts: tuple[int, ...] = (1024, 2048, 4096, 8192)
    batches: tuple[int, ...] = (1, 8, 32)
    reps: int = 5
    decode_tokens: int = 64
    warmup: int = 1
    kv_cache_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_batched_tokens: int = 16384
    max_prefill_tokens: int | None = None
    block_size: int | None = None
    enforce_eager: bool = False
    load_format: LoadFormat = "auto"
    skip_tokenizer_init: bool = False
    tensor_parallel_size: int = 1
    attention_backend: str | None = None
    concurrent_engines: bool = True
    gpu_groups: tuple[tuple[int, ...], ...] | None = None
    seed: int = 0
    timeout_s: float = 3600.0
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    engines: int = 1
    arms: tuple[str, ...] = ("colocated",)
    solo_gpu_memory_utilization: float = 0.9
    solo_kv_cache_gib: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise SpecError("DecodeSpec", "model", self.model, "a model folder, a config.json's folder, or a hub id")
        if not isinstance(self.kv_dtypes, (list, tuple)) or not self.kv_dtypes:
            raise SpecError("DecodeSpec", "kv_dtypes", self.kv_dtypes, "a non-empty list of KV dtypes")
        for d in self.kv_dtypes:
            check_kv_dtype("DecodeSpec", "kv_dtypes", d)
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        object.__setattr__(self, "contexts", _ints("DecodeSpec", "contexts", self.contexts, 16, 10_000_000))
        object.__setattr__(self, "batches", _ints("DecodeSpec", "batches", self.batches, 1, 4096))
        check_int("DecodeSpec", "engines", self.engines, 1, 100)
        check_int("DecodeSpec", "reps", self.reps, 2 if self.engines >= 3 else 3, 1000)
        if (
            not isinstance(self.arms, (list, tuple))
            or not self.arms
            or any(a not in ARMS for a in self.arms)
            or len(set(self.arms)) != len(self.arms)
        ):
            raise SpecError("DecodeSpec", "arms", self.arms, f"a non-empty list of distinct values of {list(ARMS)}")
        object.__setattr__(self, "arms", tuple(self.arms))
        check_float(
            "DecodeSpec", "solo_gpu_memory_utilization", self.solo_gpu_memory_utilization, 0.0, 1.0, lo_open=True
        )
        check_float("DecodeSpec", "solo_kv_cache_gib", self.solo_kv_cache_gib, 0.0, 1e5, lo_open=True, optional=True)
        check_int("DecodeSpec", "decode_tokens", self.decode_tokens, 8, 100_000)
        check_int("DecodeSpec", "warmup", self.warmup, 0, 100)
        check_int("DecodeSpec", "max_prefill_tokens", self.max_prefill_tokens, 1, 10**9, optional=True)
        check_int("DecodeSpec", "max_num_batched_tokens", self.max_num_batched_tokens, 16, 10_000_000)
        if self.block_size is not None:
            check_choice("DecodeSpec", "block_size", self.block_size, BLOCK_SIZES)
        check_bool("DecodeSpec", "concurrent_engines", self.concurrent_engines)
        check_float("DecodeSpec", "timeout_s", self.timeout_s, 0.0, 86400.0, lo_open=True)
        if self.gpu_groups is not None:
            groups = self.gpu_groups
            if (
                not isinstance(groups, (list, tuple))
                or not groups
                or not all(isinstance(g, (list, tuple)) and g for g in groups)
            ):
                raise SpecError("DecodeSpec", "gpu_groups", groups, "None or a list of non-empty GPU index lists")
            for g in groups:
                if len(g) != self.tensor_parallel_size:
                    raise SpecError(
                        "DecodeSpec",
                        "gpu_groups",
                        groups,
                        f"groups of tensor_parallel_size = {self.tensor_parallel_size} GPUs each",
                    )
                for i in g:
                    check_int("DecodeSpec", "gpu_groups", i, 0, 63)
            object.__setattr__(self, "gpu_groups", tuple(tuple(int(i) for i in g) for g in groups))
        if not isinstance(self.engine_args, dict) or not all(isinstance(k, str) for k in self.engine_args):
            raise SpecError("DecodeSpec", "engine_args", self.engine_args, "a dict of vllm.LLM keyword arguments")
        for d in self.kv_dtypes:  # the engine fields are checked by EngineSpec itself, once per dtype and arm
            for arm in self.arms:
                self.engine_spec(d, arm)

    @property
    def replicated(self) -> bool:
        """The issue-35 design (more than one engine per dtype, or a solo arm), as opposed to one engine per dtype."""
        return self.engines > 1 or self.arms != ("colocated",)

    def schedule(self) -> list[EngineSet]:
        """The engines in the order they start (:func:`fp8lab.engine.schedule.abba_schedule`)."""
        return abba_schedule(self.kv_dtypes, self.engines, self.arms, colocate=self.concurrent_engines)

    def engine_spec(self, kv_dtype: str, arm: str = "colocated") -> EngineSpec:
        """The engine of ``kv_dtype`` in ``arm`` (``solo``: the solo memory settings)."""
        solo = arm == "solo"
        return EngineSpec(
            model=self.model,
            kv_cache_dtype=kv_dtype,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.solo_gpu_memory_utilization if solo else self.gpu_memory_utilization,
            kv_cache_gib=self.solo_kv_cache_gib if solo else self.kv_cache_gib,
            max_num_seqs=max(self.batches),
            max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
            load_format=self.load_format,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
            enable_prefix_caching=False,
            skip_tokenizer_init=self.skip_tokenizer_init,
            attention_backend=self.attention_backend,
            timeout_s=self.timeout_s,
        )

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> DecodeSpec:
        """From a notebook's UPPER_CASE parameters (unknown names are ignored; missing ones take defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k.lower(): v for k, v in params.items() if k.lower() in names}
        if "tp" in {k.lower() for k in params}:
            kw["tensor_parallel_size"] = params.get("TP", params.get("tp"))
        for k in ("kv_cache_gib", "solo_kv_cache_gib"):
            if k in kw and isinstance(kw[k], int):
                kw[k] = float(kw[k])
        spec = cls(**kw)
        return spec if spec.max_model_len is not None else fit_model_len(spec)

    def descriptor(self) -> dict[str, Any]:
        """What determines the outcome: the spec with its model as given (:func:`fp8lab.engine.results.model_ref`, so a store
        loads on another machine or checkout) and what that model is (``model_digest``), the protocol, and the vLLM
        and torch versions, engine-side code and this study's worker (another vLLM or an edited worker measures
        anew; :func:`fp8lab.engine.results.run_versions`)."""
        from fp8lab.engine.results import study_descriptor

        d = dataclasses.asdict(self)
        d.pop("timeout_s")
        if not self.replicated:  # the design before issue 35: its descriptor as it was
            for k in ("engines", "arms", "solo_gpu_memory_utilization", "solo_kv_cache_gib"):
                d.pop(k)
        return study_descriptor(STUDY, PROTOCOL, d, self.model, self.load_format, ("decode/worker.py",))


def margin(spec: DecodeSpec, batch: int, context: int) -> int:
    """Extra tokens every request but the last asks for: more than the steps the batch's prefill can take
    (``batch x context`` prompt tokens in chunks of the token budget less one decode token per sequence)."""
    per_step = max(spec.max_num_batched_tokens - batch, 1)
    return math.ceil(batch * context / per_step) + 4


def fit_model_len(spec: DecodeSpec) -> DecodeSpec:
    """``spec`` with ``max_model_len`` set to the longest sequence its grid asks for among those within the model's
    ``max_position_embeddings`` (``MAX_MODEL_LEN: null``, as the gpu-quick profile gives it for any model: a 8K-position
    model measures its contexts up to 8K, a 40K one up to the grid's top, and the engine never reserves a
    128K-position model's full window); unchanged when the config cannot be read or nothing fits."""
    try:
        limit = kvmath.load_layout(spec.engine_spec(spec.kv_dtypes[0]).model).config.get("max_position_embeddings")
    except Exception:  # noqa: BLE001 - the engine's own check names a model it cannot read
        return spec
    needs = [c + spec.decode_tokens + margin(spec, b, c) for b in spec.batches for c in spec.contexts]
    fits = [n for n in needs if not limit or n <= limit]
    return dataclasses.replace(spec, max_model_len=max(fits)) if fits else spec


def plan(spec: DecodeSpec) -> Any:
    """The grid as a table: ``batch, context_len, measure`` (bool) and ``reason`` for each point left out.

    A point is left out when a sequence does not fit ``max_model_len`` (as given, else the config's
    ``max_position_embeddings``), when the batch's KV does not fit the KV budget of the dtype with the least
    capacity (by the formula; only when ``kv_cache_gib`` is set), or when ``batch x context`` exceeds
    ``max_prefill_tokens``."""
    import pandas as pd

    lay = kvmath.load_layout(spec.engine_spec(spec.kv_dtypes[0]).model)
    limit = spec.max_model_len or lay.config.get("max_position_embeddings")
    block = spec.block_size or 16
    cap = None
    if spec.kv_cache_gib is not None:
        cap = min(
            kvmath.capacity_tokens(lay, int(spec.kv_cache_gib * 2**30), block, d, spec.tensor_parallel_size)
            for d in spec.kv_dtypes
        )
    rows = []
    for b in spec.batches:
        for c in spec.contexts:
            m = margin(spec, b, c)
            need_len = c + spec.decode_tokens + m
            reason = None
            if limit and need_len > limit:
                reason = f"{need_len} tokens per sequence > max_model_len {limit}"
            elif cap is not None and b * (need_len + block) > cap:
                reason = f"batch KV {b} x {need_len} tokens > {cap} tokens of KV budget"
            elif spec.max_prefill_tokens and b * c > spec.max_prefill_tokens:
                reason = f"prefill {b * c} tokens > max_prefill_tokens {spec.max_prefill_tokens}"
            rows.append({"batch": b, "context_len": c, "margin": m, "measure": reason is None, "reason": reason})
    return pd.DataFrame(rows)
