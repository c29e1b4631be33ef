"""KV-cache memory arithmetic on a Hugging Face ``config.json`` (stdlib only).

Everything here is pure arithmetic: no torch, no vLLM, no numpy, so ``fp8lab estimate`` works from a
plain ``pip install -e .``. Units are bytes and tokens unless a name says GiB (``GIB = 2**30`` bytes).

Sources of the formulas
-----------------------
- Page size of one standard attention layer on one tensor-parallel rank, vLLM
  ``vllm/v1/kv_cache_interface.py`` (``AttentionSpec.page_size_bytes``)::

      page = block_size * num_kv_heads_per_rank * (head_size + head_size_v) * dtype_bytes

  ``dtype_bytes`` is 2 for ``kv_cache_dtype="auto"`` on a bf16/fp16 model and 1 for ``fp8*`` (stored as
  uint8; per-tensor scales are per-layer scalars and add no bytes per token).
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

See also ``/work/shared/vllm-notes.md`` section 3 (how vLLM sizes the cache).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeGuard, get_args, overload

from fp8lab.specs import KVDtype, SpecError

GIB = 1 << 30
"""Bytes in one GiB."""

AttentionKind = Literal["full", "sliding", "mla"]

#: Bytes per element of the model dtype names found in ``torch_dtype`` / ``dtype``.
TORCH_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}
)
#: Bytes per element of each explicit ``kv_cache_dtype`` (``auto`` is resolved from the model dtype).
KV_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2}
)
#: Weight dtypes accepted by :func:`estimate_param_bytes` (``fp8`` = 1 byte per weight, scales ignored).
WEIGHT_DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1})


def _fail(field_name: str, value: Any, allowed: str, spec: str = "config") -> SpecError:
    return SpecError(spec, field_name, value, allowed)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _need_int(value: Any, field_name: str, lo: int = 1, spec: str = "kvmath") -> int:
    if not _is_int(value) or value < lo:
        raise _fail(field_name, value, f"an integer >= {lo}", spec)
    return value


# --------------------------------------------------------------------------------------------------
# The layout
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVLayout:
    """What the KV cache of one model looks like, read from its ``config.json``.

    ``layer_kinds[i]`` is the attention kind of decoder layer ``i``: ``"full"`` (caches every token),
    ``"sliding"`` (caches the last ``sliding_window`` tokens) or ``"mla"`` (DeepSeek latent).
    ``num_kv_heads`` K/V heads of ``head_dim`` (K) and ``v_head_dim`` (V) values are cached per layer and
    token. For MLA layouts ``num_kv_heads = 1``, ``head_dim = kv_lora_rank + qk_rope_head_dim`` and
    ``v_head_dim = 0`` (one latent vector per token and layer, as vLLM's ``MLAAttentionSpec``).
    ``torch_dtype`` is the checkpoint dtype (``None`` when the config does not say); ``config`` keeps the
    (text) config the layout was read from, for :func:`estimate_param_count`.
    """

    name: str
    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    torch_dtype: str | None
    layer_kinds: tuple[str, ...]
    sliding_window: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    max_position_embeddings: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_kinds", tuple(self.layer_kinds))
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        for name in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim"):
            _need_int(getattr(self, name), name, 1, "KVLayout")
        _need_int(self.v_head_dim, "v_head_dim", 0, "KVLayout")
        if len(self.layer_kinds) != self.num_layers:
            raise _fail("layer_kinds", self.layer_kinds, f"one kind per layer ({self.num_layers})", "KVLayout")
        bad = sorted(set(self.layer_kinds) - set(get_args(AttentionKind)))
        if bad:
            raise _fail("layer_kinds", bad[0], "allowed: " + " | ".join(get_args(AttentionKind)), "KVLayout")
        if "sliding" in self.layer_kinds:
            _need_int(self.sliding_window, "sliding_window", 1, "KVLayout")
        if "mla" in self.layer_kinds:
            _need_int(self.kv_lora_rank, "kv_lora_rank", 1, "KVLayout")
            _need_int(self.qk_rope_head_dim, "qk_rope_head_dim", 0, "KVLayout")
        if self.torch_dtype is not None and self.torch_dtype not in TORCH_DTYPE_BYTES:
            raise _fail("torch_dtype", self.torch_dtype, "allowed: " + " | ".join(TORCH_DTYPE_BYTES), "KVLayout")

    @property
    def is_mla(self) -> bool:
        return "mla" in self.layer_kinds

    @property
    def kind_counts(self) -> dict[str, int]:
        """Number of layers of each attention kind, e.g. ``{"sliding": 21, "full": 21}``."""
        out: dict[str, int] = {}
        for k in self.layer_kinds:
            out[k] = out.get(k, 0) + 1
        return out

    @property
    def attention_summary(self) -> str:
        """Readable layer mix, e.g. ``"36 full"`` or ``"21 sliding(4096) + 21 full"``."""
        parts = []
        for kind, n in self.kind_counts.items():
            parts.append(f"{n} sliding({self.sliding_window})" if kind == "sliding" else f"{n} {kind}")
        return " + ".join(parts)


LayoutLike = KVLayout | Mapping[str, Any] | str | Path


# --------------------------------------------------------------------------------------------------
# Reading a config
# --------------------------------------------------------------------------------------------------


def config_path(src: str | Path) -> Path:
    """The ``config.json`` that ``src`` names: the file itself, or ``<folder>/config.json``.

    A relative path that does not exist is also tried under the repository's ``data/configs/`` (so
    ``"qwen3-8b"`` finds ``data/configs/qwen3-8b/config.json``).
    """
    from fp8lab.paths import CONFIGS_DIR, REPO_ROOT

    p = Path(src).expanduser()
    candidates = [p]
    if not p.is_absolute():
        candidates += [REPO_ROOT / p, CONFIGS_DIR / p]
    for cand in candidates:
        if cand.is_file():
            return cand
        if cand.is_dir():
            if (cand / "config.json").is_file():
                return cand / "config.json"
            raise _fail("path", str(src), "a config.json file or a folder holding one (this folder has none)")
    raise _fail("path", str(src), "a config.json file or a model folder holding one (nothing found there)")


def load_config(src: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """The config dict of ``src`` (a dict, a ``config.json`` path, or a model folder), as written."""
    if isinstance(src, Mapping):
        return dict(src)
    path = config_path(src)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise _fail("path", str(path), f"valid JSON (line {err.lineno}: {err.msg})") from None
    except UnicodeDecodeError as err:
        raise _fail(
            "path", str(path), f"a UTF-8 text file (byte {err.start} is {err.object[err.start]:#04x})"
        ) from None
    if not isinstance(cfg, dict):
        raise _fail("path", str(path), "a JSON object at the top level")
    return cfg


def text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The language-model part of a config: ``text_config`` (multimodal models such as Gemma-3,
    Llava, Qwen2-VL-style nests) when present, with the top-level dtype/tying filled in; else ``cfg``."""
    inner = cfg.get("text_config")
    if not isinstance(inner, Mapping):
        return dict(cfg)
    merged = dict(inner)
    for key in ("torch_dtype", "dtype", "tie_word_embeddings"):
        if merged.get(key) is None and cfg.get(key) is not None:
            merged[key] = cfg[key]
    return merged


