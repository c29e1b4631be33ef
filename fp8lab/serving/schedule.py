"""Study 01's schedule: the closed-loop sweep and capacity ladder from the KV formula, the phases each engine serves
(:func:`build_phases`, names parsed back by :func:`phase_meta`), their paired run order (:func:`paired_schedule`,
:func:`schedule_table`) and what the engine process receives for each (:func:`phase_payload`). No engine starts
here."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab import kvmath
from fp8lab.serving.spec import ServingPlan, default_block_size, on_gpu
from fp8lab.specs import EngineSpec, Phase, Request
from fp8lab.workloads import RequestClass, build_requests, with_arrivals


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
        hybrid_kv_cache_manager=on_gpu(),
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


def tagged_requests(reqs: Sequence[Request], tag: str, **changes: Any) -> tuple[Request, ...]:
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
        phases.append(Phase("warmup", tagged_requests(reqs, tag), concurrency=max(concurrency)))
    for c in concurrency:
        n = min_requests(plan, c)  # every point reaches its concurrency, 4 times over at least
        reqs = build_requests(model, plan.mix, n, source=src, seed=plan.seed + 2)
        phases.append(Phase(f"closed-c{c}", tagged_requests(reqs, tag), concurrency=c))
    for c in plan.naive_concurrency:
        n = min_requests(plan, c)
        reqs = build_requests(model, plan.mix, n, source=src, seed=plan.seed + 2)  # closed-c<N>'s requests
        phases.append(Phase(f"naive-c{c}", tagged_requests(reqs, tag), concurrency=c, client="final"))
    for i, rate in enumerate(plan.rates):
        for process in plan.arrivals:
            reqs = build_requests(model, plan.mix, plan.open_loop_requests, source=src, seed=plan.seed + 3)
            sched = with_arrivals(reqs, rate, process, seed=plan.seed + 100 + i)  # type: ignore[arg-type]
            phases.append(Phase(f"open-{process}-{rate:g}", tagged_requests(sched, tag)))
    if plan.capacity_shape is not None and trial < plan.capacity_trials and capacity_predicted:
        shape = RequestClass("capacity", *plan.capacity_shape)
        for c in capacity_ladder(capacity_predicted, plan.capacity_factors):
            reqs = build_requests(model, [shape], c, source=src, seed=plan.seed + 4)
            phases.append(Phase(f"cap-c{c}", tagged_requests(reqs, tag), concurrency=c))
    return phases


def phase_payload(plan: ServingPlan, phase: Phase, trial: int) -> dict[str, Any]:
    """What the engine process receives for one phase: the phase as a dict, with ``min_seconds`` /
    ``min_requests`` for a sustained closed loop (streamed closed-loop phases) and a ``key`` naming the
    trial."""
    d = dataclasses.asdict(phase)
    d["key"] = f"t{trial}:{phase.name}"
    if phase_meta(phase.name)["kind"] == "closed":
        d.update(min_seconds=plan.phase_seconds, min_requests=min_requests(plan, int(phase.concurrency or 1)))
    return d


def plan_phases(plan: ServingPlan, conc: Sequence[int], cap_pred: dict[str, int]) -> dict[str, dict[int, list[Phase]]]:
    return {d: {t: build_phases(plan, d, t, conc, cap_pred.get(d)) for t in range(plan.trials)} for d in plan.kv_dtypes}


def planned(plan: ServingPlan) -> tuple[tuple[int, ...], dict[str, int]]:
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
    conc, cap = planned(plan)
    phases = plan_phases(plan, conc, cap)
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
