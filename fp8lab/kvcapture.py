"""Capture a model's real K, V (and Q) as its attention layers see them, with transformers on CPU.

Where vLLM quantizes: in vLLM's Qwen3 (and Llama, Mistral, Gemma...) attention, ``qkv_proj`` is
split, Qwen3 applies the per-head ``q_norm``/``k_norm``, then rotary embeddings, and only then
``self.attn(q, k, v)`` is called; that layer writes ``k``/``v`` into the paged cache (divided by
``k_scale``/``v_scale`` and cast to FP8) before attending (vllm-notes section 6). So the cache holds
**post-norm, post-RoPE K** and **V as projected**.

transformers' attention modules compute exactly those tensors and hand them to the function in
``ALL_ATTENTION_FUNCTIONS`` (``query, key, value`` of shape ``[batch, heads, seq, head_dim]``, K/V
before GQA head repetition). We register a capturing attention function there that records its
inputs and then runs ``sdpa``: no model-specific hooks (no re-implementing ``k_norm`` + RoPE per
architecture), and the tensors are by construction the ones the attention kernel would receive.
Each sequence runs alone (batch 1, no padding, no KV cache), in the model's own dtype (bf16 for the
shipped model, as vLLM runs it). Kernels differ from vLLM's, so values can differ from vLLM's in
the last bf16 bit; the distribution (what a round trip is measured on) is the same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp8lab.specs import SpecError, resolve_model

CAPTURE_ATTN = "fp8lab_capture"
_RECORDER: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


@dataclass
class KVCapture:
    """Per-layer tensors of every captured token, sequences concatenated along the token axis.

    ``keys[l]`` / ``values[l]``: ``[tokens, kv_heads, head_dim]``; ``queries[l]``:
    ``[tokens, heads, head_dim]`` (empty list unless captured); all in the model's dtype.
    ``seq_lens``: tokens of each input sequence, in order (their sum is ``tokens``).
    """

    model: str
    dtype: str
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    queries: list[torch.Tensor] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_tokens(self) -> int:
        return int(self.keys[0].shape[0]) if self.keys else 0

    @property
    def num_kv_heads(self) -> int:
        return int(self.keys[0].shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.keys[0].shape[2])

    def tensor(self, name: str, layer: int) -> torch.Tensor:
        """``name`` in ``K | V | Q``."""
        src = {"K": self.keys, "V": self.values, "Q": self.queries}.get(name)
        if src is None:
            raise SpecError("KVCapture", "name", name, "K | V | Q")
        if not src:
            raise SpecError("KVCapture", name, "not captured", "capture with with_queries=True for Q")
        return src[layer]

    def sequences(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """``(Q, K, V)`` of each sequence for one layer (Q is None when not captured)."""
        out, start = [], 0
        for n in self.seq_lens:
            q = self.queries[layer][start : start + n] if self.queries else None
            out.append((q, self.keys[layer][start : start + n], self.values[layer][start : start + n]))
            start += n
        return out


def _capture_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _RECORDER is not None:
        # [1, heads, seq, head_dim] -> [seq, heads, head_dim]
        _RECORDER.append(
            (
                int(module.layer_idx),
                query[0].transpose(0, 1).detach().clone(),
                key[0].transpose(0, 1).detach().clone(),
                value[0].transpose(0, 1).detach().clone(),
            )
        )
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CAPTURE_ATTN, _capture_attention)
    AttentionMaskInterface.register(CAPTURE_ATTN, sdpa_mask)


def model_dtype(model_path: str, dtype: str) -> torch.dtype:
    if dtype != "auto":
        return getattr(torch, dtype)
    cfg_path = Path(model_path) / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg = cfg.get("text_config", cfg)
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    return getattr(torch, name)


def capture_kv(
    model_path: str,
    token_id_batches: Sequence[Sequence[int]],
    *,
    dtype: str = "auto",
    device: str = "cpu",
    with_queries: bool = True,
) -> KVCapture:
    """Run each token-id sequence through ``model_path`` and return every layer's K/V (and Q).

    ``token_id_batches``: one token-id sequence per forward pass (each run alone, batch 1).
    ``dtype``: ``auto`` (the config's dtype) | ``bfloat16`` | ``float16`` | ``float32``.
    ``device``: ``cpu`` by default; in a notebook that also drives CUDA vLLM engines keep it on CPU
    (vllm-notes section 5: the notebook kernel must not hold the GPU).
    """
    global _RECORDER
    from transformers import AutoModelForCausalLM

    seqs = [list(map(int, s)) for s in token_id_batches]
    if not seqs or any(len(s) == 0 for s in seqs):
        raise SpecError("capture_kv", "token_id_batches", len(seqs), "at least one non-empty token-id sequence")
    path = resolve_model(model_path)
    torch_dtype = model_dtype(path, dtype)
    _register()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=CAPTURE_ATTN)
    model.to(device).eval()
    per_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
    try:
        for s in seqs:
            _RECORDER = []
            with torch.no_grad():
                model(torch.tensor([s], device=device), use_cache=False)
            for layer, q, k, v in _RECORDER:
                per_layer.setdefault(layer, []).append((q.cpu(), k.cpu(), v.cpu()))
    finally:
        _RECORDER = None
        del model
    layers = sorted(per_layer)
    cat = lambda i: [torch.cat([t[i] for t in per_layer[layer]]) for layer in layers]  # noqa: E731
    return KVCapture(
        model=path,
        dtype=str(torch_dtype).removeprefix("torch."),
        keys=cat(1),
        values=cat(2),
        queries=cat(0) if with_queries else [],
        seq_lens=[len(s) for s in seqs],
    )


# ------------------------------------------------------------------------------------- scale sets
_SCALE_RE = re.compile(r"layers\.(\d+)\..*?(k_scale|v_scale|kv_scale)$")


def kv_cache_scheme(model_path: str) -> dict[str, Any] | None:
    """The ``quantization_config.kv_cache_scheme`` of a model folder, or None (vllm-notes section 4:
    without it vLLM ignores ``k_scale``/``v_scale`` tensors, or refuses them)."""
    cfg_path = Path(resolve_model(model_path)) / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    return (cfg.get("quantization_config") or {}).get("kv_cache_scheme")


def read_kv_scales(model_path: str, reduce: str = "none") -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(k_scale, v_scale)`` from a scale set's safetensors, as float32 ``[kv_heads]`` (or
    ``[1]`` for per-tensor scales). Names follow vLLM's remapping (``…self_attn.k_scale``,
    ``…k_proj.k_scale``, ``…attn.k_scale``, deprecated ``…kv_scale`` for both).

    ``reduce="max"``: one scalar per layer, the max over heads, which is what the CPU backend uses
    for ``attn_head`` scales (vllm-notes section 4); FlashAttention uses the per-head values.
    """
    from safetensors import safe_open

    folder = Path(resolve_model(model_path))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecError("read_kv_scales", "model_path", model_path, "a folder with *.safetensors")
    found: dict[int, dict[str, torch.Tensor]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                m = _SCALE_RE.search(name)
                if m:
                    found.setdefault(int(m.group(1)), {})[m.group(2)] = st.get_tensor(name).float().reshape(-1)
    if not found:
        raise SpecError("read_kv_scales", "model_path", model_path, "a scale set holding k_scale/v_scale tensors")
    out = {}
    for layer, d in sorted(found.items()):
        k = d.get("k_scale", d.get("kv_scale"))
        v = d.get("v_scale", d.get("kv_scale"))
        if k is None or v is None:
            raise SpecError("read_kv_scales", f"layer {layer}", sorted(d), "both k_scale and v_scale (or kv_scale)")
        if reduce == "max":
            k, v = k.max().reshape(1), v.max().reshape(1)
        out[layer] = (k, v)
    return out


def check_kv_scales(model_path: str) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`read_kv_scales`, checked before any engine loads them: one ``k_scale`` and ``v_scale`` per attention
    layer of the model's config, each of ``1`` (per tensor) or ``num_key_value_heads`` values, all finite and > 0
    (a NaN, infinite, zero or negative scale would turn the cache into NaN or zeros without an error)."""
    scales = read_kv_scales(model_path)
    cfg = json.loads((Path(resolve_model(model_path)) / "config.json").read_text(encoding="utf-8"))
    c = cfg.get("text_config", cfg)
    n_layers, kv_heads = c.get("num_hidden_layers"), c.get("num_key_value_heads") or c.get("num_attention_heads")
    where = f"check_kv_scales({Path(model_path).name})"
    if isinstance(n_layers, int) and sorted(scales) != list(range(n_layers)):
        raise SpecError(
            where, "layers", sorted(scales), f"scales for each of the model's {n_layers} layers 0..{n_layers - 1}"
        )
    for layer, pair in scales.items():
        for name, t in zip(("k_scale", "v_scale"), pair, strict=True):
            if t.numel() not in (1, kv_heads):
                raise SpecError(
                    where, f"layer {layer} {name}", tuple(t.shape), f"1 value (per tensor) or {kv_heads} (per KV head)"
                )
            bad = t[~(torch.isfinite(t) & (t > 0))]
            if bad.numel():
                raise SpecError(where, f"layer {layer} {name}", float(bad[0]), "finite scales > 0")
    return scales


__all__ = ["CAPTURE_ATTN", "KVCapture", "capture_kv", "check_kv_scales", "kv_cache_scheme", "read_kv_scales"]
