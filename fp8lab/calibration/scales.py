"""Scale sets: :class:`ScaleSet` (k/v scales ``[layers, kv_heads]``), made from captured amax per tensor or per KV head
(:func:`scales_from_amax`, :func:`scale_set_from_capture`, :func:`build_scale_sets`), vLLM's dynamic formula and the
default 1.0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fp8lab.calibration.capture import AmaxCapture
from fp8lab.calibration.spec import VLLM_DYNAMIC_DIVISORS, Strategy, Tensor
from fp8lab.specs import (
    SpecError,
    check_choice,
)


@dataclass(frozen=True, eq=False)
class ScaleSet:
    """One set of FP8 KV scales: ``k``/``v`` float64 ``[layers, kv_heads]`` (a ``tensor`` strategy set
    repeats its one value per layer over the heads). ``name``: where it comes from (``prompt32``,
    ``large``, ``default``, ``dynamic_emul``, ``subset-<n>-<draw>``); ``n_samples``/``n_tokens``: the
    calibration data; ``seconds``: calibration time (capture + amax, None when not calibrated)."""

    name: str
    format: str
    strategy: str
    k: np.ndarray
    v: np.ndarray
    n_samples: int = 0
    n_tokens: int = 0
    seconds: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        from fp8lab.fp8formats import get_format

        check_choice(self, "strategy", self.strategy, Strategy)
        object.__setattr__(self, "format", get_format(self.format).name)
        k, v = np.asarray(self.k, dtype=np.float64), np.asarray(self.v, dtype=np.float64)
        if k.ndim != 2 or k.shape != v.shape:
            raise SpecError(self, "k/v", (k.shape, v.shape), "two arrays of the same shape [layers, kv_heads]")
        if not (np.isfinite(k).all() and np.isfinite(v).all() and (k > 0).all() and (v > 0).all()):
            raise SpecError(self, "k/v", "non-positive or non-finite values", "positive finite scales")
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "v", v)

    @property
    def label(self) -> str:
        return f"{self.name}.{self.format}.{self.strategy}"

    @property
    def num_layers(self) -> int:
        return int(self.k.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k.shape[1])

    def tensor(self, name: str) -> np.ndarray:
        check_choice(self, "tensor", name, Tensor)
        return self.k if name == "K" else self.v

    def reduced(self) -> ScaleSet:
        """One scale per layer, the max over heads: what vLLM's ``_k_scale_float`` holds and the CPU backend
        uses for ``attn_head`` scales (compressed_tensors.py 32:1261-1265; vllm-notes section 4)."""
        k = np.repeat(self.k.max(axis=1, keepdims=True), self.num_kv_heads, axis=1)
        v = np.repeat(self.v.max(axis=1, keepdims=True), self.num_kv_heads, axis=1)
        return ScaleSet(
            self.name, self.format, "tensor", k, v, self.n_samples, self.n_tokens, self.seconds, self.source
        )

    def scaled(self, factor: float, name: str | None = None) -> ScaleSet:
        """Every scale times ``factor`` (a deliberately wrong set for tests: ``factor=0.01`` clips)."""
        return ScaleSet(
            name or f"{self.name}x{factor:g}",
            self.format,
            self.strategy,
            self.k * factor,
            self.v * factor,
            self.n_samples,
            self.n_tokens,
            self.seconds,
            self.source,
        )

    def to_frame(self) -> pd.DataFrame:
        """Long format: ``set, name, format, strategy, tensor, layer, head, scale``."""
        rows = []
        for t in ("K", "V"):
            a = self.tensor(t)
            for layer in range(a.shape[0]):
                for head in range(a.shape[1]):
                    rows.append(
                        {
                            "set": self.label,
                            "name": self.name,
                            "format": self.format,
                            "strategy": self.strategy,
                            "tensor": t,
                            "layer": layer,
                            "head": head,
                            "scale": float(a[layer, head]),
                        }
                    )
        return pd.DataFrame(rows)


def scales_from_amax(
    amax: np.ndarray, fmt: str = "e4m3", strategy: str = "attn_head", divisor: float | None = None
) -> np.ndarray:
    """Scales ``[layers, kv_heads]`` from amax ``[layers, kv_heads]``: ``amax / divisor`` with
    ``divisor = fmt.max`` by default (448 for E4M3, 57344 for E5M2), so the largest calibrated value maps
    to the format's largest; ``tensor`` takes the max over heads first (one scale per layer, repeated
    over the heads). An amax of 0 (a head that is all zeros) gets vLLM's default scale 1.0."""
    from fp8lab.fp8formats import get_format

    check_choice("scales_from_amax", "strategy", strategy, Strategy)
    a = np.asarray(amax, dtype=np.float64)
    if a.ndim != 2:
        raise SpecError("scales_from_amax", "amax", a.shape, "an array [layers, kv_heads]")
    if strategy == "tensor":
        a = np.repeat(a.max(axis=1, keepdims=True), a.shape[1], axis=1)
    d = float(divisor) if divisor is not None else get_format(fmt).max
    return np.where(a > 0, a / d, 1.0)