def _first(c: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if c.get(k) is not None:
            return c[k]
    return None


@overload
def _cfg_int(c: Mapping[str, Any], keys: tuple[str, ...], what: str, required: Literal[True] = True) -> int: ...
@overload
def _cfg_int(c: Mapping[str, Any], keys: tuple[str, ...], what: str, required: bool) -> int | None: ...
def _cfg_int(c: Mapping[str, Any], keys: tuple[str, ...], what: str, required: bool = True) -> int | None:
    v = _first(c, *keys)
    if v is None and not required:
        return None
    if not _is_int(v) or v < 1:
        raise _fail(keys[0], v, f"a positive integer ({what})")
    return v


def _norm_dtype(v: Any) -> str | None:
    if v is None:
        return None
    s = str(v).removeprefix("torch.")
    if s not in TORCH_DTYPE_BYTES:
        raise _fail("torch_dtype", v, "allowed: " + " | ".join(TORCH_DTYPE_BYTES) + " (or absent)")
    return s


def _layer_kinds(c: Mapping[str, Any], n: int, model_type: str) -> tuple[tuple[str, ...], int | None]:
    """Per-layer attention kind and the sliding window, following the rules of transformers' configs:

    1. ``layer_types`` (Gemma-2/3, Qwen3 and newer configs): ``"full_attention"`` | ``"sliding_attention"``.
    2. ``use_sliding_window: false`` (Qwen2/2.5/3): no sliding window whatever ``sliding_window`` says.
    3. ``use_sliding_window: true`` + ``max_window_layers`` (Qwen): layers ``i >= max_window_layers`` slide.
    4. ``sliding_window_pattern`` P (Gemma-3, Cohere2): layer ``i`` is full iff ``(i + 1) % P == 0``.
    5. ``model_type == "gemma2"``: even layers slide, odd layers are full.
    6. Any other ``sliding_window`` (Mistral-7B-v0.1): every layer slides.
    """
    window = c.get("sliding_window")
    if window == 0:  # vLLM reads sliding_window=0 as "disabled" (config/model.py)
        window = None
    if window is not None and (not _is_int(window) or window < 1):
        raise _fail("sliding_window", window, "a positive integer or null")
    layer_types = c.get("layer_types")
    if layer_types is not None:
        allowed = {"full_attention": "full", "sliding_attention": "sliding"}
        if not isinstance(layer_types, list) or len(layer_types) != n:
            raise _fail("layer_types", layer_types, f"a list of {n} entries (one per layer)")
        for t in layer_types:
            if t not in allowed:
                raise _fail(
                    "layer_types", t, "allowed: " + " | ".join(allowed) + " (other layer kinds are not modelled)"
                )
        kinds = tuple(allowed[t] for t in layer_types)
        if "sliding" in kinds and window is None:
            raise _fail("sliding_window", None, "a positive integer (layer_types has sliding_attention layers)")
        return kinds, (window if "sliding" in kinds else None)
    if window is None or c.get("use_sliding_window") is False:
        return ("full",) * n, None
    if c.get("use_sliding_window") is True:
        mwl = c.get("max_window_layers", n)
        if not _is_int(mwl) or mwl < 0:
            raise _fail("max_window_layers", mwl, "an integer >= 0 (layers below it use full attention)")
        kinds = tuple("sliding" if i >= mwl else "full" for i in range(n))
    else:
        pattern = c.get("sliding_window_pattern")
        if pattern is None and model_type.startswith("gemma3"):
            pattern = 6  # transformers' Gemma3TextConfig default
        if pattern is not None:
            if not _is_int(pattern) or pattern < 1:
                raise _fail("sliding_window_pattern", pattern, "a positive integer")
            kinds = tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(n))
        elif model_type == "gemma2":
            kinds = tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
        else:
            kinds = ("sliding",) * n
    return kinds, (window if "sliding" in kinds else None)


