"""Typed, validated specs: one frozen dataclass per thing a study runs.

Every spec checks itself in ``__post_init__``; a bad value raises :class:`SpecError` (defined in
:mod:`fp8lab.errors`, re-exported here) naming the field, the value and what is allowed, before any engine
starts. Specs are plain data: they serialise to JSON (``to_dict``) and hash to a short content id
(``spec_hash``) that names the run directory in the results store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from fp8lab import realmodel
from fp8lab.errors import SpecError
from fp8lab.kvformats import check_kv_dtype
from fp8lab.paths import REPO_ROOT, runs_dir

#: A ``kv_cache_dtype`` name. Not a list written here: the names the installed vLLM accepts are checked by
#: :func:`check_kv_dtype` (:mod:`fp8lab.kvformats`; without vLLM, the formats the KV calculator knows).
KVDtype = str
ModelDtype = Literal["auto", "bfloat16", "float16", "float32"]
LoadFormat = Literal["auto", "safetensors", "dummy"]
Client = Literal["stream", "final"]
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256, 512)


def _name(obj: Any) -> str:
    """The spec's name in messages: a string is taken as the name itself."""
    return obj if isinstance(obj, str) else type(obj).__name__


def check_choice(obj: Any, name: str, value: Any, choices: Any) -> None:
    """``value`` must be one of ``choices`` (a ``Literal`` type or an iterable)."""
    allowed = get_args(choices) or tuple(choices)
    if value not in allowed:
        raise SpecError(_name(obj), name, value, "allowed: " + " | ".join(map(str, allowed)))


def check_int(
    obj: Any, name: str, value: Any, lo: int | None = None, hi: int | None = None, optional: bool = False
) -> None:
    """``value`` must be an int in ``[lo, hi]`` (``None`` too when ``optional``)."""
    if value is None and optional:
        return
    rng = f"an integer in [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
    if optional:
        rng += " or None"
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(_name(obj), name, value, rng)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SpecError(_name(obj), name, value, rng)


def check_float(
    obj: Any, name: str, value: Any, lo: float, hi: float, lo_open: bool = False, optional: bool = False
) -> None:
    """``value`` must be a number in ``(lo, hi]`` (``lo_open``) or ``[lo, hi]``."""
    if value is None and optional:
        return
    rng = f"a number in {'(' if lo_open else '['}{lo}, {hi}]" + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(_name(obj), name, value, rng)
    if value > hi or value < lo or (lo_open and value == lo):
        raise SpecError(_name(obj), name, value, rng)


