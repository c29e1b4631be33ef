"""KV-cache formats: which ``kv_cache_dtype`` names are allowed (asked of the installed vLLM, never listed here) and
what one token costs in each format the calculator knows (vLLM's own page-size rules, stdlib only).

Allowed names (:func:`check_kv_dtype`, used by every spec)
----------------------------------------------------------
The names come from the installed vLLM (``typing.get_args(vllm.config.cache.CacheDType)``, asked once per
installation in a subprocess and cached, :func:`fp8lab.vllm_options.cached_engine_choices`). Where no vLLM is
installed (a plain ``pip install -e .`` for ``fp8lab estimate``) or the installed one cannot answer, the names the
calculator has a byte rule for (:data:`FORMATS`) are accepted and any other name is refused as an "unknown
format". Either way the error is a :class:`~fp8lab.errors.SpecError` naming the field, the value and every allowed
value, raised before any engine starts.

Bytes per token (:func:`slot_bytes`)
------------------------------------
vLLM sizes one layer's page as ``num_heads * block_size * state_content_size_bytes`` (vLLM 0.32
``v1/kv_cache_interface.py``, ``AttentionSpec.unpadded_page_size_bytes``), where the state content defaults to
``(head_size + head_size_v) * dtype_size`` and a backend's ``customize_spec`` replaces it for packed formats. vLLM
0.26 writes the same numbers in ``AttentionSpec.unpadded_page_size_bytes`` / ``real_page_size_bytes`` and
``TQFullAttentionSpec``. :func:`slot_bytes` gives the bytes one token occupies for one KV head of one layer
(for MLA: the one latent slot of a layer, ``head_size_v = 0``):

==========================  ================================================================  =====================
format                      bytes per token and KV head                                       source (vLLM 0.32)
==========================  ================================================================  =====================
auto                        ``(hk + hv) * model dtype bytes``                                 ``AttentionSpec``
float16, bfloat16           ``(hk + hv) * 2``                                                 ``STR_DTYPE_TO_TORCH_DTYPE``
fp8, fp8_e4m3, fp8_e5m2     ``(hk + hv) * 1`` (per-tensor scales: one scalar per layer)       uint8 storage
fp8_inc                     ``(hk + hv) * 1``                                                 ``torch.float8_e4m3fn``
int8/fp8_per_token_head     ``(hk + hv) * 1 + 2 * 4`` (one fp32 scale per token, head, K/V)   ``TritonAttentionBackend.customize_spec``
int4_per_token_head         ``hk // 2 + hv // 2 + 2 * 4`` (two int4 per byte)                 same
turboquant_k8v4             ``even(hk + ceil(hk*4/8) + 4)`` (fp8 K; 4-bit V + fp16 scale, zero) ``TurboQuantConfig.slot_size_aligned``
turboquant_4bit_nc          ``even(ceil(hk*4/8) + 2 + ceil(hk*4/8) + 4)`` (K norm fp16)       same
turboquant_k3v4_nc          ``even(ceil(hk*3/8) + 2 + ceil(hk*4/8) + 4)``                     same
turboquant_3bit_nc          ``even(ceil(hk*3/8) + 2 + ceil(hk*3/8) + 4)``                     same
ultraquant_4bit             ``hk/2 + hk/32 + hk/2 + hk/32`` (fp4 codes + one E8M0 per 32)     ``ultraquant/format.slot_size``
nvfp4, nvfp4_4over6         ``(hk/2 + hk/16) + (hv/2 + hv/16)`` (fp4 + one fp8 scale per 16)  ``FlashInferBackend.customize_spec``
fp8_ds_mla (MLA only)       656 per token and layer                                           ``MLAAttention.get_kv_cache_spec``
nvfp4_ds_mla (MLA only)     352 per token and layer                                           same
==========================  ================================================================  =====================

TurboQuant and UltraQuant keep the first two and the last two decoder layers in the model dtype (vLLM
``TurboQuantConfig.get_boundary_skip_layers``, applied in ``EngineArgs.create_engine_config`` for every
``turboquant_*`` in 0.26 and 0.32 and for ``ultraquant_4bit`` in 0.32): those layers cost ``auto`` bytes
(:func:`skipped_layers`). ``kv_cache_dtype_skip_layers`` adds layers (indices, or ``"sliding_window"`` for every
sliding layer) that are stored as ``auto`` too (vLLM ``Attention.__init__``). A model whose layers then differ in
page size is still one KV-cache group when all its layers are full attention (``UniformTypeKVCacheSpecs``: a
block's bytes are the sum of its layers' pages).

Block sizes: the page is linear in ``block_size`` for every format here, so tokens per GiB do not depend on it;
a backend may pin one (TurboQuant runs with 32 on the H200 under 0.26, vllm-notes section 10; UltraQuant's backend
prefers 64, ``UltraQuantAttentionBackend.get_preferred_block_size``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from fp8lab.errors import SpecError

Rule = Literal["model", "dense", "per_token_head", "int4_per_token_head", "turboquant", "ultraquant", "nvfp4", "ds_mla"]


@dataclass(frozen=True)
class KVFormat:
    """What the calculator knows of one ``kv_cache_dtype``: the byte ``rule`` of :func:`slot_bytes`, its ``elem_bytes``
    (dense formats; ``None`` for packed ones), the TurboQuant bits (``k_bits``, ``v_bits``; 8-bit K is fp8), whether
    it is for MLA models only, whether vLLM keeps the boundary layers in the model dtype, and where its scales come
    from (``scales``)."""

    name: str
    rule: Rule
    elem_bytes: int | None = None
    k_bits: int | None = None
    v_bits: int | None = None
    mla_only: bool = False
    boundary_skip: bool = False
    fixed_bytes: int | None = None
    scales: str = "none"


_PTH = "per token and head (fp32, computed when written)"
FORMATS: Mapping[str, KVFormat] = MappingProxyType(
    {
        f.name: f
        for f in (
            KVFormat("auto", "model"),
            KVFormat("float16", "dense", 2),
            KVFormat("bfloat16", "dense", 2),
            KVFormat("fp8", "dense", 1, scales="per tensor (checkpoint, else 1.0)"),
            KVFormat("fp8_e4m3", "dense", 1, scales="per tensor (checkpoint, else 1.0)"),
            KVFormat("fp8_e5m2", "dense", 1, scales="per tensor (checkpoint, else 1.0)"),
            KVFormat("fp8_inc", "dense", 1, scales="per tensor (Intel Neural Compressor)"),
            KVFormat("int8_per_token_head", "per_token_head", 1, scales=_PTH),
            KVFormat("fp8_per_token_head", "per_token_head", 1, scales=_PTH),
            KVFormat("int4_per_token_head", "int4_per_token_head", scales=_PTH + ", zero point, Hadamard"),
            KVFormat("turboquant_k8v4", "turboquant", k_bits=8, v_bits=4, boundary_skip=True, scales="V per token"),
            KVFormat("turboquant_4bit_nc", "turboquant", k_bits=4, v_bits=4, boundary_skip=True, scales="per token"),
            KVFormat("turboquant_k3v4_nc", "turboquant", k_bits=3, v_bits=4, boundary_skip=True, scales="per token"),
            KVFormat("turboquant_3bit_nc", "turboquant", k_bits=3, v_bits=3, boundary_skip=True, scales="per token"),
            KVFormat("ultraquant_4bit", "ultraquant", boundary_skip=True, scales="per 32 values (E8M0)"),
            KVFormat("nvfp4", "nvfp4", scales="per 16 values (fp8)"),
            KVFormat("nvfp4_4over6", "nvfp4", scales="per 16 values (fp8)"),
            KVFormat("fp8_ds_mla", "ds_mla", mla_only=True, fixed_bytes=656, scales="per tile (in the 656 B slot)"),
            KVFormat("nvfp4_ds_mla", "ds_mla", mla_only=True, fixed_bytes=352, scales="per tile (in the 352 B slot)"),
        )
    }
)
"""Every format the calculator has a byte rule for (read from vLLM 0.26 and 0.32 source; module docstring)."""

ULTRAQUANT_GROUP = 32  # vLLM 0.32 v1/attention/ops/ultraquant/format.py GROUP_SIZE
BOUNDARY_LAYERS = 2  # TurboQuantConfig.get_boundary_skip_layers(n=2)


def known_format(kv_dtype: str, spec: str = "kvmath", field: str = "kv_dtype") -> KVFormat:
    """The :class:`KVFormat` of ``kv_dtype``, or a :class:`SpecError` "unknown format" naming the formats the calculator
    knows (it never guesses a byte count)."""
    fmt = FORMATS.get(kv_dtype) if isinstance(kv_dtype, str) else None
    if fmt is None:
        raise SpecError(
            spec, field, kv_dtype, "unknown format: the KV calculator knows " + " | ".join(FORMATS) + " (no byte rule)"
        )
    return fmt


def _even(n: int) -> int:
    return n + (n % 2)


def slot_bytes(kv_dtype: str, head_size: int, head_size_v: int, model_elem_bytes: int | None) -> int:
    """Bytes one token occupies for one KV head of one layer in ``kv_dtype`` (for MLA: the layer's one latent slot,
    ``head_size`` = ``kv_lora_rank + qk_rope_head_dim``, ``head_size_v`` = 0). ``model_elem_bytes`` is the model
    dtype's width, needed for ``auto``. The rules and their sources are in the module docstring."""
    fmt = known_format(kv_dtype)
    hk, hv = head_size, head_size_v
    mla = hv == 0
    if fmt.rule == "model":
        if model_elem_bytes is None:
            raise SpecError(
                "config",
                "torch_dtype",
                None,
                "a model dtype (bfloat16 | float16 | float32) for kv_dtype='auto'; or pass an explicit kv_dtype",
            )
        return (hk + hv) * model_elem_bytes
    if fmt.rule == "dense":
        return (hk + hv) * fmt.elem_bytes  # type: ignore[operator]
    if fmt.rule == "per_token_head":  # data + one fp32 scale per K/V side (MLA: a scale pair after the latent)
        return (hk + hv) * 1 + 2 * 4
    if fmt.rule == "int4_per_token_head":
        return hk // 2 + hv // 2 + 2 * 4
    if fmt.rule == "ds_mla":
        if not mla:
            raise SpecError("kvmath", "kv_dtype", kv_dtype, "a format for this model: it is for MLA (DeepSeek) only")
        return fmt.fixed_bytes  # type: ignore[return-value]
    if mla:
        raise SpecError("kvmath", "kv_dtype", kv_dtype, "unknown format for an MLA model (no byte rule for its latent)")
    if fmt.rule == "turboquant":
        kb, vb = fmt.k_bits, fmt.v_bits
        key = hk if kb == 8 else math.ceil(hk * kb / 8) + 2  # type: ignore[operator]
        val = math.ceil(hk * vb / 8) + 4  # type: ignore[operator]
        return _even(key + val)
    if fmt.rule == "ultraquant":
        if hk % ULTRAQUANT_GROUP:
            raise SpecError("kvmath", "head_dim", hk, f"a multiple of {ULTRAQUANT_GROUP} for ultraquant_4bit")
        return 2 * (hk // 2 + hk // ULTRAQUANT_GROUP)
    if fmt.rule == "nvfp4":
        return (hk // 2 + hk // 16) + (hv // 2 + hv // 16)
    raise AssertionError(fmt.rule)  # pragma: no cover - every rule is handled above


def skipped_layers(
    kv_dtype: str, num_layers: int, layer_kinds: Iterable[str] = (), skip_layers: Iterable[str] = ()
) -> frozenset[int]:
    """Layers vLLM stores as ``auto`` under ``kv_dtype``: the boundary layers TurboQuant/UltraQuant keep
    (``min(2, L // 2)`` first and last, ``TurboQuantConfig.get_boundary_skip_layers``), plus ``skip_layers``
    (``kv_cache_dtype_skip_layers``: layer indices as strings, or ``"sliding_window"`` for every sliding layer)."""
    kinds = tuple(layer_kinds)
    out: set[int] = set()
    if known_format(kv_dtype).boundary_skip:
        n = min(BOUNDARY_LAYERS, num_layers // 2)
        out |= set(range(n)) | set(range(num_layers - n, num_layers))
    for s in skip_layers:
        s = str(s)
        if s == "sliding_window":
            out |= {i for i, k in enumerate(kinds) if k == "sliding"}
        elif s.isdigit() and int(s) < num_layers:
            out.add(int(s))
        else:
            raise SpecError(
                "kvmath", "skip_layers", s, f"layer indices in [0, {num_layers - 1}] (as strings) or 'sliding_window'"
            )
    return frozenset(out)


# --------------------------------------------------------------------------------------------------
# Allowed names: the installed vLLM's
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def installed_choices() -> dict[str, Any] | None:
    """The installed vLLM's answer (:func:`fp8lab.vllm_options.cached_engine_choices`: ``version``, ``platform``,
    ``kv_cache_dtypes``, per backend ``kv_cache_dtypes`` / ``block_sizes`` / ``head_sizes``), once per process;
    None where no vLLM is installed or it cannot answer."""
    from fp8lab.vllm_options import cached_engine_choices

    return cached_engine_choices()


def allowed_kv_dtypes(
    choices: dict[str, Any] | None | Literal["installed"] = "installed",
) -> tuple[tuple[str, ...], str]:
    """The ``kv_cache_dtype`` names a spec may use and where they come from: the installed vLLM's (``choices``, by
    default asked of it), else the formats the calculator knows."""
    info = installed_choices() if choices == "installed" else choices
    if isinstance(info, dict) and info.get("kv_cache_dtypes"):
        return tuple(info["kv_cache_dtypes"]), f"the installed vLLM {info.get('version', '?')} accepts"
    return tuple(FORMATS), "unknown format: no vLLM installed to ask; the KV calculator knows"


def check_kv_dtype(
    obj: Any, name: str, value: Any, choices: dict[str, Any] | None | Literal["installed"] = "installed"
) -> None:
    """``value`` must be a ``kv_cache_dtype`` of the installed vLLM (:func:`allowed_kv_dtypes`); a :class:`SpecError`
    names the spec, the field, the value and every allowed value otherwise."""
    allowed, where = allowed_kv_dtypes(choices)
    if not isinstance(value, str) or value not in allowed:
        spec = obj if isinstance(obj, str) else type(obj).__name__
        raise SpecError(spec, name, value, f"{where}: " + " | ".join(allowed))


__all__ = [
    "FORMATS",
    "KVFormat",
    "allowed_kv_dtypes",
    "check_kv_dtype",
    "installed_choices",
    "known_format",
    "skipped_layers",
    "slot_bytes",
]
