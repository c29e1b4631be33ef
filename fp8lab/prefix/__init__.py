"""Study 07: FP8 KV and the prefix cache. Does ``fp8`` keep more of the reused prefixes than ``auto``?

The claim under test (a field report): FP8 KV leaves the prefix-cache hit rate unchanged (68.3% -> 67.9% on
multi-turn chat, 54.1% -> 53.7% on JSON generation). The mechanism predicts more: vLLM's block hashes depend on
the token ids only, not on the KV dtype, so at equal KV memory both dtypes hit alike while the cache holds the
working set; once it does not, ``fp8`` holds twice the blocks, so its hit rate should stay up where ``auto``'s
falls, and its time to first token (TTFT) should be lower exactly there.

**Workloads** (:class:`Shape`, real text from ``data/text`` or seeded random ids for dummy weights): ``N``
conversations are active at once and served round robin, turn by turn, at most ``max_in_flight`` requests at a
time (a wave). Turn ``t`` of a conversation sends ``shared + private + u_0 + a_0 + ... + u_t``: the conversation so
far, the model's last answer (its own greedy output) and a new user message. ``chat``: no shared part; ``system``:
every conversation starts with one long shared system prompt; ``json``: a shared JSON-schema template, then a
private JSON record, then extraction requests. ``N`` is swept from well inside to well beyond what the KV budget
holds; each (workload, N, trial) cell starts from an empty prefix cache (``reset_prefix_cache``).

**Prediction** (:func:`simulate`, no engine): vLLM's block pool replayed on the same schedule (LRU free queue,
blocks freed tail first, a block cached once it is full, the null block, hits capped at ``(prompt - 1) // block``
blocks). It gives each cell's hit rate for both block counts, and the knee: the largest ``N`` that loses no hit
against an unbounded cache. :func:`knee_formula` is the same in one line of arithmetic.

**Measurement** (:mod:`fp8lab.prefix.worker`): one engine per KV dtype, both alive, serving the whole sweep,
alternating within every cell pair (AB, BA, ...). Hit rate from vLLM's own prefix-cache counters (the per-step
``prefix_cache_stats`` that vLLM adds to ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``), per-request
``num_cached_tokens``, TTFT, throughput, preemptions and peak KV usage per turn; ``trials`` paired repetitions
(fresh text per trial, the same for both dtypes). Correctness: greedy tokens and logprobs of the same prompt with
a prefix hit against computed cold, within each dtype.

The store keeps one folder per spec (``<runs>/07_prefix/<hash>/``): ``spec.json``, ``rows.jsonl`` (a row per cell
and turn), ``correctness.jsonl``, ``engines.json`` (engine facts, failures with their reason, provenance),
``worker.log`` and ``complete.json`` once done. A complete run is loaded, an incomplete one resumes.

The study is one subpackage, one concept per module; arrows point down only (``spec`` imports only the block
arithmetic of ``predict``, never ``run``):

- :mod:`~fp8lab.prefix.spec`: :class:`Shape`, :class:`PrefixSpec` (validated, ``from_params``, ``descriptor``).
- :mod:`~fp8lab.prefix.prompts`: the conversations' token ids (:func:`conversation_pool`).
- :mod:`~fp8lab.prefix.predict`: the prediction (:class:`BlockPool`, :func:`simulate`, knees, :func:`plan`).
- :mod:`~fp8lab.prefix.run`: :func:`run_prefix` (the worker, :mod:`fp8lab.prefix.worker`) -> :class:`PrefixRun`;
  :func:`load`.
- :mod:`~fp8lab.prefix.replication`: fresh engines per dtype (issue 35): per-engine cells, intervals over engines.
- :mod:`~fp8lab.prefix.tables`: the tables from a run's rows (cells, sweep, knees, correctness).
- :mod:`~fp8lab.prefix.summary`: :func:`summary`, :func:`summary_rows` (the typed rows);
  :mod:`~fp8lab.prefix.verdict`: :data:`CLAIM`,
  :func:`claim_verdict`, :func:`claim_evidence`, :func:`verdict`.
- :mod:`~fp8lab.prefix.plots`: the notebook's figures (imported on its own: it loads matplotlib).
- :mod:`~fp8lab.prefix.study`: the study contract (:mod:`fp8lab.study`) the notebook calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``rows()``, ``verdict()``, ``markdown()``).

Every public name is re-exported here (``from fp8lab import prefix as px; px.PrefixSpec(...)``); the functions
``summary`` and ``verdict`` shadow their submodules' names on the package (import those modules by their dotted
name).
"""

from __future__ import annotations

from fp8lab.prefix.predict import (
    BlockPool,
    conversation_blocks,
    knee_formula,
    knee_simulated,
    plan,
    sim_hit_rate,
    simulate,
)
from fp8lab.prefix.prompts import conversation_pool
from fp8lab.prefix.run import PrefixRun, load, run_prefix

# CPU_DEFAULT_BLOCK, PROTOCOL, STUDY, PromptSource, WorkloadKind and claim_evidence: module-level names of the
# former fp8lab/prefix.py that its __all__ left out, still importable from here (hence the noqa)
from fp8lab.prefix.spec import (  # noqa: F401
    CPU_DEFAULT_BLOCK,
    PROTOCOL,
    STUDY,
    PrefixSpec,
    PromptSource,
    Shape,
    WorkloadKind,
    parse_workloads,
)
from fp8lab.prefix.summary import summary, summary_rows  # summary: the function shadows the submodule's name
from fp8lab.prefix.tables import (
    cell_table,
    compare_outputs,
    correctness_table,
    knee_table,
    measured_knee,
    sweep_table,
)
from fp8lab.prefix.verdict import CLAIM, claim_evidence, claim_verdict, verdict  # noqa: F401  (claim_evidence)

__all__ = [
    "CLAIM",
    "BlockPool",
    "PrefixRun",
    "PrefixSpec",
    "Shape",
    "cell_table",
    "claim_verdict",
    "compare_outputs",
    "conversation_blocks",
    "conversation_pool",
    "correctness_table",
    "knee_formula",
    "knee_simulated",
    "knee_table",
    "load",
    "measured_knee",
    "parse_workloads",
    "plan",
    "run_prefix",
    "sim_hit_rate",
    "simulate",
    "summary",
    "summary_rows",
    "sweep_table",
    "verdict",
]
