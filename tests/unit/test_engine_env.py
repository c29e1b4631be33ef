"""vLLM's process layout for fp8lab's engine workers (fp8lab.engine.devices.engine_env)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref

import pytest

from fp8lab.engine import devices
from fp8lab.engine.worker import settle_heap


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(devices, "_nvml", lambda: None)
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", devices.DEFAULT_LAYOUT_ENV):
        monkeypatch.delenv(var, raising=False)


def test_on_a_cpu_the_engine_core_runs_in_the_worker(cpu_only, monkeypatch):
    assert devices.engine_env() == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert devices.engine_core_layout() == "process"  # vLLM's default until the worker sets it
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert devices.engine_core_layout() == "in_process"
    assert devices.engine_core_layout(async_engine=True) == "process"  # an AsyncLLM always has a core process


def test_a_users_setting_and_the_opt_out_are_kept(cpu_only, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert devices.engine_env() == {}
    assert devices.engine_core_layout() == "process"
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    monkeypatch.setenv(devices.DEFAULT_LAYOUT_ENV, "1")
    assert devices.engine_env() == {}


def test_on_a_gpu_nothing_changes(monkeypatch):
    monkeypatch.setattr(devices, "_nvml", lambda: object())  # an NVIDIA device is present
    monkeypatch.delenv(devices.DEFAULT_LAYOUT_ENV, raising=False)
    assert devices.engine_env() == {}


def test_a_forkserver_child_takes_the_environment_of_the_moment_it_starts(tmp_path):
    """vLLM sets variables around ``Process.start`` for the engine core it starts: a child forked from fp8lab's
    forkserver sees them (as a spawned child would), not the environment at ``Process(...)`` or the server's. Run in
    a fresh interpreter: a forkserver started here without vLLM preloaded would be the one this test session's
    engine workers fork from (``worker_context`` then falls back to spawn)."""
    out = tmp_path / "env.txt"
    code = textwrap.dedent(f"""
        import multiprocessing as mp, os
        from fp8lab.engine.procs import _CallersEnvironment, worker_context
        ctx = _CallersEnvironment(mp.get_context("forkserver"))
        os.environ["FP8LAB_TEST_VAR"] = "at-construction"
        proc = ctx.Process(target=os.system, args=('echo "$FP8LAB_TEST_VAR" > {out}',), name="fp8lab-env-test")
        os.environ["FP8LAB_TEST_VAR"] = "at-start"
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0 and ctx.Queue is not None  # the rest is the forkserver context's own
        print(worker_context().get_start_method())  # a forkserver without vLLM runs here: workers spawn
    """)
    env = {**os.environ, "FP8LAB_VLLM_PROCESSES": "", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("FP8LAB_FORKSERVER", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert out.read_text().strip() == "at-start"
    if devices.cpu_layout():
        assert res.stdout.split()[-1] == "spawn"


def test_a_forkserver_child_freezes_what_it_inherited(tmp_path):
    """An engine start calls ``gc.collect`` five times; in a forkserver child every object inherited from the server
    (vLLM imported) is frozen first, out of the collector's reach, so those calls stay short. The child sees a
    non-empty permanent generation; a plain forked child (nothing frozen) sees none. In a fresh interpreter, as
    above."""
    out = tmp_path / "frozen.txt"
    code = textwrap.dedent(f"""
        import gc, multiprocessing as mp
        from fp8lab.engine.procs import _CallersEnvironment
        write = "import gc; open({str(out)!r}, 'a').write(str(gc.get_freeze_count()) + chr(10))"
        for ctx in (_CallersEnvironment(mp.get_context("forkserver")), mp.get_context("fork")):
            proc = ctx.Process(target=exec, args=(write,), name="fp8lab-freeze-test")
            proc.start()
            proc.join(60)
            assert proc.exitcode == 0
        assert gc.get_freeze_count() == 0  # the starting process itself is left as it was
    """)
    env = {**os.environ, "FP8LAB_VLLM_PROCESSES": "", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("FP8LAB_FORKSERVER", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    in_forkserver_child, in_plain_fork = (int(n) for n in out.read_text().split())
    assert in_forkserver_child > 1000 and in_plain_fork == 0


class _Engine:
    """An engine's objects as the collector sees them: a reference cycle, freed only by ``gc.collect``."""

    def __init__(self) -> None:
        self.me = self


