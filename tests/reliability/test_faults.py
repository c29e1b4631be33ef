"""Faults, tried with real processes and real CPU vLLM: an engine worker killed by a signal mid-run, an engine past
its timeout, the runner itself killed with SIGKILL mid-study and run again (twice at once, on one store), and a
notebook rerun that fails over a good report. After each, no engine process is left running.

Engine starts are few (each costs about 30 s on 2 cores): one for the killed worker, a fraction of one for the
timeout, two and a part for the killed and resumed study."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from fp8lab.engine.run import run_engine
from fp8lab.paths import REPO_ROOT
from fp8lab.specs import EngineSpec, Phase, Request

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

PROMPT = tuple(range(100, 164))  # 64 token ids


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``FP8LAB_RELIAB_TAG=tag`` (a study and everything it started,
    orphans included)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("FP8LAB_RELIAB_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            pass
    return out


def _wait_until(cond, timeout_s: float, what: str) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_worker_killed_mid_run_is_recorded_and_keeps_what_it_measured(tiny_model, tmp_path, engine_processes):
    """SIGKILL to the engine worker while its second phase runs: the run comes back (no exception) as ``error``
    naming the signal, with the first phase's records, and the engine's own processes are gone."""
    spec = EngineSpec(model=tiny_model, kv_cache_gib=0.25, max_model_len=2048, timeout_s=600)
    first = Phase("first", tuple(Request(prompt_token_ids=PROMPT, max_tokens=4) for _ in range(2)))
    long = Phase("long", tuple(Request(prompt_token_ids=PROMPT, max_tokens=1900) for _ in range(8)))
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(res=run_engine(spec, [first, long], work_dir=tmp_path)))
    t.start()

    def first_phase_stored() -> bool:
        try:
            return "first" in pickle.loads((tmp_path / "result.pkl").read_bytes()).get("phases", {})
        except (OSError, EOFError, pickle.UnpicklingError):
            return False

    _wait_until(lambda: first_phase_stored() or not t.is_alive(), 400, "the first phase finished")
    assert t.is_alive(), out["res"].error
    procs = engine_processes()
    worker = [p for p in procs if p.ppid() not in {q.pid for q in procs}]  # fp8lab's worker, not vLLM's processes
    assert len(worker) == 1, worker
    os.kill(worker[0].pid, signal.SIGKILL)
    t.join(120)
    res = out["res"]
    assert res.status in ("error", "oom"), (res.status, res.error)
    assert "killed by SIGKILL" in res.error, res.error
    assert list(res.records.phase) == ["first", "first"], res.records
    assert (res.records.output_tokens == 4).all()
    assert "long" not in res.phases
    assert engine_processes() == []


def test_engine_past_its_timeout_is_killed_with_all_its_children(tiny_model, tmp_path, engine_processes):
    spec = EngineSpec(model=tiny_model, kv_cache_gib=0.25, max_model_len=2048, timeout_s=6)
    # minutes of decoding: the timeout falls while the engine works, however fast it starts
    long = [Request(prompt_token_ids=PROMPT, max_tokens=1900) for _ in range(32)]
    res = run_engine(spec, long, work_dir=tmp_path)
    assert res.status == "timeout" and "timeout_s = 6" in res.error
    assert engine_processes() == []


def test_async_engine_past_its_timeout_is_killed_with_its_engine_core(tiny_model, tmp_path, engine_processes):
    """The async driver's engine core is a process of its own (on a CPU forked from fp8lab's forkserver, so not the
    worker's child: it joins the worker's process group). A timeout kills it with the worker, leaving nothing."""
    spec = EngineSpec(model=tiny_model, kv_cache_gib=0.25, max_model_len=2048, timeout_s=8)
    long = [Request(prompt_token_ids=PROMPT, max_tokens=1900) for _ in range(32)]
    seen: list = []

    def watch() -> None:  # the engine's processes while it runs: the worker and its core
        deadline = time.time() + 60
        while time.time() < deadline and len(seen) < 2:
            procs = engine_processes()
            if len(procs) >= 2:
                seen.extend(procs)
            time.sleep(0.5)

    t = threading.Thread(target=watch)
    t.start()
    res = run_engine(spec, long, driver="async", work_dir=tmp_path)
    t.join(70)
    assert res.status == "timeout" and "timeout_s = 8" in res.error
    assert len(seen) >= 2, seen  # the worker and its engine core were both seen running
    left = engine_processes()
    assert left == [], [(p.pid, p.ppid(), os.getpgid(p.pid), p.cmdline()[-3:]) for p in left]


STUDY = textwrap.dedent("""
    import json, sys
    from fp8lab.engine.results import run_cached
    from fp8lab.specs import EngineSpec, Phase, Request

    if __name__ == "__main__":  # the engine worker is spawned: it re-imports this script
        model = sys.argv[1]
        for name, seed, n_out in (("A", 0, 4), ("B", 1, 400)):  # B: long enough to be killed while it runs
            spec = EngineSpec(model=model, kv_cache_gib=0.25, max_model_len=512, seed=seed, timeout_s=600)
            reqs = (Request(prompt_token_ids=tuple(range(100, 132)), max_tokens=n_out),)
            res = run_cached(spec, [Phase("main", reqs)], study="reliab")
            print(json.dumps({"run": name, "status": res.status, "error": res.error,
                              "cached": bool(res.extra.get("cached")), "dir": str(res.run_dir),
                              "tokens": res.records.output_tokens.tolist()}), flush=True)
