"""Memory bandwidth for the roofline bound: given as a parameter, or measured once by a large copy.

The measurement runs in a freshly spawned process (vllm-notes section 5), so the caller (a notebook
kernel) never initialises CUDA and later engines get the whole GPU. GPU: a device-to-device
``Tensor.copy_`` of ``size_mib`` MiB timed with CUDA events; CPU: ``numpy.copyto`` between two
arrays. A copy reads and writes every byte, so bandwidth = ``2 x bytes / seconds`` (the STREAM "copy"
convention, McCalpin 1995). The best of ``repeats`` copies is reported: the achievable peak, which is
what a lower bound needs. 1 GB/s = 1e9 bytes/s.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Literal

from fp8lab.engine.devices import cpu_name, gpu_facts  # gpu_facts: NVML only, does not initialise CUDA
from fp8lab.specs import SpecError, check_choice, check_float, check_int

Device = Literal["auto", "cuda", "cpu"]


def _probe(device: str, size_mib: int, repeats: int) -> dict[str, Any]:
    """Runs in the spawned process: time ``repeats`` copies of ``size_mib`` MiB, return plain data."""
    import time

    nbytes = int(size_mib) * 2**20
    times: list[float] = []
    if device == "cuda":
        import torch

        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        name = torch.cuda.get_device_name(0)
    else:
        import numpy as np

        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # warm-up (page faults)
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t0)
        name = cpu_name()
    best = min(times)
    return {
        "device": device,
        "device_name": name,
        "size_mib": size_mib,
        "repeats": repeats,
        "best_s": best,
        "median_s": sorted(times)[len(times) // 2],
        "bandwidth_gbs": 2 * nbytes / best / 1e9,
        "method": "copy (read + write), best of repeats",
    }


def _has_gpu() -> bool:
    return bool(gpu_facts())


def measure_bandwidth(device: Device = "auto", size_mib: int = 1024, repeats: int = 10) -> dict[str, Any]:
    """Measure copy bandwidth once in a spawned process. ``device="auto"`` picks ``cuda`` when NVML sees a
    GPU, else ``cpu``. Returns ``device, device_name, size_mib, repeats, best_s, median_s, bandwidth_gbs``."""
    check_choice("bandwidth", "device", device, Device)
    check_int("bandwidth", "size_mib", size_mib, 1, 1 << 20)
    check_int("bandwidth", "repeats", repeats, 1, 10_000)
    if device == "auto":
        device = "cuda" if _has_gpu() else "cpu"
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_probe, device, size_mib, repeats).result()


def resolve_bandwidth(value: float | str | None, device: Device = "auto", size_mib: int = 1024) -> dict[str, Any]:
    """The bandwidth to use: a number is taken as GB/s as given (``source="parameter"``); ``None`` or
    ``"measure"`` measures it (:func:`measure_bandwidth`, ``source="measured"``)."""
    if value is None or value == "measure":
        out = measure_bandwidth(device, size_mib)
        out["source"] = "measured"
        return out
    if isinstance(value, str):
        raise SpecError("bandwidth", "value", value, "a number of GB/s, None or 'measure'")
    check_float("bandwidth", "value", value, 0.0, 1e6, lo_open=True)
    return {"bandwidth_gbs": float(value), "source": "parameter", "device": device}


__all__ = ["measure_bandwidth", "resolve_bandwidth"]
