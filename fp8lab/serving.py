"""The serving study: does FP8 KV cache change throughput and latency, beyond noise?

One :class:`ServingPlan` describes the whole A/B study, a paired design: :func:`run_study` starts ONE
engine per kv dtype, each in its own process (:mod:`fp8lab.serving_worker`), and keeps both alive for
the whole study; their phases are interleaved in time, phase by phase and trial by trial, A B / B A
(:func:`paired_schedule`), so drift of the machine hits both alike. Each phase goes through vLLM's
``AsyncLLM`` with streaming (every token is timestamped by the client):

1. ``warmup``: ``warmup_requests`` requests from the mix, once per engine (discarded from every table);
2. ``closed-c<N>``: closed loop, ``N`` requests in flight, for each ``N`` of the concurrency sweep,
   sustained: at least ``max(closed_loop_requests, 4 N)`` requests and ``phase_seconds``, measured up to
   the deadline with ``N`` still in flight (requests then in flight are cancelled);
3. ``open-<process>-<rate>``: open loop, requests sent at ``rate`` per second (constant spacing or a
   Poisson process) whether or not earlier ones have finished;
4. ``cap-c<N>`` (first ``capacity_trials`` trials only): ``N`` identical requests of
   ``capacity_shape`` at once, for a ladder of ``N`` around the KV formula's prediction, to find the
   largest concurrency that runs without preemption.

Runs go through :func:`fp8lab.results.run_cached` (a finished run is loaded, not repeated; a failed one
is kept with its reason). The analysis functions turn a :class:`ServingResult` into tidy tables for
the notebook: capacity, throughput vs concurrency, per-class latency percentiles, the fp8-vs-baseline
deltas paired per trial with t intervals, the noise floor of each config against itself and the "beyond
noise" rule (all from :mod:`fp8lab.stats`), the capacity search and the
roofline comparison (:mod:`fp8lab.roofline`). :func:`fidelity_check` compares fp8lab's offline
throughput with vLLM's own ``vllm bench throughput`` on the same settings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from fp8lab import kvmath, metrics, roofline, stats
from fp8lab.specs import EngineSpec, KVDtype, Phase, Request, SpecError, check_choice, check_float, check_int
from fp8lab.workloads import REPORT_MIX, PromptSource, RequestClass, build_requests, parse_mix, with_arrivals

Arrival = Literal["constant", "poisson"]
STUDY = "01_kv_dtype_auto_vs_fp8"
#: vLLM's default block size when none is given: 16 on GPU, 128 on the CPU backend (vllm-notes section 3).
DEFAULT_BLOCK_SIZE = {"gpu": 16, "cpu": 128}


def _on_gpu() -> bool:
    from fp8lab.devices import gpu_facts  # NVML only: never initialises CUDA in the caller

    return bool(gpu_facts())


def default_block_size() -> int:
    return DEFAULT_BLOCK_SIZE["gpu" if _on_gpu() else "cpu"]


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------


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

    def __post_init__(self) -> None:
        if not isinstance(self.engine, EngineSpec):
            raise SpecError("ServingPlan", "engine", type(self.engine).__name__, "an fp8lab.specs.EngineSpec")
        setf = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        setf("kv_dtypes", tuple(self.kv_dtypes))
        for d in self.kv_dtypes:
            check_choice(self, "kv_dtypes", d, KVDtype)
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
        check_int(self, "trials", self.trials, 3, 1000)  # the issue's minimum: 3 trials per configuration
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

    def spec_for(self, kv_dtype: str) -> EngineSpec:
        return self.engine.replace(kv_cache_dtype=kv_dtype)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["engine"] = self.engine.to_dict()
        return d


def trial_order(kv_dtypes: Sequence[str], trials: int) -> list[tuple[int, str]]:
    """The trials of each dtype: ``[(0, A), (0, B), (1, A), (1, B), ...]`` (the phases inside them are
    interleaved by :func:`paired_schedule`)."""
    return [(t, d) for t in range(trials) for d in kv_dtypes]


def min_requests(plan: ServingPlan, concurrency: int) -> int:
    """Requests a closed-loop phase of ``concurrency`` finishes at least: ``max(closed_loop_requests, 4 x N)``
    (also the size of its request pool, which repeats while the phase lasts)."""
    return max(plan.closed_loop_requests, 4 * concurrency)


def paired_schedule(
    phase_names: dict[str, dict[int, Sequence[str]]], kv_dtypes: Sequence[str], trials: int
) -> list[tuple[int, str, str]]:
    """The run order of the paired design, ``[(trial, phase, kv_dtype), ...]``: within each trial, phase by
    phase, the dtypes alternate ``A B`` / ``B A`` by ``(trial + phase index) % 2`` (so each dtype goes first
    equally often, by phase and by trial; the index counts the measured phases, the warm-up runs ``A B``); a
    phase only one dtype has (its own capacity ladder) runs alone.
    ``phase_names[dtype][trial]``: that engine's phases of that trial, in order.

    >>> paired_schedule({"a": {0: ["warmup", "x"], 1: ["x"]}, "b": {0: ["warmup", "x"], 1: ["x"]}}, ["a", "b"], 2)
    [(0, 'warmup', 'a'), (0, 'warmup', 'b'), (0, 'x', 'a'), (0, 'x', 'b'), (1, 'x', 'b'), (1, 'x', 'a')]
    """
    out = []
    for t in range(trials):
        names: list[str] = []
        for d in kv_dtypes:
            names += [n for n in phase_names.get(d, {}).get(t, ()) if n not in names]
        measured = [n for n in names if n != "warmup"]
        for name in names:
            j = measured.index(name) if name in measured else -t  # the warm-up: A B
            order = list(kv_dtypes) if (t + j) % 2 == 0 else list(kv_dtypes)[::-1]
            out += [(t, name, d) for d in order if name in phase_names.get(d, {}).get(t, ())]
    return out


def mean_context(mix: Sequence[RequestClass]) -> float:
    """Weighted mean of ``input_len + output_len`` over the mix (tokens per request at its end)."""
    w = sum(c.weight for c in mix)
    return sum(c.weight * (c.input_len + c.output_len) for c in mix) / w


def predicted_blocks(spec: EngineSpec, block_size: int | None = None) -> int | None:
    """KV blocks the engine of ``spec`` will have, by :func:`fp8lab.kvmath.predict_num_blocks`, when its
    budget is fixed (``kv_cache_gib``); ``None`` when vLLM sizes the cache itself (GPU without a budget)."""
    if spec.kv_cache_gib is None:
        return None
    bs = block_size or spec.block_size or default_block_size()
    # vLLM's hybrid KV-cache manager is on by default on GPU and off on CPU (matters for sliding-window models)
    return kvmath.predict_num_blocks(
        spec.model,
        int(spec.kv_cache_gib * 2**30),
        bs,
        spec.kv_cache_dtype,
        spec.tensor_parallel_size,
        hybrid_kv_cache_manager=_on_gpu(),
    )


def concurrency_limit(num_blocks: int, block_size: int, context_len: float) -> int:
    """How many sequences of ``context_len`` tokens fit in ``num_blocks`` blocks of ``block_size``:
    ``num_blocks // ceil(context_len / block_size)`` (the formula, at least 1)."""
    return max(1, int(num_blocks) // max(1, math.ceil(context_len / block_size)))


def resolve_concurrency(plan: ServingPlan, blocks: dict[str, tuple[int, int]]) -> tuple[int, ...]:
    """The closed-loop sweep: ``plan.concurrency`` when given, else ``1, 2, 4, ...`` up to the largest
    dtype's limit for the mix's mean request (that limit included), capped by ``max_num_seqs``."""
    if plan.concurrency:
        return plan.concurrency
    ctx = mean_context(plan.mix)
    limit = max(concurrency_limit(n, bs, ctx) for n, bs in blocks.values())
    if plan.engine.max_num_seqs:
        limit = min(limit, plan.engine.max_num_seqs)
    sweep = [2**i for i in range(int(math.log2(limit)) + 1)]
    return tuple(sorted(set(sweep) | {limit}))


def capacity_ladder(predicted: int, factors: Sequence[float]) -> tuple[int, ...]:
    """Concurrencies the capacity search tries around the prediction ``P``: ``P - 1, P, P + 1`` and
    ``round(P x f)`` for each factor (all at least 1)."""
    pts = {predicted - 1, predicted, predicted + 1} | {round(predicted * f) for f in factors}
    return tuple(sorted(p for p in pts if p >= 1))


# --------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------

_PHASE_RE = re.compile(
    r"^(?:(?P<warm>warmup)|closed-c(?P<cc>\d+)|open-(?P<proc>constant|poisson)-(?P<rate>[\d.e+-]+)"
    r"|cap-c(?P<capc>\d+)|naive-c(?P<nc>\d+))$"
)


def phase_meta(name: str) -> dict[str, Any]:
    """``kind`` (warmup | closed | naive | open | capacity), ``concurrency``, ``process`` and ``rate`` of a phase
    name (``naive``: the closed loop of the client that does not read the stream)."""
    m = _PHASE_RE.match(name)
    if not m:
        return {"kind": "other", "concurrency": np.nan, "process": None, "rate": np.nan}
    if m["warm"]:
        return {"kind": "warmup", "concurrency": np.nan, "process": None, "rate": np.nan}
    if m["cc"]:
        return {"kind": "closed", "concurrency": int(m["cc"]), "process": None, "rate": np.nan}
    if m["nc"]:
        return {"kind": "naive", "concurrency": int(m["nc"]), "process": None, "rate": np.nan}
    if m["proc"]:
        return {"kind": "open", "concurrency": np.nan, "process": m["proc"], "rate": float(m["rate"])}
    return {"kind": "capacity", "concurrency": int(m["capc"]), "process": None, "rate": np.nan}


def _tagged(reqs: Sequence[Request], tag: str, **changes: Any) -> tuple[Request, ...]:
    return tuple(dataclasses.replace(r, tag=tag, **changes) for r in reqs)


def build_phases(
    plan: ServingPlan, kv_dtype: str, trial: int, concurrency: Sequence[int], capacity_predicted: int | None
) -> list[Phase]:
    """The phases one engine (``kv_dtype``, ``trial``) serves, in order: the warm-up in trial 0 only (the
    engine lives through all trials). Requests are drawn with fixed seeds, so every arm and trial gets the
    same ones; each is tagged ``trial<k>`` (which also gives every trial its own run directory in the
    results store). A closed-loop phase's requests are its pool (:func:`min_requests`)."""
    model, src, tag = plan.engine.model, plan.prompt_source, f"trial{trial}"
    phases: list[Phase] = []
    if plan.warmup_requests and trial == 0:
        reqs = build_requests(model, plan.mix, plan.warmup_requests, source=src, seed=plan.seed + 1)
        phases.append(Phase("warmup", _tagged(reqs, tag), concurrency=max(concurrency)))
    for c in concurrency:
        n = min_requests(plan, c)  # every point reaches its concurrency, 4 times over at least
        reqs = build_requests(model, plan.mix, n, source=src, seed=plan.seed + 2)
        phases.append(Phase(f"closed-c{c}", _tagged(reqs, tag), concurrency=c))
    for c in plan.naive_concurrency:
        n = min_requests(plan, c)
        reqs = build_requests(model, plan.mix, n, source=src, seed=plan.seed + 2)  # closed-c<N>'s requests
        phases.append(Phase(f"naive-c{c}", _tagged(reqs, tag), concurrency=c, client="final"))
    for i, rate in enumerate(plan.rates):
        for process in plan.arrivals:
            reqs = build_requests(model, plan.mix, plan.open_loop_requests, source=src, seed=plan.seed + 3)
            sched = with_arrivals(reqs, rate, process, seed=plan.seed + 100 + i)  # type: ignore[arg-type]
            phases.append(Phase(f"open-{process}-{rate:g}", _tagged(sched, tag)))
    if plan.capacity_shape is not None and trial < plan.capacity_trials and capacity_predicted:
        shape = RequestClass("capacity", *plan.capacity_shape)
        for c in capacity_ladder(capacity_predicted, plan.capacity_factors):
            reqs = build_requests(model, [shape], c, source=src, seed=plan.seed + 4)
            phases.append(Phase(f"cap-c{c}", _tagged(reqs, tag), concurrency=c))
    return phases


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


@dataclass
class ServingResult:
    """What :func:`run_study` produced: the plan, one entry per engine run (``runs``: trial, kv_dtype,
    order, result), the closed-loop sweep and capacity predictions it used, and tidy frames:
    ``records`` (one row per request, with ``kv_dtype, trial, kind, concurrency, process, rate``),
    ``phases`` (one row per engine and phase), ``engines`` (one row per engine) and ``samples``
    (KV usage and memory over time)."""

    plan: ServingPlan
    runs: list[dict[str, Any]]
    concurrency: tuple[int, ...]
    blocks: dict[str, tuple[int, int]]
    records: pd.DataFrame = field(default_factory=pd.DataFrame)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)
    samples: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_s: float = 0.0

    @property
    def failed(self) -> pd.DataFrame:
        return self.engines[self.engines.status != "ok"] if len(self.engines) else self.engines

    @property
    def headline_concurrency(self) -> int:
        return max(self.concurrency)


