"""Study 02: FP8 KV-cache scales from one 32-token prompt vs a large calibration set.

A field report claims that scales computed from one 32-token calibration prompt (three Q&A lines) differ
from scales computed on a 2.4K-sample calibration set "by less than 0.03 on average", cutting calibration
from 12 minutes to 18 seconds, and that per-head scales matter for GQA models. This subpackage measures it:

1. **Capture** every layer's K and V exactly where vLLM quantizes them (:func:`capture_amax`): keys after
   the model's key norm (Qwen3's ``k_norm``) and after RoPE, values as projected, per KV head. It uses
   transformers' attention interface (a registered attention function), like :mod:`fp8lab.kvcapture`:
   transformers' attention modules hand exactly those tensors (``[batch, kv_heads, seq, head_dim]``,
   before GQA repetition) to the attention function, which is where vLLM's ``self.attn(q, k, v)`` is
   called and the cache write happens (vllm-notes section 6). No per-architecture hook re-implements
   ``k_norm`` + RoPE, so it works on any local HF model whose attention goes through
   ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral, Gemma...). Unlike ``kvcapture.capture_kv`` it
   keeps only the per-sequence, per-head ``max |x|`` (``[sequences, layers, kv_heads]``), so a
   calibration set of any size fits in memory; held-out K/V for the error measures use ``capture_kv``.
   It runs in the model's dtype (bf16 for the shipped model, as vLLM does) with transformers' kernels,
   so a value can differ from vLLM's in the last bf16 bit (an amax by at most ~0.4%), not in kind.
2. **Scales** from amax: ``scale = amax / fmt.max`` (448 for E4M3, 57344 for E5M2), per tensor (one per
   layer: the max over heads) or per KV head (:func:`scales_from_amax`), from (a) the reports' prompt,
   (b) a large held-out calibration set and random subsets of it, (c) vLLM's dynamic scales (an engine
   flag in vLLM 0.26, removed in 0.32; also emulated offline with its formula: amax/200 for K and
   amax/100 for V of one forward pass), (d) the default 1.0.
3. **Compare** (:func:`scale_diff_table`, :func:`convergence_table`, :func:`quant_error_table`): relative
   scale difference per layer/head against (b), clipping rate, SNR / relative MSE of held-out K/V.
4. **Export** a scale set into a copy of the model that vLLM loads (compressed-tensors ``kv_cache_scheme``,
   strategy ``tensor`` or ``attn_head``; vllm-notes section 4) and check that vLLM uses it, including
   whether the backend reduces per-head scales to one per layer (the CPU build takes the max over heads).
5. **End to end**: Study 03's measures (:mod:`fp8lab.quality`) for fp8 with each exported scale set.

Calibration data is disjoint from Study 03's evaluation data: the held-out documents minus the quality
prompts' spans and minus the documents that hold the start of the held-out token stream (Study 03's
perplexity windows and copy-task passages), see :func:`calibration_pool`.

The study is one subpackage, one concept per module; arrows point down only (``pool`` at the bottom, ``spec`` above
it; the end-to-end part uses :mod:`fp8lab.quality`, which never imports this package):

- :mod:`~fp8lab.calibration.pool`: the reports' prompt and the held-out calibration pool (:func:`calibration_pool`).
- :mod:`~fp8lab.calibration.spec`: constants and :class:`CalibrationSpec` (validated, ``from_params``).
- :mod:`~fp8lab.calibration.capture`: :func:`capture_amax`, :func:`stored_capture`, :func:`capture_heldout`.
- :mod:`~fp8lab.calibration.scales`: :class:`ScaleSet` and the sets (a)-(d) (:func:`build_scale_sets`).
- :mod:`~fp8lab.calibration.tables`: the comparisons (scale differences, convergence, held-out round-trip error).
- :mod:`~fp8lab.calibration.export`: scale sets into model copies vLLM loads (:func:`export_scale_set`).
- :mod:`~fp8lab.calibration.endtoend`: Study 03's measures per scale set: dynamic scales, the head-reduction check.
- :mod:`~fp8lab.calibration.run`: :func:`calibrate` -> :class:`Calibration`; :func:`quality_scale_sets`.
- :mod:`~fp8lab.calibration.verdict`: :func:`claim_verdict`; :mod:`~fp8lab.calibration.summary`: :func:`headline`,
  :func:`summary_rows`.
- :mod:`~fp8lab.calibration.plots`: the notebook's figures (imported on its own: it loads matplotlib).
- :mod:`~fp8lab.calibration.study`: the study contract (:mod:`fp8lab.study`) the notebook calls: ``Spec.from_params``,
  ``run`` -> ``Results`` (``tables()``, ``summary()``, ``rows()``, ``verdict()``, ``markdown()``).

Every public name is re-exported here (``from fp8lab import calibration as c; c.CalibrationSpec(...)``).
"""