#: Config keys that bound a model's sequence length, as vLLM reads them (``derive_max_model_len_and_key``
#: in vllm/transformers_utils/model_arch_config_convertor.py, 0.32.0): the smallest one present wins.
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
#: RoPE types whose ``factor`` vLLM does not apply again (their ``max_position_embeddings`` is already scaled).
_ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def model_max_len(config: Mapping[str, Any] | str | Path) -> tuple[int | None, str | None]:
    """``(limit, source)``: the longest sequence (tokens) the model's config allows, derived as vLLM 0.32
    does (``_get_and_verify_max_len`` in vllm/config/model.py): the smallest of :data:`MAX_LEN_KEYS`
    (``model_max_length`` taking precedence), times the RoPE scaling ``factor`` unless the RoPE type is
    one whose positions are already scaled (YaRN, llama3, longrope) or the model is a Gemma 3.
    ``(None, None)`` when the config names no length (vLLM then assumes 2048 or takes the user's)."""
    cfg = load_config(config)
    c = text_config(cfg)
    best: int | None = None
    key: str | None = None
    for k in MAX_LEN_KEYS:
        v = c.get(k)
        if _is_int(v) and v > 0 and (best is None or v < best):
            best, key = v, k
    if _is_int(c.get("model_max_length")) and c["model_max_length"] > 0:
        best, key = c["model_max_length"], "model_max_length"
    if best is None:
        return None, None
    model_type = str(c.get("model_type") or cfg.get("model_type") or "")
    rope = c.get("rope_scaling") or c.get("rope_parameters")
    if isinstance(rope, Mapping) and rope and all(isinstance(v, Mapping) for v in rope.values()):
        rope = next(iter(rope.values()))  # per-layer-type RoPE parameters (transformers 5): the same factor
    if isinstance(rope, Mapping) and "gemma3" not in model_type:
        rtype, factor = rope.get("rope_type") or rope.get("type"), rope.get("factor")
        if rtype not in _ROPE_PRESCALED and isinstance(factor, (int, float)) and factor > 0 and factor != 1:
            return int(best * factor), f"{key} = {best:,} x rope_scaling.factor {factor:g}"
    return int(best), f"{key} = {best:,}"


