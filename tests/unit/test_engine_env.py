"""vLLM's process layout for fp8lab's engine workers (fp8lab.devices.engine_env)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from fp8lab import devices


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
        from fp8lab.engine import _CallersEnvironment, worker_context
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
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert out.read_text().strip() == "at-start"
    if devices.cpu_layout():
        assert res.stdout.split()[-1] == "spawn"


def test_the_memory_probe_finds_the_members_of_a_process_group():
    """A worker leading its process group counts an engine core that joined the group from elsewhere (an AsyncLLM's
    core forked from the forkserver is not the worker's child): ``_group_members`` lists the group, nothing else."""
    child = subprocess.Popen(["sleep", "30"], process_group=0)  # a group of its own
    try:
        assert devices._group_members(child.pid) == [child.pid]
        assert child.pid not in devices._group_members(os.getpgrp())
    finally:
        child.kill()
        child.wait()


def test_a_killed_group_is_awaited_until_no_member_lives():
    """``_kill_group`` returns once every process of the group is gone (a zombie counts as gone): a member that is
    not the caller's child (an AsyncLLM's core forked from the forkserver) is waited for, not left exiting."""
    from fp8lab.engine import _alive, _kill_group

    leader = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & sleep 60"], process_group=0)
    try:
        time.sleep(0.3)
        members = devices._group_members(leader.pid)
        assert leader.pid in members and len(members) >= 2  # the shell and its two sleeps
        _kill_group(leader.pid)
        assert not any(_alive(p) for p in members)  # all killed; the leader a zombie until reaped below
        assert _alive(os.getpid()) and not _alive(leader.pid)
    finally:
        leader.kill()
        leader.wait()
