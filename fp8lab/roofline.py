"""The memory-bandwidth lower bound on decode inter-token latency (pure arithmetic).

A decode step produces one token for every sequence in the batch. It must read every weight once
(shared by the batch) and the whole KV cache of every sequence in the batch, so with a memory
bandwidth of ``BW`` bytes/s no step can be faster than::

    ITL_min = (W + sum over sequences of context_len x kv_bytes_per_token) / BW
            = (W + B x L x k) / BW          (B sequences of L tokens)

``W`` = weight bytes read per step (:func:`weight_bytes_per_step`), ``k`` = KV bytes per token of one
sequence over all layers (:func:`fp8lab.kvmath.kv_bytes_per_token`; halved by FP8). The bound ignores
compute, activations, the new token's KV write and kernel-launch overhead, so measured ITL sits above
it; how far above says how memory-bound vLLM is. The FP8 gain the bound allows,
``ITL_min(auto) / ITL_min(fp8) = (W + T k_auto) / (W + T k_auto / 2)`` for ``T = B x L`` KV tokens per
step, approaches 2 only when the KV read dominates the weights (long contexts, large batches). This is
the standard roofline argument (Williams, Waterman & Patterson, "Roofline", CACM 52(4), 2009) applied to
LLM decode (e.g. Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023, sec. 2).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fp8lab import kvmath
from fp8lab.errors import SpecError


def weight_bytes_per_step(model: kvmath.LayoutLike, weight_dtype: str = "auto", tp: int = 1) -> int:
    """Weight bytes one decode step reads on one TP rank: the estimated parameters x bytes per weight
    (:func:`fp8lab.kvmath.estimate_param_bytes`), less the input-embedding table when it is not tied to
    the LM head (a step gathers only ``batch`` rows of it); a tied table is read whole by the LM head.
    Divided by ``tp`` (projections and embeddings are sharded)."""
    lay = kvmath.load_layout(model)
    total = kvmath.estimate_param_bytes(lay, weight_dtype)
    c = lay.config
    tied = c.get("tie_word_embeddings")
    if tied is None:
        tied = lay.model_type.startswith("gemma")
    if not tied:
        per = total // kvmath.estimate_param_count(lay)
        # estimate_param_count has required vocab_size and one of these widths (SpecError otherwise)
        total -= int(c["vocab_size"]) * int(c.get("hidden_size") or c.get("n_embd") or c["d_model"]) * per
    return int(total // tp)


def step_bytes(weight_bytes: float, kv_tokens: float, kv_bytes_per_token: float) -> float:
    """Bytes one decode step must read: ``weight_bytes + kv_tokens x kv_bytes_per_token``."""
    return float(weight_bytes) + float(kv_tokens) * float(kv_bytes_per_token)


def itl_lower_bound(
    weight_bytes: float, kv_tokens: float, kv_bytes_per_token: float, bandwidth_bytes_s: float
) -> float:
    """Seconds: ``(weight_bytes + kv_tokens x kv_bytes_per_token) / bandwidth_bytes_s``, where
    ``kv_tokens`` is the total context of the batch (``batch x context_len`` for equal sequences)."""
    if not bandwidth_bytes_s or bandwidth_bytes_s <= 0:
        raise SpecError("roofline", "bandwidth_bytes_s", bandwidth_bytes_s, "a positive number of bytes per second")
    return step_bytes(weight_bytes, kv_tokens, kv_bytes_per_token) / float(bandwidth_bytes_s)


def fp8_speedup_bound(weight_bytes: float, kv_tokens: float, kv_bytes_auto: float, kv_bytes_fp8: float) -> float:
    """The largest ITL ratio ``auto / fp8`` the bandwidth bound allows at ``kv_tokens`` KV tokens per step."""
    return step_bytes(weight_bytes, kv_tokens, kv_bytes_auto) / step_bytes(weight_bytes, kv_tokens, kv_bytes_fp8)


def bound_grid(
    model: kvmath.LayoutLike,
    bandwidth_gbs: float,
    context_lens: Iterable[int],
    batch_sizes: Iterable[int],
    kv_dtypes: Iterable[str] = ("auto", "fp8"),
    tp: int = 1,
    weight_dtype: str = "auto",
) -> list[dict[str, Any]]:
    """One row per (kv_dtype, batch, context_len): ``kv_tokens = batch x context_len``, ``weight_bytes``,
    ``kv_bytes`` (the batch's KV read per step), ``step_bytes``, ``itl_bound_s`` and ``kv_share``
    (KV / step bytes), for ``bandwidth_gbs`` GB/s (1 GB = 1e9 bytes)."""
    lay = kvmath.load_layout(model)
    w = weight_bytes_per_step(lay, weight_dtype, tp)
    bw = float(bandwidth_gbs) * 1e9
    rows = []
    for dt in kv_dtypes:
        k = kvmath.kv_bytes_per_token(lay, dt, tp)
        for b in batch_sizes:
            for n in context_lens:
                t = int(b) * int(n)
                sb = step_bytes(w, t, k)
                rows.append(
                    {
                        "model": lay.name,
                        "kv_dtype": dt,
                        "batch": int(b),
                        "context_len": int(n),
                        "kv_tokens": t,
                        "weight_bytes": w,
                        "kv_bytes_per_token": k,
                        "kv_bytes": t * k,
                        "step_bytes": sb,
                        "itl_bound_s": sb / bw,
                        "kv_share": t * k / sb,
                        "bandwidth_gbs": float(bandwidth_gbs),
                    }
                )
    return rows


__all__ = ["bound_grid", "fp8_speedup_bound", "itl_lower_bound", "step_bytes", "weight_bytes_per_step"]
