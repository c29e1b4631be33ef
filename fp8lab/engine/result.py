"""What one engine run produced and why it failed: :class:`EngineResult`, the statuses (:data:`Status`), the
failure classes (:func:`classify_failure`) and a worker log's root cause (:func:`root_cause`). Standard library only,
so the store, the capability check and every study read results without importing the engine."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fp8lab.specs import EngineSpec

Status = Literal["ok", "oom", "unsupported", "invalid", "timeout", "error"]

# Root-cause patterns, first match wins: (status, regex over the worker log and the exception).
_FAILURE_PATTERNS: list[tuple[str, str]] = [
    (
        "oom",
        r"out of memory|OutOfMemoryError|CUDA error: out of memory|less than requested memory|"
        r"larger than the available KV cache memory|No available memory for the cache blocks|"
        r"Insufficient memory|Cannot allocate memory|MemoryError",
    ),
    (
        "unsupported",
        r"No valid attention backend|not supported|Unsupported|NotImplementedError|"
        r"does not support|requires SM|is not available|No common block size",
    ),
    ("invalid", r"ValidationError|Input should be|must be|exceeds|is greater than|invalid|TypeError: .*argument"),
]


@dataclass
class EngineResult:
    """What one engine run produced.

    ``engine``: per-engine figures (``num_blocks``, ``block_size``, ``kv_capacity_tokens``,
    ``kv_cache_dtype``, ``kv_budget_bytes``, ``engine_start_s``, ``mem_*_bytes``, ...);
    ``records``: one row per request (pandas DataFrame); ``samples``: the KV-usage / memory time
    series; ``phases``: per-phase wall time, token counts, preemptions, peaks.
    """

    status: Status
    error: str | None
    engine: dict[str, Any]
    records: Any
    samples: Any
    phases: dict[str, Any]
    provenance: dict[str, Any]
    spec: EngineSpec | None = None
    log_tail: str = ""
    run_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def classify_failure(text: str) -> Status:
    """Map a failure's message (exception plus worker log) to a status."""
    for status, pattern in _FAILURE_PATTERNS:
        if re.search(pattern, text, flags=re.IGNORECASE):
            return status  # type: ignore[return-value]
    return "error"


_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM 0.26 prefixes every stdout/stderr line of its child processes (EngineCore, workers) with
# "(EngineCore pid=123) ", tracebacks included; ERROR records carry "ERROR mm-dd hh:mm:ss [file:line] ".
_PROC_PREFIX_RE = re.compile(r"^\([^()]*? pid=\d+\)\s*")
_ERROR_HEADER_RE = re.compile(r"^(?:ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s?")


def _log_line(line: str) -> str:
    """A worker-log line without colour codes, vLLM's process prefix and an ERROR record's header."""
    line = _PROC_PREFIX_RE.sub("", _ANSI_RE.sub("", line).strip())
    return _ERROR_HEADER_RE.sub("", line).strip()


#: glibc's own last words before it aborts a process whose heap a native kernel corrupted ("malloc(): unaligned
#: tcache chunk detected", "double free or corruption (out)", "free(): invalid pointer", ...): no Python error follows,
#: and the aborting process may even hang on a lock the corruption left held.
GLIBC_FATAL_RE = re.compile(
    r"^(?:(?:malloc|free|realloc|calloc|munmap_chunk|malloc_consolidate)\(\)|double free|corrupted \w|\*\*\* stack smashing)"
)


def glibc_fatal(log: str) -> str | None:
    """The first glibc abort message in a worker log (heap corruption in native code), or None."""
    for ln in log.splitlines():
        ln = _log_line(ln)
        if GLIBC_FATAL_RE.match(ln):
            return ln[:300]
    return None


def root_cause(log: str, fallback: str | None) -> str:
    """The most telling error line of a worker log: the last ``SomeError: ...`` line, else glibc's abort message
    (heap corruption in native code, :func:`glibc_fatal`) naming it so, else ``fallback``."""
    lines = [_log_line(ln) for ln in log.splitlines()]
    hits = [i for i, ln in enumerate(lines) if re.match(r"^[\w.]*(Error|Exception|error)\b.*:", ln)]
    hits = [i for i in hits if not lines[i].startswith("RuntimeError: Engine core initialization failed")] or hits
    if not hits:
        fatal = glibc_fatal(log)
        if fatal:
            return f"heap corruption in native code, glibc aborted: {fatal}" + (f" ({fallback})" if fallback else "")
        return fallback or "unknown failure"
    i = hits[-1]
    msg = lines[i]
    if "validation error" in msg:  # pydantic puts the field and the reason on the next lines
        msg += " " + " ".join(ln for ln in lines[i + 1 : i + 4] if ln and not ln.startswith("For further"))
    return msg[:2000]