def scale_set_from_capture(
    name: str,
    cap: AmaxCapture,
    fmt: str,
    strategy: str,
    idx: Sequence[int] | None = None,
    divisors: Mapping[str, float] | None = None,
    source: str = "",
) -> ScaleSet:
    """A scale set from (a subset ``idx`` of) a capture: :func:`scales_from_amax` of K and V.
    ``divisors``: ``{"K": dk, "V": dv}`` instead of the format's max (vLLM's dynamic formula)."""
    k, v = cap.amax(idx)
    dk, dv = (divisors or {}).get("K"), (divisors or {}).get("V")
    sub = cap if idx is None else cap.subset(idx)
    return ScaleSet(
        name,
        fmt,
        strategy,
        scales_from_amax(k, fmt, strategy, dk),
        scales_from_amax(v, fmt, strategy, dv),
        sub.n_samples,
        sub.n_tokens,
        cap.capture_s if idx is None else None,
        source,
    )


def default_scale_set(num_layers: int, num_kv_heads: int, fmt: str = "e4m3") -> ScaleSet:
    """(d): vLLM's scale without a calibrated checkpoint, 1.0 everywhere (attention.py 32:133-153)."""
    one = np.ones((num_layers, num_kv_heads))
    return ScaleSet("default", fmt, "tensor", one, one, source="vLLM default 1.0")


def build_scale_sets(
    captures: Mapping[str, AmaxCapture],
    formats: Sequence[str],
    strategies: Sequence[str],
    dynamic_from: str | None = None,
) -> list[ScaleSet]:
    """Every named capture x format x strategy, then (c) vLLM's dynamic formula emulated on the capture
    ``dynamic_from`` (per tensor, amax/200 for K and amax/100 for V, in each format's run) and (d) the
    default 1.0, per format."""
    from fp8lab.fp8formats import get_format

    out = []
    for fmt in formats:
        get_format(fmt)
        for name, cap in captures.items():
            for st in strategies:
                out.append(
                    scale_set_from_capture(name, cap, fmt, st, source=f"{cap.n_samples} seq, {cap.n_tokens} tokens")
                )
        if dynamic_from is not None:
            cap = captures[dynamic_from]
            out.append(
                scale_set_from_capture(
                    "dynamic_emul",
                    cap,
                    fmt,
                    "tensor",
                    divisors=VLLM_DYNAMIC_DIVISORS,
                    source=f"vLLM 0.26 formula (amax/200, amax/100) on {dynamic_from}",
                )
            )
        any_cap = next(iter(captures.values()))
        out.append(default_scale_set(any_cap.num_layers, any_cap.num_kv_heads, fmt))
    return out


def find_set(sets: Sequence[ScaleSet], name: str, fmt: str, strategy: str) -> ScaleSet:
    for s in sets:
        if s.name == name and s.format == fmt and s.strategy == strategy:
            return s
    raise SpecError(
        "scale sets", "name/format/strategy", (name, fmt, strategy), "one of " + ", ".join(s.label for s in sets)
    )