from __future__ import annotations

from fp8lab.calibration.capture import (  # noqa: F401  (batches: tests)
    CALIB_ATTN,
    AmaxCapture,
    batches,
    capture_amax,
    capture_heldout,
    capture_path,
    stored_capture,
)
from fp8lab.calibration.endtoend import (
    DYNAMIC_LABEL,
    EMULATED_SUFFIX,
    head_reduction_check,
    logprob_vectors,
    quality_label,
    quality_phases,
    run_dynamic,
)
from fp8lab.calibration.export import (
    attention_prefixes,
    export_scale_set,
    export_sets,
    kv_cache_scheme_for,
    scale_set_dir,
    scale_tensors,
)
from fp8lab.calibration.pool import (
    CALIB_PROMPT,
    MANIFEST,
    CalibrationPool,
    calibration_pool,
    draw_samples,
    prompt_ids,
    quality_reserved_tokens,
)
from fp8lab.calibration.run import Calibration, calibrate, quality_scale_sets
from fp8lab.calibration.scales import (
    ScaleSet,
    build_scale_sets,
    default_scale_set,
    find_set,
    scale_set_from_capture,
    scales_from_amax,
)
from fp8lab.calibration.spec import (
    CLAIM_THRESHOLD,
    REFERENCE,
    SCALES_FILE,
    STRATEGIES,
    STUDY,
    VLLM_DYNAMIC_DIVISORS,
    CalibrationSpec,
    CalibrationStudySpec,
    Strategy,
    Tensor,
)
from fp8lab.calibration.summary import FORMAT_DTYPES, headline, summary_rows
from fp8lab.calibration.tables import (
    convergence_table,
    prompt_points,
    quant_error_summary,
    quant_error_table,
    rel_diff,
    scale_diff_summary,
    scale_diff_table,
    snr_db,
    tokens_to_threshold,
)
from fp8lab.calibration.verdict import claim_verdict

__all__ = [
    "AmaxCapture",
    "CALIB_ATTN",
    "CALIB_PROMPT",
    "CLAIM_THRESHOLD",
    "Calibration",
    "CalibrationPool",
    "CalibrationSpec",
    "CalibrationStudySpec",
    "DYNAMIC_LABEL",
    "EMULATED_SUFFIX",
    "FORMAT_DTYPES",
    "MANIFEST",
    "REFERENCE",
    "SCALES_FILE",
    "STRATEGIES",
    "STUDY",
    "ScaleSet",
    "Strategy",
    "Tensor",
    "VLLM_DYNAMIC_DIVISORS",
    "attention_prefixes",
    "build_scale_sets",
    "calibrate",
    "calibration_pool",
    "capture_amax",
    "capture_heldout",
    "capture_path",
    "claim_verdict",
    "convergence_table",
    "default_scale_set",
    "draw_samples",
    "export_scale_set",
    "export_sets",
    "find_set",
    "head_reduction_check",
    "headline",
    "kv_cache_scheme_for",
    "logprob_vectors",
    "prompt_ids",
    "prompt_points",
    "quality_label",
    "quality_phases",
    "quality_reserved_tokens",
    "quality_scale_sets",
    "quant_error_summary",
    "quant_error_table",
    "rel_diff",
    "run_dynamic",
    "scale_diff_summary",
    "scale_diff_table",
    "scale_set_dir",
    "scale_set_from_capture",
    "scale_tensors",
    "scales_from_amax",
    "snr_db",
    "stored_capture",
    "summary_rows",
    "tokens_to_threshold",
]