def _block_info(plan: ServingPlan, study: str, runner: Callable[..., Any]) -> dict[str, tuple[int, int]]:
    """``{kv_dtype: (num_blocks, block_size)}``: predicted when the KV budget is fixed, else read from
    an engine started once per dtype with no requests (cached like any run)."""
    out = {}
    for d in plan.kv_dtypes:
        spec = plan.spec_for(d)
        bs = spec.block_size or default_block_size()
        n = predicted_blocks(spec, bs)
        if n is None:
            res = runner(spec, (), study=study)
            if res.status != "ok":
                raise RuntimeError(f"capacity probe for kv_cache_dtype={d} failed ({res.status}): {res.error}")
            n, bs = int(res.engine["num_blocks"]), int(res.engine["block_size"])
        out[d] = (int(n), int(bs))
    return out


def phase_payload(plan: ServingPlan, phase: Phase, trial: int) -> dict[str, Any]:
    """What the engine process receives for one phase: the phase as a dict, with ``min_seconds`` /
    ``min_requests`` for a sustained closed loop (streamed closed-loop phases) and a ``key`` naming the
    trial."""
    d = dataclasses.asdict(phase)
    d["key"] = f"t{trial}:{phase.name}"
    if phase_meta(phase.name)["kind"] == "closed":
        d.update(min_seconds=plan.phase_seconds, min_requests=min_requests(plan, int(phase.concurrency or 1)))
    return d


def _plan_phases(plan: ServingPlan, conc: Sequence[int], cap_pred: dict[str, int]) -> dict[str, dict[int, list[Phase]]]:
    return {d: {t: build_phases(plan, d, t, conc, cap_pred.get(d)) for t in range(plan.trials)} for d in plan.kv_dtypes}


def _planned(plan: ServingPlan) -> tuple[tuple[int, ...], dict[str, int]]:
    """The closed-loop sweep and capacity predictions known before any engine starts (from the KV formula when
    the budget is fixed; else the given sweep, and no capacity ladder yet)."""
    blocks = {}
    for d in plan.kv_dtypes:
        spec = plan.spec_for(d)
        bs = spec.block_size or default_block_size()
        n = predicted_blocks(spec, bs)
        if n is None:
            return plan.concurrency or (1,), {}
        blocks[d] = (int(n), int(bs))
    conc = resolve_concurrency(plan, blocks)
    cap = (
        {d: concurrency_limit(n, bs, sum(plan.capacity_shape)) for d, (n, bs) in blocks.items()}
        if plan.capacity_shape is not None
        else {}
    )
    return conc, cap


def schedule_table(plan: ServingPlan) -> pd.DataFrame:
    """The paired run order before any engine starts: one row per (trial, phase, dtype) in order, with the
    phase's requests (a sustained closed loop: its pool and the least it finishes) and its least duration."""
    conc, cap = _planned(plan)
    phases = _plan_phases(plan, conc, cap)
    names = {d: {t: [p.name for p in ps] for t, ps in by_t.items()} for d, by_t in phases.items()}
    by_name = {(t, p.name, d): p for d, by_t in phases.items() for t, ps in by_t.items() for p in ps}
    rows = []
    for i, (t, name, d) in enumerate(paired_schedule(names, plan.kv_dtypes, plan.trials)):
        pay = phase_payload(plan, by_name[(t, name, d)], t)
        rows.append(
            {
                "order": i,
                "trial": t,
                "phase": name,
                "kv_dtype": d,
                "requests": len(pay["requests"]),
                "min_requests": pay.get("min_requests"),
                "min_seconds": pay.get("min_seconds"),
            }
        )
    return pd.DataFrame(rows)


def estimate_seconds(
    plan: ServingPlan,
    concurrency: Sequence[int] | None = None,
    *,
    engine_start_s: float | None = None,
    step_s: float = 0.02,
    overhead_s: float = 1.0,
    fidelity: tuple[int, int] | None = None,
    fidelity_run_s: float = 35.0,
    fidelity_start_s: float = 45.0,
) -> pd.DataFrame:
    """A time plan of the paired study before any engine starts: one row per part (``engine starts``,
    ``warm-up``, ``closed loop``, ``open loop``, ``capacity``, ``fidelity``) with ``seconds`` and how it was
    reckoned, then the ``total``. Assumptions (the arguments): each engine starts in ``engine_start_s`` (a
    fresh H200 host compiles and captures CUDA graphs in about 144 s per engine; default 144 on GPU, 30 on
    CPU); a decode step takes ``step_s``, so a request of the mix lasts its output length x ``step_s`` plus
    0.5 s and a wave of requests its longest output x ``step_s`` plus 2 s; every phase adds ``overhead_s``. A
    closed-loop phase lasts ``phase_seconds`` or its least requests' time, whichever is longer; an open-loop
    phase its schedule plus a wave; a warm-up one wave per ``concurrency`` requests; a capacity phase two waves
    of its output length; ``fidelity = (rounds, runs per round)`` costs ``fidelity_start_s + fidelity_run_s``
    per run."""
    conc = tuple(concurrency or _planned(plan)[0])
    if engine_start_s is None:
        engine_start_s = 144.0 if _on_gpu() else 30.0
    nd, t = len(plan.kv_dtypes), plan.trials
    w = sum(c.weight for c in plan.mix)
    mean_req = sum(c.weight * c.output_len for c in plan.mix) / w * step_s + 0.5
    wave = max(c.output_len for c in plan.mix) * step_s + 2.0
    closed = sum(max(plan.phase_seconds, min_requests(plan, c) * mean_req / c) + overhead_s for c in conc)
    naive = sum(min_requests(plan, c) * mean_req / c + overhead_s for c in plan.naive_concurrency)
    opened = sum(plan.open_loop_requests / r + wave + overhead_s for r in plan.rates) * len(plan.arrivals)
    cap, n_cap = 0.0, 3 + len(plan.capacity_factors)
    if plan.capacity_shape is not None and plan.capacity_trials:
        cap = nd * n_cap * (2 * (plan.capacity_shape[1] * step_s + 2.0) + overhead_s) * plan.capacity_trials
    warm = nd * math.ceil(plan.warmup_requests / max(conc)) * wave if plan.warmup_requests else 0.0
    rows = [
        ("engine starts", nd * engine_start_s, f"{nd} engines x {engine_start_s:.0f} s, alive together"),
        ("warm-up", warm, f"{plan.warmup_requests} requests per engine at c={max(conc)}"),
        (
            "closed loop",
            nd * t * (closed + naive),
            f"{nd} dtypes x {t} trials x {len(conc) + len(plan.naive_concurrency)} phases, streamed ones >= "
            f"{plan.phase_seconds:g} s",
        ),
        ("open loop", nd * t * opened, f"{nd} dtypes x {t} trials x {len(plan.rates) * len(plan.arrivals)} phases"),
        ("capacity", cap, f"{nd} ladders of {n_cap} phases"),
    ]
    if fidelity:
        r, k = fidelity
        rows.append(
            (
                "fidelity",
                r * k * (fidelity_start_s + fidelity_run_s),
                f"{r} rounds x {k} runs x ({fidelity_start_s:g} s start + {fidelity_run_s:g} s)",
            )
        )
    df = pd.DataFrame(rows, columns=["part", "seconds", "reckoned"])
    total = df.seconds.sum()
    df = pd.concat(
        [df, pd.DataFrame([("total", total, f"{total / 60:.1f} minutes")], columns=df.columns)], ignore_index=True
    )
    df["seconds"] = df.seconds.round(0)
    return df


