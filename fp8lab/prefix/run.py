"""Running Study 07: :func:`run_prefix` measures (or loads, or resumes) a :class:`~fp8lab.prefix.spec.PrefixSpec`
in the results store, in one spawned worker (:mod:`fp8lab.prefix.worker`) that holds one engine per KV dtype;
:func:`load` reads a stored run back as a :class:`PrefixRun`. The tables are computed from it by
:mod:`fp8lab.prefix.tables`."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.paths import runs_dir
from fp8lab.prefix.spec import STUDY, PrefixSpec
from fp8lab.specs import spec_hash


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return rows


@dataclass
class PrefixRun:
    """A stored run: its descriptor, per-turn rows, correctness rows, engine facts."""

    run_dir: Path
    descriptor: dict[str, Any]
    rows: Any
    correctness: Any
    engines: dict[str, dict[str, Any]]
    provenance: dict[str, Any]
    complete: bool

    @property
    def spec(self) -> PrefixSpec:
        return PrefixSpec(**self.descriptor["spec"])

    def ok_dtypes(self) -> list[str]:
        return [d for d in self.spec.kv_dtypes if self.engines.get(d, {}).get("status") == "ok"]

    def missing_cells(self) -> list[tuple[str, int, int, str]]:
        s = self.spec
        have = set()
        if len(self.rows):
            for k, g in self.rows.groupby(["workload", "n_active", "trial", "kv_dtype"]):
                if g.turn.nunique() == s.workload(k[0]).turns:
                    have.add(tuple(k))
        ok = self.ok_dtypes() or list(s.kv_dtypes)
        return [
            (w.kind, n, t, d)
            for t in range(s.trials)
            for w in s.workloads
            for n in s.active
            for d in ok
            if (w.kind, n, t, d) not in have
        ]


def load(run_dir: Path) -> PrefixRun:
    import pandas as pd

    from fp8lab.engine.results import note_run

    desc = json.loads((run_dir / "spec.json").read_text())
    eng = json.loads((run_dir / "engines.json").read_text()) if (run_dir / "engines.json").exists() else {}
    done = (run_dir / "complete.json").exists()
    if eng.get("provenance"):  # the report names the device and vLLM these rows were measured with
        note_run(run_dir, eng["provenance"], "complete" if done else "partial")
    return PrefixRun(
        run_dir,
        desc,
        pd.DataFrame(_read_jsonl(run_dir / "rows.jsonl")),
        pd.DataFrame(_read_jsonl(run_dir / "correctness.jsonl")),
        eng.get("engines", {}),
        eng.get("provenance", {}),
        (run_dir / "complete.json").exists(),
    )


def run_prefix(spec: PrefixSpec, root: Path | None = None, force: bool = False) -> PrefixRun:
    """Measure (or load, or resume) ``spec`` in the results store ``root`` (default: runs/). One spawned worker
    holds one engine per dtype for the whole sweep. An engine that fails to start is recorded (status and root
    cause) and the others go on; the run is complete when every cell of every engine that started is stored."""
    from fp8lab.engine import results

    desc = spec.descriptor()
    rd = (root or runs_dir()) / STUDY / spec_hash(desc)
    if results.store_only():  # re-rendering from committed stores: load what is there, never start a worker
        kept = rd if (rd / "spec.json").exists() else results.stored_elsewhere(rd, desc)
        if kept is not None:
            return load(kept)
        import pandas as pd

        err = f"not in the results store ({rd}); ${results.STORE_ONLY_ENV} is set, so no engine was started"
        return PrefixRun(
            rd,
            desc,
            pd.DataFrame(),
            pd.DataFrame(),
            {d: {"status": "error", "error": err} for d in spec.kv_dtypes},
            {},
            False,
        )
    for d in spec.kv_dtypes:  # this machine's paths, before the worker starts (a stored spec is not checked)
        spec.engine_spec(d).check_paths()
    if force and rd.exists():
        import shutil

        shutil.rmtree(rd)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "spec.json").write_text(json.dumps(desc, indent=2, sort_keys=True, default=str))
    if (rd / "complete.json").exists():
        return load(rd)
    from fp8lab.engine.procs import kill_group, reap_descendants, worker_context
    from fp8lab.prefix import worker as prefix_worker

    t0 = time.perf_counter()
    proc = worker_context().Process(
        target=prefix_worker.entry,
        name="fp8lab-prefix",
        args=(
            str(rd / "worker.log"),
            dict(spec.env),
            json.loads(json.dumps(dataclasses.asdict(spec), default=str)),
            str(rd),
        ),
    )
    proc.start()
    proc.join(timeout=spec.timeout_s)
    if proc.is_alive():
        reap_descendants(proc.pid)
    kill_group(proc.pid)
    reap_descendants(proc.pid)
    proc.join(timeout=10)
    run = load(rd)
    # a dtype this device could not run natively leaves the run incomplete, so a device that can fills it in
    refused = any(e.get("status") == "unsupported" for e in run.engines.values())
    failed_all = bool(run.engines) and not run.ok_dtypes() and not refused
    corr_done = spec.correctness_prompts == 0 or (
        len(run.correctness) and set(run.ok_dtypes()) <= set(run.correctness.kv_dtype)
    )
    if failed_all or (run.engines and not refused and not run.missing_cells() and corr_done):
        (rd / "complete.json").write_text(json.dumps({"wall_s": time.perf_counter() - t0}))
        run.complete = True
    return run
