"""The KV layout of a model, read from its Hugging Face ``config.json`` (stdlib only): :class:`KVLayout` (the
attention kind of every layer, K/V heads and head sizes, sliding window, MLA latent, checkpoint dtype),
:func:`load_layout` / :func:`layout_from_config` (the config rules of transformers' model families),
:func:`model_max_len` (the longest sequence the config allows, as vLLM derives it), and the byte widths of the
dtype names a config or a ``kv_cache_dtype`` may give.

The arithmetic on a layout (bytes per token, pages, blocks, capacity) is :mod:`fp8lab.kvmath`, which re-exports
every public name here (``kvmath.load_layout``, ``kvmath.KVLayout``, ``kvmath.GIB``); the weights a config implies
are :mod:`fp8lab.kvweights`. Split out of ``kvmath`` (issue 16) along that line: reading a config vs arithmetic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeGuard, get_args, overload

from fp8lab.kvformats import FORMATS
from fp8lab.specs import SpecError, resolve_model

GIB = 1 << 30
"""Bytes in one GiB."""

AttentionKind = Literal["full", "sliding", "mla"]

#: Bytes per element of the model dtype names found in ``torch_dtype`` / ``dtype``.
TORCH_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}
)
#: Bytes per element of each dense explicit ``kv_cache_dtype`` the calculator knows (``auto`` is resolved from the
#: model dtype; packed formats have no one width): derived from :data:`fp8lab.kvformats.FORMATS`.
KV_DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {n: f.elem_bytes for n, f in FORMATS.items() if f.rule == "dense" and f.elem_bytes is not None}
)


def _fail(field_name: str, value: Any, allowed: str, spec: str = "config") -> SpecError:
    return SpecError(spec, field_name, value, allowed)


def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def need_int(value: Any, field_name: str, lo: int = 1, spec: str = "kvmath") -> int:
    if not is_int(value) or value < lo:
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
            need_int(getattr(self, name), name, 1, "KVLayout")
        need_int(self.v_head_dim, "v_head_dim", 0, "KVLayout")
        if len(self.layer_kinds) != self.num_layers:
            raise _fail("layer_kinds", self.layer_kinds, f"one kind per layer ({self.num_layers})", "KVLayout")
        bad = sorted(set(self.layer_kinds) - set(get_args(AttentionKind)))
        if bad:
            raise _fail("layer_kinds", bad[0], "allowed: " + " | ".join(get_args(AttentionKind)), "KVLayout")
        if "sliding" in self.layer_kinds:
            need_int(self.sliding_window, "sliding_window", 1, "KVLayout")
        if "mla" in self.layer_kinds:
            need_int(self.kv_lora_rank, "kv_lora_rank", 1, "KVLayout")
            need_int(self.qk_rope_head_dim, "qk_rope_head_dim", 0, "KVLayout")
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
    ``"qwen3-8b"`` finds ``data/configs/qwen3-8b/config.json``); a name is first resolved as an engine spec resolves
    it (:func:`fp8lab.specs.resolve_model`: the real model's name is its converted folder).
    """
    from fp8lab.paths import CONFIGS_DIR, REPO_ROOT

    p = Path(resolve_model(str(src))).expanduser()
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


def first(c: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if c.get(k) is not None:
            return c[k]
    return None


@overload
def cfg_int(c: Mapping[str, Any], keys: tuple[str, ...], what: str, required: Literal[True] = True) -> int: ...
@overload
def cfg_int(c: Mapping[str, Any], keys: tuple[str, ...], what: str, required: bool) -> int | None: ...
def cfg_int(c: Mapping[str, Any], keys: tuple[str, ...], what: str, required: bool = True) -> int | None:
    v = first(c, *keys)
    if v is None and not required:
        return None
    if not is_int(v) or v < 1:
        raise _fail(keys[0], v, f"a positive integer ({what})")
    return v


def norm_dtype(v: Any) -> str | None:
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
    if window is not None and (not is_int(window) or window < 1):
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
        if not is_int(mwl) or mwl < 0:
            raise _fail("max_window_layers", mwl, "an integer >= 0 (layers below it use full attention)")
        kinds = tuple("sliding" if i >= mwl else "full" for i in range(n))
    else:
        pattern = c.get("sliding_window_pattern")
        if pattern is None and model_type.startswith("gemma3"):
            pattern = 6  # transformers' Gemma3TextConfig default
        if pattern is not None:
            if not is_int(pattern) or pattern < 1:
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
        if is_int(v) and v > 0 and (best is None or v < best):
            best, key = v, k
    if is_int(c.get("model_max_length")) and c["model_max_length"] > 0:
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
    n = cfg_int(c, ("num_hidden_layers", "n_layer", "num_layers"), "number of decoder layers")
    heads = cfg_int(c, ("num_attention_heads", "n_head"), "number of query heads")
    dtype = norm_dtype(first(c, "torch_dtype", "dtype"))
    max_pos = first(c, "max_position_embeddings")
    max_pos = max_pos if is_int(max_pos) else None
    if c.get("kv_lora_rank") is not None:  # DeepSeek-V2/V3 multi-head latent attention
        rank = cfg_int(c, ("kv_lora_rank",), "MLA latent width d_c")
        rope = c.get("qk_rope_head_dim")
        if not is_int(rope) or rope < 0:
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
    kv_heads = first(c, "num_key_value_heads", "num_kv_heads")
    if kv_heads is None:
        kv_heads = 1 if c.get("multi_query") else heads  # MQA flag (Falcon/StarCoder), else MHA
    if not is_int(kv_heads) or kv_heads < 1:
        raise _fail("num_key_value_heads", kv_heads, "a positive integer (K/V heads; absent means MHA)")
    head_dim = c.get("head_dim")
    if head_dim is None:
        hidden = cfg_int(c, ("hidden_size", "n_embd", "d_model"), "model width, used for head_dim = hidden / heads")
        if hidden % heads:
            raise _fail(
                "head_dim", None, f"an explicit head_dim (hidden_size {hidden} is not a multiple of {heads} heads)"
            )
        head_dim = hidden // heads
    if not is_int(head_dim) or head_dim < 1:
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


__all__ = [
    "GIB",
    "KV_DTYPE_BYTES",
    "MAX_LEN_KEYS",
    "TORCH_DTYPE_BYTES",
    "AttentionKind",
    "KVLayout",
    "LayoutLike",
    "config_path",
    "layout_from_config",
    "load_config",
    "load_layout",
    "model_max_len",
    "text_config",
]
