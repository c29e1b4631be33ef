"""Study 03: what FP8 KV cache does to a model's outputs, measured several ways against ``auto``.

The field reports' protocol (kept, exactly): send each prompt to both engines greedily and compare
the **first 3 generated token ids**; the per-prompt fraction that agree is the "top-3 token match
rate" (0.92-0.96 "fine", below 0.85 "calibration failed"). Three greedy tokens say little and one
early flip changes everything after it, so this module adds:

- **greedy agreement** over ``gen_tokens``: identical-prefix length, first divergence, agreement rate;
- **teacher-forced** scoring: the baseline's own greedy continuation is forced after the prompt, token by token,
  on every engine (:mod:`fp8lab.scoring`: each scored position after the first is a decode step that reads the
  context's K/V back from the, possibly quantized, KV cache; one flip cannot cascade), per position: top-k overlap
  (k = 1..K), |delta logprob| of the actual token, and a KL lower bound from the top-k lists (:func:`kl_topk`).
  The same sequences scored in one prefill with ``prompt_logprobs`` stay as a secondary column (``*_one_pass``):
  some attention backends' one-pass prefill never reads the quantized cache (vllm-notes section 10), and
  :func:`scoring_check` records, per engine and attention backend, whether each method saw the quantization;
- **perplexity** on held-out text windows (through the cache too), and its delta;
- a **copy task** (retrieve a span from earlier in the context after a cue), scored by accuracy;
- the **round trip** of the model's real K/V (and Q) through each FP8 format and rounding, and the
  error it puts on attention outputs (:func:`roundtrip_table`, :func:`attention_error_table`).

Engines: one reference run of ``auto`` makes the greedy continuations; then every KV config
(``auto`` again, each fp8 dtype, each scale set) runs once with the phases of :data:`PHASES` (greedy, teacher and
its one-pass twin, ppl and its one-pass twin, task, task_tf), so the baseline is measured exactly as the candidates are, and ``auto`` against the
reference run is the run-to-run noise floor (exactly zero on CPU).

The study is one subpackage, one concept per module; arrows point down only (``spec`` at the bottom; Study 02,
:mod:`fp8lab.calibration`, builds on this package, never the other way):

- :mod:`~fp8lab.quality.spec`: the reports' protocol constants, :class:`KVConfig`, :class:`QualitySpec` (validated,
  ``from_params``).
- :mod:`~fp8lab.quality.metrics`: the pure per-sequence measures (:func:`token_match_fraction`, :func:`kl_topk`, ...).
- :mod:`~fp8lab.quality.inputs`: prompts, perplexity windows, copy-task items, the phases (:func:`study_phases`).
- :mod:`~fp8lab.quality.run`: :func:`run_quality` -> :class:`QualityRuns`.
- :mod:`~fp8lab.quality.tables`: the tables from a run (greedy, teacher-forced, perplexity, task, :func:`summary_table`).
- :mod:`~fp8lab.quality.roundtrip`: the FP8 round trip of real K/V/Q and its error on attention.
- :mod:`~fp8lab.quality.verdict`: :func:`verdict`, :func:`verdict_markdown`; :mod:`~fp8lab.quality.summary`:
  :func:`headline`, :func:`summary_rows`.
- :mod:`~fp8lab.quality.plots`: the notebook's figures (imported on its own: it loads matplotlib).
- :mod:`~fp8lab.quality.study`: the study contract (:mod:`fp8lab.study`) the notebook calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``rows()``, ``verdict()``, ``markdown()``).

Every public name is re-exported here (``from fp8lab import quality as q; q.QualitySpec(...)``); the function
``verdict`` shadows its submodule's name on the package (import that module by its dotted name).
"""

from __future__ import annotations

from fp8lab.quality.inputs import (
    CopyItem,
    copy_task_items,
    greedy_phase,
    load_prompt_set,
    ppl_one_pass_phase,
    ppl_phase,
    ppl_windows,
    study_phases,
    task_phase,
    task_tf_phase,
    teacher_one_pass_phase,
    teacher_phase,
)
from fp8lab.quality.metrics import (
    agreement_rate,
    delta_ppl_pct,
    first_divergence,
    identical_prefix_len,
    kl_topk,
    perplexity,
    token_match_fraction,
    topk_overlap,
)
from fp8lab.quality.roundtrip import (  # noqa: F401  (causal_attention: tests)
    attention_error_table,
    capture_prompts,
    causal_attention,
    engine_roundtrip,
    roundtrip_points,
    roundtrip_summary,
    roundtrip_table,
)
from fp8lab.quality.run import QualityRuns, run_quality
from fp8lab.quality.spec import (
    BASELINE,
    DEFAULT_PROMPTS,
    PHASES,
    REPORT_FINE_BAND,
    REPORT_N_TOKENS,
    REPORT_THRESHOLD,
    KVConfig,
    QualitySpec,
    QualityStudySpec,
    kv_configs,
)
from fp8lab.quality.summary import headline, summary_rows
from fp8lab.quality.tables import (
    by_position,
    greedy_table,
    ppl_by_label,
    ppl_table,
    scoring_check,
    summary_table,
    task_table,
    teacher_table,
    top3_by_category,
    topk_curve,
)
from fp8lab.quality.verdict import VerdictRules, verdict, verdict_markdown  # the function shadows the submodule here

__all__ = [
    "BASELINE",
    "CopyItem",
    "DEFAULT_PROMPTS",
    "KVConfig",
    "PHASES",
    "QualityRuns",
    "QualitySpec",
    "QualityStudySpec",
    "REPORT_FINE_BAND",
    "REPORT_N_TOKENS",
    "REPORT_THRESHOLD",
    "VerdictRules",
    "agreement_rate",
    "attention_error_table",
    "by_position",
    "capture_prompts",
    "copy_task_items",
    "delta_ppl_pct",
    "engine_roundtrip",
    "first_divergence",
    "greedy_phase",
    "greedy_table",
    "headline",
    "identical_prefix_len",
    "kl_topk",
    "kv_configs",
    "load_prompt_set",
    "perplexity",
    "ppl_by_label",
    "ppl_phase",
    "ppl_table",
    "ppl_windows",
    "roundtrip_points",
    "roundtrip_summary",
    "roundtrip_table",
    "run_quality",
    "study_phases",
    "summary_rows",
    "summary_table",
    "task_phase",
    "task_table",
    "task_tf_phase",
    "teacher_one_pass_phase",
    "teacher_phase",
    "ppl_one_pass_phase",
    "scoring_check",
    "teacher_table",
    "token_match_fraction",
    "top3_by_category",
    "topk_curve",
    "topk_overlap",
    "verdict",
    "verdict_markdown",
]
