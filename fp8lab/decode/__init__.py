"""Study 06: where does FP8 KV make decode faster? Decode step time by context length and batch.

One engine per KV dtype serves the whole grid (CUDA graphs on unless ``enforce_eager``), prefix caching
off. Every grid point (batch ``B``, context ``L``) is measured in ``reps`` paired repetitions: the same
fresh random-token prompts for every dtype within a repetition, the dtypes alternating AB, BA, ... while
both engines are alive (:mod:`fp8lab.decode_worker` says how a step time is read from one generation).

What comes out, per point: each dtype's mean step time, the fp8/auto ratio with a 95% t interval over the
pairs (:func:`fp8lab.stats.paired_ratio`), the same-config noise floor (:func:`fp8lab.stats.self_noise`);
per dtype and batch a line ``step = a + b x context`` (:func:`fp8lab.stats.ols`); per batch the context
where fp8 becomes faster, from the fitted paired difference, with Fieller's interval; and each dtype's
fraction of the memory-bandwidth bound (:mod:`fp8lab.roofline`).

The results store keeps one folder per spec (``<runs>/06_decode/<hash>/``): ``spec.json``, one sub-folder
per worker (``g0/``, ``g1/``... a worker per GPU group) with ``rows.jsonl`` (a row per measurement, written
as it is taken), ``engines.json`` (engine facts, failures, provenance) and ``worker.log``, and
``complete.json`` once every point is measured. An incomplete run resumes where it stopped.

The study is one subpackage, one concept per module; arrows point down only (``spec`` imports no other module of
the study):

- :mod:`~fp8lab.decode.spec`: :class:`DecodeSpec` (validated, ``from_params``, ``descriptor``), :func:`plan` (the
  grid), :func:`margin`.
- :mod:`~fp8lab.decode.run`: :func:`run_decode` (the workers, :mod:`fp8lab.decode_worker`) -> :class:`DecodeRun`;
  :func:`load`, :func:`find_run`, :func:`store_bandwidth`.
- :mod:`~fp8lab.decode.tables`: points, fits, crossovers, roofline, capacity; :data:`ANCHORS`.
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