@pytest.mark.parametrize("cpu", [True, False])
def test_settling_the_heap_collects_the_last_set_and_freezes_only_what_lives(monkeypatch, cpu):
    """``settle_heap`` between engine sets: a dropped engine is collected then, not frozen; an engine made after it
    is collected when dropped. On a CPU what is still referenced is frozen and never collected, which is why the
    workers drop every reference to the last set (a loop variable included) first; on a GPU nothing is frozen."""
    monkeypatch.setattr(devices, "cpu_layout", lambda: cpu)
    gc.disable()  # no automatic collection between the steps
    try:
        dropped, kept = _Engine(), _Engine()
        was_dropped, was_kept = weakref.ref(dropped), weakref.ref(kept)
        del dropped
        settle_heap()
        assert was_dropped() is None
        del kept
        gc.collect()
        assert (was_kept() is not None) is cpu
        later = _Engine()
        was_later = weakref.ref(later)
        del later
        gc.collect()
        assert was_later() is None
    finally:
        gc.unfreeze()
        gc.enable()


def test_the_memory_probe_finds_the_members_of_a_process_group():
    """A worker leading its process group counts an engine core that joined the group from elsewhere (an AsyncLLM's
    core forked from the forkserver is not the worker's child): ``group_members`` lists the group, nothing else."""
    child = subprocess.Popen(["sleep", "30"], process_group=0)  # a group of its own
    try:
        assert devices.group_members(child.pid) == [child.pid]
        assert child.pid not in devices.group_members(os.getpgrp())
    finally:
        child.kill()
        child.wait()


def test_a_killed_group_is_awaited_until_no_member_lives():
    """``kill_group`` returns once every process of the group is gone (a zombie counts as gone): a member that is
    not the caller's child (an AsyncLLM's core forked from the forkserver) is waited for, not left exiting."""
    from fp8lab.engine.procs import alive, kill_group

    leader = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & sleep 60"], process_group=0)
    try:
        time.sleep(0.3)
        members = devices.group_members(leader.pid)
        assert leader.pid in members and len(members) >= 2  # the shell and its two sleeps
        kill_group(leader.pid)
        assert not any(alive(p) for p in members)  # all killed; the leader a zombie until reaped below
        assert alive(os.getpid()) and not alive(leader.pid)
    finally:
        leader.kill()
        leader.wait()


# A runner (``fp8lab run``, the notebook tier) shares its forkserver with the notebook kernels it starts. Here the
# runner and the kernel are two fresh interpreters; the server preloads one light module instead of vLLM (the
# mechanism is the same, and a unit test must not wait for vLLM's import).
_RUNNER = """
import os, subprocess, sys
import fp8lab.engine.procs as e
e.FORKSERVER_PRELOAD = ("fp8lab.engine.worker",)
address = e.share_forkserver()
from multiprocessing import forkserver
print(forkserver._forkserver._forkserver_pid, flush=True)
kernel = subprocess.run([sys.executable, "-c", sys.argv[1]], env=os.environ, timeout=120)
print("kernel exit", kernel.returncode, flush=True)
exec(sys.argv[2])  # what the runner does next, its forkserver still running
"""

_KERNEL = """
import os, json
import fp8lab.engine.procs as e
e.FORKSERVER_PRELOAD = ("fp8lab.engine.worker",)
ctx = e.worker_context()
os.environ["FP8LAB_TEST_VAR"] = "the kernel's"
proc = ctx.Process(target=exec, args=(CHILD,), name="fp8lab-shared-test")
proc.start()
{after_start}
"""