""")


def test_study_killed_mid_run_resumes_and_two_reruns_share_the_store(tiny_model, tmp_path):
    """The runner killed with SIGKILL while its second run's engine works: run A stays stored and whole, no trace of
    run B is loadable, and the orphaned engine dies with its runner. The same command then run twice at once on the
    same store: A is loaded by both; B runs once (one waits on B's lock, then loads it) and both see the same B."""
    script = tmp_path / "study.py"
    script.write_text(STUDY)
    store = tmp_path / "store"
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FP8LAB_RUNS": str(store), "FP8LAB_RELIAB_TAG": tag}

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(script), tiny_model],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )

    study = start()
    a = json.loads(study.stdout.readline())
    assert a["status"] == "ok" and not a["cached"], a
    a_dir = Path(a["dir"])
    a_files = {f.name: f.read_bytes() for f in a_dir.iterdir()}
    _wait_until(
        lambda: any((d / "worker.log").exists() for d in (store / "reliab").glob(".*.work-*")),
        120,
        "run B's engine worker started",
    )
    time.sleep(1)  # B's engine is starting up (a forkserver child has vLLM imported: on a fast CPU B took under 3 s)
    assert len(_tagged(tag)) >= 2  # the runner and B's worker
    study.send_signal(signal.SIGKILL)
    study.wait(30)
    _wait_until(lambda: not _tagged(tag), 60, "the orphaned engine worker died with its runner")
    runs = [d for d in (store / "reliab").iterdir() if not d.name.startswith(".")]
    assert runs == [a_dir], runs  # only A: nothing of B can be loaded as a run
    assert {f.name: f.read_bytes() for f in a_dir.iterdir()} == a_files  # A untouched

    reruns = [start(), start()]
    outs = []
    for p in reruns:
        stdout, stderr = p.communicate(timeout=900)
        assert p.returncode == 0, stderr[-3000:]
        outs.append({r["run"]: r for r in map(json.loads, stdout.splitlines())})
    for o in outs:
        assert o["A"]["cached"] and o["A"]["dir"] == str(a_dir) and o["A"]["tokens"] == [4]
        assert o["B"]["status"] == "ok" and o["B"]["tokens"] == [400], o["B"]
    assert sorted(o["B"]["cached"] for o in outs) == [False, True]  # B ran once
    assert outs[0]["B"]["dir"] == outs[1]["B"]["dir"]
    b_dir = Path(outs[0]["B"]["dir"])
    assert json.loads((b_dir / "engine.json").read_text())["status"] == "ok"
    assert (b_dir / "records.parquet").exists() and (b_dir / "spec.json").exists()
    left = sorted(d.name for d in (store / "reliab").iterdir() if d.is_dir())
    assert left == sorted([a_dir.name, b_dir.name]), left  # no temporary folders left behind
    assert not _tagged(tag)


def test_failed_notebook_rerun_keeps_the_last_good_result(tmp_path):
    """`fp8lab run` into a report folder holding a good Study 00, with a parameter that makes it fail: exit 1, the
    good summary and HTML stay byte for byte, summary.json keeps the good entry and names the failed rerun, and
    the failed notebook is kept beside (``.failed.html``). Before, the good summary was deleted."""
    ref = REPO_ROOT / "reports" / "cpu-tiny"
    stem = "00_kv_memory_estimation"
    out = tmp_path / "report"
    out.mkdir()
    for name in (f"{stem}.summary.json", f"{stem}.html"):
        shutil.copy(ref / name, out / name)
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FP8LAB_RUNS": str(tmp_path / "runs")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "fp8lab.cli",
            "run",
            "00",
            "--profile",
            "cpu-tiny",
            "--out",
            str(out),
            "-q",
            "-p",
            "CONFIGS",
            '["no-such-config"]',
            "-p",
            "MEASURE",
            "false",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=900,
    )
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-3000:])
    assert f"failed: {stem}" in res.stderr and "last good result in that folder is kept" in res.stderr
    for name, data in before.items():
        assert (out / name).read_bytes() == data, name
    from fp8lab.report.run import read_index

    entry = read_index(out)["notebooks"][stem]
    assert entry["status"] == "ok" and entry["summary"] == json.loads(before[f"{stem}.summary.json"])
    assert "no-such-config" in entry["rerun_failed"]["error"]
    assert (out / f"{stem}.failed.html").exists() and entry["rerun_failed"]["failed_html"] == f"{stem}.failed.html"
    assert "a later rerun failed and was not kept" in (out / "index.html").read_text()
    assert not list(out.glob(".*running*"))


def test_an_engine_core_that_fails_to_start_is_recorded_with_its_root_cause(tiny_model, tmp_path):
    """An ``AsyncLLM``'s engine core forked from fp8lab's CPU forkserver writes its traceback into the worker's log, as
    a spawned core would: the run's error is vLLM's reason, not "Engine core initialization failed. See root cause
    above" (which is all a run recorded while the core wrote to the forkserver's output, the job's terminal)."""
    spec = EngineSpec(model=tiny_model, kv_cache_gib=0.0001, max_model_len=2048)  # 107 KB: not one 2048-token sequence
    res = run_engine(spec, [Request(prompt_token_ids=PROMPT, max_tokens=4)], driver="async", work_dir=tmp_path)
    assert res.status != "ok"
    assert res.error.startswith("ValueError: No available memory for the cache blocks"), res.error
    assert res.status == "oom"  # vLLM's reason classified, which the generic wrapper could not be
    log = (tmp_path / "worker.log").read_text()
    assert "EngineCore failed to start" in log  # the core's own lines, in the worker's log