def check_bool(obj: Any, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise SpecError(_name(obj), name, value, "True or False")


def resolve_model(model: str) -> str:
    """A model given as a path is made absolute (relative paths are tried against the
    working directory, then the repository root; ``<runs>/<path>``, as a run's key names a model folder inside the
    results store, against this machine's :func:`fp8lab.paths.runs_dir`); the real model's name
    (:data:`fp8lab.realmodel.NAME`, ``smollm2-135m-instruct``) is its converted folder
    (:func:`fp8lab.realmodel.model_dir`, made or not: see :func:`check_model_folder`); a hub id is returned
    unchanged. What a run's key holds is the model as given (:func:`fp8lab.engine.results.model_ref`), not this absolute
    path."""
    if model.startswith("<runs>/"):
        return str(runs_dir() / model[len("<runs>/") :])
    p = Path(model).expanduser()
    for cand in (p, REPO_ROOT / p):
        if cand.is_dir() or cand.is_file():
            return str(cand.resolve())
    if model.strip().lower() == realmodel.NAME:
        return str(realmodel.model_dir())
    return model


def real_model_problem(path: str) -> str | None:
    """If ``path`` is the real model's folder (:func:`fp8lab.realmodel.model_dir`), why it cannot be used (missing,
    or failing its manifest check), with the command that makes it; None for any other folder or a good one."""
    if Path(path) != realmodel.model_dir():
        return None
    return realmodel.problem(path)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def check_model_folder(
    obj: Any, name: str, value: str, allowed: str = "a local model folder holding config.json and weights"
) -> str:
    """``value`` resolved (:func:`resolve_model`); it must be a folder holding ``config.json``, and the real model's
    folder must pass its manifest check (:func:`real_model_problem`)."""
    path = resolve_model(value)
    if (why := real_model_problem(path)) is not None:
        raise SpecError(_name(obj), name, value, why)
    if not (Path(path) / "config.json").is_file():
        raise SpecError(_name(obj), name, path, allowed)
    return path


def check_tokenizer(obj: Any, value: str | None, model: str) -> str:
    """The tokenizer folder: ``value`` resolved, or the model's own folder when ``None``; it must hold a
    tokenizer file (:data:`TOKENIZER_FILES`)."""
    tok = resolve_model(value) if value else model
    if not any((Path(tok) / f).is_file() for f in TOKENIZER_FILES):
        raise SpecError(
            _name(obj),
            "tokenizer",
            value,
            f"None (the model's own tokenizer; none found in {tok}) or a tokenizer folder",
        )
    return tok


def check_file(obj: Any, name: str, value: str, allowed: str) -> str:
    """``value`` as an existing file: as given, else against the repository root (:func:`resolve_model`)."""
    p = Path(value)
    p = p if p.is_file() else Path(resolve_model(value))
    if not p.is_file():
        raise SpecError(_name(obj), name, value, allowed)
    return str(p)


def read_text(obj: Any, name: str, path: str | Path, allowed: str = "a non-empty UTF-8 text file") -> str:
    """The text of a prompt, corpus or data file; one that cannot be read, is not UTF-8 or holds nothing but
    whitespace raises :class:`SpecError` naming it (``allowed`` says what the file should be)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(_name(obj), name, str(path), f"{allowed} (byte {err.start} is not UTF-8)") from None
    except OSError as err:
        raise SpecError(_name(obj), name, str(path), f"{allowed} ({err.strerror or err})") from None
    if not text.strip():
        raise SpecError(_name(obj), name, str(path), f"{allowed} (this one is empty)")
    return text


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or model.count("/") != 1 or Path(model).exists()


@dataclass(frozen=True)
class EngineSpec:
    """One vLLM engine configuration.

    ``kv_cache_gib`` is the KV-cache budget in GiB, passed as ``kv_cache_memory_bytes`` on CPU and GPU
    alike (the worker drops ``VLLM_CPU_KVCACHE_SPACE``, which would override it); ``None`` lets vLLM size the cache from
    ``gpu_memory_utilization`` (GPU) or its own default (CPU). ``calculate_kv_scales``: ask vLLM
    for dynamic FP8 KV scales (passed only when True: vLLM 0.26 offers it, deprecated; 0.32 removed
    it and the engine fails with a TypeError, recorded as ``invalid``; vllm-notes section 4).
    """

    model: str
    kv_cache_dtype: KVDtype = "auto"
    block_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_gib: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = True
    load_format: LoadFormat = "auto"
    tensor_parallel_size: int = 1
    dtype: ModelDtype = "auto"
    seed: int = 0
    enable_prefix_caching: bool = False
    skip_tokenizer_init: bool = False
    attention_backend: str | None = None
    calculate_kv_scales: bool = False
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise SpecError(
                "EngineSpec", "model", self.model, "a local model folder, a config.json's folder, or a hub id"
            )
        # resolved, not checked: a stored spec.json names the measuring machine's folder, and a store copied to
        # another machine or path must still load (fp8lab.engine.results.load); check_paths() runs before an engine starts
        object.__setattr__(self, "model", resolve_model(self.model))
        check_kv_dtype(self, "kv_cache_dtype", self.kv_cache_dtype)
        if self.block_size is not None:
            check_choice(self, "block_size", self.block_size, BLOCK_SIZES)
        if self.max_model_len != -1:
            check_int(self, "max_model_len", self.max_model_len, 16, 10_000_000, optional=True)
        check_float(self, "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        check_float(self, "kv_cache_gib", self.kv_cache_gib, 0.0, 4096.0, lo_open=True, optional=True)
        check_int(self, "max_num_seqs", self.max_num_seqs, 1, 65536, optional=True)
        check_int(self, "max_num_batched_tokens", self.max_num_batched_tokens, 16, 10_000_000, optional=True)
        check_bool(self, "enforce_eager", self.enforce_eager)
        check_choice(self, "load_format", self.load_format, LoadFormat)
        check_int(self, "tensor_parallel_size", self.tensor_parallel_size, 1, 64)
        check_choice(self, "dtype", self.dtype, ModelDtype)
        check_int(self, "seed", self.seed, 0, 2**31 - 1)
        check_bool(self, "enable_prefix_caching", self.enable_prefix_caching)
        check_bool(self, "skip_tokenizer_init", self.skip_tokenizer_init)
        check_bool(self, "calculate_kv_scales", self.calculate_kv_scales)
        check_float(self, "timeout_s", self.timeout_s, 0.0, 86400.0, lo_open=True)

    def check_paths(self) -> None:
        """The checks that need this machine's file system, run when a run starts (before any engine starts), not
        when the spec is built: ``model`` given as a path must be a folder holding ``config.json``; the real model's
        folder must pass its manifest check."""
        if (why := real_model_problem(self.model)) is not None:
            raise SpecError("EngineSpec", "model", self.model, why)
        if _looks_like_path(self.model) and not (Path(self.model) / "config.json").is_file():
            raise SpecError(
                "EngineSpec",
                "model",
                self.model,
                "a folder holding config.json (none found there), or a hub id 'org/name'",
            )

    @property
    def is_fp8(self) -> bool:
        return self.kv_cache_dtype.startswith("fp8")

    def replace(self, **changes: Any) -> EngineSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpecError(cls.__name__, unknown[0], d[unknown[0]], "allowed fields: " + ", ".join(sorted(names)))
        return cls(**d)


def spec_hash(*parts: Any, n: int = 12) -> str:
    """Short content hash of specs/dicts (canonical JSON); the same content gives the same id."""

    def enc(p: Any) -> Any:
        if dataclasses.is_dataclass(p) and not isinstance(p, type):
            return {"__type__": type(p).__name__, **dataclasses.asdict(p)}
        return p

    blob = json.dumps([enc(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


@dataclass(frozen=True)
class Request:
    """One request: exact prompt token ids and an exact number of output tokens.

    ``max_tokens`` tokens are generated (``ignore_eos``) unless ``stop_at_eos``. ``cls`` names
    the request class (e.g. ``"short"``); ``arrival_s`` is the offset from the start of an
    open-loop schedule in seconds (``None`` for closed loop / offline).
    ``prompt_logprobs`` / ``logprobs``: how many top tokens to return per prompt / output position.
    ``temperature``: 0 (greedy, every study's default) or the sampling temperature (the fidelity check
    uses 1.0 with top-p 1, as ``vllm bench throughput`` does: sampling costs more than greedy).
    ``forced_token_ids``: the tokens the request must generate, forced step by step (:mod:`fp8lab.scoring`, scoring
    through the KV cache): exactly ``max_tokens`` of them, greedy, not stopping at EOS, with ``logprobs`` set.
    """

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    cls: str = "default"
    arrival_s: float | None = None
    prompt_logprobs: int | None = None
    logprobs: int | None = None
    stop_at_eos: bool = False
    tag: str = ""
    temperature: float = 0.0
    forced_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise SpecError("Request", "prompt_token_ids", (), "at least one token id")
        check_int(self, "max_tokens", self.max_tokens, 1, 10_000_000)
        check_float(self, "arrival_s", self.arrival_s, 0.0, 1e9, optional=True)
        check_int(self, "prompt_logprobs", self.prompt_logprobs, 0, 20, optional=True)
        check_int(self, "logprobs", self.logprobs, 0, 20, optional=True)
        check_float(self, "temperature", self.temperature, 0.0, 100.0)
        if self.forced_token_ids is not None:
            self._check_forced()

    def _check_forced(self) -> None:
        forced: Any = self.forced_token_ids  # whatever the caller passed: checked here, not by its annotation
        if isinstance(forced, (str, bytes)) or not hasattr(forced, "__iter__"):
            raise SpecError("Request", "forced_token_ids", forced, "a sequence of token ids (ints >= 0) or None")
        raw = tuple(forced)
        try:
            forced = tuple(operator.index(t) for t in raw if not isinstance(t, bool))
        except TypeError:
            forced = ()
        if not forced or len(forced) != len(raw) or min(forced) < 0:
            raise SpecError("Request", "forced_token_ids", raw[:8], "a non-empty sequence of ints >= 0")
        object.__setattr__(self, "forced_token_ids", forced)
        if self.max_tokens != len(forced):
            raise SpecError("Request", "max_tokens", self.max_tokens, f"len(forced_token_ids) = {len(forced)}")
        if self.stop_at_eos:
            raise SpecError(
                "Request", "stop_at_eos", True, "False with forced_token_ids (every forced token is scored)"
            )
        if self.temperature != 0.0:
            raise SpecError("Request", "temperature", self.temperature, "0.0 with forced_token_ids (greedy)")
        if self.logprobs is None:
            raise SpecError("Request", "logprobs", None, "an int 0..20 with forced_token_ids (the scores)")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


__all__ = [
    "BLOCK_SIZES",
    "EngineSpec",
    "KVDtype",
    "LoadFormat",
    "ModelDtype",
    "Phase",
    "Request",
    "SpecError",
    "TOKENIZER_FILES",
    "check_bool",
    "check_choice",
    "check_file",
    "check_float",
    "check_int",
    "check_kv_dtype",
    "check_model_folder",
    "check_tokenizer",
    "read_text",
    "real_model_problem",
    "resolve_model",
    "spec_hash",
]


@dataclass(frozen=True)
class Phase:
    """A named batch of requests run on one engine.

    With the ``llm`` driver the requests go to ``LLM.generate`` together (offline throughput).
    With the ``async`` driver each request is streamed: ``concurrency=N`` keeps N in flight
    (closed loop); ``concurrency=None`` sends each at its ``arrival_s`` (open loop).
    ``client="final"`` (async closed loop only) is the benchmark that does not read the stream: each
    of the N workers waits for its request's final output only, so no token times are seen (TTFT and
    ITL unobserved; E2E and tokens/s are); ``"stream"`` (the default) reads every delta.
    """

    name: str
    requests: tuple[Request, ...]
    concurrency: int | None = None
    client: Client = "stream"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise SpecError("Phase", "name", self.name, "a non-empty name without '/'")
        object.__setattr__(self, "requests", tuple(self.requests))
        if not all(isinstance(r, Request) for r in self.requests):
            raise SpecError("Phase", "requests", type(self.requests).__name__, "a sequence of fp8lab.specs.Request")
        check_int(self, "concurrency", self.concurrency, 1, 100_000, optional=True)
        check_choice(self, "client", self.client, Client)
        if self.client == "final" and self.concurrency is None:
            raise SpecError(
                "Phase",
                "client",
                self.client,
                "'final' only with a concurrency (a closed loop); open-loop phases stream",
            )
