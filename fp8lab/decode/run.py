"""Run (or load, or resume) Study 06: :func:`run_decode` starts one worker per GPU group
(:mod:`fp8lab.decode.worker`) and leaves a stored run (:class:`DecodeRun`, read by :func:`load`); :func:`find_run`
finds a spec's run in a store or an archive measured elsewhere; :func:`store_bandwidth` keeps the roofline's
bandwidth with the run."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import kvmath
from fp8lab.decode.spec import STUDY, DecodeSpec, margin, plan
from fp8lab.paths import runs_dir
from fp8lab.specs import SpecError, spec_hash


def _shards(spec: DecodeSpec, points: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Points per worker: whole batches to one GPU group each (a batch's fit then stays on one device),
    the costliest batch first to the least loaded group."""
    groups = spec.gpu_groups or ((),)
    load = [0.0] * len(groups)
    out: list[list[tuple[int, int]]] = [[] for _ in groups]
    by_batch: dict[int, list[tuple[int, int]]] = {}
    for b, c in points:
        by_batch.setdefault(b, []).append((b, c))
    cost = {b: sum(b * c * (1 + c / 32768) for _, c in pts) for b, pts in by_batch.items()}
    for b in sorted(by_batch, key=lambda k: -cost[k]):
        i = load.index(min(load))
        out[i].extend(by_batch[b])
        load[i] += cost[b]
    return out


def _read_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted(run_dir.glob("g*/rows.jsonl")):
        group = f.parent.name
        for line in f.read_text().splitlines():
            try:
                rows.append({**json.loads(line), "group": group})
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return rows


def sets_to_run(spec: DecodeSpec, rows: Any, group: str, points: list[tuple[int, int]], failed: Any = ()) -> list[Any]:
    """The engine sets of ``spec.schedule()`` that worker ``group`` has not finished: a set is finished when each of
    its engines (one attempt, ``engine_uid``) measured every point of ``points`` ``reps`` times. An unfinished set
    runs again whole, with fresh engines (a half-measured attempt is kept in the store, not used where a complete
    one exists: :meth:`DecodeRun.measured`). An engine in ``failed`` (ids whose start or measurement failed, recorded
    with the cause) counts as finished: the study goes on without it."""
    import pandas as pd

    r = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows
    want = len(points) * spec.reps
    full: set[str] = set()
    if not r.empty and "engine_uid" in r:
        g = r[(r.get("group", group) == group) & (r.rep >= 0)]
        g = g[g.set_index(["batch", "context_len"]).index.isin(points)]
        counts = (
            g.drop_duplicates(["engine_uid", "batch", "context_len", "rep"]).groupby(["engine", "engine_uid"]).size()
        )
        full = {e for (e, _), n in counts.items() if n >= want}
    done = full | set(failed)
    return [es for es in spec.schedule() if not all(es.engine_id(d) in done for d in es.configs)]


def _failed(starts: dict[str, dict[str, Any]], group: str) -> set[str]:
    """Engine ids of worker ``group`` whose last attempt failed (:attr:`DecodeRun.starts`)."""
    return {k.split("/", 1)[1] for k, f in starts.items() if k.startswith(f"{group}/") and f.get("status") != "ok"}


