"""Study 01's paired design on the engines: one engine process per kv dtype (:class:`_EngineProc`, running
:mod:`fp8lab.serving.worker`), both alive, phases interleaved by :func:`~fp8lab.serving.schedule.paired_schedule`
(:func:`run_paired`); each finished phase kept at once so a run cut short resumes, and every (trial, dtype) saved
as an ordinary run of the results store (:mod:`fp8lab.engine.results`) once all are in."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fp8lab.engine.schedule import EngineSet
from fp8lab.serving.schedule import paired_schedule, phase_payload, plan_phases, trial_order
from fp8lab.serving.spec import ServingPlan
from fp8lab.specs import EngineSpec

#: This study's own engine code (:func:`fp8lab.engine.results.run_versions`): an edit to it re-measures this study only.
WORKER_CODE = ("serving/worker.py",)


def _gz_json_write(path: Path, obj: Any) -> None:
    import gzip

    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as f:
        json.dump(obj, f, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    tmp.replace(path)


def _gz_json_read(path: Path) -> Any:
    import gzip

    with gzip.open(path, "rt") as f:
        return json.load(f)


class _EngineProc:
    """One engine alive in its own spawned process (:mod:`fp8lab.serving.worker`), serving phases on command."""

    def __init__(self, spec: EngineSpec, log_path: Path, sample_interval_s: float = 0.25):
        from fp8lab.engine.procs import worker_context
        from fp8lab.serving import worker as serving_worker

        self.spec, self.log_path = spec, log_path
        ctx = worker_context()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=serving_worker.entry,
            name=f"fp8lab-serve-{spec.kv_cache_dtype}",
            args=(str(log_path), {}, spec.to_dict(), {"sample_interval_s": sample_interval_s}, child),
        )
        self.proc.start()
        child.close()

    def _wait(self, timeout: float) -> dict[str, Any]:
        from fp8lab.engine.result import classify_failure, root_cause

        try:
            if self.conn.poll(timeout):
                msg = self.conn.recv()
            else:
                msg = {"status": "timeout", "error": f"no answer within timeout_s = {timeout:.0f} s"}
        except (EOFError, OSError) as exc:
            msg = {
                "status": "error",
                "error": f"engine process ended ({type(exc).__name__}, exit code {self.proc.exitcode})",
            }
        if msg.get("status") not in ("ok", "ready"):
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            err = root_cause(log, msg.get("error")) if log else msg.get("error")
            status = "timeout" if msg["status"] == "timeout" else classify_failure(f"{err}\n{msg.get('error')}")
            msg = {**msg, "status": status, "error": err}
        return msg

    def start(self) -> dict[str, Any]:
        return self._wait(self.spec.timeout_s)

    def run(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            self.conn.send(payload)
        except (BrokenPipeError, OSError) as exc:
            return {"status": "error", "error": f"engine process gone: {exc}"}
        return self._wait(self.spec.timeout_s)

    def stop(self) -> None:
        from fp8lab.engine.procs import kill_group, reap_descendants

        try:
            self.conn.send(None)
            self.proc.join(timeout=60)
        except (BrokenPipeError, OSError):
            pass
        if self.proc.pid:
            reap_descendants(self.proc.pid)
            kill_group(self.proc.pid)
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


def run_paired(
    plan: ServingPlan,
    study: str,
    conc: tuple[int, ...],
    cap_pred: dict[str, int],
    progress: bool,
    engine_factory: Callable[..., Any] | None = None,
    engine_set: EngineSet | None = None,
) -> list[dict[str, Any]]:
    """The paired design: both engines alive at once, phases interleaved by :func:`paired_schedule`. Each
    finished phase is kept at once (``<runs>/<study>/paired-<hash>/``), so a run cut short resumes with the
    phases it lacks; once every phase is in, each (trial, dtype) is saved as an ordinary run directory of the
    results store (:mod:`fp8lab.engine.results`) and the progress folder is removed. ``engine_factory(spec, log_path)``
    replaces :class:`_EngineProc` (an object with ``start()``, ``run(payload)`` and ``stop()``; tests pass one
    that answers without vLLM). ``engine_set`` (issue 35's replication, :mod:`fp8lab.engine.schedule`): run only
    that set's engines (its dtypes in start order, the arm's memory setting), its name in the design's key, so every
    set is a run of its own; None: every dtype, the design before issue 35 (its keys as they were)."""
    from fp8lab.engine import results
    from fp8lab.engine.result import EngineResult
    from fp8lab.paths import runs_dir
    from fp8lab.specs import spec_hash

    dtypes = tuple(engine_set.configs) if engine_set is not None else plan.kv_dtypes
    arm = engine_set.arm if engine_set is not None else "colocated"

    def spec_for(d: str) -> EngineSpec:
        return plan.spec_for(d, arm)

    phases = {d: v for d, v in plan_phases(plan, conc, cap_pred).items() if d in dtypes}
    names = {d: {t: [p.name for p in ps] for t, ps in by_t.items()} for d, by_t in phases.items()}
    sched = paired_schedule(names, dtypes, plan.trials)
    design = {
        "design": "paired-interleaved",
        "plan": {**plan.to_dict(), "engine": results.engine_key(plan.engine)},  # no absolute path in a key
        "concurrency": list(conc),
        "capacity_predicted": cap_pred,
    }
    if engine_set is not None:
        design["engine_set"] = engine_set.to_dict()
    descs = {
        (t, d): {
            **results.run_descriptor(spec_for(d), phases[d][t], "async", 0.25, code=WORKER_CODE),
            "paired": spec_hash(design),
            "trial": t,
        }
        for d in dtypes
        for t in range(plan.trials)
    }
    rdirs = {k: results.run_dir_for(study, v) for k, v in descs.items()}
    if all(
        (rd / "engine.json").exists() and json.loads((rd / "engine.json").read_text()).get("status") == "ok"
        for rd in rdirs.values()
    ):
        out = [
            {"trial": t, "kv_dtype": d, "order": i, "result": results.load(rdirs[(t, d)], spec_for(d))}
            for i, (t, d) in enumerate(trial_order(dtypes, plan.trials))
        ]
        if progress:
            print(f"paired study: {len(out)} stored trials loaded ({rdirs[(0, dtypes[0])].parent})", flush=True)
        return out
    if results.store_only():  # re-rendering from committed stores: what is stored, and no engine for the rest
        return [
            {
                "trial": t,
                "kv_dtype": d,
                "order": i,
                "result": results.from_store(spec_for(d), rdirs[(t, d)], descs[(t, d)]),
            }
            for i, (t, d) in enumerate(trial_order(dtypes, plan.trials))
        ]
    for d in dtypes:  # this machine's paths, before any engine starts (a stored spec is not checked)
        spec_for(d).check_paths()
    # the phases kept so far resume only under the same vLLM, torch and engine code (their runs' cache key)
    work = runs_dir() / study / f"paired-{spec_hash(design, results.run_versions(WORKER_CODE))}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "design.json").write_text(json.dumps(design, indent=2, default=str))

    def ph_path(t: int, name: str, d: str) -> Path:
        return work / f"phase-t{t}-{name}-{d}.json.gz"

    todo = [k for k in sched if not ph_path(*k).exists()]
    engines: dict[str, dict[str, Any]] = {}
    for d in dtypes:
        ep = work / f"engine-{d}.json"
        if ep.exists():
            engines[d] = json.loads(ep.read_text())
    procs: dict[str, _EngineProc] = {}
    t_all = time.perf_counter()
    try:
        for d in dtypes:
            if not any(k[2] == d for k in todo):
                continue
            t = time.perf_counter()
            p = (engine_factory or _EngineProc)(spec_for(d), work / f"worker-{d}.log")
            msg = p.start()
            if msg["status"] == "ready":
                procs[d] = p
                engines[d] = {"status": "ok", "error": None, "engine": msg["engine"], "provenance": msg["provenance"]}
            else:
                p.stop()
                engines[d] = {"status": msg["status"], "error": msg.get("error"), "engine": {}, "provenance": {}}
            (work / f"engine-{d}.json").write_text(json.dumps(engines[d], indent=2, default=str))
            if progress:
                print(
                    f"engine kv_cache_dtype={d}: {engines[d]['status']} in {time.perf_counter() - t:.0f} s"
                    + (f" - {engines[d]['error']}" if engines[d]["status"] != "ok" else ""),
                    flush=True,
                )
        by_name = {(t, p.name, d): p for d, by_t in phases.items() for t, ps in by_t.items() for p in ps}
        for i, key in enumerate(todo):
            t, name, d = key
            if d not in procs:
                continue
            t0 = time.perf_counter()
            msg = procs[d].run(phase_payload(plan, by_name[key], t))
            took = time.perf_counter() - t0
            if msg["status"] != "ok":
                engines[d].update(status=msg["status"], error=f"during trial {t} phase {name}: {msg.get('error')}")
                (work / f"engine-{d}.json").write_text(json.dumps(engines[d], indent=2, default=str))
                procs.pop(d).stop()
                if progress:
                    print(
                        f"[{i + 1}/{len(todo)}] trial {t} {name} {d}: {msg['status']} - {msg.get('error')}", flush=True
                    )
                continue
            _gz_json_write(
                ph_path(*key),
                {
                    "rows": msg["rows"],
                    "stats": {**msg["stats"], "took_s": took},
                    "samples": msg["samples"],
                    "t_wall": time.time(),
                },
            )
            if progress:
                st = msg["stats"]
                print(
                    f"[{i + 1}/{len(todo)}] trial {t} {name} {d}: {st['requests']} requests, "
                    f"{st['output_tokens'] / max(st['wall_s'], 1e-9):.0f} output tok/s over {st['wall_s']:.1f} s "
                    f"({took:.0f} s, {time.perf_counter() - t_all:.0f} s so far)",
                    flush=True,
                )
    finally:
        for p in procs.values():
            p.stop()
    import pandas as pd_

    out, complete = [], True
    for i, (t, d) in enumerate(trial_order(dtypes, plan.trials)):
        eng = engines.get(d, {"status": "error", "error": "engine never started", "engine": {}, "provenance": {}})
        recs, samples, stats, missing = [], [], {}, []
        for name in names[d][t]:
            f = ph_path(t, name, d)
            if not f.exists():
                missing.append(name)
                continue
            ph = _gz_json_read(f)
            for r in ph["rows"]:  # float32 gaps: a tenth of a microsecond is far below the clock's own resolution
                if isinstance(r.get("itl_s"), list):
                    r["itl_s"] = np.asarray(r["itl_s"], dtype=np.float32)
            recs += ph["rows"]
            samples += [{**s, "phase": name} for s in ph["samples"]]
            stats[name] = ph["stats"]
        facts = dict(eng.get("engine") or {})
        facts["run_wall_s"] = float(sum(v.get("took_s", 0.0) for v in stats.values()))
        mems = [s["mem_bytes"] for s in samples if s.get("mem_bytes") is not None]
        facts["mem_peak_bytes"] = max(mems) if mems else facts.get("mem_after_start_bytes")
        facts["mem_steady_bytes"] = float(np.median(mems)) if mems else facts.get("mem_after_start_bytes")
        status = (
            "ok" if not missing and eng["status"] == "ok" else (eng["status"] if eng["status"] != "ok" else "error")
        )
        error = None if status == "ok" else (eng.get("error") or f"phases not run: {', '.join(missing)}")
        res = EngineResult(
            status=status,
            error=error,
            engine=facts,
            records=pd_.DataFrame(recs),
            samples=pd_.DataFrame(samples),
            phases=stats,
            provenance=eng.get("provenance") or {},
            spec=spec_for(d),
            log_tail="",
            run_dir=rdirs[(t, d)],
        )
        complete &= status == "ok"
        out.append({"trial": t, "kv_dtype": d, "order": i, "result": res})
    if complete:  # every phase in: the ordinary store keeps them, the progress folder goes
        import shutil

        for run in out:
            rd = rdirs[(run["trial"], run["kv_dtype"])]
            results.save(run["result"], rd, descs[(run["trial"], run["kv_dtype"])])
            log = work / f"worker-{run['kv_dtype']}.log"
            if log.exists():
                (rd / "worker.log.tail").write_text(log.read_text(errors="replace")[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    return out


def run_sets(
    plan: ServingPlan,
    study: str,
    conc: tuple[int, ...],
    cap_pred: dict[str, int],
    progress: bool,
    engine_factory: Callable[..., Any] | None = None,
) -> list[dict[str, Any]]:
    """Every engine set of ``plan.schedule()`` in start order, each :func:`~fp8lab.serving.paired.run_paired` on
    that set (fresh engine processes; stored sets are loaded). Each run dict gains ``arm``, ``round``, ``engine``
    (``<arm>/r<round>/<dtype>``) and ``engine_trial`` (its trial within the engine); ``trial`` becomes
    ``round x trials + engine_trial``, unique within an arm, the same for a round's two dtypes (so the trial-level
    tables pair them)."""
    runs: list[dict[str, Any]] = []
    for es in plan.schedule():
        if progress:
            print(f"engine set {es.key}: {', '.join(es.configs)}", flush=True)
        part = run_paired(plan, study, conc, cap_pred, progress, engine_factory, engine_set=es)
        for r in part:
            t = int(r["trial"])
            r.update(
                arm=es.arm,
                round=es.round,
                engine=es.engine_id(r["kv_dtype"]),
                engine_trial=t,
                trial=es.round * plan.trials + t,
            )
        runs += part
    return runs