def layout_from_config(cfg: Mapping[str, Any], name: str = "config") -> KVLayout:
    """Parse a HF config dict into a :class:`KVLayout` (see :func:`_layer_kinds` for the window rules).

    Raises :class:`~fp8lab.specs.SpecError` naming the config field, its value and what is allowed.
    """
    c = text_config(cfg)
    model_type = str(c.get("model_type") or cfg.get("model_type") or "unknown")
    n = _cfg_int(c, ("num_hidden_layers", "n_layer", "num_layers"), "number of decoder layers")
    heads = _cfg_int(c, ("num_attention_heads", "n_head"), "number of query heads")
    dtype = _norm_dtype(_first(c, "torch_dtype", "dtype"))
    max_pos = _first(c, "max_position_embeddings")
    max_pos = max_pos if _is_int(max_pos) else None
    if c.get("kv_lora_rank") is not None:  # DeepSeek-V2/V3 multi-head latent attention
        rank = _cfg_int(c, ("kv_lora_rank",), "MLA latent width d_c")
        rope = c.get("qk_rope_head_dim")
        if not _is_int(rope) or rope < 0:
            raise _fail("qk_rope_head_dim", rope, "an integer >= 0 (MLA decoupled RoPE key width d_h^R)")
        return KVLayout(
            name=name,
            model_type=model_type,
            num_layers=n,
            num_attention_heads=heads,
            num_kv_heads=1,
            head_dim=rank + rope,
            v_head_dim=0,
            torch_dtype=dtype,
            layer_kinds=("mla",) * n,
            kv_lora_rank=rank,
            qk_rope_head_dim=rope,
            max_position_embeddings=max_pos,
            config=c,
        )
    kv_heads = _first(c, "num_key_value_heads", "num_kv_heads")
    if kv_heads is None:
        kv_heads = 1 if c.get("multi_query") else heads  # MQA flag (Falcon/StarCoder), else MHA
    if not _is_int(kv_heads) or kv_heads < 1:
        raise _fail("num_key_value_heads", kv_heads, "a positive integer (K/V heads; absent means MHA)")
    head_dim = c.get("head_dim")
    if head_dim is None:
        hidden = _cfg_int(c, ("hidden_size", "n_embd", "d_model"), "model width, used for head_dim = hidden / heads")
        if hidden % heads:
            raise _fail(
                "head_dim", None, f"an explicit head_dim (hidden_size {hidden} is not a multiple of {heads} heads)"
            )
        head_dim = hidden // heads
    if not _is_int(head_dim) or head_dim < 1:
        raise _fail("head_dim", head_dim, "a positive integer")
    kinds, window = _layer_kinds(c, n, model_type)
    return KVLayout(
        name=name,
        model_type=model_type,
        num_layers=n,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        torch_dtype=dtype,
        layer_kinds=kinds,
        sliding_window=window,
        max_position_embeddings=max_pos,
        config=c,
    )


def load_layout(src: LayoutLike, name: str | None = None) -> KVLayout:
    """A :class:`KVLayout` from a layout (returned as is), a config dict, a ``config.json`` or a model folder.

    ``name`` defaults to the folder name (``data/configs/qwen3-8b`` -> ``"qwen3-8b"``).
    """
    if isinstance(src, KVLayout):
        return src
    if isinstance(src, Mapping):
        return layout_from_config(src, name or "config")
    path = config_path(src)
    return layout_from_config(load_config(path), name or path.parent.name)


