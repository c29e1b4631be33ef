"""The claims audit: what the field reports claimed, and what fp8lab's recorded numbers can decide about it.

Each claim is data (:data:`CLAIMS`: the claim as the reports put it, a short paraphrase, the setting it was
reported in, what kind of evidence can decide it, the studies whose records are that evidence) and has one rule
(:data:`RULES`): a function of the evidence that returns a :class:`Finding` (verdict, the numbers it read, the
setting of the deciding evidence, the smallest effect that evidence could detect, and its basis). The rule's
docstring is the rule's text, shown beside its verdict; no verdict is typed in.

Verdicts (:data:`VERDICTS`):

- ``confirmed``: the evidence resolves the claimed effect and agrees (its interval holds the claimed value, or a
  value of the claimed size, and excludes no effect);
- ``refuted``: comparable evidence excludes the claimed effect (its interval lies on the other side of zero, or
  holds zero but excludes an effect of the claimed size), or physics / arithmetic / a documented fact rules it out;
- ``not reproduced here``: the evidence would confirm or refute the claim in its own setting, but that setting
  differs from the claim's on a dimension that can change the answer (FP8 weights + KV against KV only, SGLang
  against vLLM, an A100 or an unstated GPU against an H200, an open loop against a closed loop, a 70B model against
  the 8B shape or the 6.8M model); the mismatch is named and the uncapped verdict kept in ``details['uncapped']``
  (:mod:`~fp8lab.audit.match`, :func:`~fp8lab.audit.scale.cap`). Physics, arithmetic, documented facts,
  introspection, computations and the seed's own script carry no setting and are never capped;
- ``inconclusive``: the evidence cannot resolve the claimed effect (its interval holds both the claim and its
  negation, or the run's detectable effect is larger than the claim), or comparable settings disagree;
- ``not testable here``: no comparable evidence (the setting is not reproduced: another engine, a GPU claim with
  only CPU runs, a quantity no study records); the nearest evidence is shown as an analogue.

Comparability: a claim about a GPU serving stack's speed (``needs="gpu-model"``) is decided only by GPU runs of a
full-size model; a claim about what vLLM's GPU build does (``needs="gpu"``) by GPU runs of any model; numerical and
arithmetic claims (``needs="any"``) by any run. Runs that do not qualify (the shipped 6.8M-parameter model, CPU
vLLM) appear as ``analogue`` evidence beside the verdict, never as its basis. A refutation from physics (memory
arithmetic, the memory-bandwidth bound) is allowed and labelled ``physics``.

The setting of every piece of evidence (device, model, vLLM version, CUDA graphs or eager) is read from what was
stored: the study's summary, the report folder's ``summary.json`` (``ran_on``, ``parameters``) and, where those
lack it, the ``provenance.json`` / ``spec.json`` of the report's committed records (``records/NN_*.tar.gz``).

The numbers of Studies 01, 02, 03 and 06 (:data:`ROW_STUDIES`) are read by field from their typed rows
(:mod:`fp8lab.summary_table`, ``NN_*.rows.json`` beside the summary: ``serving_delta``, ``decode_grid``,
``quality_top3``, ...) where a report has them; a report rendered before the rows existed has only the flat summary,
whose keys are read as before (:func:`rows_note` says which, in the evidence table). A rows file is never mixed with
its summary's keys: a row a rule selects that is not there leaves the claim without that evidence.

The audit is one subpackage, one concept per module (arrows point down only; the order below):

- :mod:`~fp8lab.audit.match`: :class:`ClaimSetting` (a claim's setting by dimension), :func:`mismatches`,
  :func:`evidence_dims`, :func:`match_text`.
- :mod:`~fp8lab.audit.claims`: :class:`Claim`, :data:`CLAIMS`.
- :mod:`~fp8lab.audit.evidence`: :class:`Report`, :class:`Setting`, :class:`Evidence`, :class:`Missing`, loading
  (:func:`load_report`, :func:`load_evidence`).
- :mod:`~fp8lab.audit.scale`: the verdict words, :class:`Finding`, :func:`judge`, :func:`combine`, :func:`decide`,
  the rule registry (:data:`RULES`, :func:`rule`, :func:`per_report`).
- :mod:`~fp8lab.audit.readers`: the per-study readers (``serving_*``, ``calibration_*``, ``quality_top3``,
  ``decode_*``, :func:`ramp_noise`).
- the rules by topic: :mod:`~fp8lab.audit.rules_memory` (1-4, 20, 21), :mod:`~fp8lab.audit.rules_serving` (5, 7, 8,
  13a, 16, 24), :mod:`~fp8lab.audit.rules_longctx` (6, 12, 13b, 17, 22, 23, 28),
  :mod:`~fp8lab.audit.rules_quality` (9-11, 14, 27), :mod:`~fp8lab.audit.rules_facts` (15, 18, 19, 25, 26),
  :mod:`~fp8lab.audit.rules_seeds` (29-46: the seed claims issue 35 added).
  Claim 12a's judgment (:func:`block_size_finding`, on one Study 04 summary) is Study 04's own verdict too.
- :mod:`~fp8lab.audit.run`: :func:`audit` (registers every rule, in the claims' order), :func:`links`.
- :mod:`~fp8lab.audit.summary` (:func:`headline`, :func:`summary_values`), :mod:`~fp8lab.audit.tables`
  (:func:`evidence_frame`, :func:`verdict_frame`, :func:`styled`), :mod:`~fp8lab.audit.verdict`
  (:func:`verdict_markdown`, :func:`details_markdown`), :mod:`~fp8lab.audit.spec` (:class:`AuditSpec`).
- :mod:`~fp8lab.audit.study`: the study contract (:mod:`fp8lab.study`) notebook 05 calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``verdict()``, ``markdown()``).

Every name the former single module ``fp8lab/audit.py`` defined (but its private helpers) is still importable from
here (``from fp8lab import audit; audit.rule_mix``); :data:`__all__` is that module's list.
"""

