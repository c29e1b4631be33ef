"""The weights a model's ``config.json`` implies (stdlib only): :func:`estimate_param_count` (a decoder-only LM's
parameters, dense or MoE, standard attention or MLA) and :func:`estimate_param_bytes` (times the bytes per weight).
:mod:`fp8lab.kvmath` uses them for what FP8 KV does to total memory and re-exports both; split out of ``kvmath``
(issue 16): the weights are not KV arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from fp8lab.kvlayout import (
    TORCH_DTYPE_BYTES,
    KVLayout,
    LayoutLike,
    cfg_int,
    first,
    layout_from_config,
    load_config,
    text_config,
)
from fp8lab.specs import SpecError

#: Weight dtypes accepted by :func:`estimate_param_bytes` (``fp8`` = 1 byte per weight, scales ignored).
WEIGHT_DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1})


def estimate_param_count(config: LayoutLike) -> int:
    """Approximate parameter count of a decoder-only LM from its config.

    Counted: token embeddings (``vocab x hidden``) and an LM head of the same size unless
    ``tie_word_embeddings`` (absent = untied, except Gemma, which ties by default); per layer the
    attention projections (q, k, v, o; MLA: q or q-LoRA, ``kv_a_proj_with_mqa``, ``kv_b_proj``, o) and
    two RMSNorm weights; a gated MLP of 3 matrices (``hidden x intermediate_size``); for MoE layers
    ``n_experts`` routed experts of ``moe_intermediate_size`` plus shared experts plus the router
    (DeepSeek ``n_routed_experts``/``n_shared_experts``/``first_k_dense_replace``; Qwen-MoE
    ``num_experts``/``shared_expert_intermediate_size``/``decoder_sparse_step``/``mlp_only_layers``);
    one final norm. Approximated away: biases (Qwen2 qkv), q/k norms, Gemma's extra post-norms, MTP
    heads, vision towers. For Qwen3-8B this lands 9,216 parameters (36 x 256 q/k-norm weights) under
    the checkpoint's count.
    """
    c = dict(config.config) if isinstance(config, KVLayout) else text_config(load_config(config))
    lay = layout_from_config(c)
    hidden = cfg_int(c, ("hidden_size", "n_embd", "d_model"), "model width")
    vocab = cfg_int(c, ("vocab_size",), "vocabulary size")
    inter = cfg_int(c, ("intermediate_size", "n_inner", "ffn_dim"), "dense MLP width")
    n, heads = lay.num_layers, lay.num_attention_heads
    tied = c.get("tie_word_embeddings")
    if tied is None:
        tied = lay.model_type.startswith("gemma")
    embed = vocab * hidden * (1 if tied else 2)

    if lay.is_mla:
        nope = c.get("qk_nope_head_dim") or 0
        rope, rank = lay.qk_rope_head_dim or 0, lay.kv_lora_rank or 0
        v_dim = c.get("v_head_dim") or nope
        q_rank = c.get("q_lora_rank")
        q = hidden * heads * (nope + rope) if not q_rank else hidden * q_rank + q_rank + q_rank * heads * (nope + rope)
        attn = q + hidden * (rank + rope) + rank + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        q_out = heads * lay.head_dim
        attn = hidden * q_out + 2 * hidden * lay.num_kv_heads * lay.head_dim + q_out * hidden

    dense_mlp = 3 * hidden * inter
    n_experts = first(c, "n_routed_experts", "num_experts", "num_local_experts")
    moe_layers = 0
    moe_mlp = 0
    if n_experts:
        moe_inter = first(c, "moe_intermediate_size") or inter
        shared = (c.get("n_shared_experts") or 0) * 3 * hidden * moe_inter
        shared += 3 * hidden * c["shared_expert_intermediate_size"] if c.get("shared_expert_intermediate_size") else 0
        moe_mlp = n_experts * 3 * hidden * moe_inter + shared + hidden * n_experts
        first_dense = c.get("first_k_dense_replace") or 0
        step = c.get("decoder_sparse_step") or c.get("moe_layer_freq") or 1
        mlp_only = set(c.get("mlp_only_layers") or ())
        moe_layers = sum(1 for i in range(n) if i >= first_dense and i not in mlp_only and (i + 1) % step == 0)
    per_layer_common = attn + 2 * hidden
    return embed + n * per_layer_common + moe_layers * moe_mlp + (n - moe_layers) * dense_mlp + hidden


def estimate_param_bytes(config: LayoutLike, dtype: str = "auto") -> int:
    """Approximate weight bytes: :func:`estimate_param_count` x bytes per weight. ``dtype``: ``"auto"``
    (the config's ``torch_dtype``) | ``"bfloat16"`` | ``"float16"`` | ``"float32"`` | ``"fp8"`` (1 byte per
    weight; block scales ignored)."""
    if dtype == "auto":
        src = config if isinstance(config, KVLayout) else layout_from_config(load_config(config))
        if src.torch_dtype is None:
            raise SpecError("config", "torch_dtype", None, "a model dtype for dtype='auto', or pass dtype explicitly")
        per = TORCH_DTYPE_BYTES[src.torch_dtype]
    elif dtype in WEIGHT_DTYPE_BYTES:
        per = WEIGHT_DTYPE_BYTES[dtype]
    else:
        raise SpecError("kvmath", "dtype", dtype, "allowed: auto | " + " | ".join(WEIGHT_DTYPE_BYTES))
    return estimate_param_count(config) * per


__all__ = ["WEIGHT_DTYPE_BYTES", "estimate_param_bytes", "estimate_param_count"]
