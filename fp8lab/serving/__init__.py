"""The serving study: does FP8 KV cache change throughput and latency, beyond noise?

One :class:`ServingPlan` describes the whole A/B study, a paired design: :func:`run_study` starts ONE
engine per kv dtype, each in its own process (:mod:`fp8lab.serving.worker`), and keeps both alive for
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

Runs go through :func:`fp8lab.engine.results.run_cached` (a finished run is loaded, not repeated; a failed one
is kept with its reason). The analysis functions turn a :class:`ServingResult` into tidy tables for
the notebook: capacity, throughput vs concurrency, per-class latency percentiles, the fp8-vs-baseline
deltas paired per trial with t intervals, the noise floor of each config against itself and the "beyond
noise" rule (all from :mod:`fp8lab.stats`), the capacity search and the
roofline comparison (:mod:`fp8lab.roofline`). :func:`fidelity_check` compares fp8lab's offline
throughput with vLLM's own ``vllm bench throughput`` on the same settings.

The study is one subpackage, one concept per module; arrows point down only (``spec`` imports no other module of
the study):

- :mod:`~fp8lab.serving.spec`: :class:`ServingPlan` (validated), :func:`plan_from_params`, :class:`ServingSpec`
  (the plan and the notebook's side measurements: the study contract's ``Spec``).
- :mod:`~fp8lab.serving.schedule`: the sweep, the capacity ladder, the phases and their paired order.
- :mod:`~fp8lab.serving.estimate`: the time plan (:func:`estimate_seconds`, ``python -m fp8lab.serving``).
- :mod:`~fp8lab.serving.paired`: the engine processes and the paired run (:func:`~fp8lab.serving.paired.run_paired`).
- :mod:`~fp8lab.serving.run`: :func:`run_study` -> :class:`ServingResult`.
- :mod:`~fp8lab.serving.tables`: capacity, throughput, latency, open loop, capacity search, roofline.
- :mod:`~fp8lab.serving.deltas`: the headline metrics and their paired deltas, the noise floor, both methods.
- :mod:`~fp8lab.serving.replication`: fresh engines per dtype (issue 35): per-engine values, deltas over engine pairs.
- :mod:`~fp8lab.serving.verdict`: the verdict in prose; :mod:`~fp8lab.serving.summary`: the summary and its rows.
- :mod:`~fp8lab.serving.fidelity`: fp8lab's offline throughput vs ``vllm bench throughput``.
- :mod:`~fp8lab.serving.plots`: the notebook's figures (imported on its own: it loads matplotlib).
- :mod:`~fp8lab.serving.study`: the study contract (:mod:`fp8lab.study`) the notebook calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``verdict()``, ``markdown()``).

Every public name of the former single module ``fp8lab/serving.py`` is re-exported here (``from fp8lab import
serving; serving.run_study(...)``); the function ``verdict`` shadows its submodule's name on the package (import
that module by its dotted name).
"""

from __future__ import annotations

from fp8lab.serving.deltas import (
    DELTA_COLUMNS,
    Metric,
    delta_row,
    delta_table,
    headline_metrics,
    method_table,
    noise_floor_table,
    per_trial,  # noqa: F401  (the unit tests call it on the package)
)
from fp8lab.serving.estimate import estimate_seconds, main, profile_estimate
from fp8lab.serving.fidelity import (
    bench_args,
    fidelity_check,
    fidelity_summary,
    run_fp8lab_offline,
    run_vllm_bench,
)
from fp8lab.serving.run import ServingResult, attribute_shared_memory, run_study
from fp8lab.serving.schedule import (
    build_phases,
    capacity_ladder,
    concurrency_limit,
    mean_context,
    min_requests,
    paired_schedule,
    phase_meta,
    phase_payload,
    predicted_blocks,
    resolve_concurrency,
    schedule_table,
    trial_order,
)
from fp8lab.serving.spec import (
    DEFAULT_BLOCK_SIZE,
    STUDY,
    Arrival,
    ServingPlan,
    ServingSpec,
    default_block_size,
    plan_from_params,
)
from fp8lab.serving.summary import ROW_METRICS, run_device, summary_rows, summary_values
from fp8lab.serving.tables import (
    ENGINE_COLUMNS,
    capacity_search,
    capacity_table,
    engine_table,
    itl_frame,
    kv_usage_timeline,
    latency_summary,
    open_loop_schedule,
    open_loop_table,
    phase_records,
    require_ok,
    roofline_measured,
    roofline_tables,
    throughput_table,
)
from fp8lab.serving.verdict import (
    delta_line,
    fidelity_line,
    preemption_line,
    tput_point,  # noqa: F401  (the unit tests call it on the package)
    verdict,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DELTA_COLUMNS",
    "ENGINE_COLUMNS",
    "ROW_METRICS",
    "attribute_shared_memory",
    "default_block_size",
    "main",
    "open_loop_schedule",
    "run_device",
    "summary_rows",
    "Arrival",
    "Metric",
    "STUDY",
    "ServingSpec",
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
