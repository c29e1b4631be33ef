"""Study 01's specs: :class:`ServingPlan` (everything the paired A/B study runs, validated), the notebook's
parameters -> a plan (:func:`plan_from_params`), and :class:`ServingSpec`, the plan with the notebook's two side
measurements (the roofline's memory bandwidth and the fidelity check against ``vllm bench throughput``), which is
the study contract's ``Spec`` (:mod:`fp8lab.serving.study`). The bottom of the study: it imports no other module of
:mod:`fp8lab.serving`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fp8lab.engine.schedule import ARMS, EngineSet, abba_schedule
from fp8lab.specs import (
    EngineSpec,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_kv_dtype,
)
from fp8lab.workloads import REPORT_MIX, PromptSource, RequestClass, parse_mix

Arrival = Literal["constant", "poisson"]


STUDY = "01_kv_dtype_auto_vs_fp8"


#: vLLM's default block size when none is given: 16 on GPU, 128 on the CPU backend (vllm-notes section 3).
DEFAULT_BLOCK_SIZE = {"gpu": 16, "cpu": 128}


def on_gpu() -> bool:
    from fp8lab.engine.devices import gpu_facts  # NVML only: never initialises CUDA in the caller

    return bool(gpu_facts())


def default_block_size() -> int:
    return DEFAULT_BLOCK_SIZE["gpu" if on_gpu() else "cpu"]


@dataclass(frozen=True)
class ServingPlan:
    """Everything the serving study runs. ``engine`` is the base engine; each arm replaces its
    ``kv_cache_dtype`` with one of ``kv_dtypes`` (the first is the baseline A, the others are B).

    ``concurrency``: closed-loop sweep (``()`` = powers of two up to the KV capacity limit of the
    mix's mean request at the largest-capacity dtype, see :func:`resolve_concurrency`);
    ``closed_loop_requests`` requests per sweep point (at least the point's concurrency). ``rates`` (requests/s) x ``arrivals`` give the
    open-loop phases of ``open_loop_requests`` requests each. ``capacity_shape = (input, output)``
    tokens of the capacity search (``None``: no search); its ladder is the formula's prediction
    ``P`` with ``P - 1``, ``P + 1`` and ``round(P x f)`` for ``f`` in ``capacity_factors``.
    ``naive_concurrency``: closed-loop points also run by the benchmark that does not read the stream
    (phases ``naive-c<N>``, the same requests as ``closed-c<N>``, on the same engines; claim 8 of the audit).
    ``prompt_source``: ``"text"`` (held-out text, needs the model's tokenizer) | ``"random"`` (dummy
    weights). ``seed`` seeds the request draws; every arm and trial gets the same requests.

    Closed-loop phases are sustained: each runs until at least ``max(closed_loop_requests, 4 x N)``
    requests have finished **and** ``phase_seconds`` have passed, holding ``N`` in flight to the end
    (:func:`min_requests`). ``warmup_requests`` run once per engine, before its first trial, and are
    discarded.

    Engine-level replication (issue 35; :mod:`fp8lab.engine.schedule`, as Study 06): ``engines``: fresh engine
    pairs per arm (rounds, started in ABBA order; 1: one engine per dtype serving every trial, the design before issue
    35); ``arms``: ``colocated`` (a round's engines alive together, phases interleaved as above) and/or ``solo`` (one
    engine at a time, its trials alone, at ``solo_gpu_memory_utilization``: vLLM's default 0.9). Both arms keep the
    engine's KV budget (``engine.kv_cache_gib``: the same bytes for both dtypes is what the capacity comparison
    rests on), so an arm differs only in what shares the device. ``trials`` are per engine; with ``engines`` of 2
    or more one is allowed (the engines carry the interval).
    """

    engine: EngineSpec
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    mix: tuple[RequestClass, ...] = REPORT_MIX
    concurrency: tuple[int, ...] = ()
    closed_loop_requests: int = 64
    rates: tuple[float, ...] = ()
    arrivals: tuple[str, ...] = ("constant", "poisson")
    open_loop_requests: int = 64
    warmup_requests: int = 50
    trials: int = 3
    capacity_shape: tuple[int, int] | None = (64, 128)
    capacity_factors: tuple[float, ...] = (0.5, 1.5)
    capacity_trials: int = 1
    naive_concurrency: tuple[int, ...] = ()
    prompt_source: PromptSource = "text"
    seed: int = 0
    phase_seconds: float = 0.0
    engines: int = 1
    arms: tuple[str, ...] = ("colocated",)
    solo_gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if not isinstance(self.engine, EngineSpec):
            raise SpecError("ServingPlan", "engine", type(self.engine).__name__, "an fp8lab.specs.EngineSpec")
        setf = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        setf("kv_dtypes", tuple(self.kv_dtypes))
        for d in self.kv_dtypes:
            check_kv_dtype(self, "kv_dtypes", d)
        if len(set(self.kv_dtypes)) < 2 or len(set(self.kv_dtypes)) != len(self.kv_dtypes):
            raise SpecError(
                "ServingPlan",
                "kv_dtypes",
                self.kv_dtypes,
                "at least two distinct kv dtypes; the first is the baseline, e.g. ['auto', 'fp8']",
            )
        setf("mix", parse_mix(self.mix))
        setf("concurrency", tuple(sorted(set(self.concurrency or ()))))
        for c in self.concurrency:
            check_int(self, "concurrency", c, 1, 100_000)
        check_int(self, "closed_loop_requests", self.closed_loop_requests, 1, 10_000_000)
        setf(
            "rates", tuple(float(r) if isinstance(r, int) and not isinstance(r, bool) else r for r in self.rates or ())
        )
        for r in self.rates:
            check_float(self, "rates", r, 0.0, 1e6, lo_open=True)
        setf("arrivals", tuple(self.arrivals))
        if self.rates and not self.arrivals:
            raise SpecError(
                "ServingPlan", "arrivals", self.arrivals, "at least one of constant | poisson when rates are given"
            )
        for a in self.arrivals:
            check_choice(self, "arrivals", a, Arrival)
        check_int(self, "open_loop_requests", self.open_loop_requests, 2, 10_000_000)
        check_int(self, "warmup_requests", self.warmup_requests, 0, 10_000_000)
        check_int(self, "engines", self.engines, 1, 100)
        if (
            not isinstance(self.arms, (list, tuple))
            or not self.arms
            or any(a not in ARMS for a in self.arms)
            or len(set(self.arms)) != len(self.arms)
        ):
            raise SpecError("ServingPlan", "arms", self.arms, f"a non-empty list of distinct values of {list(ARMS)}")
        setf("arms", tuple(self.arms))
        check_float(self, "solo_gpu_memory_utilization", self.solo_gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        # the minimum: 3 trials per configuration; with fresh engines per dtype the engines are the unit
        check_int(self, "trials", self.trials, 1 if self.engines >= 2 else 3, 1000)
        if self.capacity_shape is not None:
            shape = tuple(self.capacity_shape)
            if len(shape) != 2:
                raise SpecError("ServingPlan", "capacity_shape", self.capacity_shape, "[input_len, output_len] or None")
            for v in shape:
                check_int(self, "capacity_shape", v, 1, 10_000_000)
            setf("capacity_shape", shape)
        setf("capacity_factors", tuple(float(f) for f in self.capacity_factors))
        for f in self.capacity_factors:
            check_float(self, "capacity_factors", f, 0.0, 100.0, lo_open=True)
        check_int(self, "capacity_trials", self.capacity_trials, 0, self.trials)
        setf("naive_concurrency", tuple(sorted(set(self.naive_concurrency or ()))))
        for c in self.naive_concurrency:
            check_int(self, "naive_concurrency", c, 1, 100_000)
            if self.concurrency and c not in self.concurrency:
                raise SpecError(
                    "ServingPlan",
                    "naive_concurrency",
                    c,
                    f"a concurrency of the closed-loop sweep "
                    f"{list(self.concurrency)} (the two methods are compared at the same points)",
                )
        check_choice(self, "prompt_source", self.prompt_source, PromptSource)
        check_int(self, "seed", self.seed, 0, 2**31 - 1)
        if isinstance(self.phase_seconds, int) and not isinstance(self.phase_seconds, bool):
            setf("phase_seconds", float(self.phase_seconds))
        check_float(self, "phase_seconds", self.phase_seconds, 0.0, 86_400.0)
        limit = self.engine.max_model_len if self.engine.max_model_len not in (None, -1) else None
        shapes = [(c.name, c.input_len + c.output_len) for c in self.mix]
        if self.capacity_shape is not None:
            shapes.append(("capacity_shape", sum(self.capacity_shape)))
        for name, total in shapes:
            if limit is not None and total > limit:
                raise SpecError(
                    "ServingPlan",
                    f"mix[{name}]" if name != "capacity_shape" else name,
                    total,
                    f"input + output tokens at most engine.max_model_len = {limit}",
                )

    @property
    def baseline(self) -> str:
        return self.kv_dtypes[0]

    def spec_for(self, kv_dtype: str, arm: str = "colocated") -> EngineSpec:
        """The engine of ``kv_dtype`` (``arm`` ``solo``: at ``solo_gpu_memory_utilization``)."""
        if arm == "solo":
            return self.engine.replace(kv_cache_dtype=kv_dtype, gpu_memory_utilization=self.solo_gpu_memory_utilization)
        return self.engine.replace(kv_cache_dtype=kv_dtype)

    @property
    def replicated(self) -> bool:
        """The issue-35 design (more than one engine per dtype, or a solo arm), as opposed to one engine per dtype."""
        return self.engines > 1 or self.arms != ("colocated",)

    def schedule(self) -> list[EngineSet]:
        """The engine sets in the order they start (:func:`fp8lab.engine.schedule.abba_schedule`)."""
        return abba_schedule(self.kv_dtypes, self.engines, self.arms)

    @property
    def headline_arm(self) -> str:
        """The arm the headline reports: ``solo`` (what a user deploys) where it runs, else ``colocated``."""
        return "solo" if "solo" in self.arms else "colocated"

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain values; without the replication's fields for one engine per dtype (the design
        before issue 35: its run keys as they were)."""
        d = dataclasses.asdict(self)
        d["engine"] = self.engine.to_dict()
        if not self.replicated:
            for k in ("engines", "arms", "solo_gpu_memory_utilization"):
                d.pop(k)
        return d


def plan_from_params(p: dict[str, Any]) -> ServingPlan:
    """The :class:`ServingPlan` of notebook 01's parameters (``MODEL``, ``KV_DTYPES``, ... as named in its
    ``parameters`` cell; bad values raise :class:`SpecError` naming the field)."""
    engine = EngineSpec(
        model=p["MODEL"],
        load_format=p["LOAD_FORMAT"],
        skip_tokenizer_init=p["SKIP_TOKENIZER_INIT"],
        kv_cache_gib=p["KV_CACHE_GIB"],
        gpu_memory_utilization=p["GPU_MEMORY_UTILIZATION"],
        max_model_len=p["MAX_MODEL_LEN"],
        block_size=p["BLOCK_SIZE"],
        max_num_seqs=p["MAX_NUM_SEQS"],
        enforce_eager=p["ENFORCE_EAGER"],
        seed=p["SEED"],
    )
    return ServingPlan(
        engine,
        kv_dtypes=p["KV_DTYPES"],
        mix=p["MIX"],
        concurrency=p["CONCURRENCY"],
        closed_loop_requests=p["CLOSED_LOOP_REQUESTS"],
        rates=p["RATES"],
        arrivals=p["ARRIVALS"],
        open_loop_requests=p["OPEN_LOOP_REQUESTS"],
        warmup_requests=p["WARMUP_REQUESTS"],
        trials=p["TRIALS"],
        capacity_shape=p["CAPACITY_SHAPE"],
        capacity_factors=p["CAPACITY_FACTORS"],
        naive_concurrency=p["NAIVE_CONCURRENCY"],
        prompt_source=p["PROMPT_SOURCE"],
        seed=p["SEED"],
        phase_seconds=p["PHASE_SECONDS"],
        engines=p.get("ENGINES", 1),  # issue 35's replication; absent: one engine per dtype, as before
        arms=p.get("ARMS", ("colocated",)),
        solo_gpu_memory_utilization=p.get("SOLO_GPU_MEMORY_UTILIZATION", 0.9),
    )


@dataclass(frozen=True)
class ServingSpec:
    """Study 01 as its notebook runs it: the paired study's ``plan`` (:class:`ServingPlan`) and the two side
    measurements beside it. ``bandwidth_gbs``: the memory bandwidth of the roofline bound in GB/s (1e9 B/s),
    ``None`` or ``"measure"`` to measure it once (:func:`fp8lab.engine.bandwidth.resolve_bandwidth`); ``run_fidelity``:
    also compare fp8lab's offline throughput with ``vllm bench throughput`` (:func:`fp8lab.serving.fidelity_check`)
    on ``fidelity_shape = (input tokens, output tokens, requests)``, ``fidelity_rounds`` rounds, asking agreement
    within ``fidelity_tolerance`` (a fraction), with ``fidelity_tokenizer`` for the benchmark when the model has
    none."""

    plan: ServingPlan
    bandwidth_gbs: float | str | None = None
    run_fidelity: bool = False
    fidelity_shape: tuple[int, int, int] = (512, 128, 32)
    fidelity_rounds: int = 2
    fidelity_tolerance: float = 0.03
    fidelity_tokenizer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.plan, ServingPlan):
            raise SpecError("ServingSpec", "plan", type(self.plan).__name__, "a ServingPlan")
        if self.bandwidth_gbs is not None and self.bandwidth_gbs != "measure":
            check_float(self, "bandwidth_gbs", self.bandwidth_gbs, 0.0, 1e6, lo_open=True)
        check_bool(self, "run_fidelity", self.run_fidelity)
        shape = self.fidelity_shape
        if not isinstance(shape, (list, tuple)) or len(shape) != 3:
            raise SpecError("ServingSpec", "fidelity_shape", shape, "[input tokens, output tokens, requests]")
        for v in shape:
            check_int(self, "fidelity_shape", v, 1, 10_000_000)
        object.__setattr__(self, "fidelity_shape", tuple(shape))
        check_int(self, "fidelity_rounds", self.fidelity_rounds, 1, 100)
        check_float(self, "fidelity_tolerance", self.fidelity_tolerance, 0.0, 1.0, lo_open=True)
        if self.fidelity_tokenizer is not None and not isinstance(self.fidelity_tokenizer, str):
            raise SpecError("ServingSpec", "fidelity_tokenizer", self.fidelity_tokenizer, "a tokenizer folder or None")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ServingSpec:
        """From notebook 01's UPPER_CASE parameters (``globals()``, or a profile's resolved parameters; lower-case
        names are ignored). A missing or bad parameter raises :class:`SpecError` naming it, before any engine."""
        p = {k: v for k, v in params.items() if isinstance(k, str) and k.isupper()}
        try:
            plan = plan_from_params(p)
            return cls(
                plan,
                bandwidth_gbs=p["BANDWIDTH_GBS"],
                run_fidelity=p["RUN_FIDELITY"],
                fidelity_shape=p["FIDELITY_SHAPE"],
                fidelity_rounds=p["FIDELITY_ROUNDS"],
                fidelity_tolerance=p["FIDELITY_TOLERANCE"],
                fidelity_tokenizer=p["FIDELITY_TOKENIZER"],
            )
        except KeyError as e:
            raise SpecError(
                "ServingSpec", str(e.args[0]), "missing", "a parameter of notebook 01's parameters cell"
            ) from None