def _gz_json_write(path: Path, obj: Any) -> None:
    import gzip

    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as f:
        json.dump(obj, f, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    tmp.replace(path)


def _gz_json_read(path: Path) -> Any:
    import gzip

    with gzip.open(path, "rt") as f:
        return json.load(f)


class _EngineProc:
    """One engine alive in its own spawned process (:mod:`fp8lab.serving_worker`), serving phases on command."""

    def __init__(self, spec: EngineSpec, log_path: Path, sample_interval_s: float = 0.25):
        from fp8lab import serving_worker
        from fp8lab.engine import worker_context

        self.spec, self.log_path = spec, log_path
        ctx = worker_context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=serving_worker.entry,
            name=f"fp8lab-serve-{spec.kv_cache_dtype}",
            args=(str(log_path), {}, spec.to_dict(), {"sample_interval_s": sample_interval_s}, child),
        )
        self.proc.start()
        child.close()

    def _wait(self, timeout: float) -> dict[str, Any]:
        from fp8lab.engine import classify_failure, root_cause

        try:
            if self.conn.poll(timeout):
                msg = self.conn.recv()
            else:
                msg = {"status": "timeout", "error": f"no answer within timeout_s = {timeout:.0f} s"}
        except (EOFError, OSError) as exc:
            msg = {
                "status": "error",
                "error": f"engine process ended ({type(exc).__name__}, exit code {self.proc.exitcode})",
            }
        if msg.get("status") not in ("ok", "ready"):
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            err = root_cause(log, msg.get("error")) if log else msg.get("error")
            status = "timeout" if msg["status"] == "timeout" else classify_failure(f"{err}\n{msg.get('error')}")
            msg = {**msg, "status": status, "error": err}
        return msg

    def start(self) -> dict[str, Any]:
        return self._wait(self.spec.timeout_s)

    def run(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            self.conn.send(payload)
        except (BrokenPipeError, OSError) as exc:
            return {"status": "error", "error": f"engine process gone: {exc}"}
        return self._wait(self.spec.timeout_s)

    def stop(self) -> None:
        from fp8lab.engine import _kill_group, _reap_descendants

        try:
            self.conn.send(None)
            self.proc.join(timeout=60)
        except (BrokenPipeError, OSError):
            pass
        if self.proc.pid:
            _reap_descendants(self.proc.pid)
            _kill_group(self.proc.pid)
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


def _run_paired(
    plan: ServingPlan,
    study: str,
    conc: tuple[int, ...],
    cap_pred: dict[str, int],
    progress: bool,
    engine_factory: Callable[..., Any] | None = None,
) -> list[dict[str, Any]]:
    """The paired design: both engines alive at once, phases interleaved by :func:`paired_schedule`. Each
    finished phase is kept at once (``<runs>/<study>/paired-<hash>/``), so a run cut short resumes with the
    phases it lacks; once every phase is in, each (trial, dtype) is saved as an ordinary run directory of the
    results store (:mod:`fp8lab.results`) and the progress folder is removed. ``engine_factory(spec, log_path)``
    replaces :class:`_EngineProc` (an object with ``start()``, ``run(payload)`` and ``stop()``; tests pass one
    that answers without vLLM)."""
    from fp8lab import results
    from fp8lab.engine import EngineResult
    from fp8lab.paths import runs_dir
    from fp8lab.specs import spec_hash

    phases = _plan_phases(plan, conc, cap_pred)
    names = {d: {t: [p.name for p in ps] for t, ps in by_t.items()} for d, by_t in phases.items()}
    sched = paired_schedule(names, plan.kv_dtypes, plan.trials)
    design = {
        "design": "paired-interleaved",
        "plan": plan.to_dict(),
        "concurrency": list(conc),
        "capacity_predicted": cap_pred,
    }
    descs = {
        (t, d): {
            **results.run_descriptor(plan.spec_for(d), phases[d][t], "async", 0.25),
            "paired": spec_hash(design),
            "trial": t,
        }
        for d in plan.kv_dtypes
        for t in range(plan.trials)
    }
    rdirs = {k: results.run_dir_for(study, v) for k, v in descs.items()}
    if all(
        (rd / "engine.json").exists() and json.loads((rd / "engine.json").read_text()).get("status") == "ok"
        for rd in rdirs.values()
    ):
        out = [
            {"trial": t, "kv_dtype": d, "order": i, "result": results.load(rdirs[(t, d)], plan.spec_for(d))}
            for i, (t, d) in enumerate(trial_order(plan.kv_dtypes, plan.trials))
        ]
        if progress:
            print(f"paired study: {len(out)} stored trials loaded ({rdirs[(0, plan.baseline)].parent})", flush=True)
        return out
    if results.store_only():  # re-rendering from committed stores: what is stored, and no engine for the rest
        return [
            {
                "trial": t,
                "kv_dtype": d,
                "order": i,
                "result": results.from_store(plan.spec_for(d), rdirs[(t, d)], descs[(t, d)]),
            }
            for i, (t, d) in enumerate(trial_order(plan.kv_dtypes, plan.trials))
        ]
    for d in plan.kv_dtypes:  # this machine's paths, before any engine starts (a stored spec is not checked)
        plan.spec_for(d).check_paths()
    # the phases kept so far resume only under the same vLLM, torch and engine code (their runs' cache key)
    work = runs_dir() / study / f"paired-{spec_hash(design, results.run_versions())}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "design.json").write_text(json.dumps(design, indent=2, default=str))

    def ph_path(t: int, name: str, d: str) -> Path:
        return work / f"phase-t{t}-{name}-{d}.json.gz"

    todo = [k for k in sched if not ph_path(*k).exists()]
    engines: dict[str, dict[str, Any]] = {}
    for d in plan.kv_dtypes:
        ep = work / f"engine-{d}.json"
        if ep.exists():
            engines[d] = json.loads(ep.read_text())
    procs: dict[str, _EngineProc] = {}
    t_all = time.perf_counter()
    try:
        for d in plan.kv_dtypes:
            if not any(k[2] == d for k in todo):
                continue
            t = time.perf_counter()
            p = (engine_factory or _EngineProc)(plan.spec_for(d), work / f"worker-{d}.log")
            msg = p.start()
            if msg["status"] == "ready":
                procs[d] = p
                engines[d] = {"status": "ok", "error": None, "engine": msg["engine"], "provenance": msg["provenance"]}
            else:
                p.stop()
                engines[d] = {"status": msg["status"], "error": msg.get("error"), "engine": {}, "provenance": {}}
            (work / f"engine-{d}.json").write_text(json.dumps(engines[d], indent=2, default=str))
            if progress:
                print(
                    f"engine kv_cache_dtype={d}: {engines[d]['status']} in {time.perf_counter() - t:.0f} s"
                    + (f" - {engines[d]['error']}" if engines[d]["status"] != "ok" else ""),
                    flush=True,
                )
        by_name = {(t, p.name, d): p for d, by_t in phases.items() for t, ps in by_t.items() for p in ps}
        for i, key in enumerate(todo):
            t, name, d = key
            if d not in procs:
                continue
            t0 = time.perf_counter()
            msg = procs[d].run(phase_payload(plan, by_name[key], t))
            took = time.perf_counter() - t0
            if msg["status"] != "ok":
                engines[d].update(status=msg["status"], error=f"during trial {t} phase {name}: {msg.get('error')}")
                (work / f"engine-{d}.json").write_text(json.dumps(engines[d], indent=2, default=str))
                procs.pop(d).stop()
                if progress:
                    print(
                        f"[{i + 1}/{len(todo)}] trial {t} {name} {d}: {msg['status']} - {msg.get('error')}", flush=True
                    )
                continue
            _gz_json_write(
                ph_path(*key),
                {
                    "rows": msg["rows"],
                    "stats": {**msg["stats"], "took_s": took},
                    "samples": msg["samples"],
                    "t_wall": time.time(),
                },
            )
            if progress:
                st = msg["stats"]
                print(
                    f"[{i + 1}/{len(todo)}] trial {t} {name} {d}: {st['requests']} requests, "
                    f"{st['output_tokens'] / max(st['wall_s'], 1e-9):.0f} output tok/s over {st['wall_s']:.1f} s "
                    f"({took:.0f} s, {time.perf_counter() - t_all:.0f} s so far)",
                    flush=True,
                )
    finally:
        for p in procs.values():
            p.stop()
    import pandas as pd_

    out, complete = [], True
    for i, (t, d) in enumerate(trial_order(plan.kv_dtypes, plan.trials)):
        eng = engines.get(d, {"status": "error", "error": "engine never started", "engine": {}, "provenance": {}})
        recs, samples, stats, missing = [], [], {}, []
        for name in names[d][t]:
            f = ph_path(t, name, d)
            if not f.exists():
                missing.append(name)
                continue
            ph = _gz_json_read(f)
            for r in ph["rows"]:  # float32 gaps: a tenth of a microsecond is far below the clock's own resolution
                if isinstance(r.get("itl_s"), list):
                    r["itl_s"] = np.asarray(r["itl_s"], dtype=np.float32)
            recs += ph["rows"]
            samples += [{**s, "phase": name} for s in ph["samples"]]
            stats[name] = ph["stats"]
        facts = dict(eng.get("engine") or {})
        facts["run_wall_s"] = float(sum(v.get("took_s", 0.0) for v in stats.values()))
        mems = [s["mem_bytes"] for s in samples if s.get("mem_bytes") is not None]
        facts["mem_peak_bytes"] = max(mems) if mems else facts.get("mem_after_start_bytes")
        facts["mem_steady_bytes"] = float(np.median(mems)) if mems else facts.get("mem_after_start_bytes")
        status = (
            "ok" if not missing and eng["status"] == "ok" else (eng["status"] if eng["status"] != "ok" else "error")
        )
        error = None if status == "ok" else (eng.get("error") or f"phases not run: {', '.join(missing)}")
        res = EngineResult(
            status=status,
            error=error,
            engine=facts,
            records=pd_.DataFrame(recs),
            samples=pd_.DataFrame(samples),
            phases=stats,
            provenance=eng.get("provenance") or {},
            spec=plan.spec_for(d),
            log_tail="",
            run_dir=rdirs[(t, d)],
        )
        complete &= status == "ok"
        out.append({"trial": t, "kv_dtype": d, "order": i, "result": res})
    if complete:  # every phase in: the ordinary store keeps them, the progress folder goes
        import shutil

        for run in out:
            rd = rdirs[(run["trial"], run["kv_dtype"])]
            results.save(run["result"], rd, descs[(run["trial"], run["kv_dtype"])])
            log = work / f"worker-{run['kv_dtype']}.log"
            if log.exists():
                (rd / "worker.log.tail").write_text(log.read_text(errors="replace")[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    return out


def run_study(
    plan: ServingPlan,
    study: str = STUDY,
    runner: Callable[..., Any] | None = None,
    progress: bool = True,
    engine_factory: Callable[..., Any] | None = None,
) -> ServingResult:
    """Run (or load) the paired study: one engine per kv dtype, both alive at once, phases interleaved by
    :func:`paired_schedule` (:func:`_run_paired`), and collect the tidy frames.

    ``runner`` replaces :func:`fp8lab.results.run_cached` for the capacity probe of an engine without a fixed
    KV budget, ``engine_factory`` the engine processes (see :func:`_run_paired`). A failed engine stays in ``engines`` with its status and error; the analyses use the engines
    that ran.
    """
    if runner is None:
        from fp8lab.results import run_cached as runner
    t0 = time.perf_counter()
    blocks = _block_info(plan, study, runner)
    conc = resolve_concurrency(plan, blocks)
    cap_pred = {}
    if plan.capacity_shape is not None:
        cap_pred = {d: concurrency_limit(n, bs, sum(plan.capacity_shape)) for d, (n, bs) in blocks.items()}
    if progress:
        est = estimate_seconds(plan, conc)
        print(
            f"plan: {len(plan.kv_dtypes)} engines alive together, {plan.trials} trials, closed loop at c={list(conc)}, "
            f"estimate {est.seconds.iloc[-1] / 60:.1f} min",
            flush=True,
        )
    runs = _run_paired(plan, study, conc, cap_pred, progress, engine_factory)
    attribute_shared_memory(runs)
    out = ServingResult(plan=plan, runs=runs, concurrency=conc, blocks=blocks)
    _collect(out)
    out.wall_s = time.perf_counter() - t0
    return out


def attribute_shared_memory(runs: list[dict[str, Any]]) -> None:
    """Per-engine memory where the engines of the paired design shared one GPU (``mem_kind`` ``gpu``: NVML
    reads the whole device, so every engine's samples hold both engines' memory). In place, on each run's
    ``result.engine``: ``mem_device_peak_bytes`` keeps the device's peak (both engines), ``mem_shared_device``
    is set, and ``mem_peak_bytes`` / ``mem_steady_bytes`` become this engine's own: what the device gained
    over its start (``mem_after_start_bytes - mem_baseline_bytes``) plus what the device gained after the last
    engine started (an upper bound: that growth is counted to each engine). Engines measured alone, or
    on CPU (each engine's own resident memory), are left as they are."""
    facts = [r["result"].engine for r in runs if r["result"].engine]
    gpu = [
        f
        for f in facts
        if f.get("mem_kind") == "gpu"
        and f.get("mem_after_start_bytes") is not None
        and f.get("mem_baseline_bytes") is not None
    ]
    if len({r["kv_dtype"] for r in runs}) < 2 or len(gpu) < 2 or any(f.get("mem_shared_device") for f in gpu):
        return
    all_started = max(float(f["mem_after_start_bytes"]) for f in gpu)
    for f in gpu:
        own = float(f["mem_after_start_bytes"]) - float(f["mem_baseline_bytes"])
        peak = f.get("mem_peak_bytes")
        steady = f.get("mem_steady_bytes")
        f["mem_device_peak_bytes"] = peak
        f["mem_shared_device"] = True
        f["mem_engine_start_bytes"] = own
        f["mem_peak_bytes"] = own + max(0.0, float(peak) - all_started) if peak is not None else own
        f["mem_steady_bytes"] = own + max(0.0, float(steady) - all_started) if steady is not None else own


def _collect(res: ServingResult) -> None:
    recs, phases, engines, samples = [], [], [], []
    for run in res.runs:
        r, key = run["result"], {"kv_dtype": run["kv_dtype"], "trial": run["trial"], "order": run["order"]}
        engines.append(
            {
                **key,
                "status": r.status,
                "error": r.error,
                "run_dir": str(r.run_dir or ""),
                **{k: v for k, v in (r.engine or {}).items() if not isinstance(v, (list, dict))},
            }
        )
        if len(r.records):
            df = r.records.copy()
            for k, v in key.items():
                df[k] = v
            recs.append(df)
        for name, ph in (r.phases or {}).items():
            phases.append({**key, "phase": name, **phase_meta(name), **ph})
        if len(r.samples):
            s = r.samples.copy()
            for k, v in key.items():
                s[k] = v
            samples.append(s)
    res.engines = pd.DataFrame(engines)
    res.samples = pd.concat(samples, ignore_index=True) if samples else pd.DataFrame()
    rec = pd.concat(recs, ignore_index=True) if recs else pd.DataFrame()
    if len(rec):
        meta = pd.DataFrame([{"phase": p, **phase_meta(p)} for p in rec.phase.unique()])
        rec = rec.merge(meta, on="phase", how="left")
    res.records = rec
    ph = pd.DataFrame(phases)
    if len(ph):
        tp = ph.apply(lambda r: metrics.throughput(r.prompt_tokens, r.output_tokens, r.wall_s, r.requests), axis=1)
        ph = pd.concat([ph, pd.DataFrame(list(tp), index=ph.index)], axis=1)
        if len(rec):
            key = ["kv_dtype", "trial", "phase"]
            g = rec.groupby(key)
            extra = pd.DataFrame(
                {
                    "achieved_rate": g["sent_s"].apply(metrics.achieved_rate) if "sent_s" in rec else np.nan,
                    "request_preemptions": g["num_preemptions"].sum() if "num_preemptions" in rec else np.nan,
                    "completed": g.apply(lambda d: int((d.finish_reason == "length").sum()), include_groups=False),
                    "merged_deltas": g["merged_deltas"].sum() if "merged_deltas" in rec else np.nan,
                }
            ).reset_index()
            ph = ph.merge(extra, on=key, how="left")
        ph["preemptions_any"] = (
            ph[["preemptions", "request_preemptions"]].max(axis=1) if "request_preemptions" in ph else ph["preemptions"]
        )
    res.phases = ph


# --------------------------------------------------------------------------------------------------
# Analyses
# --------------------------------------------------------------------------------------------------


ENGINE_COLUMNS = [
    "order",
    "trial",
    "kv_dtype",
    "status",
    "error",
    "engine_start_s",
    "run_wall_s",
    "num_blocks",
    "block_size",
    "kv_capacity_tokens",
]


def engine_table(res: ServingResult) -> pd.DataFrame:
    """One row per engine run, in run order: status, error, start-up and run time, KV blocks."""
    return res.engines.reindex(columns=ENGINE_COLUMNS)


def require_ok(res: ServingResult) -> None:
    """Raise, naming every failure, unless each kv dtype has at least one engine that ran."""
    ok = set(res.engines[res.engines.status == "ok"].kv_dtype) if len(res.engines) else set()
    missing = [d for d in res.plan.kv_dtypes if d not in ok]
    if missing:
        errs = "; ".join(f"{r.kv_dtype} trial {r.trial}: {r.status}: {r.error}" for r in res.failed.itertuples())
        raise RuntimeError(f"no successful engine for kv_cache_dtype {', '.join(missing)} ({errs})")


def _ok(res: ServingResult, df: pd.DataFrame) -> pd.DataFrame:
    if df.empty or res.engines.empty:
        return df
    ok = res.engines[res.engines.status == "ok"][["kv_dtype", "trial"]]
    return df.merge(ok, on=["kv_dtype", "trial"], how="inner")


def capacity_table(res: ServingResult) -> pd.DataFrame:
    """One row per kv dtype (its first successful engine): ``num_blocks``, ``block_size``,
    ``kv_capacity_tokens``, ``predicted_blocks`` (:func:`fp8lab.kvmath.predict_num_blocks` on the engine's
    budget and block size, when the budget is known), ``ratio_vs_baseline`` (capacity / the baseline's)
    and memory (``mem_peak_gib``, ``mem_steady_gib``: GPU used memory, or the engine's RSS on CPU; where both
    engines shared one GPU, each engine's own share (:func:`attribute_shared_memory`) and ``mem_device_peak_gib``,
    the device's peak with both)."""
    e = res.engines[res.engines.status == "ok"] if len(res.engines) else res.engines
    rows = []
    for d in res.plan.kv_dtypes:
        g = e[e.kv_dtype == d] if len(e) else e
        if g.empty:
            rows.append({"kv_dtype": d, "status": "failed"})
            continue
        r = g.sort_values("trial").iloc[0]
        budget = r.get("kv_budget_bytes")
        pred = None
        if budget is not None and not (isinstance(budget, float) and math.isnan(budget)):
            hybrid = bool(r.get("hybrid_kv_cache_manager", r.get("mem_kind", "gpu") == "gpu"))
            pred = int(
                kvmath.predict_num_blocks(
                    res.plan.engine.model,
                    int(budget),
                    int(r.block_size),
                    d,
                    res.plan.engine.tensor_parallel_size,
                    hybrid_kv_cache_manager=hybrid,
                )
            )
        rows.append(
            {
                "kv_dtype": d,
                "status": "ok",
                "num_blocks": int(r.num_blocks),
                "block_size": int(r.block_size),
                "kv_capacity_tokens": int(r.kv_capacity_tokens),
                "predicted_blocks": pred,
                "kv_budget_gib": (budget / 2**30) if pred is not None else None,
                "mem_peak_gib": g.mem_peak_bytes.max() / 2**30 if "mem_peak_bytes" in g else None,
                "mem_steady_gib": g.mem_steady_bytes.median() / 2**30 if "mem_steady_bytes" in g else None,
                "mem_device_peak_gib": (
                    g.mem_device_peak_bytes.max() / 2**30 if "mem_device_peak_bytes" in g else None
                ),
                "engine_start_s": g.engine_start_s.median() if "engine_start_s" in g else None,
            }
        )
    df = pd.DataFrame(rows)
    if "kv_capacity_tokens" in df:
        base = df.loc[df.kv_dtype == res.plan.baseline, "kv_capacity_tokens"]
        df["ratio_vs_baseline"] = (
            df.kv_capacity_tokens / float(base.iloc[0]) if len(base) and base.notna().all() else np.nan
        )
    return df


def throughput_table(res: ServingResult, kinds: Sequence[str] = ("closed",)) -> pd.DataFrame:
    """One row per engine and phase of ``kinds``: ``kv_dtype, trial, phase, concurrency, rate``, tokens/s
    (``input_tok_s``, ``output_tok_s``, ``total_tok_s``), ``requests_s``, ``preemptions``,
    ``kv_usage_peak`` and ``merged_deltas`` (stream outputs that carried several tokens because the client
    fell behind: their gaps are split evenly, so ITL is smeared there; 0 means every token was seen)."""
    ph = _ok(res, res.phases)
    if ph.empty:
        return ph
    cols = [
        "kv_dtype",
        "trial",
        "phase",
        "kind",
        "concurrency",
        "process",
        "rate",
        "requests",
        "wall_s",
        "input_tok_s",
        "output_tok_s",
        "total_tok_s",
        "requests_s",
        "preemptions_any",
        "kv_usage_peak",
        "achieved_rate",
        "merged_deltas",
    ]
    out = ph[ph.kind.isin(kinds)][[c for c in cols if c in ph]].rename(columns={"preemptions_any": "preemptions"})
    return out.sort_values(["kind", "concurrency", "rate", "kv_dtype", "trial"]).reset_index(drop=True)


def phase_records(
    res: ServingResult, kind: str, concurrency: int | None = None, process: str | None = None, rate: float | None = None
) -> pd.DataFrame:
    """The request records of the successful engines for one kind of phase (optionally one sweep point)."""
    r = _ok(res, res.records)
    if r.empty:
        return r
    m = r.kind == kind
    if concurrency is not None:
        m &= r.concurrency == concurrency
    if process is not None:
        m &= r.process == process
    if rate is not None:
        m &= np.isclose(r.rate.astype(float), rate)
    return r[m]


def latency_summary(
    res: ServingResult,
    kind: str = "closed",
    concurrency: int | None = None,
    by: Sequence[str] = ("kv_dtype", "cls"),
    **sel: Any,
) -> pd.DataFrame:
    """TTFT, TPOT (excluding the first token), ITL (every gap) and E2E in ms: ``n, mean, p50, p95, p99``
    per kv dtype and request class, pooled over trials (:func:`fp8lab.metrics.latency_table`)."""
    if kind == "closed" and concurrency is None:
        concurrency = res.headline_concurrency
    return metrics.latency_table(phase_records(res, kind, concurrency, **sel), by=by)


def itl_frame(res: ServingResult, kind: str = "closed", concurrency: int | None = None, **sel: Any) -> pd.DataFrame:
    """Every inter-token gap (``itl_ms``) of one phase kind / sweep point, with ``kv_dtype, trial, cls``."""
    if kind == "closed" and concurrency is None:
        concurrency = res.headline_concurrency
    df = metrics.explode_itl(phase_records(res, kind, concurrency, **sel), keep=("kv_dtype", "trial", "cls", "request"))
    df["itl_ms"] = df["itl_s"] * 1e3
    return df


def open_loop_schedule(plan: ServingPlan, process: str, rate: float) -> np.ndarray:
    """The scheduled send times (s) of one open-loop phase, exactly as :func:`build_phases` drew them."""
    i = list(plan.rates).index(rate)
    dummy = [Request(prompt_token_ids=(1,), max_tokens=1)] * plan.open_loop_requests
    return np.array([r.arrival_s for r in with_arrivals(dummy, rate, process, seed=plan.seed + 100 + i)])  # type: ignore[arg-type]


def open_loop_table(res: ServingResult) -> pd.DataFrame:
    """Open-loop phases, per kv dtype, process and rate: ``requested_rate``; ``scheduled_rate`` (of the
    drawn schedule: a Poisson draw of few requests deviates from the requested rate by chance);
    ``achieved_rate`` (of the actual send times, mean over trials); ``send_lag_p50_ms`` /
    ``send_lag_max_ms`` (actual minus scheduled send time: a client that falls behind, e.g. one that
    does not read its streams, shows up here); output tokens/s; TTFT and TPOT P50/P99 in ms (pooled over
    trials); preemptions."""
    ph = _ok(res, res.phases)
    rec = phase_records(res, "open")
    if ph.empty or rec.empty:
        return pd.DataFrame()
    rows = []
    for (d, proc, rate), g in ph[ph.kind == "open"].groupby(["kv_dtype", "process", "rate"], sort=True):
        rr = rec[(rec.kv_dtype == d) & (rec.process == proc) & np.isclose(rec.rate, rate)]
        sched = open_loop_schedule(res.plan, proc, rate)
        lag = (rr.sent_s.to_numpy() - sched[rr.request.to_numpy().astype(int)]) * 1e3
        tt, tp = metrics.percentiles(rr.ttft_s * 1e3), metrics.percentiles(rr.tpot_s * 1e3)
        rows.append(
            {
                "kv_dtype": d,
                "process": proc,
                "requested_rate": rate,
                "scheduled_rate": metrics.achieved_rate(sched),
                "achieved_rate": g.achieved_rate.mean(),
                "send_lag_p50_ms": float(np.median(lag)),
                "send_lag_max_ms": float(np.max(lag)),
                "output_tok_s": g.output_tok_s.mean(),
                "ttft_p50_ms": tt["p50"],
                "ttft_p99_ms": tt["p99"],
                "tpot_p50_ms": tp["p50"],
                "tpot_p99_ms": tp["p99"],
                "preemptions": g.preemptions_any.sum(),
                "trials": g.trial.nunique(),
            }
        )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------- deltas
@dataclass(frozen=True)
class Metric:
    """A headline metric: which phase (``kind``, ``concurrency`` / ``process``, ``rate``), which
    quantity (``column`` of the phase table for throughput, else a request/gap column) and statistic."""

    name: str
    kind: str
    column: str
    statistic: str = "mean"
    concurrency: int | None = None
    process: str | None = None
    rate: float | None = None
    higher_is_better: bool = False

    @property
    def level(self) -> str:
        return "phase" if self.column.endswith("_tok_s") else "request"


def headline_metrics(res: ServingResult) -> list[Metric]:
    """The study's headline metrics: output tokens/s at every closed-loop concurrency; TTFT, TPOT and
    ITL P50/P99 at the largest and the smallest concurrency; TTFT and TPOT P50/P99 of every open-loop
    phase; output tokens/s of the non-streaming closed loop at every ``naive_concurrency``."""
    out = [
        Metric(f"output tok/s @c={c}", "closed", "output_tok_s", "mean", concurrency=c, higher_is_better=True)
        for c in res.concurrency
    ]
    out += [
        Metric(
            f"output tok/s (no stream) @c={c}", "naive", "output_tok_s", "mean", concurrency=c, higher_is_better=True
        )
        for c in res.plan.naive_concurrency
    ]
    for c in sorted({res.headline_concurrency, min(res.concurrency)}, reverse=True):
        for col, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL")):
            for st in ("p50", "p99"):
                out.append(Metric(f"{label} {st.upper()} @c={c}", "closed", col, st, concurrency=c))
    for rate in res.plan.rates:
        for proc in res.plan.arrivals:
            for col, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
                for st in ("p50", "p99"):
                    out.append(
                        Metric(f"{label} {st.upper()} @{proc} {rate:g}/s", "open", col, st, process=proc, rate=rate)
                    )
    return out


def _metric_samples(res: ServingResult, m: Metric, kv_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, trial of each value) of one metric and dtype."""
    if m.level == "phase":
        tp = throughput_table(res, kinds=(m.kind,))
        g = (
            tp[(tp.kv_dtype == kv_dtype) & (tp.concurrency == m.concurrency)]
            if m.concurrency is not None
            else tp[(tp.kv_dtype == kv_dtype) & (tp.process == m.process) & np.isclose(tp.rate, m.rate)]
        )
        g = g.sort_values("trial")
        return g[m.column].to_numpy(float), g.trial.to_numpy()
    rec = phase_records(res, m.kind, m.concurrency, m.process, m.rate)
    rec = rec[rec.kv_dtype == kv_dtype]
    if m.column == "itl_s":
        ex = metrics.explode_itl(rec, keep=("trial",))
        return ex.itl_s.to_numpy(float), ex.trial.to_numpy()
    return rec[m.column].to_numpy(float), rec.trial.to_numpy()


def _per_trial(values: np.ndarray, trials: np.ndarray, statistic: str) -> dict[int, float]:
    """The metric's statistic within each trial (a percentile of that trial's requests or gaps, never of
    requests pooled over trials)."""
    stat = stats.statistic_fn(statistic)
    out = {}
    for t in pd.unique(trials):
        v = values[(trials == t) & np.isfinite(values)]
        if v.size:
            out[int(t)] = stat(v)
    return out


DELTA_COLUMNS = [
    "metric",
    "kind",
    "baseline",
    "kv_dtype",
    "unit",
    "a",
    "b",
    "delta_pct",
    "lo_pct",
    "hi_pct",
    "n",
    "label",
    "noise_floor_pct",
    "noise_floor_q25_pct",
    "noise_floor_q75_pct",
    "noise_pairs",
    "detectable_pct",
    "beyond_noise_floor",
    "n_a",
    "n_b",
    "higher_is_better",
    "a_per_trial",
    "b_per_trial",
]


def delta_row(
    name: str, a_per_trial: dict[int, float], b_per_trial: dict[int, float], higher_is_better: bool, ci: float = 0.95
) -> dict[str, Any]:
    """One metric's A/B comparison from its per-trial values (``{trial: value}`` of A and of B): the paired
    delta over the trials both have (:func:`fp8lab.stats.paired_delta`: t interval on the log ratios, valid
    for that n), the noise floor of each config against itself over consecutive trials
    (:func:`fp8lab.stats.noise_floor`), the label, ``beyond_noise_floor`` (:func:`fp8lab.stats.beyond_noise`)
    and ``detectable_pct`` (:func:`fp8lab.stats.smallest_detectable_pct`)."""
    common = sorted(set(a_per_trial) & set(b_per_trial))
    d = stats.paired_delta([a_per_trial[t] for t in common], [b_per_trial[t] for t in common], ci)
    nf = stats.noise_floor(
        [[a_per_trial[t] for t in sorted(a_per_trial)], [b_per_trial[t] for t in sorted(b_per_trial)]]
    )
    return {
        "metric": name,
        "a": d.a,
        "b": d.b,
        "delta_pct": d.delta_pct,
        "lo_pct": d.lo_pct,
        "hi_pct": d.hi_pct,
        "n": d.n,
        "label": stats.delta_label(d, higher_is_better),
        "noise_floor_pct": nf.median_pct,
        "noise_floor_q25_pct": nf.q25_pct,
        "noise_floor_q75_pct": nf.q75_pct,
        "noise_pairs": nf.n_pairs,
        "detectable_pct": stats.smallest_detectable_pct(d, nf),
        "beyond_noise_floor": stats.beyond_noise(d, nf),
        "n_a": len(a_per_trial),
        "n_b": len(b_per_trial),
        "higher_is_better": higher_is_better,
        "a_per_trial": [float(a_per_trial[t]) for t in sorted(a_per_trial)],
        "b_per_trial": [float(b_per_trial[t]) for t in sorted(b_per_trial)],
    }


def delta_table(res: ServingResult, metric_list: Sequence[Metric] | None = None, ci: float = 0.95) -> pd.DataFrame:
    """For each headline metric and each non-baseline dtype B, the paired comparison of :func:`delta_row`:
    one value per engine and trial (throughput: the phase's; a latency percentile: that percentile of the
    trial's own requests or gaps), A and B of a trial paired (their phases ran back to back, alternating
    which went first). ``a`` / ``b`` are the per-trial means (ms for latencies), ``delta_pct`` the geometric-mean
    ratio's change with its t interval (``lo_pct``, ``hi_pct``; ``n`` pairs), ``label`` "within noise" when
    the interval contains 0, else "better" / "worse" for B; ``noise_floor_pct`` the median absolute difference
    between consecutive trials of the same config (with its IQR); ``beyond_noise_floor`` only when the
    interval excludes 0 and ``|delta|`` exceeds the floor; ``detectable_pct`` the smallest delta this run
    could have called beyond noise."""
    metric_list = list(metric_list) if metric_list is not None else headline_metrics(res)
    a_dt = res.plan.baseline
    rows = []
    for m in metric_list:
        va, ta = _metric_samples(res, m, a_dt)
        pa = _per_trial(va, ta, m.statistic)
        scale = 1.0 if m.level == "phase" else 1e3
        for b_dt in res.plan.kv_dtypes[1:]:
            vb, tb = _metric_samples(res, m, b_dt)
            pb = _per_trial(vb, tb, m.statistic)
            row = delta_row(
                m.name,
                {t: v * scale for t, v in pa.items()},
                {t: v * scale for t, v in pb.items()},
                m.higher_is_better,
                ci,
            )
            rows.append(
                {
                    **row,
                    "kind": m.kind,
                    "baseline": a_dt,
                    "kv_dtype": b_dt,
                    "unit": "tok/s" if m.level == "phase" else "ms",
                }
            )
    return pd.DataFrame(rows, columns=DELTA_COLUMNS)


def noise_floor_table(res: ServingResult) -> pd.DataFrame:
    """The same config against itself, for the closed-loop throughput at every concurrency: per dtype and
    concurrency the per-trial output tokens/s (in trial order) and the median absolute relative difference
    between consecutive trials (%), with its IQR and the number of differences."""
    tp = throughput_table(res)
    rows = []
    for (d, c), g in tp.groupby(["kv_dtype", "concurrency"]):
        g = g.sort_values("trial")
        nf = stats.noise_floor([g.output_tok_s.to_numpy(float)])
        rows.append(
            {
                "kv_dtype": d,
                "concurrency": c,
                "output_tok_s_per_trial": g.output_tok_s.round(1).tolist(),
                "median_pct": nf.median_pct,
                "q25_pct": nf.q25_pct,
                "q75_pct": nf.q75_pct,
                "n_pairs": nf.n_pairs,
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------- capacity
def capacity_search(res: ServingResult) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ladder and its outcome.

    ``ladder``: one row per dtype and concurrency tried: ``preemptions`` (the engine's counter over the
    phase, or the requests' own counts if higher), ``kv_usage_peak``, ``sustained`` (no preemption and
    every request completed).
    ``result``: one row per dtype: ``measured`` (the largest concurrency sustained with every smaller
    one sustained too), ``first_preempted``, ``censored`` (True when even the top of the ladder was
    sustained: the limit is at least ``measured``), ``predicted`` (the KV formula on the engine's blocks,
    ``num_blocks // ceil((input + output) / block_size)``) and ``predicted_vllm`` (the same with vLLM's
    block accounting: one block of the pool is its reserved null block, and the last generated token's
    KV is never written: ``(num_blocks - 1) // ceil((input + output - 1) / block_size)``).
    """
    ph = _ok(res, res.phases)
    shape = res.plan.capacity_shape
    if ph.empty or shape is None or not (ph.kind == "capacity").any():
        return pd.DataFrame(), pd.DataFrame()
    cap = ph[ph.kind == "capacity"].copy()
    cap["sustained"] = (cap.preemptions_any == 0) & (cap.completed == cap.requests)
    ladder = cap[
        [
            "kv_dtype",
            "trial",
            "concurrency",
            "requests",
            "completed",
            "preemptions_any",
            "kv_usage_peak",
            "sustained",
            "wall_s",
        ]
    ].rename(columns={"preemptions_any": "preemptions"})
    ladder = ladder.sort_values(["kv_dtype", "trial", "concurrency"]).reset_index(drop=True)
    rows = []
    cap_eng = res.engines[res.engines.status == "ok"]
    for d, g in ladder.groupby("kv_dtype", sort=False):
        g = g.groupby("concurrency").sustained.all().sort_index()
        measured, first_fail = None, None
        for c, ok in g.items():
            if ok and first_fail is None:
                measured = int(c)
            elif not ok and first_fail is None:
                first_fail = int(c)
        e = cap_eng[cap_eng.kv_dtype == d].sort_values("trial").iloc[0]
        n, bs = int(e.num_blocks), int(e.block_size)
        total = sum(shape)
        rows.append(
            {
                "kv_dtype": d,
                "capacity_shape": f"{shape[0]} in + {shape[1]} out",
                "num_blocks": n,
                "block_size": bs,
                "measured": measured,
                "first_preempted": first_fail,
                "censored": first_fail is None,
                "predicted": concurrency_limit(n, bs, total),
                "predicted_vllm": max(1, (n - 1) // max(1, math.ceil((total - 1) / bs))),
            }
        )
    result = pd.DataFrame(rows)
    result["measured_vs_predicted"] = result.measured / result.predicted
    return ladder, result


# ---------------------------------------------------------------------------------------- roofline
def roofline_measured(
    res: ServingResult, kinds: Sequence[str] = ("closed", "capacity"), bins: int = 12, min_gaps: int = 20
) -> pd.DataFrame:
    """Measured ITL against the KV tokens each decode step read (:func:`fp8lab.metrics.decode_steps`,
    per engine and phase), binned on a log scale: per dtype and bin the median ITL (ms), the median batch
    and the number of gaps (bins with fewer than ``min_gaps`` are dropped). Steps that also ran another request's prefill are included (they are the
    ITL spikes); the median is robust to them."""
    rec = _ok(res, res.records)
    if rec.empty:
        return pd.DataFrame()
    rec = rec[rec.kind.isin(kinds)]
    steps = []
    for (d, _trial, _phase), g in rec.groupby(["kv_dtype", "trial", "phase"]):
        s = metrics.decode_steps(g)
        s["kv_dtype"] = d
        steps.append(s)
    if not steps:
        return pd.DataFrame()
    s = pd.concat(steps, ignore_index=True)
    s = s[s.kv_tokens > 0]
    edges = np.unique(np.geomspace(max(1.0, s.kv_tokens.min()), s.kv_tokens.max() * 1.0001, bins + 1))
    s["bin"] = np.clip(np.searchsorted(edges, s.kv_tokens, side="right") - 1, 0, len(edges) - 2)
    out = (
        s.groupby(["kv_dtype", "bin"])
        .agg(
            kv_tokens=("kv_tokens", "median"),
            itl_ms=("itl_s", "median"),
            batch=("batch", "median"),
            n=("itl_s", "size"),
        )
        .reset_index()
    )
    out["itl_ms"] *= 1e3
    return out[out.n >= min_gaps].reset_index(drop=True)


def roofline_tables(
    res: ServingResult,
    bandwidth_gbs: float,
    context_lens: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> dict[str, pd.DataFrame]:
    """The bound and the measurement side by side.

    ``grid``: :func:`fp8lab.roofline.bound_grid` over ``context_lens`` x ``batch_sizes`` (defaults: the
    mix's input lengths and the concurrency sweep), with ``itl_bound_ms`` and, per (batch, context), the
    ``fp8_speedup_bound`` (baseline bound / fp8 bound). ``measured``: :func:`roofline_measured` with the
    bound at each bin's KV tokens (``itl_bound_ms``) and ``bound_over_measured`` (1.0 = at the bound)."""
    plan = res.plan
    model, tp = plan.engine.model, plan.engine.tensor_parallel_size
    context_lens = list(context_lens or sorted({c.input_len + c.output_len // 2 for c in plan.mix}))
    batch_sizes = list(batch_sizes or res.concurrency)
    grid = pd.DataFrame(roofline.bound_grid(model, bandwidth_gbs, context_lens, batch_sizes, plan.kv_dtypes, tp))
    grid["itl_bound_ms"] = grid.itl_bound_s * 1e3
    base = grid[grid.kv_dtype == plan.baseline].set_index(["batch", "context_len"]).itl_bound_s
    grid["speedup_bound_vs_baseline"] = grid.apply(lambda r: base.loc[(r.batch, r.context_len)] / r.itl_bound_s, axis=1)
    meas = roofline_measured(res)
    if len(meas):
        w = roofline.weight_bytes_per_step(model, tp=tp)
        kvb = {d: kvmath.kv_bytes_per_token(model, d, tp) for d in plan.kv_dtypes}
        meas["itl_bound_ms"] = [
            roofline.itl_lower_bound(w, t, kvb[d], bandwidth_gbs * 1e9) * 1e3
            for d, t in zip(meas.kv_dtype, meas.kv_tokens, strict=True)
        ]
        meas["bound_over_measured"] = meas.itl_bound_ms / meas.itl_ms
    return {"grid": grid, "measured": meas}


def kv_usage_timeline(res: ServingResult, trial: int = 0) -> pd.DataFrame:
    """The sampled KV-cache usage (fraction), running / waiting requests and memory of each dtype's engine
    of one trial, with ``t_s`` from the engine's start of sampling."""
    s = res.samples
    if s.empty:
        return s
    return s[(s.trial == trial) & (s.phase != "start")].copy()


# ----------------------------------------------------------------------------------------- verdict
def _fmt_ci(r: pd.Series) -> str:
    return f"{r.delta_pct:+.1f}% [{r.lo_pct:+.1f}, {r.hi_pct:+.1f}]"


def _row_delta(r: Any) -> tuple[stats.PairedDelta, stats.NoiseFloor]:
    return (
        stats.PairedDelta(r.a, r.b, r.delta_pct, r.lo_pct, r.hi_pct, int(r.n)),
        stats.NoiseFloor(r.noise_floor_pct, r.noise_floor_q25_pct, r.noise_floor_q75_pct, int(r.noise_pairs)),
    )


def delta_line(r: Any) -> str:
    """One delta row as the verdict states it: the delta, its interval, n, the floor with its IQR, the smallest
    detectable effect and whether it is beyond noise."""
    d, nf = _row_delta(r)
    if r.label == "within noise":
        tail = "within noise"
    else:
        tail = f"{r.label}, beyond noise" if r.beyond_noise_floor else f"{r.label}, but not beyond the noise floor"
    return f"{stats.delta_sentence(d, nf)}: {tail}"


def _tput_point(metric: str) -> str:
    """``output tok/s @c=8`` -> ``c=8``; ``output tok/s (no stream) @c=8`` -> ``c=8 (no stream)``."""
    note, _, point = metric.removeprefix("output tok/s").rpartition("@")
    return f"{point} {note.strip()}".strip()


def fidelity_line(fidelity: dict[str, Any] | None) -> str | None:
    """The verdict's line on :func:`fidelity_check`'s result (None when it did not run or has no ratio)."""
    if not fidelity or fidelity.get("ratio") is None:
        return None
    tol = 100 * fidelity.get("tolerance", 0.03)
    nr = len(fidelity.get("round_ratios") or [])
    msg = (
        f"- **Fidelity.** fp8lab's offline throughput / `vllm bench throughput` = {fidelity['ratio']:.3f} "
        f"({'median of ' + str(nr) + ' rounds' if nr > 1 else 'one round'}; "
        f"{'within' if fidelity.get('within_tolerance') else 'outside'} {tol:.0f}%"
    )
    spread = fidelity.get("spread_pct") or {}
    if spread:
        msg += "; run to run, " + ", ".join(
            f"{'vLLM bench' if w == 'bench' else w} varied by {v:.2f}%" for w, v in sorted(spread.items())
        )
    msg += ")."
    rows = fidelity.get("rows")
    if isinstance(rows, pd.DataFrame) and len(rows) and "status" in rows:
        bad = rows[rows.status != "ok"]
        if len(bad):
            msg += (
                " Not measured: "
                + "; ".join(
                    f"round {int(r['round'])} {'vLLM bench' if r['who'] == 'bench' else r['who']} ({r['status']})"
                    for _, r in bad.iterrows()
                )
                + "."
            )
    if fidelity.get("resolvable") is None:
        msg += (
            " Each tool's own run-to-run spread needs two runs of it, so whether this check resolves "
            f"{tol:.0f}% is not established."
        )
    if fidelity.get("resolvable") is False:
        off = 100 * abs(fidelity["ratio"] - 1)
        msg += (
            f" A tool varied by itself by more than {tol:.0f}%, so runs this short cannot resolve {tol:.0f}% on "
            "this machine (more requests make longer runs); "
            + (
                "the ratio's distance from 1 is within that variation, so it is no verdict on either tool."
                if off <= max(spread.values())
                else "the ratio is farther from 1 than either tool's own variation: the tools disagree."
            )
        )
    return msg


def preemption_line(tp: pd.DataFrame, baseline: str, other: str) -> str | None:
    """A verdict line on the closed-loop preemptions of ``baseline`` and ``other`` (``tp``: rows of
    :func:`throughput_table`: ``kv_dtype, concurrency, trial, preemptions``), or None when neither preempted.
    Where only one dtype preempts, its throughput at that point paid for recomputing preempted requests:
    the difference there is the other dtype's capacity, not faster decoding."""
    if tp.empty or "preemptions" not in tp:
        return None
    t = tp[tp.kv_dtype.isin([baseline, other])]
    per = {}
    for (d, c), g in t.groupby(["kv_dtype", "concurrency"]):
        counts = g.sort_values("trial").preemptions.fillna(0).astype(int).tolist()
        if sum(counts):
            per.setdefault(d, []).append(f"c={int(c)} ({', '.join(map(str, counts))} over {len(counts)} trials)")
    if not per:
        return None
    said = [
        f"`{d}` preempted at {'; '.join(per[d])}" if d in per else f"`{d}` never preempted" for d in (baseline, other)
    ]
    msg = "- **Preemptions (closed loop).** " + "; ".join(said) + "."
    if len(per) == 1:
        msg += (
            f" Only `{next(iter(per))}` ran out of KV cache: at those points the other dtype's throughput gain "
            "is its capacity (no preempted requests recomputed), not faster decoding."
        )
    return msg


def verdict(
    res: ServingResult,
    deltas: pd.DataFrame,
    capacity: pd.DataFrame,
    search: pd.DataFrame | None = None,
    roof: dict[str, pd.DataFrame] | None = None,
    fidelity: dict[str, Any] | None = None,
) -> str:
    """A short Markdown verdict, every number taken from the tables given (nothing else)."""
    a = res.plan.baseline
    lines = []
    tp = throughput_table(res)  # closed-loop phases of every engine, for the preemption line of each dtype
    for b in res.plan.kv_dtypes[1:]:
        cap = capacity.set_index("kv_dtype")
        if b in cap.index and a in cap.index and cap.loc[b].get("status") == "ok":
            lines.append(
                f"- **Capacity.** With the same KV budget, `{b}` holds {int(cap.loc[b].kv_capacity_tokens):,} tokens "
                f"vs {int(cap.loc[a].kv_capacity_tokens):,} for `{a}` (x{cap.loc[b].ratio_vs_baseline:.2f}, "
                "measured from the engines' block counts)."
            )
        if search is not None and len(search):
            s = search.set_index("kv_dtype")
            if a in s.index and b in s.index:

                def conc(d, s=s):
                    r = s.loc[d]
                    m = "n/a" if r.measured is None or pd.isna(r.measured) else f"{int(r.measured)}"
                    return (
                        f"{'>=' if r.censored else ''}{m} (formula {int(r.predicted)}, "
                        f"vLLM block accounting {int(r.predicted_vllm)})"
                    )

                lines.append(
                    f"- **Concurrency without preemption** ({s.loc[a].capacity_shape}): `{a}` {conc(a)}, `{b}` {conc(b)}."
                )
        if (
            b in cap.index
            and a in cap.index
            and cap.loc[b].get("status") == "ok"
            and pd.notna(cap.loc[a].get("mem_peak_gib"))
            and pd.notna(cap.loc[b].get("mem_peak_gib"))
        ):
            dev = cap.loc[b].get("mem_device_peak_gib")
            shared = dev is not None and pd.notna(dev)
            what = "each engine's own share of the one GPU both ran on" if shared else "peak"
            lines.append(
                f"- **Memory** ({what}): "
                f"`{a}` {cap.loc[a].mem_peak_gib:.2f} GiB, `{b}` {cap.loc[b].mem_peak_gib:.2f} GiB"
                + (f" (the device's peak with both engines: {float(dev):.2f} GiB)" if shared else "")
                + (
                    ". The KV budget is fixed, so FP8 buys capacity here, not memory."
                    if res.plan.engine.kv_cache_gib is not None
                    else "."
                )
            )
        d = deltas[deltas.kv_dtype == b]
        tput = d[d.metric.str.startswith("output tok/s")]
        if len(tput):
            parts = [f"{_tput_point(r.metric)}: {delta_line(r)}" for r in tput.itertuples()]
            robust = tput[tput.beyond_noise_floor].metric.tolist()
            lines.append(
                f"- **Throughput** (output tokens/s, `{b}` vs `{a}`; per trial one sustained phase per engine, "
                "both engines alive, phases interleaved A B / B A; 95% t-interval of the paired log ratios; "
                "noise floor = median |difference| between consecutive trials of the same config): "
                + "; ".join(parts)
                + ". "
                + (
                    f"Beyond both the interval and the noise floor: {', '.join(robust)}."
                    if robust
                    else "No throughput delta is beyond both its interval and the noise floor."
                )
            )
        pre = preemption_line(tp, a, b)
        if pre:
            lines.append(pre)
        lat = d[d.metric.str.match(r"^(TTFT|TPOT|ITL) P(50|99) @")]
        if len(lat):
            beyond = [
                f"{r.metric} {r.delta_pct:+.1f}% [{r.lo_pct:+.1f}, {r.hi_pct:+.1f}] ({r.label})"
                for r in lat.itertuples()
                if r.beyond_noise_floor
            ]
            det = lat.detectable_pct.dropna()
            n = int(lat.n.max()) if len(lat) else 0
            msg = (
                f"- **Latency** (each percentile taken per trial and engine, then paired over n={n} trials): "
                + (f"beyond noise: {'; '.join(beyond)}." if beyond else "no percentile delta is beyond noise.")
                + (
                    f" The smallest latency effect this run could detect ranged from {det.min():.1f}% to "
                    f"{det.max():.1f}% by metric (median {det.median():.1f}%)."
                    if len(det)
                    else ""
                )
            )
            lines.append(msg)
    if roof is not None and len(roof.get("measured", [])):
        m = roof["measured"]
        g = roof["grid"]
        eff = m.bound_over_measured.median()
        top = g[g.kv_dtype != a].speedup_bound_vs_baseline.max()
        lines.append(
            f"- **Roofline.** Measured ITL is {1 / eff:.0f}x the bandwidth bound (median over steps), so "
            + (
                "decode here is far from memory-bound and FP8's byte savings cannot show up in ITL"
                if eff < 0.2
                else "decode is close to memory-bound, where FP8's smaller KV reads pay off"
            )
            + f"; over the grid the bound allows at most x{top:.2f} ITL from FP8 "
            "(largest at long contexts and large batches)."
        )
    fid = fidelity_line(fidelity)
    if fid:
        lines.append(fid)
    if len(res.failed):
        lines.append(
            "- **Failed engines:** "
            + "; ".join(f"{r.kv_dtype} trial {r.trial}: {r.status} ({r.error})" for r in res.failed.itertuples())
        )
    return "\n".join(lines)


def method_table(res: ServingResult, deltas: pd.DataFrame) -> pd.DataFrame:
    """Both benchmark methods on the same engines (claim 8): per non-baseline dtype and ``naive_concurrency``
    point, the fp8-vs-baseline output tokens/s delta (% with its 95% CI and label) measured by the streamed
    closed loop and by the client that does not read the stream, and their difference in points."""
    rows = []
    for c in res.plan.naive_concurrency:
        for d in res.plan.kv_dtypes[1:]:
            st = deltas[(deltas.metric == f"output tok/s @c={c}") & (deltas.kv_dtype == d)]
            nv = deltas[(deltas.metric == f"output tok/s (no stream) @c={c}") & (deltas.kv_dtype == d)]
            if st.empty or nv.empty:
                continue
            a, b = st.iloc[0], nv.iloc[0]
            rows.append(
                {
                    "kv_dtype": d,
                    "concurrency": c,
                    "streamed_delta_pct": a.delta_pct,
                    "streamed_ci": f"{a.lo_pct:+.1f} to {a.hi_pct:+.1f}",
                    "streamed_label": a.label,
                    "no_stream_delta_pct": b.delta_pct,
                    "no_stream_ci": f"{b.lo_pct:+.1f} to {b.hi_pct:+.1f}",
                    "no_stream_label": b.label,
                    "difference_pts": b.delta_pct - a.delta_pct,
                }
            )
    return pd.DataFrame(rows)


def summary_values(
    res: ServingResult,
    deltas: pd.DataFrame,
    capacity: pd.DataFrame,
    search: pd.DataFrame,
    open_loop: pd.DataFrame,
    bandwidth: dict[str, Any] | None = None,
    fidelity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The key numbers for ``record_summary`` (flat keys, one value each; deltas as dicts)."""
    plan, a = res.plan, res.plan.baseline
    c = res.headline_concurrency
    out: dict[str, Any] = {
        "model": Path(plan.engine.model).name,
        "kv_dtypes": list(plan.kv_dtypes),
        "trials": plan.trials,
        "concurrency": list(res.concurrency),
        "headline_concurrency": c,
        "naive_concurrency": list(plan.naive_concurrency),
        "engines_ok": int((res.engines.status == "ok").sum()),
        "engines": len(res.engines),
        "engine_wall_s_total": round(float(res.engines.get("run_wall_s", pd.Series(dtype=float)).sum()), 1),
    }
    cap = capacity.set_index("kv_dtype")
    for d in plan.kv_dtypes:
        if d in cap.index and cap.loc[d].get("status") == "ok":
            out[f"capacity_tokens_{d}"] = int(cap.loc[d].kv_capacity_tokens)
            out[f"num_blocks_{d}"] = int(cap.loc[d].num_blocks)
            out[f"predicted_blocks_{d}"] = cap.loc[d].predicted_blocks
            out[f"mem_peak_gib_{d}"] = cap.loc[d].mem_peak_gib
            out[f"mem_steady_gib_{d}"] = cap.loc[d].mem_steady_gib
            dev = cap.loc[d].get("mem_device_peak_gib")
            if dev is not None and not pd.isna(dev):  # both engines on one GPU: per-engine figures are shares
                out["mem_device_peak_gib"] = max(float(dev), out.get("mem_device_peak_gib", 0.0))
                out["mem_shared_device"] = True
    for d in plan.kv_dtypes[1:]:
        if f"capacity_tokens_{d}" in out and f"capacity_tokens_{a}" in out:
            out["capacity_ratio" if len(plan.kv_dtypes) == 2 else f"capacity_ratio_{d}"] = (
                out[f"capacity_tokens_{d}"] / out[f"capacity_tokens_{a}"]
            )
    tp = throughput_table(res)
    for d in plan.kv_dtypes:
        g = tp[(tp.kv_dtype == d) & (tp.concurrency == c)]
        out[f"output_tok_s_{d}"] = g.output_tok_s.mean()
        out[f"total_tok_s_{d}"] = g.total_tok_s.mean()
        out[f"preemptions_{d}"] = g.preemptions.sum()
    closed = tp[tp.concurrency.notna()] if "concurrency" in tp else tp.iloc[0:0]
    out["preemptions_by_concurrency"] = {
        str(int(cc)): {str(d): float(g.preemptions.sum()) for d, g in gc.groupby("kv_dtype")}
        for cc, gc in closed.groupby("concurrency")
    }
    lat = latency_summary(res, by=("kv_dtype",))
    for r in lat.itertuples():
        if r.metric in ("ttft_ms", "tpot_ms", "itl_ms"):
            out[f"{r.metric.removesuffix('_ms')}_p50_ms_{r.kv_dtype}"] = r.p50
            out[f"{r.metric.removesuffix('_ms')}_p99_ms_{r.kv_dtype}"] = r.p99
    keep = (
        "delta_pct",
        "lo_pct",
        "hi_pct",
        "n",
        "label",
        "noise_floor_pct",
        "noise_floor_q25_pct",
        "noise_floor_q75_pct",
        "noise_pairs",
        "detectable_pct",
        "beyond_noise_floor",
        "a",
        "b",
    )
    out["deltas"] = {f"{r['kv_dtype']}: {r['metric']}": {k: r[k] for k in keep} for r in deltas.to_dict("records")}
    out["design"] = "paired: engines alive together, phases interleaved A B / B A by phase and trial"
    out["phase_seconds"] = plan.phase_seconds
    out["closed_loop_min_requests"] = {str(cc): min_requests(plan, cc) for cc in res.concurrency}
    ph = _ok(res, res.phases)
    closed = ph[ph.kind == "closed"] if len(ph) else ph
    if len(closed):
        out["closed_phase_wall_s_min"] = float(closed.wall_s.min())
        out["closed_phase_requests_min_ratio"] = float((closed.requests / closed.concurrency).min())
    head = deltas[deltas.metric == f"output tok/s @c={c}"]
    if len(head):
        h = head.iloc[0]
        out.update(
            throughput_delta_pct=h.delta_pct,
            throughput_delta_lo_pct=h.lo_pct,
            throughput_delta_hi_pct=h.hi_pct,
            throughput_delta_label=h.label,
            throughput_delta_n=int(h.n),
            throughput_detectable_pct=h.detectable_pct,
            throughput_beyond_noise=bool(h.beyond_noise_floor),
        )
    if len(head):
        out["noise_floor_pct"] = head.iloc[0].noise_floor_pct  # headline throughput: consecutive trials, same config
        out["noise_floor_iqr_pct"] = [head.iloc[0].noise_floor_q25_pct, head.iloc[0].noise_floor_q75_pct]
    rec = _ok(res, res.records)
    if len(rec) and "merged_deltas" in rec:
        measured = rec[rec.kind.isin(("closed", "open"))]
        out["merged_delta_requests_frac"] = float((measured.merged_deltas > 0).mean())  # 0: the client saw every token
    if len(search):
        for r in search.itertuples():
            out[f"max_concurrency_measured_{r.kv_dtype}"] = r.measured
            out[f"max_concurrency_predicted_{r.kv_dtype}"] = r.predicted
            out[f"max_concurrency_predicted_vllm_{r.kv_dtype}"] = r.predicted_vllm
            out[f"max_concurrency_censored_{r.kv_dtype}"] = bool(r.censored)
    if len(open_loop):
        out["open_loop"] = [
            {
                "kv_dtype": r.kv_dtype,
                "process": r.process,
                "requested_rate": r.requested_rate,
                "scheduled_rate": r.scheduled_rate,
                "achieved_rate": r.achieved_rate,
            }
            for r in open_loop.itertuples()
        ]
        # the sender's accuracy: achieved vs the drawn schedule (a short Poisson draw is not the requested rate)
        out["open_loop_rate_error_max"] = float((open_loop.achieved_rate / open_loop.scheduled_rate - 1).abs().max())
        out["open_loop_send_lag_max_ms"] = float(open_loop.send_lag_max_ms.max())
    if bandwidth:
        out["bandwidth_gbs"] = bandwidth.get("bandwidth_gbs")
        out["bandwidth_source"] = bandwidth.get("source")
    if fidelity:
        out["fidelity_ratio"] = fidelity.get("ratio")
        out["fidelity_within_tolerance"] = fidelity.get("within_tolerance")
        out["fidelity_round_ratios"] = fidelity.get("round_ratios")
        out["fidelity_spread_pct"] = fidelity.get("spread_pct")
        out["fidelity_resolvable"] = fidelity.get("resolvable")
    return out


# ------------------------------------------------------------------------------------------ summary rows
#: The row metric (:data:`fp8lab.summary_table.METRICS`) of a headline metric's phase kind and column.
ROW_METRICS = {("closed", "output_tok_s"): "output_tok_s", ("naive", "output_tok_s"): "output_tok_s_no_stream"}


def _row_metric(m: Metric) -> str:
    return ROW_METRICS.get((m.kind, m.column)) or f"{m.column.removesuffix('_s')}_{m.statistic}"


def _row_setting(m: Metric) -> str:
    if m.kind == "open":
        return f"open loop {m.process} {m.rate:g}/s"
    return "closed loop, not streamed" if m.kind == "naive" else "closed loop"


def run_device(res: ServingResult) -> str | None:
    """The device the study's engines ran on, as their provenance names it (the first successful run's)."""
    for run in res.runs:
        r = run["result"]
        if r.status == "ok" and (r.provenance or {}).get("device"):
            return str(r.provenance["device"])
    return None


def summary_rows(
    res: ServingResult, deltas: pd.DataFrame, capacity: pd.DataFrame, search: pd.DataFrame
) -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from its own tables: per headline metric
    (:func:`headline_metrics`) each dtype's per-trial mean and each candidate's paired change against the baseline
    (from :func:`delta_table`: value ``delta_pct`` %, its t interval, ``n`` pairs, ``beyond_noise``, ``detectable``);
    the pooled TTFT P50/P99 at the headline concurrency (:func:`latency_summary`); preemptions per closed-loop
    point (:func:`throughput_table`); capacity and peak memory per dtype (:func:`capacity_table`); the largest
    concurrency held without preemption where the search found the limit (:func:`capacity_search`; a censored
    search, a lower bound only, gives no row). Non-finite values give no row."""
    from fp8lab import summary_table as st

    plan, a = res.plan, res.plan.baseline
    device = run_device(res)
    model = Path(plan.engine.model).name
    common = {"study": "serving", "evidence": st.evidence_of(device, model), "device": device or "unknown"}
    common["model"] = model
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}

    def finite(v: Any) -> bool:
        return v is not None and not pd.isna(v) and math.isfinite(float(v))

    def add(**f: Any) -> None:
        if not finite(f.get("value")):
            return
        if not (finite(f.get("ci_low")) and finite(f.get("ci_high"))):
            f["ci_low"] = f["ci_high"] = None
        if not finite(f.get("detectable")):
            f["detectable"] = None
        row = st.make_row(**common, **f)
        rows.setdefault(tuple(row[k] for k in st.KEY), row)

    by_name = {m.name: m for m in headline_metrics(res)}
    for r in deltas.to_dict("records"):
        m = by_name.get(r["metric"])
        if m is None:
            continue
        where = {"metric": _row_metric(m), "setting": _row_setting(m), "concurrency": m.concurrency}
        add(**where, kv_dtype=a, value=r["a"], n=int(r["n_a"]), unit=r["unit"])
        add(**where, kv_dtype=r["kv_dtype"], value=r["b"], n=int(r["n_b"]), unit=r["unit"])
        add(
            **where,
            kv_dtype=r["kv_dtype"],
            baseline=a,
            value=r["delta_pct"],
            ci_low=r["lo_pct"],
            ci_high=r["hi_pct"],
            n=int(r["n"]),
            unit="%",
            beyond_noise=bool(r["beyond_noise_floor"]),
            detectable=r["detectable_pct"],
        )
    lat = latency_summary(res, by=("kv_dtype",))
    for r in lat.itertuples():
        if r.metric == "ttft_ms":
            for q in ("p50", "p99"):
                add(
                    metric=f"ttft_{q}_pooled",
                    setting="closed loop",
                    concurrency=res.headline_concurrency,
                    kv_dtype=r.kv_dtype,
                    value=getattr(r, q),
                    n=int(r.n),
                    unit="ms",
                )
    tp = throughput_table(res)
    if len(tp) and "concurrency" in tp:
        for (d, c), g in tp[tp.concurrency.notna()].groupby(["kv_dtype", "concurrency"]):
            add(
                metric="preemptions",
                setting="closed loop",
                concurrency=int(c),
                kv_dtype=d,
                value=float(g.preemptions.sum()),
                n=len(g),
                unit="preemptions",
            )
    n_eng = res.engines[res.engines.status == "ok"].groupby("kv_dtype").size() if len(res.engines) else {}
    for r in capacity.to_dict("records"):
        if r.get("status") != "ok":
            continue
        d = r["kv_dtype"]
        for metric, unit in (("kv_capacity_tokens", "tokens"), ("num_blocks", "blocks"), ("mem_peak_gib", "GiB")):
            if r.get(metric) is not None:
                n = int(n_eng.get(d, 1)) if metric == "mem_peak_gib" else 1
                add(metric=metric, setting="engine", kv_dtype=d, value=r[metric], n=n, unit=unit)
    shape = plan.capacity_shape
    for r in search.to_dict("records") if len(search) else []:
        if r["measured"] is not None and not r["censored"] and not pd.isna(r["measured"]):
            add(
                metric="max_concurrency_no_preemption",
                setting=f"capacity search, {shape[0]} in + {shape[1]} out" if shape else "capacity search",
                kv_dtype=r["kv_dtype"],
                value=int(r["measured"]),
                n=1,
                unit="requests",
            )
    return list(rows.values())


# --------------------------------------------------------------------------------------------------
# Fidelity: fp8lab's offline throughput vs `vllm bench throughput`
# --------------------------------------------------------------------------------------------------

_BENCH_CODE = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.throughput import add_cli_args, main
if __name__ == "__main__":
    p = FlexibleArgumentParser()
    add_cli_args(p)
    main(p.parse_args(sys.argv[1:]))
"""


def bench_args(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    num_warmups: int,
    output_json: str,
    tokenizer: str | None = None,
) -> list[str]:
    """``vllm bench throughput`` arguments for the same engine settings as ``spec``: random dataset with
    exact lengths (``--random-range-ratio 0``), prefix caching as in the spec, no detokenization."""
    args = [
        "--backend",
        "vllm",
        "--model",
        spec.model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(num_prompts),
        "--num-warmups",
        str(num_warmups),
        "--output-json",
        output_json,
        "--kv-cache-dtype",
        spec.kv_cache_dtype,
        "--dtype",
        spec.dtype,
        "--seed",
        str(spec.seed),
        "--load-format",
        spec.load_format,
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(spec.gpu_memory_utilization),
        "--disable-detokenize",
        "--enforce-eager" if spec.enforce_eager else "--no-enforce-eager",
        "--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if tokenizer:  # a folder path is made absolute: the benchmark's working directory need not be the repo's
        from fp8lab.specs import resolve_model

        args += ["--tokenizer", resolve_model(tokenizer)]
    for flag, value in (
        ("--max-model-len", spec.max_model_len),
        ("--block-size", spec.block_size),
        ("--max-num-seqs", spec.max_num_seqs),
        ("--max-num-batched-tokens", spec.max_num_batched_tokens),
        ("--attention-backend", spec.attention_backend),
    ):
        if value is not None:
            args += [flag, str(value)]
    if spec.kv_cache_gib is not None:
        args += ["--kv-cache-memory-bytes", str(int(spec.kv_cache_gib * 2**30))]
    if getattr(spec, "calculate_kv_scales", False):
        args.append("--calculate-kv-scales")
    return args


def run_vllm_bench(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    num_warmups: int = 0,
    tokenizer: str | None = None,
    work_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run vLLM's offline throughput benchmark in a fresh Python process (the CPU build's ``vllm`` command
    does not start, vllm-notes section 8; this is the same code). Returns its JSON (``elapsed_time``,
    ``num_requests``, ``total_num_tokens``, ``tokens_per_second``) plus ``status``, ``log`` path and
    ``wall_s``."""
    wd = Path(work_dir or tempfile.mkdtemp(prefix="fp8lab-bench-"))
    wd.mkdir(parents=True, exist_ok=True)
    out_json, log = wd / "bench.json", wd / "bench.log"
    out_json.unlink(missing_ok=True)
    # the spec's budget is the one; the same vLLM process layout as fp8lab's own engines (devices.engine_env)
    from fp8lab.devices import engine_env

    env = {**{k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}, **engine_env()}
    cmd = [
        sys.executable,
        "-c",
        _BENCH_CODE,
        *bench_args(spec, input_len, output_len, num_prompts, num_warmups, str(out_json), tokenizer),
    ]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=spec.timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    out: dict[str, Any] = {
        "status": "ok" if rc == 0 and out_json.exists() else "error",
        "returncode": rc,
        "log": str(log),
        "wall_s": time.perf_counter() - t0,
        "cmd": cmd[3:],
    }
    if out_json.exists():
        out.update(json.loads(out_json.read_text()))
    else:
        from fp8lab.engine import root_cause

        out["error"] = root_cause(log.read_text(errors="replace"), f"exit code {rc}")
    return out


def run_fp8lab_offline(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    num_warmups: int = 0,
    prompt_source: PromptSource = "random",
    seed: int = 0,
    work_dir: str | Path | None = None,
    tag: str = "",
    temperature: float = 0.0,
) -> dict[str, Any]:
    """fp8lab's offline throughput: ``num_prompts`` requests of exactly ``input_len`` / ``output_len``
    tokens through ``LLM.generate`` (the ``llm`` driver), after ``num_warmups`` warm-up requests; total
    tokens per second of the timed phase, as vLLM's benchmark counts them. ``temperature``: 0 greedy, else
    sampled (vLLM's benchmark samples at 1.0)."""
    from fp8lab.engine import run_engine

    cls = [RequestClass("fidelity", input_len, output_len)]
    phases = []
    if num_warmups:
        phases.append(
            Phase(
                "warmup",
                _tagged(
                    build_requests(spec.model, cls, num_warmups, source=prompt_source, seed=seed + 1),
                    tag,
                    temperature=temperature,
                ),
            )
        )
    phases.append(
        Phase(
            "main",
            _tagged(
                build_requests(spec.model, cls, num_prompts, source=prompt_source, seed=seed),
                tag,
                temperature=temperature,
            ),
        )
    )
    res = run_engine(spec, phases, driver="llm", work_dir=work_dir)
    out: dict[str, Any] = {"status": res.status, "error": res.error, "wall_s": res.engine.get("run_wall_s")}
    if res.ok:
        ph = res.phases["main"]
        total = ph["prompt_tokens"] + ph["output_tokens"]
        out.update(
            elapsed_time=ph["wall_s"],
            num_requests=ph["requests"],
            total_num_tokens=total,
            tokens_per_second=total / ph["wall_s"],
            requests_per_second=ph["requests"] / ph["wall_s"],
        )
    return out


def fidelity_check(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    *,
    rounds: int = 2,
    num_warmups: int = 4,
    tokenizer: str | None = None,
    prompt_source: PromptSource = "random",
    temperature: float = 1.0,
    tolerance: float = 0.03,
    work_dir: str | Path | None = None,
    store: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """fp8lab's offline throughput vs ``vllm bench throughput`` on the same model, lengths, request count
    and kv dtype (``spec``), measured now, ``rounds`` times in alternating order (bench, fp8lab, fp8lab,
    bench, ...) so slow drifts of a shared machine cancel. Returns :func:`fidelity_summary` of the runs (``rows``,
    one per run; ``ratio``, ``within_tolerance``, each tool's own ``spread_pct`` and ``resolvable``) with the
    settings.

    vLLM's benchmark samples at temperature 1.0 (top-p 1), so fp8lab samples at ``temperature`` = 1.0 too
    (sampling costs more than greedy decoding: about 5-8% of the step for the tiny model on CPU, measured on
    one engine). Remaining difference: its random prompts are re-tokenized text (fp8lab: token ids), a few
    tokens longer or shorter. ``tokenizer`` is needed by the benchmark for a model folder without one (e.g.
    dummy weights: pass the shipped model's).

    ``store``: a folder that keeps each finished run (``<store>/<hash of settings.json>/round<r>-<who>.json``
    with its provenance, and the run's logs beside it), so that a check cut short (a time limit, a dead
    kernel) resumes: runs already finished with status ``ok`` are loaded (``cached`` True), the others run.
    """
    from fp8lab import results
    from fp8lab.devices import provenance
    from fp8lab.specs import spec_hash

    check_int("fidelity", "rounds", rounds, 1, 100)
    check_float("fidelity", "tolerance", tolerance, 0.0, 1.0, lo_open=True)
    settings = {
        "engine": spec.to_dict(),
        "input_len": input_len,
        "output_len": output_len,
        "num_prompts": num_prompts,
        "num_warmups": num_warmups,
        "tokenizer": tokenizer,
        "prompt_source": prompt_source,
        "temperature": temperature,
    }
    keep = Path(store) / spec_hash(settings) if store is not None else None
    wd = Path(work_dir) if work_dir else keep or Path(tempfile.mkdtemp(prefix="fp8lab-fidelity-"))
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "settings.json").write_text(json.dumps(settings, indent=2, sort_keys=True, default=str))
    rows = []
    for r in range(rounds):
        order = ("bench", "fp8lab") if r % 2 == 0 else ("fp8lab", "bench")
        for who in order:
            t = time.perf_counter()
            sub = wd / f"round{r}-{who}"
            kept = keep / f"round{r}-{who}.json" if keep is not None else None
            stored = json.loads(kept.read_text()) if kept is not None and kept.is_file() else {}
            if stored.get("status") == "ok":
                rows.append({**{k: v for k, v in stored.items() if k != "provenance"}, "cached": True})
                if progress:
                    print(
                        f"fidelity round {r} {who}: ok (stored), {rows[-1]['tokens_per_second']:.1f} tok/s", flush=True
                    )
                continue
            if results.store_only():  # re-rendering from committed stores: never start an engine
                out = {
                    "status": "error",
                    "error": f"not in the fidelity store ({kept}); ${results.STORE_ONLY_ENV} is set, so nothing is run",
                }
            elif who == "bench":
                out = run_vllm_bench(spec, input_len, output_len, num_prompts, num_warmups, tokenizer, sub)
            else:
                out = run_fp8lab_offline(
                    spec,
                    input_len,
                    output_len,
                    num_prompts,
                    num_warmups,
                    prompt_source,
                    work_dir=sub,
                    tag=f"fidelity-round{r}",
                    temperature=temperature,
                )
                (sub / "result.pkl").unlink(missing_ok=True)  # the worker's raw records: the row keeps the figures
            row = {
                "round": r,
                "who": who,
                "status": out["status"],
                "tokens_per_second": out.get("tokens_per_second"),
                "elapsed_time": out.get("elapsed_time"),
                "total_num_tokens": out.get("total_num_tokens"),
                "num_requests": out.get("num_requests"),
                "error": out.get("error"),
            }
            if kept is not None:  # with where and with what it ran
                kept.write_text(json.dumps({**row, "provenance": provenance(with_torch=False)}, indent=2, default=str))
            rows.append({**row, "cached": False})
            if progress:
                tps = row["tokens_per_second"]
                print(
                    f"fidelity round {r} {who}: {row['status']}, "
                    f"{'n/a' if tps is None else f'{tps:.1f}'} tok/s ({time.perf_counter() - t:.0f} s)",
                    flush=True,
                )
    return {
        **fidelity_summary(pd.DataFrame(rows), tolerance),
        "kv_dtype": spec.kv_cache_dtype,
        "temperature": temperature,
        "input_len": input_len,
        "output_len": output_len,
        "num_prompts": num_prompts,
        "rounds": rounds,
        "work_dir": str(wd),
    }


def fidelity_summary(rows: pd.DataFrame, tolerance: float = 0.03) -> dict[str, Any]:
    """The fidelity check's verdict from its ``rows`` (``round, who, status, tokens_per_second``; ``who`` is
    ``bench`` or ``fp8lab``): ``round_ratios`` (fp8lab / bench of each round, whose two runs ran back to back),
    ``ratio`` (their median), ``within_tolerance`` (``|ratio - 1| <= tolerance``), ``spread_pct`` (per tool with
    two or more runs: its fastest run over its slowest, minus 1, in %) and ``resolvable``: whether the check
    can tell ``tolerance`` apart at all (both tools' own spread within it; ``None`` with fewer than 2 rounds).
    A ratio outside the tolerance while a tool disagrees with itself by more is run-to-run variation of
    runs too short for this machine, not a disagreement between the tools: run more requests."""
    ok = rows[rows.status == "ok"]
    per_round = ok.pivot_table(index="round", columns="who", values="tokens_per_second")
    ratios = (per_round["fp8lab"] / per_round["bench"]).dropna() if {"fp8lab", "bench"} <= set(per_round) else []
    ratio = float(np.median(ratios)) if len(ratios) else None
    spread = {
        str(w): 100.0 * (float(g.max()) / float(g.min()) - 1.0)
        for w, g in ok.groupby("who").tokens_per_second
        if len(g) >= 2 and float(g.min()) > 0
    }
    resolvable = None if len(spread) < 2 else bool(max(spread.values()) <= 100.0 * tolerance)
    return {
        "ratio": ratio,
        "round_ratios": [float(r) for r in ratios],
        "within_tolerance": ratio is not None and abs(ratio - 1) <= tolerance,
        "tolerance": tolerance,
        "spread_pct": spread,
        "resolvable": resolvable,
        "rows": rows,
    }


# --------------------------------------------------------------------------------------------------
# The notebook's parameters -> the plan; the time plan of a profile before anything starts
# --------------------------------------------------------------------------------------------------


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
    )


def profile_estimate(profile: str, overrides: dict[str, Any] | None = None, gpu: bool = True) -> pd.DataFrame:
    """:func:`estimate_seconds` of notebook 01 under a profile (``fp8lab/profiles.yaml``), without starting
    anything: the parameters as papermill would pass them, engine starts of a fresh GPU host (``gpu``) or CPU."""
    from fp8lab.paths import NOTEBOOKS_DIR
    from fp8lab.report import load_profile, resolved_parameters

    params = resolved_parameters(NOTEBOOKS_DIR / f"{STUDY}.ipynb", load_profile(profile), overrides)
    plan = plan_from_params(params)
    fid = (params["FIDELITY_ROUNDS"], 2) if params["RUN_FIDELITY"] else None
    return estimate_seconds(plan, engine_start_s=144.0 if gpu else 30.0, step_s=0.02 if gpu else 0.01, fidelity=fid)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fp8lab.serving --profile h200-graphs [-p NAME VALUE ...]``: print Study 01's time plan."""
    import argparse
    import ast

    ap = argparse.ArgumentParser(prog="python -m fp8lab.serving", description=main.__doc__)
    ap.add_argument("--profile", required=True)
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    ap.add_argument("--cpu", action="store_true", help="CPU engine start times")
    a = ap.parse_args(argv)
    over = {}
    for k, v in a.p:
        try:
            over[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            over[k] = v
    from fp8lab.paths import NOTEBOOKS_DIR
    from fp8lab.report import load_profile, resolved_parameters

    est = profile_estimate(a.profile, over, gpu=not a.cpu)
    plan = plan_from_params(resolved_parameters(NOTEBOOKS_DIR / f"{STUDY}.ipynb", load_profile(a.profile), over))
    with pd.option_context("display.width", 200, "display.max_colwidth", 100):
        print(
            f"Study 01 time plan, profile {a.profile}: {len(schedule_table(plan))} phases in the paired schedule "
            f"(each kept as phase-*.json.gz when done)\n{est.to_string(index=False)}",
            flush=True,
        )
    return 0


__all__ = [
    "Arrival",
    "Metric",
    "STUDY",
    "ServingPlan",
    "ServingResult",
    "bench_args",
    "build_phases",
    "capacity_ladder",
    "capacity_search",
    "capacity_table",
    "concurrency_limit",
    "delta_line",
    "delta_row",
    "delta_table",
    "engine_table",
    "estimate_seconds",
    "fidelity_check",
    "min_requests",
    "paired_schedule",
    "phase_payload",
    "plan_from_params",
    "profile_estimate",
    "schedule_table",
    "fidelity_line",
    "fidelity_summary",
    "preemption_line",
    "headline_metrics",
    "require_ok",
    "itl_frame",
    "kv_usage_timeline",
    "latency_summary",
    "mean_context",
    "method_table",
    "noise_floor_table",
    "open_loop_table",
    "phase_meta",
    "phase_records",
    "predicted_blocks",
    "resolve_concurrency",
    "roofline_measured",
    "roofline_tables",
    "run_fp8lab_offline",
    "run_study",
    "run_vllm_bench",
    "summary_values",
    "throughput_table",
    "trial_order",
    "verdict",
]


if __name__ == "__main__":
    raise SystemExit(main())
