"""The results store: one directory per run, named by the content hash of what was run.

``<runs>/<study>/<run_id>/`` holds ``spec.json`` (the engine spec, driver and a digest of every
request), ``records.parquet`` (one row per request), ``samples.parquet`` (KV usage and memory over
time), ``engine.json`` (status, error, per-engine and per-phase figures), ``provenance.json`` and
``worker.log``. A committed store may hold records written compactly (``scripts/slim_store.py``): float
columns whose values are exactly float32 as float32, integer lists as narrower integers, ``itl_e<k>``
(integer ticks of 10**-k s; ``itl_e8``: 10 ns) for ``itl_s``; :func:`read_records`
gives back float64, int64 and ``itl_s``, so readers see one format. A run whose status is final (ok, oom, unsupported, invalid) is loaded instead of
re-run; ``timeout`` and ``error`` are retried. Failed runs stay on disk with their reason. The hash (the run's
cache key, :func:`run_descriptor`) is what was measured: the model as given (:func:`model_ref`: a path from the
repository root, a path in the store or a hub id, never where the checkout lies) and what it is (:func:`model_digest`:
its config and weights), the engine spec, driver and phases, the installed vLLM and torch, the engine-side code and
the study's own worker (:func:`run_versions`): after an upgrade, an engine edit or new weights a run is measured anew,
while a re-render from committed stores (:func:`store_only`) still finds runs of other versions
(:func:`stored_elsewhere`), and a checkout or store copied to another path finds every run. A stored spec is read
without checking this machine's paths (they are checked when a run starts).

A run folder appears whole or not at all: it is written as a hidden sibling (``.<run_id>.tmp-<pid>``) and
renamed into place, so a process killed mid-write leaves no half-written run that could be loaded as
finished; the engine works in ``.<run_id>.work-<pid>``. Hidden folders are never read as runs. One lock per
run (``.<run_id>.lock``, ``flock``) lets two studies share a store: the second waits, then loads the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fp8lab.engine import devices, fp8emu
from fp8lab.engine.capability import unsupported_result
from fp8lab.engine.result import EngineResult
from fp8lab.engine.run import Driver, run_engine
from fp8lab.metrics import percentiles, throughput
from fp8lab.paths import REPO_ROOT, STORE_ONLY_ENV, reuse_stored, runs_dir, store_only
from fp8lab.specs import EngineSpec, Phase, Request, resolve_model, spec_hash

FINAL_STATUSES = ("ok", "oom", "unsupported", "invalid")


def _requests_digest(reqs: Sequence[Request]) -> str:
    """16 hex digits of SHA-256 over the requests' fields as JSON. The fields are read as they are (tuples of ints
    and scalars), not through ``dataclasses.asdict``, whose element-by-element deep copy of every token id took most
    of a stored run's load (47 of 70 s for Study 04's H200 store); the JSON, and so every run key, is the same."""
    h = hashlib.sha256()
    names = [f.name for f in dataclasses.fields(Request)]
    for r in reqs:
        d = {n: getattr(r, n) for n in names}
        if d.get("forced_token_ids") is None:  # so requests stored before the field existed keep their digests
            d.pop("forced_token_ids", None)
        h.update(json.dumps(d, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _as_phases(phases: Sequence[Phase] | Sequence[Request]) -> list[Phase]:
    if phases and isinstance(phases[0], Request):
        return [Phase("main", tuple(phases))]  # type: ignore[arg-type]
    return list(phases)  # type: ignore[arg-type]


#: The engine-side code every run shares: the files whose change can change what any engine run measures (how the
#: engine is configured and started, its environment, the worker that runs :func:`run_cached`'s phases, the FP8
#: emulation's kernels and formats). Their hash (:func:`engine_code_hash`) is part of every run's cache key, so
#: after an edit to any of them a normal run measures anew instead of loading a run the old code measured. A study
#: with a worker of its own (``serving/worker.py``, ``decode/worker.py``, ``prefix/worker.py``) passes it as ``code`` to
#: :func:`run_versions`: it is hashed into that study's runs only (``study_code``), so editing one study's worker
#: re-measures that study and no other. Left out on purpose: the specs and workloads (already in the key as data),
#: the analysis, plots and reports (they read records, they do not make them). Add a file here when every engine
#: run starts depending on it.
ENGINE_CODE_FILES = (
    "engine/run.py",
    "engine/worker.py",
    "engine/fp8emu.py",
    "fp8formats.py",
    "engine/devices.py",
    "forcing.py",
    "engine/procs.py",
    "engine/result.py",
)

#: The name a file of the run key is hashed under (:func:`engine_code_hash`), for the files that moved into a
#: package: the name it had when it joined the key, so that where a file lies is not part of what was measured.
KEY_NAMES = {
    "engine/run.py": "engine.py",
    "engine/worker.py": "engine_worker.py",
    "engine/fp8emu.py": "fp8emu.py",
    "engine/devices.py": "devices.py",
    "decode/worker.py": "decode_worker.py",
    "prefix/worker.py": "prefix_worker.py",
    "serving/worker.py": "serving_worker.py",
}


def engine_code_hash(files: Sequence[str | Path] | None = None) -> str:
    """12 hex digits of SHA-256 over ``files`` (default :data:`ENGINE_CODE_FILES`; paths relative to the package)
    (name, :data:`KEY_NAMES` for a moved file, and content, line endings normalised, so a checkout with CRLF hashes the same); a missing file counts as
    missing, not as an error."""
    pkg = Path(__file__).parents[1]
    h = hashlib.sha256()
    for f in files if files is not None else ENGINE_CODE_FILES:
        path = pkg / f
        h.update(KEY_NAMES.get(Path(f).as_posix(), Path(f).name).encode() + b"\0")
        try:
            h.update(path.read_bytes().replace(b"\r\n", b"\n"))
        except OSError:
            h.update(b"<missing>")
        h.update(b"\0")
    return h.hexdigest()[:12]


def run_versions(code: Sequence[str] = ()) -> dict[str, str | None]:
    """The part of every run's cache key that says with what it was measured: the installed vLLM and torch
    versions, :func:`engine_code_hash` and, for a study with a worker of its own, the hash of that study's ``code``
    (``study_code``; files relative to the package, e.g. ``("decode/worker.py",)``). Under :func:`store_only`
    :func:`stored_elsewhere` ignores them (:data:`VERSION_KEYS`), so committed stores re-render on any version."""
    out: dict[str, str | None] = {
        "vllm": devices.installed_version("vllm"),
        "torch": devices.installed_version("torch"),
        "engine_code": engine_code_hash(),
    }
    if code:
        out["study_code"] = engine_code_hash(code)
    return out


def study_descriptor(
    study: str, protocol: int, spec: dict[str, Any], model: str, load_format: str, code: Sequence[str]
) -> dict[str, Any]:
    """The cache key of a study that stores its own runs (Studies 06, 07, 08): ``spec`` (its fields as a dict) with
    its model as given (:func:`model_ref`, never where it lies) beside :func:`model_digest` of the model's config and
    weights, the ``protocol``, and :func:`run_versions` with that study's own ``code``."""
    path = resolve_model(model)
    digest = model_digest(path, load_format)
    return {
        "study": study,
        "protocol": protocol,
        **run_versions(code),
        "spec": {**spec, "model": model_ref(path)},
        **({"model_digest": digest} if digest is not None else {}),
    }


