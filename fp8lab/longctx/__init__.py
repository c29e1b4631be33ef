"""Study 04: long context, ``auto`` vs ``fp8`` KV cache, on a ramp of context lengths up to 128K.

The field reports say FP8 KV cache is "the key to long context": bf16 runs out of memory where fp8
keeps going, FP8's gains grow with context length, block size 256 beats 16 at 128K, the real danger
is silent failure (no error, worse output) rather than OOM, and most "128K tests" are worthless
because they feed random tokens. This module measures each claim; the notebook
``notebooks/04_long_context_ramp_128k.ipynb`` only calls it.

What runs (one :class:`LongCtxPlan`; every engine through :func:`fp8lab.engine.results.run_cached`, so a
finished run is loaded, a failed one is kept with its reason, and the study goes on):

- **Ramp** (one engine per kv dtype, ``max_model_len`` = the longest prompt + output): a warm-up, then
  for each length of the grid ``requests_per_length`` requests one at a time (``ramp-c1-L<L>``), then
  ``concurrency`` requests at once (``ramp-c<C>-L<L>``), streamed (the ``async`` driver), so TTFT,
  every inter-token gap, E2E, KV usage, device memory and preemptions are recorded per length.
  ``randtok-L<L>`` phases time random-token prompts beside real text at the same length.
- **Block-size sweep** at the longest lengths: one engine per (dtype, block size) other than the
  ramp's; a size the attention backend rejects is recorded as ``unsupported``.
- **Boundary probes** (start-only engines): the formula (:mod:`fp8lab.kvmath`) predicts the longest
  context each dtype holds, ``(num_blocks - 1) * block_size`` (vLLM keeps one block back as the null
  block: ``BlockPool.null_block``); one engine per dtype asks for one block more and must fail at start
  with vLLM's "larger than the available KV cache memory" error (status ``oom``), whose message states
  vLLM's own estimate of the maximum length: that is the measured boundary.
- **Quality along the context** (the shipped model, real weights; merged into the ramp engines when the
  ramp model is the quality model): teacher-forced scoring of whole documents with prompt logprobs
  (Study 03's measure, :func:`fp8lab.quality.topk_overlap` / :func:`fp8lab.quality.kl_topk`) binned by
  position, on real text and on random tokens; and passkey retrieval at several depths
  (Mohtashami & Jaggi, "Landmark Attention", arXiv:2305.16300, appendix: the task's wording).

Prompts (:mod:`fp8lab.longctx.documents`) are exact-length slices of one long document built from the held-out text (``data/text``):
documents concatenated with their paragraph structure, with generated code blocks and JSON objects
inserted every few paragraphs, as the field reports did. Dummy-weight models (no tokenizer) get
seeded random token ids for the performance part.

The study is one subpackage, one concept per module; arrows point down only (``spec`` imports no other module
of it, ``run`` none of the tables):

- :mod:`~fp8lab.longctx.spec`: :class:`LongCtxPlan`, validated before any engine starts (``from_params``).
- :mod:`~fp8lab.longctx.boundary`: the boundary arithmetic (blocks, longest context, concurrency).
- :mod:`~fp8lab.longctx.phases`: the requests every engine runs (ramp, sweep, quality, passkey).
- :mod:`~fp8lab.longctx.run`: :func:`run_study` (engines, in order) -> :class:`LongCtxResult`; :func:`plan_table`.
- :mod:`~fp8lab.longctx.ramp`, :mod:`~fp8lab.longctx.growth`, :mod:`~fp8lab.longctx.divergence`: the tables,
  from a result; :mod:`~fp8lab.longctx.tables`: all of them at once (:func:`tables` -> :class:`Tables`).
- :mod:`~fp8lab.longctx.verdict`: :func:`claims` and :func:`verdict_markdown`; :mod:`~fp8lab.longctx.summary`:
  :func:`summary_values`, :func:`summary_rows` (the typed rows).
- :mod:`~fp8lab.longctx.plots`: the notebook's figures (imported on its own: it loads matplotlib).
- :mod:`~fp8lab.longctx.study`: the study contract (:mod:`fp8lab.study`) the notebook calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``rows()``, ``verdict()``, ``markdown()``).

Every public name is re-exported here (``from fp8lab import longctx as lc; lc.LongCtxPlan(...)``).
"""

from __future__ import annotations