def run_decode(spec: DecodeSpec, root: Path | None = None, force: bool = False) -> DecodeRun:
    """Measure (or load, or resume) the grid of ``spec`` in the results store ``root`` (default: runs/)."""
    from fp8lab.engine import results

    desc = spec.descriptor()
    rd = (root or runs_dir()) / STUDY / spec_hash(desc)
    if results.store_only() and not (rd / "spec.json").exists():  # a re-render: the run under another vLLM/code
        kept = results.stored_elsewhere(rd, desc)
        if kept is not None:
            return load(kept)
        raise SpecError(  # a re-render never starts an engine
            "DecodeSpec",
            "model",
            spec.model,
            f"a spec whose run is in the results store ({rd.parent}): ${results.STORE_ONLY_ENV} is set, so no "
            "engine is started",
        )
    for d in spec.kv_dtypes:  # this machine's paths, before any worker starts (a stored spec is not checked)
        spec.engine_spec(d).check_paths()
    if force and rd.exists():
        import shutil

        shutil.rmtree(rd)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "spec.json").write_text(json.dumps(desc, indent=2, sort_keys=True))
    if (rd / "complete.json").exists():
        return load(rd)
    grid = plan(spec)
    points = [(int(r.batch), int(r.context_len)) for r in grid.itertuples() if r.measure]
    rows = _read_rows(rd)
    before = load(rd).starts if any(rd.glob("g*/engines.json")) else {}
    lay = kvmath.load_layout(spec.engine_spec(spec.kv_dtypes[0]).model)
    engine_specs = {arm: {d: spec.engine_spec(d, arm).to_dict() for d in spec.kv_dtypes} for arm in spec.arms}
    from fp8lab.decode import worker as decode_worker
    from fp8lab.engine.procs import kill_group, reap_descendants, worker_context

    ctx = worker_context()

    procs = []
    t0 = time.perf_counter()
    for i, pts in enumerate(_shards(spec, points)):
        if not pts:
            continue
        gdir = rd / f"g{i}"
        gdir.mkdir(exist_ok=True)
        env = dict(spec.env)
        if spec.gpu_groups:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpu_groups[i]))
        todo = sets_to_run(spec, rows, f"g{i}", pts, _failed(before, f"g{i}"))
        if not todo:
            continue
        p = {
            "sets": [es.to_dict() for es in todo],
            "points": pts,
            "margins": [margin(spec, b, c) for b, c in pts],
            "reps": spec.reps,
            "decode_tokens": spec.decode_tokens,
            "warmup": spec.warmup,
            "seed": spec.seed,
            "vocab": int(lay.config["vocab_size"]),
            "engine_args": spec.engine_args,
        }
        proc = ctx.Process(
            target=decode_worker.entry,
            name=f"fp8lab-decode-g{i}",
            args=(str(gdir / "worker.log"), env, engine_specs, p, str(gdir)),
        )
        proc.start()
        procs.append(proc)
    for proc in procs:
        proc.join(timeout=max(spec.timeout_s - (time.perf_counter() - t0), 1.0))
        if proc.is_alive():
            reap_descendants(proc.pid)
        kill_group(proc.pid)
        reap_descendants(proc.pid)
        proc.join(timeout=10)
    run = load(rd)
    left = [
        es
        for i, pts in enumerate(_shards(spec, points))
        if pts
        for es in sets_to_run(spec, run.rows, f"g{i}", pts, _failed(run.starts, f"g{i}"))
    ]
    if not left or run.all_engines_failed():
        (rd / "complete.json").write_text(json.dumps({"wall_s": time.perf_counter() - t0}))
        run.complete = True
    return run


@dataclass
class DecodeRun:
    """A stored decode run: its spec descriptor, measurement rows and engine facts per worker."""

    run_dir: Path
    descriptor: dict[str, Any]
    rows: Any
    engines: dict[str, dict[str, Any]]
    provenance: dict[str, Any]
    complete: bool
    starts: dict[str, dict[str, Any]] = field(default_factory=dict)  # every engine started, by group/engine id
    deferred: list[dict[str, Any]] = field(default_factory=list)  # engine sets left for a later call (deadline)

    @property
    def spec(self) -> dict[str, Any]:
        return self.descriptor["spec"]

    def all_engines_failed(self) -> bool:
        return bool(self.engines) and all(e.get("status") != "ok" for e in self.engines.values())

    def measured(self) -> Any:
        """Measurement rows after warm-up with ``step_ms`` and the engine that took them (``arm``, ``round``,
        ``engine``). Of an engine started more than once (a resumed run), the attempt with the most rows (the
        latest among equals); a run before issue 35 (no engine column) is one co-located round, the last row kept
        where a point was measured twice."""
        r = self.rows
        if r.empty:
            return r
        r = r[r.rep >= 0]
        if "engine_uid" not in r:
            r = r.drop_duplicates(["batch", "context_len", "rep", "kv_dtype"], keep="last")
            return r.assign(
                step_ms=r.step_s * 1e3, arm="colocated", round=0, engine="colocated/r0/" + r.kv_dtype.astype(str)
            )
        size = r.groupby(["group", "engine", "engine_uid"]).size().rename("n").reset_index()
        best = size.sort_values(["n", "engine_uid"]).drop_duplicates(["group", "engine"], keep="last").engine_uid
        r = r[r.engine_uid.isin(set(best))].drop_duplicates(["engine_uid", "batch", "context_len", "rep"], keep="last")
        return r.assign(step_ms=r.step_s * 1e3, round=r["round"].astype(int))

    @property
    def replicated(self) -> bool:
        """Whether the run is the issue-35 design (several engines per dtype or a solo arm)."""
        return bool(self.spec.get("engines", 1) > 1 or tuple(self.spec.get("arms") or ("colocated",)) != ("colocated",))

    def missing_points(self) -> Any:
        import pandas as pd

        spec = DecodeSpec(**{**self.spec, "gpu_groups": self.spec.get("gpu_groups")})
        grid = plan(spec)
        want = grid[grid.measure]
        m = self.measured()
        ok = {d for d, e in self.engines.items() if e.get("status") == "ok"} or set(spec.kv_dtypes)
        have = (
            m[m.kv_dtype.isin(ok)].groupby(["batch", "context_len"]).size().rename("n").reset_index()
            if not m.empty
            else pd.DataFrame(columns=["batch", "context_len", "n"])
        )
        merged = want.merge(have, on=["batch", "context_len"], how="left").fillna({"n": 0})
        return merged[merged.n < spec.reps * len(ok)]