#: How a model folder inside the results store is named in a run's key: ``<runs>/`` and its path in the store
#: (:func:`model_ref`), read back by :func:`fp8lab.specs.resolve_model` against this machine's :func:`runs_dir`.
RUNS_PREFIX = "<runs>/"
#: The files of a model folder whose content is its weights (:func:`model_digest`).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def model_ref(model: str) -> str:
    """The model as a run's key names it, never where this checkout or store lies: a hub id (or anything that is
    not an existing absolute path) as given; a folder inside the results store as ``<runs>/<path in the store>``
    (Study 02's exported scale sets); a folder inside the repository as its path from the repository root (as the
    profiles write it, e.g. ``data/models/fp8lab-tiny-qwen3``); any other folder by its name alone (what it holds
    is in :func:`model_digest`). An absolute path is named so whether or not it exists here."""
    p = Path(model)
    if not p.is_absolute():
        return model
    for q in dict.fromkeys((p, p.resolve())):
        for root, prefix in ((runs_dir(), RUNS_PREFIX), (REPO_ROOT, "")):
            for r in dict.fromkeys((Path(root).absolute(), Path(root).resolve())):
                try:
                    return prefix + q.relative_to(r).as_posix()
                except ValueError:
                    continue
    return p.name


_DIGESTS: dict[str, str] = {}


