"""The results store under faults that need no engine: a half-written run (what a kill mid-write leaves) is never
read as a run, a run is replaced whole, and the per-run lock excludes a second writer."""

from __future__ import annotations

import fcntl
import json
import shutil

import pandas as pd
import pytest

from fp8lab.capacity.records import run_dirs
from fp8lab.engine.result import EngineResult
from fp8lab.engine.results import _final, collect, phase_table, run_lock, save

pytestmark = pytest.mark.reliability


def _result(status: str = "ok", tokens: int = 5, vllm: str = "x") -> EngineResult:
    return EngineResult(
        status=status,
        error=None if status == "ok" else "boom",
        engine={"kv_cache_dtype": "auto", "num_blocks": 10},
        records=pd.DataFrame({"phase": ["main"], "output_tokens": [tokens]}),
        samples=pd.DataFrame(),
        phases={"main": {"wall_s": 1.0, "requests": 1, "prompt_tokens": 3, "output_tokens": tokens}},
        provenance={"vllm": vllm},
    )


DESC = {"engine": {"model": "m", "kv_cache_dtype": "auto"}}


def test_half_written_runs_are_never_read_as_runs(tmp_path):
    """What a process killed inside ``save`` or mid-run leaves: hidden ``.<id>.tmp-<pid>`` / ``.<id>.work-<pid>``
    folders, even ones that already hold ``engine.json``. No reader of the store takes them for runs."""
    save(_result(), tmp_path / "study" / "good", DESC)
    for partial in (".bad.tmp-123", ".bad.work-123"):
        shutil.copytree(tmp_path / "study" / "good", tmp_path / "study" / partial)
    assert list(collect("study", tmp_path).run_id) == ["good"]
    assert set(phase_table("study", tmp_path).run_id) == {"good"}
    assert [d.name for d in run_dirs(tmp_path, tmp_path / "scratch")] == ["good"]
    assert not _final(tmp_path / "study" / "bad")


def test_a_run_is_replaced_whole(tmp_path):
    rd = tmp_path / "study" / "r1"
    save(_result("error", tokens=2), rd, DESC)
    (rd / "stray.txt").write_text("from the earlier attempt")
    save(_result("ok", tokens=7), rd, DESC)
    assert json.loads((rd / "engine.json").read_text())["status"] == "ok"
    assert pd.read_parquet(rd / "records.parquet").output_tokens.tolist() == [7]
    assert not (rd / "stray.txt").exists()  # nothing of the earlier attempt mixed in
    assert sorted(p.name for p in (tmp_path / "study").iterdir()) == ["r1"]  # no temporary folders left


def test_run_lock_excludes_a_second_writer(tmp_path):
    rd = tmp_path / "study" / "r1"
    with run_lock(rd):
        with open(rd.with_name(".r1.lock"), "a+") as other:  # another open file: another writer
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(rd.with_name(".r1.lock"), "a+") as other:  # released on exit
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_reuse_loads_a_run_of_older_engine_code_only_when_this_vllm_measured_it(tmp_path, monkeypatch, tiny_model):
    """``FP8LAB_REUSE_STORED`` (a GPU host re-measuring one part of a study): ``run_cached`` loads a finished run of the
    same spec and phases stored under other engine code when its provenance names the vLLM installed here, and
    starts nothing; a run another vLLM measured, or one of other phases, is not reused."""
    from fp8lab.engine import devices, results
    from fp8lab.specs import EngineSpec, Request

    spec = EngineSpec(model=tiny_model, kv_cache_dtype="auto", kv_cache_gib=0.01)
    phases = [Request(prompt_token_ids=(1, 2, 3), max_tokens=4)]
    desc = results.run_descriptor(spec, results._as_phases(phases), "llm", 0.25)
    old = {**desc, "engine_code": "000000000000"}  # the same run measured by an earlier fp8lab
    here = devices.installed_version("vllm")
    for name, vllm, d in (("same-vllm", here, old), ("other-vllm", "0.0.1", {**old, "torch": "x"})):
        save(_result(tokens=9 if vllm == here else 1, vllm=vllm), tmp_path / "s" / name, d)

    def no_engine(*a, **k):
        raise AssertionError("an engine was started")

    monkeypatch.setattr(results, "run_engine", no_engine)
    monkeypatch.setenv("FP8LAB_REUSE_STORED", "1")
    res = results.run_cached(spec, phases, study="s", root=tmp_path)
    assert res.run_dir.name == "same-vllm" and res.records.output_tokens.tolist() == [9]
    (tmp_path / "s" / "same-vllm" / "provenance.json").write_text(json.dumps({"vllm": "0.0.1"}))
    rd = results.run_dir_for("s", desc, tmp_path)
    assert results.reusable(rd, desc) is None  # measured by another vLLM: measured again
    other = results.run_descriptor(
        spec, results._as_phases([Request(prompt_token_ids=(7,), max_tokens=4)]), "llm", 0.25
    )
    assert results.reusable(results.run_dir_for("s", other, tmp_path), other) is None


def test_the_same_spec_stored_twice_loads_the_run_measured_first(tmp_path):
    """Study 02 re-measured Study 03's auto and fp8 engines (same spec and phases, newer engine code) into the same
    store: a re-render must load the run measured first, whatever the folders' names, so a run stored later never
    changes which run an earlier page shows (before, the folder name decided: Study 03's page re-rendered with Study
    02's auto engines)."""
    from fp8lab.engine import results

    old = {**DESC, "engine_code": "000000000000"}
    for name, date in (("0-later", "2026-12-04T14:05:32+00:00"), ("f-first", "2026-12-03T09:55:16+00:00")):
        res = _result(tokens=len(name))
        res.provenance["date_utc"] = date
        save(res, tmp_path / "s" / name, old)
    save(_result(), tmp_path / "s" / "0-undated", old)  # no date: after every dated run
    want = {**DESC, "engine_code": "111111111111"}
    assert results.stored_elsewhere(tmp_path / "s" / "new", want, done=_final).name == "f-first"
    assert [d.name for d in results._alike(tmp_path / "s" / "new", want, results.VERSION_KEYS)] == [
        "f-first",
        "0-later",
        "0-undated",
    ]