from __future__ import annotations

from fp8lab.audit import pages  # noqa: F401  (the studies the audit reads, by their pages' names)
from fp8lab.audit.claims import (  # noqa: F401
    CLAIMS,
    CLAIMS_BY_ID,
    Claim,
)
from fp8lab.audit.evidence import (  # noqa: F401
    OPTIONS_GLOB,
    SUMMARY_GLOB,
    Evidence,
    Missing,
    Report,
    Setting,
    default_configs,
    load_evidence,
    load_options,
    load_report,
    report_label,
    study_setting,
)
from fp8lab.audit.match import (  # noqa: F401
    DIMENSIONS,
    ClaimSetting,
    evidence_dims,
    match_text,
    mismatches,
)
from fp8lab.audit.readers import (  # noqa: F401
    QUALITY_BASELINE,
    ROW_STUDIES,
    SERVING_DELTAS,
    calibration_quality,
    calibration_scale_diffs,
    decode_detectable,
    decode_grid,
    decode_points,
    half_width,
    physics_step_cut,
    quality_top3,
    ramp_noise,
    serving_candidate,
    serving_concurrency,
    serving_delta,
    serving_figure,
    serving_has_delta,
    serving_headline_concurrency,
    serving_preemptions,
)
from fp8lab.audit.rules_facts import (  # noqa: F401
    CAPTURE_SIZE_ARGS,
    CLAIM15_OPTIONS,
    DTYPE_HEADER_WORDS,
    GPU_FP8_FACTS,
    dtype_headers,
    option_exists,
    options_table,
    rule_a100_e4m3,
    rule_ada_fp8,
    rule_graph_recapture,
    rule_options,
    rule_vllm_versions,
)
from fp8lab.audit.rules_longctx import (  # noqa: F401
    CLAIM6_GAIN,
    CLAIM6_LENGTH,
    CLAIM12_CONTEXT,
    CLAIM12_RATIO,
    LIMITED,
    block_size_finding,
    rule_128k_throughput,
    rule_block_size,
    rule_chunked_prefill,
    rule_cuts_at_128k,
    rule_hit_rate,
    rule_long_capacity,
    rule_long_speed,
    rule_long_tpot,
    rule_random_tokens,
)
from fp8lab.audit.rules_memory import (  # noqa: F401
    A100_BANDWIDTH,
    A100_MEMORY_BYTES,
    CLAIM2_BYTES,
    CLAIM2_CONTEXT,
    CLAIM2_MODEL,
    CLAIM2_TOTAL_BYTES,
    CLAIM3_DROP,
    CLAIM3_FIGURES,
    CLAIM21_TOK_S,
    MIX_MAX_IN_OUT,
    claimed_kv_bytes_per_token,
    rule_concurrency_doubles,
    rule_concurrency_sglang,
    rule_kv_formula,
    rule_kv_halves,
    rule_llama2_batch1_speed,
    rule_llama2_one_a100,
    rule_llama3_70b_128k,
    rule_total_memory,
)
from fp8lab.audit.rules_quality import (  # noqa: F401
    CLAIM10_MARGIN,
    CLAIM10_THRESHOLD,
    CLAIM11_BAND,
    CLAIM11_FAIL,
    DYNAMIC_CHANGES_KEY,
    DYNAMIC_SCALE_ARGS,
    format_facts,
    rule_32_token_calibration,
    rule_dynamic_per_head,
    rule_formats,
    rule_silent_448,
    rule_top3_band,
    rule_top3_threshold,
)
from fp8lab.audit.rules_seeds import (  # noqa: F401
    GPU_RIDGE,
    SEED000_CLASSES,
    SEED000_SCRIPT_DRAW,
    SEED000_STATED_MIX,
)
from fp8lab.audit.rules_serving import (  # noqa: F401
    CLAIM5,
    CLAIM7,
    CLAIM8_GAIN_PCT,
    CLAIM13,
    PREFIX_VERDICTS,
    rule_gain_at_batch_1,
    rule_loss_grows_with_batch,
    rule_mix,
    rule_prefix_hit_rate,
    rule_streaming_benchmark,
    rule_ttft_spread,
)
from fp8lab.audit.run import (  # noqa: F401
    audit,
    judge_run,
    links,
)
from fp8lab.audit.scale import (  # noqa: F401
    ABOUT_TOL,
    ANALOGUE,
    ARITHMETIC,
    COMBINE_TEXT,
    COMPUTATION,
    CONFIRMED,
    CONTRADICTED,
    CPU_EVIDENCE,
    FACT,
    GPU_EVIDENCE,
    HOLDS,
    INCONCLUSIVE,
    INTROSPECTION,
    MAD_SIGMA,
    MAX_FP8_STEP_CUT,
    MEMORY_NOISE,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    OPEN_LOOP_RATE_TOL,
    PHYSICS,
    REFUTED,
    RULES,
    SCRIPT,
    SETTING_FREE_BASES,
    SIZE_TOL,
    UNRESOLVED,
    UNTESTED,
    VERDICTS,
    Z95,
    Finding,
    Needs,
    Outcome,
    Rule,
    Verdict,
    cap,
    combine,
    decide,
    finding,
    judge,
    outcome_verdict,
    parts_verdict,
    per_report,
    rule,
    safe,
)
from fp8lab.audit.spec import (  # noqa: F401
    AuditSpec,
)
from fp8lab.audit.summary import (  # noqa: F401
    HEADLINE_MAX,
    HEADLINE_ORDER,
    headline,
    summary_values,
)
from fp8lab.audit.tables import (  # noqa: F401
    VERDICT_COLORS,
    evidence_frame,
    rows_note,
    styled,
    verdict_frame,
)
from fp8lab.audit.verdict import (  # noqa: F401
    details_markdown,
    verdict_markdown,
)

__all__ = [
    "CLAIMS",
    "CLAIMS_BY_ID",
    "RULES",
    "VERDICTS",
    "AuditSpec",
    "Claim",
    "Evidence",
    "Finding",
    "Missing",
    "Report",
    "Setting",
    "audit",
    "claimed_kv_bytes_per_token",
    "combine",
    "decide",
    "default_configs",
    "details_markdown",
    "evidence_frame",
    "format_facts",
    "headline",
    "judge",
    "judge_run",
    "links",
    "load_evidence",
    "load_options",
    "load_report",
    "option_exists",
    "options_table",
    "parts_verdict",
    "ramp_noise",
    "study_setting",
    "styled",
    "summary_values",
    "verdict_frame",
    "verdict_markdown",
]