def load(run_dir: Path) -> DecodeRun:
    """Read a stored decode run (complete or not)."""
    import pandas as pd

    desc = json.loads((run_dir / "spec.json").read_text())
    engines: dict[str, dict[str, Any]] = {}
    prov: dict[str, Any] = {}
    starts: dict[str, dict[str, Any]] = {}  # issue-35 runs: every engine by group/engine id
    deferred: list[dict[str, Any]] = []
    for f in sorted(run_dir.glob("g*/engines.json")):
        e = json.loads(f.read_text())
        prov = prov or e.get("provenance", {})
        deferred += e.get("deferred") or []
        for key, facts in e.get("engines", {}).items():
            if "engine_uid" in facts:  # keyed by engine id; per dtype: ok where any of its engines is
                starts[f"{f.parent.name}/{key}"] = facts
                d = facts["kv_dtype"]
                agg = engines.setdefault(d, {"status": "error", "error": None, "groups": []})
                if f.parent.name not in agg["groups"]:
                    agg["groups"].append(f.parent.name)
                if facts.get("status") == "ok" and agg["status"] != "ok":
                    agg.update({k: v for k, v in facts.items() if k != "groups"}, status="ok", error=None)
                elif agg["status"] != "ok":
                    agg["error"] = facts.get("error")
                continue
            d = key
            engines.setdefault(d, {**facts, "groups": []})["groups"].append(f.parent.name)
            if facts.get("status") != "ok":
                engines[d].update(status=facts.get("status"), error=facts.get("error"))
    from fp8lab.engine.results import note_run

    note_run(run_dir, prov, "complete" if (run_dir / "complete.json").exists() else "partial")
    return DecodeRun(
        run_dir,
        desc,
        pd.DataFrame(_read_rows(run_dir)),
        engines,
        prov,
        (run_dir / "complete.json").exists(),
        starts,
        deferred,
    )


def find_run(records: str | Path, spec: DecodeSpec, scratch: str | Path | None = None) -> DecodeRun:
    """The stored run of ``spec`` in ``records`` (a results store, or a ``.tar.gz`` of one, or a folder of such
    archives), whatever vLLM version measured it: for reports rendered on another machine than the one
    that measured. Raises :class:`SpecError` naming the specs on record when none matches."""
    import tarfile
    import tempfile

    root = Path(records)
    if not root.exists():
        raise SpecError(
            "notebook", "RECORDS", str(records), "an existing results store, .tar.gz of one, or folder of them"
        )
    archives = [root] if root.is_file() else sorted(root.glob("*.tar.gz"))
    bases = [] if root.is_file() else [root]
    for a in archives:
        dest = Path(scratch or tempfile.mkdtemp(prefix="fp8lab-decode-")) / a.name.removesuffix(".tar.gz")
        with tarfile.open(a) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and not m.name.startswith("/") and ".." not in m.name]
            tf.extractall(dest, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        bases.append(dest)
    placement = ("env", "gpu_groups")  # where it ran, not what was measured

    def measured_as(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in placement}

    want = measured_as(spec.descriptor()["spec"])
    seen = []
    for base in bases:
        for sj in sorted(base.rglob(f"{STUDY}/*/spec.json")):
            got = json.loads(sj.read_text())
            have = measured_as(DecodeSpec(**got["spec"]).descriptor()["spec"])
            if have == want:
                return load(sj.parent)
            seen.append(sj.parent.name)
    raise SpecError(
        "notebook",
        "RECORDS",
        str(records),
        f"a store holding a {STUDY} run of this spec (runs there: {', '.join(seen) or 'none'})",
    )


def store_bandwidth(run: DecodeRun, value: float | str | None = None) -> dict[str, Any]:
    """The memory bandwidth for the roofline: ``value`` (GB/s) when given; else the figure stored with the run
    (``bandwidth.json``, measured on the machine that ran it); else measured here and stored
    (:func:`fp8lab.engine.bandwidth.resolve_bandwidth`)."""
    from fp8lab.engine.bandwidth import resolve_bandwidth

    path = run.run_dir / "bandwidth.json"
    if value is None and path.exists():
        return json.loads(path.read_text())
    bw = resolve_bandwidth(value)
    if value is None:
        path.write_text(json.dumps(bw, indent=2, default=str))
    return bw
