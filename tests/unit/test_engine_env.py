"""vLLM's process layout for fp8lab's engine workers (fp8lab.devices.engine_env)."""

from __future__ import annotations

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
    assert devices.engine_core_layout(async_engine=True) == "process"  # an AsyncLLM always spawns its core


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
