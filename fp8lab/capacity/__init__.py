"""Study 00: KV-cache memory. What does FP8 KV buy, by the formula and by the engine?

From a model's ``config.json`` alone (:mod:`fp8lab.kvmath`, pure arithmetic): the KV bytes per token of every
layer and kv dtype, the KV of one sequence against context length, the capacity on one GPU (blocks, tokens,
concurrent sequences) and the total memory (weights + KV) at a load; then the arithmetic against what vLLM does:
one engine per kv dtype with a fixed KV budget (:func:`capacity_check`; random weights, only shapes matter), and
every engine stored in the results stores named (:func:`records_check`), each beside the block count the formula
predicts from the engine's own budget and block size.

The study is one subpackage, one concept per module; arrows point down only (``spec`` imports none of the others):

- :mod:`~fp8lab.capacity.spec`: :class:`CapacitySpec` (validated, ``from_params``), :func:`check_record_roots`.
- :mod:`~fp8lab.capacity.check`: the measured check (:func:`capacity_check`, :func:`check_runs`).
- :mod:`~fp8lab.capacity.records`: the engines on record (:func:`records_check`, :func:`summarize_records`).
- :mod:`~fp8lab.capacity.run`: :func:`run_capacity` -> :class:`CapacityRun`.
- :mod:`~fp8lab.capacity.tables`: the tables from a run (formula, per layer, curve, plan, memory).
- :mod:`~fp8lab.capacity.summary`: :func:`summarize`, :func:`summary`, :func:`summary_rows`;
  :mod:`~fp8lab.capacity.verdict`: :func:`verdict_markdown`, :func:`records_markdown`, :func:`verdicts`.
- :mod:`~fp8lab.capacity.plots`: the notebook's figures (imported on its own: it loads matplotlib).
- :mod:`~fp8lab.capacity.study`: the study contract (:mod:`fp8lab.study`) the notebook calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``rows()``, ``verdict()``, ``markdown()``).

Every public name of the former ``fp8lab/capacity.py`` is re-exported here (``from fp8lab import capacity;
capacity.capacity_check(...)``); the function ``summary`` shadows its submodule's name on the package (import the
module by its dotted name).
"""

from __future__ import annotations

from fp8lab.capacity.check import COLUMNS, NOT_RUN, capacity_check, check_runs
from fp8lab.capacity.records import RECORD_COLUMNS, records_check, summarize_records
from fp8lab.capacity.run import CapacityRun, run_capacity
from fp8lab.capacity.spec import STUDY, CapacitySpec, check_record_roots
from fp8lab.capacity.summary import summarize, summary, summary_rows  # the function shadows the submodule's name
from fp8lab.capacity.tables import tables  # the function shadows the submodule's name here
from fp8lab.capacity.verdict import CLAIMS, records_markdown, verdict_markdown, verdicts

__all__ = [
    "CLAIMS",
    "COLUMNS",
    "NOT_RUN",
    "RECORD_COLUMNS",
    "STUDY",
    "CapacityRun",
    "CapacitySpec",
    "capacity_check",
    "check_record_roots",
    "check_runs",
    "records_check",
    "records_markdown",
    "run_capacity",
    "summarize",
    "summarize_records",
    "summary",
    "summary_rows",
    "tables",
    "verdict_markdown",
    "verdicts",
]
