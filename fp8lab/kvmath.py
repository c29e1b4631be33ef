"""KV-cache memory arithmetic on a Hugging Face ``config.json`` (stdlib only).

Everything here is pure arithmetic: no torch, no vLLM, no numpy, so ``fp8lab estimate`` works from a
plain ``pip install -e .``. Units are bytes and tokens unless a name says GiB (``GIB = 2**30`` bytes).

Sources of the formulas
-----------------------
- Page size of one standard attention layer on one tensor-parallel rank, vLLM
  ``vllm/v1/kv_cache_interface.py`` (``AttentionSpec.page_size_bytes``)::

      page = block_size * num_kv_heads_per_rank * (head_size + head_size_v) * dtype_bytes

  ``dtype_bytes`` is 2 for ``kv_cache_dtype="auto"`` on a bf16/fp16 model and 1 for ``fp8*`` (stored as
  uint8; per-tensor scales are per-layer scalars and add no bytes per token). Packed formats (per-token-head
  scales, TurboQuant, NVFP4, ...) replace ``(head_size + head_size_v) * dtype_bytes`` by their slot bytes, and
  TurboQuant keeps boundary layers in the model dtype: :mod:`fp8lab.kvformats` has every rule and its source;
  a name without a rule is an "unknown format" error, never a guess.
- Block count, vLLM ``vllm/v1/core/kv_cache_utils.py`` (``get_kv_cache_config_from_groups``)::

      num_blocks = available_bytes // bytes_per_block

  where ``bytes_per_block`` is the sum of the pages of the layers of the largest KV-cache group (one
  group holding every layer for a model whose layers all have the same attention type).
- Tensor parallelism: ``num_kv_heads_per_rank = max(1, num_kv_heads // tp)``, so K/V heads are
  replicated when ``tp > num_kv_heads`` (vLLM ``models/qwen3.py`` / ``llama.py`` attention init).
- Multi-head latent attention (MLA, DeepSeek-V2/V3): each layer caches one compressed latent
  ``c_KV`` of ``kv_lora_rank`` values plus the decoupled RoPE key of ``qk_rope_head_dim`` values per
  token (DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
  Model", arXiv:2405.04434, section 2.1.3: ``(d_c + d_h^R) * l`` elements per token). It is cached
  once per layer (no separate K and V, so no factor 2) and is not split across TP ranks; vLLM's
  ``MLAAttentionSpec`` has ``num_kv_heads=1``, ``head_size=kv_lora_rank+qk_rope_head_dim``,
  ``head_size_v=0``, which is exactly how :class:`KVLayout` stores it.

See also the project's shared ``vllm-notes.md`` section 3 (how vLLM sizes the cache).

Where the names live (issue 16 split this module along a clean line; every name is still ``kvmath.<name>``):
:mod:`fp8lab.kvlayout` reads a config into a :class:`KVLayout` (re-exported here), :mod:`fp8lab.kvweights`
estimates the weights (re-exported here); this module is the arithmetic on a layout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from fp8lab.kvformats import known_format, skipped_layers, slot_bytes
from fp8lab.kvlayout import (
    GIB,
    KV_DTYPE_BYTES,
    MAX_LEN_KEYS,
    TORCH_DTYPE_BYTES,
    AttentionKind,
    KVLayout,
    LayoutLike,
    config_path,
    is_int,
    layout_from_config,
    load_config,
    load_layout,
    model_max_len,
    need_int,
    norm_dtype,
    text_config,
)
from fp8lab.kvweights import WEIGHT_DTYPE_BYTES, estimate_param_bytes, estimate_param_count
from fp8lab.specs import SpecError

# --------------------------------------------------------------------------------------------------
# Bytes per token and per sequence
# --------------------------------------------------------------------------------------------------


def dtype_bytes(kv_dtype: str, torch_dtype: str | None) -> int:
    """Bytes per cached element for ``kv_cache_dtype`` ``kv_dtype`` on a model of dtype ``torch_dtype``
    (a dense format; a packed one, :func:`fp8lab.kvformats.slot_bytes`, raises: it has no one width).

    ``"auto"`` stores K/V in the model dtype (bf16/fp16 -> 2, fp32 -> 4); ``"fp8"``, ``"fp8_e4m3"`` and
    ``"fp8_e5m2"`` -> 1; ``"bfloat16"``/``"float16"`` -> 2 (vLLM ``utils/torch_utils.py``,
    ``STR_DTYPE_TO_TORCH_DTYPE``). Note: vLLM's *model* ``dtype="auto"`` runs a float32 checkpoint in
    bf16/fp16, so its "auto" cache is then 2 bytes; pass ``kv_dtype="bfloat16"`` to model that.
    """
    fmt = known_format(kv_dtype)
    if fmt.rule == "dense":
        return fmt.elem_bytes  # type: ignore[return-value]
    if fmt.rule != "model":
        raise SpecError(
            "kvmath", "kv_dtype", kv_dtype, "a dense format for bytes per element (a packed format has none)"
        )
    if torch_dtype is None:
        raise SpecError(
            "config",
            "torch_dtype",
            None,
            "a model dtype (bfloat16 | float16 | float32) for kv_dtype='auto'; "
            "or pass an explicit kv_dtype (bfloat16 | float16 | fp8)",
        )
    dt = norm_dtype(torch_dtype)
    return TORCH_DTYPE_BYTES[dt]  # type: ignore[index]


def kv_heads_per_rank(layout: KVLayout, tp: int = 1) -> int:
    """K/V heads cached on one TP rank: ``max(1, num_kv_heads // tp)`` (replicated when ``tp > num_kv_heads``);
    always 1 for MLA (the latent is not split across ranks). vLLM requires ``num_kv_heads`` and ``tp`` to
    divide one another; other combinations raise."""
    need_int(tp, "tp")
    if layout.is_mla:
        return 1
    kv = layout.num_kv_heads
    if kv % tp and tp % kv:
        raise SpecError("kvmath", "tp", tp, f"a divisor or a multiple of num_key_value_heads = {kv}")
    return max(1, kv // tp)


def layer_bytes_per_token(
    layout: LayoutLike, layer: int, kv_dtype: str = "auto", tp: int = 1, *, skip_layers: Iterable[str] = ()
) -> int:
    """Bytes one token occupies in layer ``layer`` on one TP rank:
    ``kv_heads_per_rank * slot_bytes`` (dense formats: ``(head_dim + v_head_dim) * dtype_bytes``, so
    ``2 * kv * head_dim * b`` for standard attention, ``(kv_lora_rank + qk_rope_head_dim) * b`` for MLA; packed
    formats: :func:`fp8lab.kvformats.slot_bytes`). A layer vLLM keeps in the model dtype (TurboQuant's boundary
    layers, ``skip_layers`` = ``kv_cache_dtype_skip_layers``) costs ``auto`` bytes."""
    lay = load_layout(layout)
    if not (is_int(layer) and 0 <= layer < lay.num_layers):
        raise SpecError("kvmath", "layer", layer, f"an integer in [0, {lay.num_layers - 1}]")
    return _layers(lay, kv_dtype, tp, skip_layers)[layer]


def _layers(lay: KVLayout, kv_dtype: str, tp: int, skip_layers: Iterable[str] = ()) -> tuple[int, ...]:
    """Bytes per token of every layer on one rank (every layer has the same heads and head sizes; a skipped layer
    is stored as ``auto``)."""
    kvr = kv_heads_per_rank(lay, tp)
    skipped = skipped_layers(kv_dtype, lay.num_layers, lay.layer_kinds, skip_layers)
    model_bytes = TORCH_DTYPE_BYTES[norm_dtype(lay.torch_dtype)] if lay.torch_dtype is not None else None  # type: ignore[index]
    quant = slot_bytes(kv_dtype, lay.head_dim, lay.v_head_dim, model_bytes)
    auto = slot_bytes("auto", lay.head_dim, lay.v_head_dim, model_bytes) if skipped else quant
    return tuple(kvr * (auto if i in skipped else quant) for i in range(lay.num_layers))


def kv_bytes_per_token(
    layout: LayoutLike, kv_dtype: str = "auto", tp: int = 1, *, skip_layers: Iterable[str] = ()
) -> int:
    """Bytes of KV cache for one token of one sequence, summed over all layers, on one TP rank
    (for ``tp=1`` the model total). Sliding-window layers count too: this is the cost of a token
    that is still inside every window."""
    return sum(_layers(load_layout(layout), kv_dtype, tp, skip_layers))


def kv_bytes_per_sequence(
    layout: LayoutLike, context_len: int, kv_dtype: str = "auto", tp: int = 1, *, skip_layers: Iterable[str] = ()
) -> int:
    """Bytes of KV cache one sequence of ``context_len`` tokens needs on one TP rank, counting
    ``min(context_len, sliding_window)`` tokens in sliding-window layers (an ideal ring buffer; vLLM
    frees whole blocks only, so it holds up to one block more per sliding layer)."""
    lay = load_layout(layout)
    need_int(context_len, "context_len")
    total = 0
    window = lay.sliding_window  # an int whenever a layer slides (KVLayout checks it)
    for kind, per_layer in zip(lay.layer_kinds, _layers(lay, kv_dtype, tp, skip_layers), strict=True):
        tokens = min(context_len, window) if kind == "sliding" and window is not None else context_len
        total += tokens * per_layer
    return total


# --------------------------------------------------------------------------------------------------
# vLLM's paged view: pages, blocks, capacity
# --------------------------------------------------------------------------------------------------


def page_bytes(
    layout: LayoutLike, block_size: int = 16, kv_dtype: str = "auto", tp: int = 1, *, skip_layers: Iterable[str] = ()
) -> int:
    """Bytes of one block of ``block_size`` tokens across *all* layers on one TP rank:
    ``sum over layers of block_size * num_kv_heads_per_rank * (head_dim + v_head_dim) * dtype_bytes``
    (vLLM ``AttentionSpec.page_size_bytes`` summed over layers)."""
    need_int(block_size, "block_size")
    return block_size * kv_bytes_per_token(layout, kv_dtype, tp, skip_layers=skip_layers)


def kv_cache_groups(layout: LayoutLike, hybrid_kv_cache_manager: bool = True) -> tuple[tuple[int, ...], ...]:
    """Layer indices of each vLLM KV-cache group.

    A model whose layers share one attention kind (and window) is one group of all layers. With the
    hybrid KV-cache manager (vLLM's default on GPU; it is off on CPU) a model that mixes kinds, e.g.
    Gemma-2 (21 sliding + 21 full), is split into equal-sized groups that share one block pool;
    ``group_size`` is the smallest kind's layer count, or the largest when it is < 1.5x the smallest,
    and kind ``k`` is split into ``ceil(n_k / group_size)`` groups ``layers[i::num_groups]``
    (vLLM ``kv_cache_utils._get_kv_cache_groups_uniform_page_size``). With the manager off, sliding
    layers are treated as full attention and everything is one group (``unify_hybrid_kv_cache_specs``).
    """
    lay = load_layout(layout)
    if len(set(lay.layer_kinds)) == 1 or not hybrid_kv_cache_manager:
        return (tuple(range(lay.num_layers)),)
    buckets: dict[str, list[int]] = {}
    for i, kind in enumerate(lay.layer_kinds):
        buckets.setdefault(kind, []).append(i)
    sizes = [len(b) for b in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups: list[tuple[int, ...]] = []
    for layers in buckets.values():
        num_groups = math.ceil(len(layers) / group_size)
        groups += [tuple(layers[i::num_groups]) for i in range(num_groups)]
    return tuple(groups)


def bytes_per_block(
    layout: LayoutLike,
    block_size: int = 16,
    kv_dtype: str = "auto",
    tp: int = 1,
    hybrid_kv_cache_manager: bool = True,
    *,
    skip_layers: Iterable[str] = (),
) -> int:
    """Bytes one block id costs in vLLM's pool: the page bytes of the layers in the largest KV-cache group
    (= :func:`page_bytes` for a model with one attention kind; with layers of different page sizes in that one
    group, their sum: vLLM ``UniformTypeKVCacheSpecs.page_size_bytes``). Alignment padding is not modelled; a hybrid
    model whose groups' pages differ (TurboQuant or skip layers on a sliding + full model) is an error: vLLM
    pads those pages and that is not modelled."""
    lay = load_layout(layout)
    need_int(block_size, "block_size")
    per_layer = _layers(lay, kv_dtype, tp, skip_layers)
    groups = kv_cache_groups(lay, hybrid_kv_cache_manager)
    pages = {block_size * sum(per_layer[i] for i in g) for g in groups}
    if len(groups) > 1 and len(set(per_layer)) > 1:
        raise SpecError(
            "kvmath", "kv_dtype", kv_dtype, "a format whose layers share one page size on a hybrid model (not modelled)"
        )
    return max(pages)


def predict_num_blocks(
    layout: LayoutLike,
    kv_budget_bytes: int,
    block_size: int = 16,
    kv_dtype: str = "auto",
    tp: int = 1,
    hybrid_kv_cache_manager: bool = True,
    *,
    skip_layers: Iterable[str] = (),
) -> int:
    """Number of KV blocks vLLM allocates from ``kv_budget_bytes`` of KV memory on each rank:
    ``kv_budget_bytes // bytes_per_block`` (``= budget // page_bytes`` for a model with one attention kind;
    vLLM ``get_kv_cache_config_from_groups``)."""
    need_int(kv_budget_bytes, "kv_budget_bytes", 0)
    return kv_budget_bytes // bytes_per_block(
        layout, block_size, kv_dtype, tp, hybrid_kv_cache_manager, skip_layers=skip_layers
    )


def capacity_tokens(
    layout: LayoutLike,
    kv_budget_bytes: int,
    block_size: int = 16,
    kv_dtype: str = "auto",
    tp: int = 1,
    hybrid_kv_cache_manager: bool = True,
    *,
    skip_layers: Iterable[str] = (),
) -> int:
    """KV capacity in tokens: ``num_blocks * block_size``. For a model with several KV-cache groups
    (hybrid manager) these are token slots of the shared pool: every group takes its own blocks for a
    sequence, so a sequence uses more than one slot per token (see :func:`max_concurrency`)."""
    blocks = predict_num_blocks(
        layout, kv_budget_bytes, block_size, kv_dtype, tp, hybrid_kv_cache_manager, skip_layers=skip_layers
    )
    return blocks * block_size


def blocks_per_sequence(
    layout: LayoutLike,
    context_len: int,
    block_size: int = 16,
    hybrid_kv_cache_manager: bool = True,
    max_in_flight_tokens: int = 0,
) -> int:
    """Blocks one sequence of ``context_len`` tokens holds at full length, summed over KV-cache groups.

    A full-attention (or MLA) group needs ``ceil(context_len / block_size)``. A sliding-window group of
    window ``w`` needs ``ceil(min(w - 1 + max_in_flight_tokens, context_len) / block_size) + 1`` (the +1:
    the window may start mid-block), vLLM ``SlidingWindowSpec.max_admission_blocks_per_request``.
    ``max_in_flight_tokens=0`` is a sequence in steady decode; vLLM's startup figure ("Maximum
    concurrency ...") reserves ``max_num_batched_tokens`` in-flight tokens for chunked prefill, which
    for small windows (Gemma-3's 512) costs far more blocks than the window itself.
    """
    lay = load_layout(layout)
    need_int(context_len, "context_len")
    need_int(block_size, "block_size")
    need_int(max_in_flight_tokens, "max_in_flight_tokens", 0)
    full = math.ceil(context_len / block_size)
    total = 0
    for group in kv_cache_groups(lay, hybrid_kv_cache_manager):
        if {lay.layer_kinds[i] for i in group} == {"sliding"}:
            tokens = min(lay.sliding_window - 1 + max_in_flight_tokens, context_len)  # type: ignore[operator]
            total += math.ceil(tokens / block_size) + 1
        else:
            total += full
    return total


def max_concurrency(
    layout: LayoutLike,
    kv_budget_bytes: int,
    context_len: int,
    block_size: int = 16,
    kv_dtype: str = "auto",
    tp: int = 1,
    hybrid_kv_cache_manager: bool = True,
    max_in_flight_tokens: int = 0,
) -> int:
    """How many sequences of ``context_len`` tokens fit in the KV cache at once:
    ``num_blocks // ceil(context_len / block_size)`` for a full-attention model.

    Assumes every sequence is at its full length at the same time (the worst case; real requests grow
    and finish at different times) and full-attention layers; for sliding-window and hybrid models the
    divisor is :func:`blocks_per_sequence` (vLLM ``get_max_concurrency_for_kv_cache_config``, floored).
    Prefix sharing between sequences is not counted.
    """
    blocks = predict_num_blocks(layout, kv_budget_bytes, block_size, kv_dtype, tp, hybrid_kv_cache_manager)
    return blocks // blocks_per_sequence(layout, context_len, block_size, hybrid_kv_cache_manager, max_in_flight_tokens)


# --------------------------------------------------------------------------------------------------
# Tidy rows for tables and plots
# --------------------------------------------------------------------------------------------------


def kv_gib_vs_context(
    layout: LayoutLike,
    context_lens: Iterable[int],
    kv_dtypes: Iterable[str],
    batch: int = 1,
    tp: int = 1,
    within_max_position: bool = False,
) -> list[dict[str, Any]]:
    """One row per (kv_dtype, context_len): ``model, kv_dtype, context_len, batch, kv_bytes, kv_gib``,
    the KV cache of ``batch`` sequences of ``context_len`` tokens on one TP rank (sliding windows capped).
    ``within_max_position`` drops lengths beyond the config's ``max_position_embeddings``."""
    lay = load_layout(layout)
    need_int(batch, "batch")
    limit = lay.max_position_embeddings if within_max_position and lay.max_position_embeddings else None
    rows = []
    for dt in kv_dtypes:
        for n in context_lens:
            if limit is not None and n > limit:
                continue
            b = batch * kv_bytes_per_sequence(lay, n, dt, tp)
            rows.append(
                {"model": lay.name, "kv_dtype": dt, "context_len": n, "batch": batch, "kv_bytes": b, "kv_gib": b / GIB}
            )
    return rows


def layer_rows(layout: LayoutLike, kv_dtypes: Iterable[str] = ("auto", "fp8"), tp: int = 1) -> list[dict[str, Any]]:
    """Per-layer breakdown, one row per (layer, kv_dtype): ``layer, kind, window, kv_heads_per_rank,
    head_dim, v_head_dim, kv_dtype, dtype_bytes, bytes_per_token``."""
    lay = load_layout(layout)
    rows = []
    for dt in kv_dtypes:
        b = dtype_bytes(dt, lay.torch_dtype) if known_format(dt).rule in ("model", "dense") else None
        for i, kind in enumerate(lay.layer_kinds):
            rows.append(
                {
                    "model": lay.name,
                    "layer": i,
                    "kind": kind,
                    "window": lay.sliding_window if kind == "sliding" else None,
                    "kv_heads_per_rank": kv_heads_per_rank(lay, tp),
                    "head_dim": lay.head_dim,
                    "v_head_dim": lay.v_head_dim,
                    "kv_dtype": dt,
                    "dtype_bytes": b,
                    "bytes_per_token": layer_bytes_per_token(lay, i, dt, tp),
                }
            )
    return rows


def summary_row(layout: LayoutLike, kv_dtypes: Iterable[str] = ("auto", "fp8"), tp: int = 1) -> dict[str, Any]:
    """The formula row of one model: shape, the per-layer formula, and bytes per token for each kv dtype
    (``bytes_per_token_<dtype>``), all layers, one token, one sequence, one TP rank."""
    lay = load_layout(layout)
    kvr = kv_heads_per_rank(lay, tp)
    row: dict[str, Any] = {
        "model": lay.name,
        "model_type": lay.model_type,
        "torch_dtype": lay.torch_dtype,
        "layers": lay.num_layers,
        "attention": lay.attention_summary,
        "kv_heads": lay.num_kv_heads,
        "kv_heads_per_rank": kvr,
        "head_dim": lay.head_dim,
        "v_head_dim": lay.v_head_dim,
        "tp": tp,
        "formula": (
            f"{lay.num_layers} x 1 x ({lay.kv_lora_rank}+{lay.qk_rope_head_dim}) x b"
            if lay.is_mla
            else f"{lay.num_layers} x {kvr} x ({lay.head_dim}+{lay.v_head_dim}) x b"
        ),
    }
    for dt in kv_dtypes:
        row[f"bytes_per_token_{dt}"] = kv_bytes_per_token(lay, dt, tp)
    return row


# --------------------------------------------------------------------------------------------------
# What FP8 KV does to total memory (the weights: fp8lab.kvweights)
# --------------------------------------------------------------------------------------------------


def memory_rows(
    layout: LayoutLike,
    batch: int,
    context_len: int,
    kv_dtypes: Iterable[str] = ("auto", "fp8"),
    weight_dtype: str = "auto",
    tp: int = 1,
) -> list[dict[str, Any]]:
    """Weights + KV of ``batch`` sequences of ``context_len`` tokens, per TP rank, for each kv dtype:
    ``kv_dtype, weight_gib, kv_gib, total_gib, kv_share`` (KV / total) and ``total_vs_first`` (total
    relative to the first kv dtype's). Weights per rank = estimated weights / tp (every projection and the
    embeddings are sharded; replicated norms are negligible). Activations and runtime buffers are not
    counted. Shows why halving the KV cache does not halve memory."""
    lay = load_layout(layout)
    w = estimate_param_bytes(lay, weight_dtype) / tp
    rows: list[dict[str, Any]] = []
    for dt in kv_dtypes:
        kv = batch * kv_bytes_per_sequence(lay, context_len, dt, tp)
        rows.append(
            {
                "model": lay.name,
                "kv_dtype": dt,
                "batch": batch,
                "context_len": context_len,
                "weight_gib": w / GIB,
                "kv_gib": kv / GIB,
                "total_gib": (w + kv) / GIB,
                "kv_share": kv / (w + kv),
            }
        )
    for r in rows:
        r["total_vs_first"] = r["total_gib"] / rows[0]["total_gib"]
    return rows


def plan_capacity(
    layout: LayoutLike,
    gpu_memory_gib: float,
    kv_dtypes: Iterable[str] = ("auto", "fp8"),
    context_len: int = 8192,
    block_size: int | None = 16,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    weight_dtype: str = "auto",
    overhead_gib: float = 0.0,
    hybrid_kv_cache_manager: bool = True,
    max_in_flight_tokens: int = 0,
) -> list[dict[str, Any]]:
    """Capacity on one GPU (per TP rank): the KV budget is
    ``gpu_memory_gib * gpu_memory_utilization - weights / tp - overhead_gib``; rows of ``kv_dtype,
    kv_budget_gib, num_blocks, capacity_tokens, max_concurrency`` at ``context_len``.

    Assumptions (an upper bound on what vLLM will get): weights from :func:`estimate_param_bytes`;
    activations, CUDA graphs and non-torch memory only through ``overhead_gib`` (vLLM measures them in
    its profiling run; a few GiB on an 8B model); every sequence at ``context_len`` at once.
    ``fits`` is False when the budget is not positive. ``block_size=None`` means 16 (vLLM's GPU default).
    """
    lay = load_layout(layout)
    block_size = 16 if block_size is None else block_size
    w = estimate_param_bytes(lay, weight_dtype) / tp
    budget = int(gpu_memory_gib * gpu_memory_utilization * GIB - w - overhead_gib * GIB)
    rows = []
    for dt in kv_dtypes:
        b = max(budget, 0)
        blocks = predict_num_blocks(lay, b, block_size, dt, tp, hybrid_kv_cache_manager)
        rows.append(
            {
                "model": lay.name,
                "kv_dtype": dt,
                "gpu_memory_gib": gpu_memory_gib,
                "tp": tp,
                "weight_gib": w / GIB,
                "kv_budget_gib": b / GIB,
                "fits": budget > 0,
                "block_size": block_size,
                "num_blocks": blocks,
                "capacity_tokens": blocks * block_size,
                "context_len": context_len,
                "max_concurrency": blocks
                // blocks_per_sequence(lay, context_len, block_size, hybrid_kv_cache_manager, max_in_flight_tokens),
            }
        )
    return rows


__all__ = [
    "GIB",
    "KV_DTYPE_BYTES",
    "MAX_LEN_KEYS",
    "TORCH_DTYPE_BYTES",
    "WEIGHT_DTYPE_BYTES",
    "model_max_len",
    "KVLayout",
    "AttentionKind",
    "LayoutLike",
    "blocks_per_sequence",
    "bytes_per_block",
    "capacity_tokens",
    "config_path",
    "dtype_bytes",
    "estimate_param_bytes",
    "estimate_param_count",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "kv_cache_groups",
    "kv_gib_vs_context",
    "kv_heads_per_rank",
    "layer_bytes_per_token",
    "layer_rows",
    "layout_from_config",
    "load_config",
    "load_layout",
    "max_concurrency",
    "memory_rows",
    "page_bytes",
    "plan_capacity",
    "predict_num_blocks",
    "summary_row",
    "text_config",
]