_REPORT = """
import json, os
from fp8lab.engine.procs import caller_pid
json.dump({"ppid": os.getppid(), "caller": caller_pid(), "var": os.environ.get("FP8LAB_TEST_VAR")}, open(OUT, "w"))
"""


def _run_shared(
    tmp_path, child: str, after_start: str, runner_then: str = ""
) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "child.json"
    kernel = f"CHILD = {child!r}.replace('OUT', {repr(str(out))!r})\n" + _KERNEL.format(after_start=after_start)
    env = {**os.environ, "FP8LAB_VLLM_PROCESSES": "", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("FP8LAB_FORKSERVER", None)
    res = subprocess.run(
        [sys.executable, "-c", _RUNNER, kernel, runner_then],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )
    return res, (json.loads(out.read_text()) if out.exists() else {})


@pytest.mark.skipif(not devices.cpu_layout(), reason="workers fork from a forkserver on CPU hosts only")
def test_a_kernel_forks_its_workers_from_the_runners_forkserver(tmp_path):
    after = """
proc.join(60)
from multiprocessing import forkserver
print(json.dumps({"kernel": os.getpid(), "exit": proc.exitcode, "own_server": forkserver._forkserver._forkserver_pid}))
"""
    res, child = _run_shared(tmp_path, _REPORT, after)
    assert res.returncode == 0, res.stderr[-3000:]
    server = int(res.stdout.split()[0])
    kernel = json.loads(res.stdout.strip().splitlines()[-2])
    assert res.stdout.strip().endswith("kernel exit 0")
    assert kernel["exit"] == 0 and kernel["own_server"] is None  # the kernel started no forkserver of its own
    assert child == {"ppid": server, "caller": kernel["kernel"], "var": "the kernel's"}


@pytest.mark.skipif(not devices.cpu_layout(), reason="workers fork from a forkserver on CPU hosts only")
def test_an_engine_worker_dies_with_its_caller_not_with_the_shared_forkserver(tmp_path):
    """The kernel dies (SIGKILL) while its worker runs: the worker, a child of the runner's forkserver that lives on,
    kills its group once its caller is gone, as a spawned worker does when its parent dies."""
    child = """
import os, time, json
from fp8lab.engine.procs import caller_pid
from fp8lab.engine.worker import _die_with_parent
os.setpgrp()
_die_with_parent(caller_pid())
json.dump({"pid": os.getpid(), "caller": caller_pid()}, open(OUT, "w"))
time.sleep(120)
"""
    after = """
import signal, time
for _ in range(600):
    if os.path.exists(OUTFILE):
        break
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""
    out = tmp_path / "child.json"
    watch = f"""
import json, time
pid = json.load(open({str(out)!r}))["pid"]
def exists():
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
deadline = time.monotonic() + 30
while exists() and time.monotonic() < deadline:
    time.sleep(0.1)
print("worker", "alive" if exists() else "gone", "server", "alive" if forkserver._forkserver._forkserver_pid else "-")
"""
    res, info = _run_shared(tmp_path, child, after.replace("OUTFILE", repr(str(out))), watch)
    assert res.returncode == 0 and f"kernel exit {-signal.SIGKILL}" in res.stdout, res.stderr[-3000:]
    assert res.stdout.strip().endswith("worker gone server alive"), res.stdout
    assert info["caller"] != int(res.stdout.split()[0])  # it watched the kernel, not the forkserver, its parent


def test_a_stale_or_foreign_address_is_not_attached(monkeypatch):
    """``$FP8LAB_FORKSERVER`` naming a process that is gone, or one that is not a forkserver, attaches nothing (the
    kernel then starts its own server)."""
    from fp8lab.engine.procs import FORKSERVER_ENV, _attach_shared

    class Handle:
        _forkserver_address = None

    for value in ("", "junk", f"{2**22 + 12345}:/tmp/none", f"{os.getpid()}:/tmp"):
        monkeypatch.setenv(FORKSERVER_ENV, value)
        h = Handle()
        assert _attach_shared(h) is False and h._forkserver_address is None, value