def _digest_cache_file() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fp8lab" / "file-digests.json"


def file_digest(path: Path) -> str:
    """SHA-256 (16 hex digits) of a file's bytes, read once per file version: cached by (resolved path, size,
    mtime in ns) in this process and in ``~/.cache/fp8lab/file-digests.json`` (``$XDG_CACHE_HOME``), as git's index
    and make trust a file's stat to say it is unchanged. The whole file is hashed, not a summary: a retrained model
    keeps its tensor names, shapes and size, so only its bytes tell it apart. An 8B model's 16 GB take about a
    minute once; every later key of the same files costs a ``stat``."""
    real = path.resolve()
    st = real.stat()
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}"
    if key in _DIGESTS:
        return _DIGESTS[key]
    cache = _digest_cache_file()
    try:
        disk = json.loads(cache.read_text())
    except (OSError, ValueError):
        disk = {}
    if key not in disk:
        h = hashlib.sha256()
        with open(real, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        disk[key] = h.hexdigest()[:16]
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(json.dumps(disk, sort_keys=True))
            os.replace(tmp, cache)
    _DIGESTS[key] = disk[key]
    return disk[key]


def model_digest(model: str, load_format: str = "auto") -> dict[str, str | None] | None:
    """What a local model is, as data: ``config`` (16 hex digits of SHA-256 over its ``config.json`` as canonical
    JSON) and ``weights`` (over the name and :func:`file_digest` of every weights file, :data:`WEIGHT_SUFFIXES`,
    symlinks followed; ``None`` for ``load_format`` ``dummy``, whose runs key on the config alone, and for a folder
    without weights). ``None`` for a model that is not a local path (a hub id: its name is its key)."""
    p = Path(model)
    if not p.exists():
        return None
    folder = p if p.is_dir() else p.parent
    cfg = folder / "config.json"
    try:
        config = hashlib.sha256(json.dumps(json.loads(cfg.read_text()), sort_keys=True).encode()).hexdigest()[:16]
    except (OSError, ValueError):
        config = None
    weights = None
    if load_format != "dummy":
        files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
        if files:
            h = hashlib.sha256()
            for f in files:
                h.update(f"{f.name}\0{file_digest(f)}\0".encode())
            weights = h.hexdigest()[:16]
    return {"config": config, "weights": weights}


def model_id(model: str, load_format: str = "auto") -> dict[str, Any]:
    """A model's part of any key (captures, scale sets): ``{"model": model_ref, "digest": model_digest}``."""
    return {"model": model_ref(model), "digest": model_digest(model, load_format)}


def engine_key(spec: EngineSpec) -> dict[str, Any]:
    """``spec.to_dict()`` with its model as :func:`model_ref` names it (what a key and a stored ``spec.json`` hold;
    :meth:`EngineSpec.from_dict` resolves it on the machine that reads it)."""
    return {**spec.to_dict(), "model": model_ref(spec.model)}


def run_descriptor(
    spec: EngineSpec, phases: Sequence[Phase], driver: str, sample_interval_s: float, code: Sequence[str] = ()
) -> dict[str, Any]:
    """Everything that determines a run's outcome, as JSON-able data (its hash names the run): the engine spec with
    its model as given (:func:`engine_key`) and what that model is (:func:`model_digest`, when it is a local path),
    driver, sampling interval, phases and :func:`run_versions` (vLLM, torch, the engine-side code and ``code``, the
    study's own). No absolute path: a checkout or store moved elsewhere finds the same runs."""
    digest = model_digest(spec.model, spec.load_format)
    return {
        **run_versions(code),
        "engine": engine_key(spec),
        **({"model_digest": digest} if digest is not None else {}),
        "driver": driver,
        "sample_interval_s": sample_interval_s,
        # "client" only when not the default, so runs stored before the field existed keep their hashes
        "phases": [
            {
                "name": p.name,
                "concurrency": p.concurrency,
                "n_requests": len(p.requests),
                "requests_digest": _requests_digest(p.requests),
                **({"client": p.client} if p.client != "stream" else {}),
            }
            for p in phases
        ],
    }


def run_dir_for(study: str, descriptor: dict[str, Any], root: Path | None = None) -> Path:
    return (root or runs_dir()) / study / spec_hash(descriptor)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def save(result: EngineResult, run_dir: Path, descriptor: dict[str, Any], log: Path | None = None) -> None:
    """Write a run folder atomically: every file into ``.<run_id>.tmp-<pid>`` beside it (``engine.json``
    last), then one rename onto ``run_dir`` (an earlier run there is moved aside first and removed after)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_dir.with_name(f".{run_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "spec.json").write_text(json.dumps(descriptor, indent=2, sort_keys=True))
    (tmp / "provenance.json").write_text(json.dumps(result.provenance, indent=2, default=_json_default))
    if len(result.records):
        result.records.to_parquet(tmp / "records.parquet", index=False)
    if len(result.samples):
        result.samples.to_parquet(tmp / "samples.parquet", index=False)
    if result.log_tail:
        (tmp / "worker.log.tail").write_text(result.log_tail)
    if log is not None and log.exists():
        shutil.copy(log, tmp / "worker.log")
    (tmp / "engine.json").write_text(
        json.dumps(
            {"status": result.status, "error": result.error, "engine": result.engine, "phases": result.phases},
            indent=2,
            default=_json_default,
        )
    )
    old = run_dir.with_name(f".{run_dir.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    if run_dir.exists():
        os.replace(run_dir, old)
    os.replace(tmp, run_dir)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold ``.<run_id>.lock`` beside ``run_dir`` (an exclusive ``flock``, released when the holder exits,
    however it exits) while a run is checked, run and saved."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(run_dir.with_name(f".{run_dir.name}.lock"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _final(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "engine.json").read_text()).get("status") in FINAL_STATUSES
    except (OSError, ValueError):
        return False


#: Set by ``fp8lab run`` for each notebook: a file to which every engine run the notebook loads or runs appends
#: one JSON line (its folder and provenance), so the report says on what device and vLLM the runs it shows ran.
RUNS_LOG_ENV = "FP8LAB_RUNS_LOG"
PROVENANCE_KEYS = ("device", "vllm", "torch", "driver", "date_utc", "fp8lab_commit")


#: Descriptor keys that name with what a run was measured (:func:`run_versions`) rather than what was measured:
#: part of the cache key of a normal run, ignored when a re-render looks a run up (:func:`stored_elsewhere`).
VERSION_KEYS = ("vllm", "torch", "engine_code", "study_code")


def stored_elsewhere(
    run_dir: Path, descriptor: dict[str, Any], done: str | Callable[[Path], bool] = "complete.json"
) -> Path | None:
    """For a re-render only (:func:`store_only`; a normal run never calls it, :func:`reusable` is its GPU-host
    counterpart): the stored run beside ``run_dir``
    whose ``spec.json`` equals ``descriptor`` in everything but :data:`VERSION_KEYS`, i.e. the same study measured
    under another vLLM, torch or engine code (the H200's 0.26.0 re-rendered on the CPU's 0.32.0), or stored before
    those keys were part of the descriptor; when this machine lacks the model's files (``descriptor`` has no
    ``model_digest``), by the model's name alone. Finished runs first (``done``: a file they hold, or a test of the
    folder), then the earliest measured (:func:`_alike`); ``None`` if none. The loaded run's own provenance still
    names its vLLM, so the page says where its numbers come from."""

    # a model whose files are not on this machine has no digest here: it is then found by its name (model_ref)
    skip = VERSION_KEYS if "model_digest" in descriptor else (*VERSION_KEYS, "model_digest")
    found = _alike(run_dir, descriptor, skip)
    finished = done if callable(done) else (lambda d: (d / done).exists())
    found.sort(key=lambda d: not finished(d))
    return found[0] if found else None


def _measured_on(run: Path) -> str:
    """When ``run`` was measured (its provenance's ``date_utc``, ISO 8601 in UTC, so it sorts as text); ``"~"``, after
    every date, where its provenance does not say."""
    try:
        return str(json.loads((run / "provenance.json").read_text()).get("date_utc") or "~")
    except (OSError, ValueError):
        return "~"


def _alike(run_dir: Path, descriptor: dict[str, Any], skip: Sequence[str]) -> list[Path]:
    """The stored folders beside ``run_dir`` whose ``spec.json`` equals ``descriptor`` but for the keys ``skip``,
    the earliest measured first (then by folder name). A store may hold the same spec measured twice (a later study
    re-measuring engines of the same spec under newer engine code, as Study 02 did Study 03's in 2026-12): the first
    measured is the one a page was made with, and one measured later never changes which run an earlier page loads.
    """

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in skip}

    want = json.dumps(strip(json.loads(json.dumps(descriptor, default=str))), sort_keys=True)
    found = []
    for f in sorted(run_dir.parent.glob("[!.]*/spec.json")):  # hidden folders are half-written runs
        try:
            have = json.dumps(strip(json.loads(f.read_text())), sort_keys=True)
        except (OSError, ValueError):
            continue
        if have == want:
            found.append(f.parent)
    return sorted(found, key=lambda d: (_measured_on(d), d.name))


def reusable(run_dir: Path, descriptor: dict[str, Any]) -> Path | None:
    """Under :func:`fp8lab.paths.reuse_stored` (a GPU host re-measuring one part of a study whose other parts are in a
    committed store): the finished run beside ``run_dir`` of the same spec, phases and model
    (:func:`stored_elsewhere`) that the vLLM installed here measured, by its provenance; ``None`` for any other, so a
    run of another vLLM is measured again. Its provenance keeps the fp8lab commit and date that measured it."""
    here = devices.installed_version("vllm")
    for kept in _alike(run_dir, descriptor, VERSION_KEYS):  # the model's digest must match: the same weights
        try:
            measured_by = json.loads((kept / "provenance.json").read_text()).get("vllm")
        except (OSError, ValueError):
            continue
        if _final(kept) and measured_by is not None and measured_by == here:
            return kept
    return None


def from_store(spec: EngineSpec, run_dir: Path, descriptor: dict[str, Any] | None = None) -> EngineResult:
    """For a re-render (:func:`store_only`): the stored run in ``run_dir``, else (given its ``descriptor``) the run
    of the same spec stored under another vLLM, torch or engine code (:func:`stored_elsewhere`); a stored failure
    shown as it was, not retried; or the ``error`` result of a run the store lacks. No engine starts either way."""
    if (run_dir / "engine.json").exists():
        return load(run_dir, spec)
    kept = stored_elsewhere(run_dir, descriptor, done=_final) if descriptor is not None else None
    if kept is not None:
        return load(kept, spec)
    import pandas as pd

    res = EngineResult(
        status="error",
        error=f"not in the results store ({run_dir}); ${STORE_ONLY_ENV} is set, so no engine was started",
        engine={},
        records=pd.DataFrame(),
        samples=pd.DataFrame(),
        phases={},
        provenance={},
        spec=spec,
        run_dir=run_dir,
    )
    note_run(run_dir, {}, res.status)
    return res


def note_run(run_dir: Path | str, provenance: dict[str, Any] | None, status: str | None = None) -> None:
    """Append ``run_dir`` and its provenance to ``$FP8LAB_RUNS_LOG`` when set (a no-op otherwise)."""
    log = os.environ.get(RUNS_LOG_ENV)
    if not log:
        return
    line = {"run_dir": str(run_dir), "status": status, **{k: (provenance or {}).get(k) for k in PROVENANCE_KEYS}}
    try:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=str) + "\n")
    except OSError:
        pass


def _widen(v: Any) -> Any:
    """One cell of a compact list column back to the wide dtype (nested lists recursively)."""
    import numpy as np

    if not isinstance(v, np.ndarray):
        return v
    if v.dtype == object:
        return np.array([_widen(x) for x in v] + [None], dtype=object)[:-1]
    if v.dtype.kind == "f" and v.dtype != np.float64:
        return v.astype(np.float64)
    if v.dtype.kind in "iu" and v.dtype != np.int64:
        return v.astype(np.int64)
    return v


def read_records(path: Path) -> Any:
    """``records.parquet`` as a DataFrame, compact columns widened (see the module's doc): a store written
    by :func:`save` and one slimmed by ``scripts/slim_store.py`` read the same."""
    import numpy as np
    import pandas as pd

    df = pd.read_parquet(path)
    for c in list(df.columns):
        s = df[c]
        if s.dtype == np.float32:
            df[c] = s.astype(np.float64)
        elif s.dtype == object:
            first = next((v for v in s if isinstance(v, np.ndarray)), None)
            if first is not None and (first.dtype == object or first.dtype not in (np.float64, np.int64)):
                df[c] = s.map(_widen)
    ticks = [c for c in df.columns if re.fullmatch(r"itl_e\d+", c)]
    if ticks and "itl_s" not in df.columns:
        scale = 10.0 ** int(ticks[0][5:])
        df[ticks[0]] = df[ticks[0]].map(lambda v: v / scale if isinstance(v, np.ndarray) else v)
        df = df.rename(columns={ticks[0]: "itl_s"})
    return df


def load(run_dir: Path, spec: EngineSpec | None = None) -> EngineResult:
    """Read a stored run back into an :class:`EngineResult`."""
    import pandas as pd

    meta = json.loads((run_dir / "engine.json").read_text())
    prov_path = run_dir / "provenance.json"
    rec, smp = run_dir / "records.parquet", run_dir / "samples.parquet"
    if spec is None and (run_dir / "spec.json").exists():
        spec = EngineSpec.from_dict(json.loads((run_dir / "spec.json").read_text())["engine"])
    prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    note_run(run_dir, prov, meta["status"])
    return EngineResult(
        status=meta["status"],
        error=meta.get("error"),
        engine=meta.get("engine", {}),
        records=read_records(rec) if rec.exists() else pd.DataFrame(),
        samples=read_records(smp) if smp.exists() else pd.DataFrame(),
        phases=meta.get("phases", {}),
        provenance=prov,
        spec=spec,
        run_dir=run_dir,
        extra={"cached": True},
    )


def run_cached(
    spec: EngineSpec,
    phases: Sequence[Phase] | Sequence[Request] = (),
    *,
    study: str = "adhoc",
    driver: Driver = "llm",
    sample_interval_s: float = 0.25,
    root: Path | None = None,
    force: bool = False,
    env: dict[str, str] | None = None,
) -> EngineResult:
    """Run (or load, when already complete) one engine configuration and store it.

    The run directory is ``<root or $FP8LAB_RUNS or runs/>/<study>/<hash>``. A stored run with a
    final status is returned as it is (``extra['cached'] = True``) unless ``force``.
    """
    import multiprocessing as mp

    if getattr(mp.current_process(), "_inheriting", False):  # a spawned worker re-running an unguarded script
        raise RuntimeError(
            "run_cached was called while a spawned engine worker imported the calling script: guard "
            "the script's top-level code with `if __name__ == '__main__':` (multiprocessing's spawn "
            "re-imports it)"
        )
    phase_list = _as_phases(phases)
    desc = run_descriptor(spec, phase_list, driver, sample_interval_s)
    rd = run_dir_for(study, desc, root)
    if not force and _final(rd):  # a stored run is loaded wherever it was measured
        return load(rd, spec)
    if store_only():  # a re-render shows what the store holds, a failure as it was, before asking this device
        if (rd / "engine.json").exists():
            return load(rd, spec)
        kept = stored_elsewhere(rd, desc, done=_final)  # the same run under another vLLM, torch or engine code
        if kept is not None:
            return load(kept, spec)
    kept = reusable(rd, desc) if reuse_stored() else None
    if kept is not None:
        return load(kept, spec)
    skipped = unsupported_result(spec)  # not run here and not stored: the device lacks the kernel (capability.py)
    if skipped is not None:
        return skipped
    if store_only():  # re-rendering reports from committed stores: never start an engine
        return from_store(spec, rd, desc)
    with run_lock(rd):
        if not force and _final(rd):  # another process finished it while this one waited
            return load(rd, spec)
        for stale in rd.parent.glob(f".{rd.name}.*-*"):  # left by a process killed mid-run (this one holds the lock)
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        work = rd.with_name(f".{rd.name}.work-{os.getpid()}")
        res = run_engine(spec, phase_list, driver=driver, sample_interval_s=sample_interval_s, work_dir=work, env=env)
        save(res, rd, desc, log=work / "worker.log")
        shutil.rmtree(work, ignore_errors=True)
    res.run_dir = rd
    note_run(rd, res.provenance, res.status)
    return res


def collect(study: str, root: Path | None = None) -> Any:
    """All stored runs of a study as one DataFrame: a row per run with its spec, status and engine figures."""
    import pandas as pd

    rows = []
    for rd in sorted(((root or runs_dir()) / study).glob("[!.]*/engine.json")):
        meta = json.loads(rd.read_text())
        spec = json.loads((rd.parent / "spec.json").read_text())
        rows.append(
            {
                "run_id": rd.parent.name,
                "status": meta["status"],
                "error": meta.get("error"),
                **{f"spec.{k}": v for k, v in spec["engine"].items()},
                **meta.get("engine", {}),
            }
        )
    return pd.DataFrame(rows)


def phase_table(study: str, root: Path | None = None) -> Any:
    """One row per stored run and workload phase of a study: ``run_id, kv_cache_dtype, tag, phase,
    status, requests, prompt_tokens, output_tokens, wall_s`` (the phase's wall time, seconds),
    ``output_tok_s``, ``ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, tpot_p99_ms`` (per request; TPOT excludes
    the first token) and ``preemptions``. Read from the store alone (``engine.json`` and
    ``records.parquet``), so a study cut short can still be tabulated from what it finished."""
    import numpy as np
    import pandas as pd

    rows = []
    for ej in sorted(((root or runs_dir()) / study).glob("[!.]*/engine.json")):
        meta = json.loads(ej.read_text())  # not load(): the spec's model path may not exist on this machine
        rec_path = ej.parent / "records.parquet"
        rec = read_records(rec_path) if rec_path.exists() else pd.DataFrame()
        for phase, ph in (meta.get("phases") or {}).items():
            r = rec[rec.phase == phase] if len(rec) and "phase" in rec else rec.iloc[0:0]
            ttft = percentiles(r.ttft_s.to_numpy(float) * 1e3) if "ttft_s" in r else {}
            tpot = percentiles(r.tpot_s.to_numpy(float) * 1e3) if "tpot_s" in r else {}
            tags = sorted(set(r.tag.dropna())) if "tag" in r else []
            rows.append(
                {
                    "run_id": ej.parent.name,
                    "kv_cache_dtype": (meta.get("engine") or {}).get("kv_cache_dtype"),
                    "tag": ",".join(tags),
                    "phase": phase,
                    "status": meta["status"],
                    "requests": ph.get("requests"),
                    "prompt_tokens": ph.get("prompt_tokens"),
                    "output_tokens": ph.get("output_tokens"),
                    "wall_s": ph.get("wall_s"),
                    "output_tok_s": throughput(0, ph.get("output_tokens") or 0, ph.get("wall_s") or 0)["output_tok_s"],
                    "ttft_p50_ms": ttft.get("p50", np.nan),
                    "ttft_p99_ms": ttft.get("p99", np.nan),
                    "tpot_p50_ms": tpot.get("p50", np.nan),
                    "tpot_p99_ms": tpot.get("p99", np.nan),
                    "preemptions": ph.get("preemptions"),
                }
            )
    return pd.DataFrame(rows)


def run_emulated(
    spec: Any, phases: Any = (), *, study: str, scale_set: str | None = None, base_model: str | None = None, **kw: Any
) -> Any:
    """Run ``spec`` (an FP8 :class:`fp8lab.specs.EngineSpec`) as an emulated-FP8 engine: ``kv_cache_dtype="auto"``
    on ``base_model`` (default ``spec.model``; a scale set's own folder would make vLLM switch to a native FP8
    cache, so pass the base model and the set as ``scale_set``), stored apart from native runs in the study
    folder ``<study>.fp8emu-<format>[-<scale set>]``. Returns the :class:`fp8lab.engine.run.EngineResult` with
    ``extra['emulated']`` set to the format."""
    env = fp8emu.env_for(spec.kv_cache_dtype, scale_set)
    tag = f"{study}.fp8emu-{env[fp8emu.ENV]}" + (f"-{Path(scale_set).name}" if scale_set else "")
    res = run_cached(
        spec.replace(kv_cache_dtype="auto", model=base_model or spec.model), phases, study=tag, env=env, **kw
    )
    res.extra["emulated"] = env[fp8emu.ENV]
    return res