# --------------------------------------------------------------------------------------------------
# Bytes per token and per sequence
# --------------------------------------------------------------------------------------------------


def dtype_bytes(kv_dtype: str, torch_dtype: str | None) -> int:
    """Bytes per cached element for ``kv_cache_dtype`` ``kv_dtype`` on a model of dtype ``torch_dtype``.

    ``"auto"`` stores K/V in the model dtype (bf16/fp16 -> 2, fp32 -> 4); ``"fp8"``, ``"fp8_e4m3"`` and
    ``"fp8_e5m2"`` -> 1; ``"bfloat16"``/``"float16"`` -> 2 (vLLM ``utils/torch_utils.py``,
    ``STR_DTYPE_TO_TORCH_DTYPE``). Note: vLLM's *model* ``dtype="auto"`` runs a float32 checkpoint in
    bf16/fp16, so its "auto" cache is then 2 bytes; pass ``kv_dtype="bfloat16"`` to model that.
    """
    allowed = get_args(KVDtype)
    if kv_dtype not in allowed:
        raise SpecError("kvmath", "kv_dtype", kv_dtype, "allowed: " + " | ".join(allowed))
    if kv_dtype != "auto":
        return KV_DTYPE_BYTES[kv_dtype]
    if torch_dtype is None:
        raise SpecError(
            "config",
            "torch_dtype",
            None,
            "a model dtype (bfloat16 | float16 | float32) for kv_dtype='auto'; "
            "or pass an explicit kv_dtype (bfloat16 | float16 | fp8)",
        )
    dt = _norm_dtype(torch_dtype)
    return TORCH_DTYPE_BYTES[dt]  # type: ignore[index]


