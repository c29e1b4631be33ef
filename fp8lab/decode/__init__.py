"""Study 06: where does FP8 KV make decode faster? Decode step time by context length and batch.

Engine-level replication (issue 35; :mod:`fp8lab.engine.schedule`): every KV dtype is started ``engines`` times,
fresh, in ABBA order, in two arms: ``colocated`` (a round's auto and fp8 engines alive together, today's layout)
and ``solo`` (one engine at a time at vLLM's default memory settings, as a user runs it). CUDA graphs on unless
``enforce_eager``, prefix caching off. Every engine measures every grid point (batch ``B``, context ``L``) ``reps``
times on the same fresh random-token prompts (:mod:`fp8lab.decode.worker` says how a step time is read from one
generation). With ``engines = 1`` and the co-located arm only, the design before issue 35 (one engine per dtype,
intervals over its repetitions), which the committed 2026-11-30 runs were measured with.

What comes out (:mod:`fp8lab.decode.replication`, the engine as the unit: repetitions averaged within an engine,
then intervals over engines), per arm: per point the fp8/auto ratio with a 95% t interval over engine pairs; per
dtype and batch the line ``step = a + b x context`` fitted per engine, with the fixed cost per step and per layer
and the slope, each with its interval over engines, and fp8's paired differences; per batch the crossover context
with Fieller's interval over engine pairs (stated within the measured contexts); the co-location effect on the fixed
cost (paired by round); each dtype's fraction of the memory-bandwidth bound (:mod:`fp8lab.roofline`).

The results store keeps one folder per spec (``<runs>/06_decode/<hash>/``): ``spec.json``, one sub-folder
per worker (``g0/``, ``g1/``... a worker per GPU group) with ``rows.jsonl`` (a row per measurement, written
as it is taken, naming its engine), ``engines.json`` (every engine's facts, failures, provenance, engine sets
deferred by ``FP8LAB_DEADLINE``) and ``worker.log``, and ``complete.json`` once every engine set is measured. An
incomplete run resumes with the engine sets it has not finished (a half-measured set runs again, fresh).

The study is one subpackage, one concept per module; arrows point down only (``spec`` imports no other module of
the study):

- :mod:`~fp8lab.decode.spec`: :class:`DecodeSpec` (validated, ``from_params``, ``descriptor``), :func:`plan` (the
  grid), :func:`margin`.
- :mod:`~fp8lab.decode.run`: :func:`run_decode` (the workers, :mod:`fp8lab.decode.worker`) -> :class:`DecodeRun`;
  :func:`load`, :func:`find_run`, :func:`store_bandwidth`.
- :mod:`~fp8lab.decode.replication`: the statistics over engines (points, fits, crossover, co-location effect).
- :mod:`~fp8lab.decode.tables`: points, fits, crossovers, co-location, roofline, capacity; :data:`ANCHORS`.
- :mod:`~fp8lab.decode.summary`: :func:`summary`, :func:`summary_rows`; :mod:`~fp8lab.decode.verdict`:
  :func:`verdict`.
- :mod:`~fp8lab.decode.plots`: the notebook's figures (imported on its own: it loads matplotlib).
- :mod:`~fp8lab.decode.study`: the study contract (:mod:`fp8lab.study`) the notebook calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``verdict()``, ``markdown()``).

Every public name of the former single module ``fp8lab/decode.py`` is re-exported here (``from fp8lab import
decode; decode.DecodeSpec(...)``); the functions ``summary`` and ``verdict`` shadow their submodules' names on the
package (import those modules by their dotted name).
"""

from __future__ import annotations

from fp8lab.decode.run import DecodeRun, find_run, load, run_decode, store_bandwidth
from fp8lab.decode.spec import PROTOCOL, STUDY, DecodeSpec, margin, plan
from fp8lab.decode.summary import summary, summary_rows  # the function shadows the submodule's name here
from fp8lab.decode.tables import (
    ANCHORS,
    capacity_table,
    crossover_table,
    fit_table,
    point_table,
    roofline_table,
)
from fp8lab.decode.verdict import verdict  # the function shadows the submodule's name here

__all__ = [
    "ANCHORS",
    "PROTOCOL",
    "STUDY",
    "DecodeRun",
    "DecodeSpec",
    "capacity_table",
    "crossover_table",
    "find_run",
    "fit_table",
    "load",
    "margin",
    "plan",
    "point_table",
    "roofline_table",
    "run_decode",
    "store_bandwidth",
    "summary",
    "summary_rows",
    "verdict",
]
