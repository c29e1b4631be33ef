"""Process control for engine workers: killing a worker's process group and whatever it left behind
(:func:`kill_group`, :func:`reap_descendants`), a signal's cause (:func:`killed_cause`), and where a worker starts:
the CPU forkserver that has imported vLLM once (:func:`worker_context`, :func:`share_forkserver`,
:func:`core_from_forkserver`) and the process that started it (:func:`caller_pid`). Every study that starts
workers of its own uses these, never a copy."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from fp8lab.engine import devices
from fp8lab.engine.result import Status


def kill_group(pid: int, wait_s: float = 10.0) -> None:
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
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(alive(p) for p in devices.group_members(pid)):
        time.sleep(0.05)


def alive(pid: int) -> bool:
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


def reap_descendants(pid: int) -> None:
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


def oom_kill_count() -> int | None:
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


def killed_cause(signum: int, oom_kills_before: int | None) -> tuple[Status, str]:
    """Status and message of a worker that a signal ended before it could write its own failure."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    after = oom_kill_count()
    if signum == signal.SIGKILL and oom_kills_before is not None and after is not None and after > oom_kills_before:
        return "oom", (
            f"worker killed by {name}: the kernel's OOM killer (the memory cgroup's oom_kill count went "
            f"{oom_kills_before} -> {after}); host memory ran out"
        )
    hint = " (the kernel's OOM killer sends SIGKILL too: see dmesg)" if signum == signal.SIGKILL else ""
    return "error", f"worker killed by {name} before finishing{hint}"


#: What the CPU forkserver imports once, before it forks any engine worker: the worker modules, vLLM's engine
#: entry points and its CPU worker and model runner (the rest of an import that ``spawn`` repeats for every engine;
#: the last two, imported lazily by each engine, were about 1.4 s of a 3.6 s CPU engine start on 2 cores).
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
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
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
    here: each makes a group of its own. What the child inherited (vLLM imported) is frozen out of the garbage
    collector's reach (``gc.freeze``): an engine start calls ``gc.collect`` five times, and over vLLM's modules those
    took about 1.3 s of a 3.6 s CPU engine start on 2 cores; a short-lived child loses nothing by never collecting
    them."""
    global _CALLER
    gc.freeze()
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