def kv_heads_per_rank(layout: KVLayout, tp: int = 1) -> int:
    """K/V heads cached on one TP rank: ``max(1, num_kv_heads // tp)`` (replicated when ``tp > num_kv_heads``);
    always 1 for MLA (the latent is not split across ranks). vLLM requires ``num_kv_heads`` and ``tp`` to
    divide one another; other combinations raise."""
    _need_int(tp, "tp")
    if layout.is_mla:
        return 1
    kv = layout.num_kv_heads
    if kv % tp and tp % kv:
        raise SpecError("kvmath", "tp", tp, f"a divisor or a multiple of num_key_value_heads = {kv}")
    return max(1, kv // tp)


def layer_bytes_per_token(layout: LayoutLike, layer: int, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes one token occupies in layer ``layer`` on one TP rank:
    ``kv_heads_per_rank * (head_dim + v_head_dim) * dtype_bytes`` (= ``2 * kv * head_dim * b`` for standard
    attention, ``(kv_lora_rank + qk_rope_head_dim) * b`` for MLA)."""
    lay = load_layout(layout)
    if not (_is_int(layer) and 0 <= layer < lay.num_layers):
        raise SpecError("kvmath", "layer", layer, f"an integer in [0, {lay.num_layers - 1}]")
    return kv_heads_per_rank(lay, tp) * (lay.head_dim + lay.v_head_dim) * dtype_bytes(kv_dtype, lay.torch_dtype)


def _per_layer(lay: KVLayout, kv_dtype: str, tp: int) -> int:
    # Every layer of a layout has the same heads and head sizes, so one layer's bytes serve for all.
    return kv_heads_per_rank(lay, tp) * (lay.head_dim + lay.v_head_dim) * dtype_bytes(kv_dtype, lay.torch_dtype)


def kv_bytes_per_token(layout: LayoutLike, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes of KV cache for one token of one sequence, summed over all layers, on one TP rank
    (for ``tp=1`` the model total). Sliding-window layers count too: this is the cost of a token
    that is still inside every window."""
    lay = load_layout(layout)
    return lay.num_layers * _per_layer(lay, kv_dtype, tp)


def kv_bytes_per_sequence(layout: LayoutLike, context_len: int, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes of KV cache one sequence of ``context_len`` tokens needs on one TP rank, counting
    ``min(context_len, sliding_window)`` tokens in sliding-window layers (an ideal ring buffer; vLLM
    frees whole blocks only, so it holds up to one block more per sliding layer)."""
    lay = load_layout(layout)
    _need_int(context_len, "context_len")
    per_layer = _per_layer(lay, kv_dtype, tp)
    total = 0
    window = lay.sliding_window  # an int whenever a layer slides (KVLayout checks it)
    for kind in lay.layer_kinds:
        tokens = min(context_len, window) if kind == "sliding" and window is not None else context_len
        total += tokens * per_layer
    return total


# --------------------------------------------------------------------------------------------------
# vLLM's paged view: pages, blocks, capacity
# --------------------------------------------------------------------------------------------------


def page_bytes(layout: LayoutLike, block_size: int = 16, kv_dtype: str = "auto", tp: int = 1) -> int:
    """Bytes of one block of ``block_size`` tokens across *all* layers on one TP rank:
    ``sum over layers of block_size * num_kv_heads_per_rank * (head_dim + v_head_dim) * dtype_bytes``
    (vLLM ``AttentionSpec.page_size_bytes`` summed over layers)."""
    _need_int(block_size, "block_size")
    return block_size * kv_bytes_per_token(layout, kv_dtype, tp)


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
    layout: LayoutLike, block_size: int = 16, kv_dtype: str = "auto", tp: int = 1, hybrid_kv_cache_manager: bool = True
) -> int:
    """Bytes one block id costs in vLLM's pool: the page bytes of the layers in the largest KV-cache group
    (= :func:`page_bytes` for a model with one attention kind). Alignment padding is not modelled."""
    lay = load_layout(layout)
    _need_int(block_size, "block_size")
    largest = max(len(g) for g in kv_cache_groups(lay, hybrid_kv_cache_manager))
    return largest * block_size * _per_layer(lay, kv_dtype, tp)


def predict_num_blocks(
    layout: LayoutLike,
    kv_budget_bytes: int,
    block_size: int = 16,
    kv_dtype: str = "auto",
    tp: int = 1,
    hybrid_kv_cache_manager: bool = True,
) -> int:
    """Number of KV blocks vLLM allocates from ``kv_budget_bytes`` of KV memory on each rank:
    ``kv_budget_bytes // bytes_per_block`` (``= budget // page_bytes`` for a model with one attention kind;
    vLLM ``get_kv_cache_config_from_groups``)."""
    _need_int(kv_budget_bytes, "kv_budget_bytes", 0)
    return kv_budget_bytes // bytes_per_block(layout, block_size, kv_dtype, tp, hybrid_kv_cache_manager)


def capacity_tokens(
    layout: LayoutLike,
    kv_budget_bytes: int,
    block_size: int = 16,
    kv_dtype: str = "auto",
    tp: int = 1,
    hybrid_kv_cache_manager: bool = True,
) -> int:
    """KV capacity in tokens: ``num_blocks * block_size``. For a model with several KV-cache groups
    (hybrid manager) these are token slots of the shared pool: every group takes its own blocks for a
    sequence, so a sequence uses more than one slot per token (see :func:`max_concurrency`)."""
    return predict_num_blocks(layout, kv_budget_bytes, block_size, kv_dtype, tp, hybrid_kv_cache_manager) * block_size


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
    _need_int(context_len, "context_len")
    _need_int(block_size, "block_size")
    _need_int(max_in_flight_tokens, "max_in_flight_tokens", 0)
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
    _need_int(batch, "batch")
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
        b = dtype_bytes(dt, lay.torch_dtype)
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
# Weights, and what FP8 KV does to total memory
# --------------------------------------------------------------------------------------------------


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
    hidden = _cfg_int(c, ("hidden_size", "n_embd", "d_model"), "model width")
    vocab = _cfg_int(c, ("vocab_size",), "vocabulary size")
    inter = _cfg_int(c, ("intermediate_size", "n_inner", "ffn_dim"), "dense MLP width")
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
    n_experts = _first(c, "n_routed_experts", "num_experts", "num_local_experts")
    moe_layers = 0
    moe_mlp = 0
    if n_experts:
        moe_inter = _first(c, "moe_intermediate_size") or inter
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