from fp8lab.longctx.boundary import (
    NULL_BLOCKS,
    blocks_for,
    longest_context,
    max_concurrency_at,
    parse_estimated_max_len,
    predicted_num_blocks,
)
from fp8lab.longctx.divergence import (
    divergence_by_position,
    divergence_table,
    divergence_trend,
    passkey_accuracy,
    passkey_paired,
    passkey_table,
    position_divergence,
    random_token_table,
    stored_divergence,
)

# The study's inputs live in fp8lab.longctx.documents, and the spec's checks in fp8lab.specs; the names the former
# fp8lab/longctx.py imported stay importable from here.
from fp8lab.longctx.documents import (
    PASSKEY_LABELS,
    PASSKEY_MULTI_NEEDLE,
    PASSKEY_MULTI_QUESTION,
    PASSKEY_NEEDLE,
    PASSKEY_OUTPUT_TOKENS,
    PASSKEY_QUESTION,
    PASSKEY_TASK,
    GridKind,
    PasskeyItem,
    PromptSource,
    insert_at_depth,
    length_grid,
    passkey_correct,
    passkey_items,
)
from fp8lab.longctx.growth import (
    GROWTH_METRICS,
    crossover_table,
    fit_growth,
    fitted,
    fitted_crossover,
    growth_table,
    measured_crossover,
    speed_table,
)
from fp8lab.longctx.phases import (
    fit_phases,
    phase_meta,
    quality_documents,
    quality_phases,
    ramp_phases,
    ramp_prompt,
    sweep_phases,
)
from fp8lab.longctx.ramp import (
    blocksize_table,
    boundary_table,
    capacity_frontier,
    frontier_at_budgets,
    ramp_table,
)
from fp8lab.longctx.ramp import (
    overlap_peak as overlap_peak,  # tests read it here
)
from fp8lab.longctx.run import EMULATED_ROLE, LongCtxResult, plan_table, ramp_max_model_len, run_study
from fp8lab.longctx.spec import BASELINE, STUDY, LongCtxPlan
from fp8lab.longctx.summary import summary_rows, summary_values
from fp8lab.longctx.tables import Tables, tables  # the function `tables` shadows the submodule's name here
from fp8lab.longctx.verdict import claims, verdict_markdown
from fp8lab.specs import (
    BLOCK_SIZES,
    EngineSpec,
    KVDtype,
    LoadFormat,
    Phase,
    Request,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_model_folder,
    resolve_model,
)
from fp8lab.workloads import InsertKind, assemble_document, code_block, document_ids, json_object, random_ids

__all__ = [
    "BASELINE",
    "BLOCK_SIZES",
    "EMULATED_ROLE",
    "EngineSpec",
    "GROWTH_METRICS",
    "GridKind",
    "InsertKind",
    "KVDtype",
    "LoadFormat",
    "LongCtxPlan",
    "LongCtxResult",
    "NULL_BLOCKS",
    "PASSKEY_NEEDLE",
    "PASSKEY_OUTPUT_TOKENS",
    "PASSKEY_QUESTION",
    "PASSKEY_TASK",
    "PasskeyItem",
    "Phase",
    "PromptSource",
    "Request",
    "STUDY",
    "SpecError",
    "Tables",
    "assemble_document",
    "blocks_for",
    "blocksize_table",
    "boundary_table",
    "capacity_frontier",
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "check_model_folder",
    "claims",
    "code_block",
    "crossover_table",
    "divergence_by_position",
    "divergence_table",
    "divergence_trend",
    "document_ids",
    "fit_growth",
    "fit_phases",
    "fitted",
    "fitted_crossover",
    "frontier_at_budgets",
    "growth_table",
    "insert_at_depth",
    "json_object",
    "length_grid",
    "longest_context",
    "max_concurrency_at",
    "measured_crossover",
    "parse_estimated_max_len",
    "passkey_accuracy",
    "passkey_correct",
    "passkey_items",
    "passkey_paired",
    "PASSKEY_LABELS",
    "PASSKEY_MULTI_NEEDLE",
    "PASSKEY_MULTI_QUESTION",
    "passkey_table",
    "phase_meta",
    "plan_table",
    "position_divergence",
    "predicted_num_blocks",
    "quality_documents",
    "quality_phases",
    "ramp_max_model_len",
    "ramp_phases",
    "ramp_prompt",
    "ramp_table",
    "random_ids",
    "random_token_table",
    "resolve_model",
    "run_study",
    "speed_table",
    "stored_divergence",
    "summary_rows",
    "summary_values",
    "sweep_phases",
    "tables",
    "verdict_markdown",
]
