"""fp8lab.vllm_options' cache of what the installed vLLM offers: one file per question, vLLM install and version of
the asking code; an answer found there is returned without importing vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fp8lab import vllm_options as vo


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_CACHE", str(tmp_path))
    return tmp_path


def test_one_file_per_question_under_fp8lab_cache(cache_root):
    options, choices = vo._cache_file("options"), vo._cache_file("choices")
    assert options.parent == choices.parent == cache_root
    assert options.name.startswith("vllm-options-") and choices.name.startswith("vllm-choices-")
    assert options.name.removeprefix("vllm-options-") == choices.name.removeprefix("vllm-choices-")  # one install key


def test_the_key_changes_with_the_asking_code(cache_root, tmp_path, monkeypatch):
    before = vo._cache_file("options")
    edited = tmp_path / "vllm_options.py"
    edited.write_text(open(vo.__file__).read() + "\n# a changed question\n")
    monkeypatch.setattr(vo, "__file__", str(edited))
    assert vo._cache_file("options") != before


def test_a_cached_answer_is_returned_without_importing_vllm(cache_root):
    sentinel = {"version": "0.0.test", "serve_flags": ["--only-in-this-test"], "engine_args": [], "request_headers": []}
    vo._cache_file("options").write_text(json.dumps(sentinel))
    code = (
        "import json, sys; from fp8lab.vllm_options import cached_inspect_vllm; "
        "print(json.dumps([cached_inspect_vllm(), 'vllm' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(), check=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [sentinel, False]


@pytest.mark.parametrize("text", ["not json", "[1, 2]", ""])
def test_an_unreadable_cache_file_is_no_answer(cache_root, text):
    f = vo._cache_file("options")
    f.write_text(text)
    assert vo._read_cache(f) is None


def _failing_python(tmp_path, calls):
    """An interpreter stand-in that cannot answer: it counts its calls in ``calls`` and exits 3 with a message."""
    exe = tmp_path / "python-that-aborts"
    exe.write_text(f"#!/bin/sh\necho call >> {calls}\necho 'terminate called after throwing c10::Error' >&2\nexit 3\n")
    exe.chmod(0o755)
    return str(exe)


def test_an_installation_that_cannot_answer_is_asked_once(cache_root, tmp_path, monkeypatch):
    """Before this was kept, each engine start on an AVX2-only CPU re-ran the 15 s subprocess that aborted there."""
    calls = tmp_path / "calls"
    monkeypatch.setattr(sys, "executable", _failing_python(tmp_path, calls))
    assert vo.cached_engine_choices() is None
    assert vo.cached_engine_choices() is None
    assert calls.read_text().count("call") == 1
    kept = json.loads(vo._cache_file("choices").read_text())
    assert kept[vo.UNANSWERED].startswith("exit code 3: ") and "c10::Error" in kept[vo.UNANSWERED]


def test_a_kept_no_answer_is_none_and_a_kept_answer_is_the_answer(cache_root):
    f = vo._cache_file("choices")
    f.write_text(json.dumps({vo.UNANSWERED: "exit code 134: aborted"}))
    assert vo.cached_engine_choices() is None  # this machine's vLLM would answer if it were asked again
    answer = {"version": "0.0.test", "platform": "cpu", "kv_cache_dtypes": ["auto"], "backends": {}}
    f.write_text(json.dumps(answer))
    assert vo.cached_engine_choices() == answer
