"""Study 00's spec: :class:`CapacitySpec`, what the notebook computes and measures (the model and the published
configs, the KV dtypes, the GPU the capacity is planned on, the load of the total-memory comparison, the measured
engines' budget, and the results stores whose engines are checked), validated before any engine starts
(:class:`fp8lab.errors.SpecError` names the field, the value and what is allowed). Built from a notebook's
parameters by :meth:`CapacitySpec.from_params`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import kvmath
from fp8lab.specs import (
    BLOCK_SIZES,
    SpecError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_kv_dtype,
)

STUDY = "00_kv_memory"
NAME = "CapacitySpec"


def check_record_roots(roots: Any) -> list[str]:
    """``ENGINE_RECORDS`` checked before any engine starts: a list of existing paths (a results store, a study or
    run folder in one, a ``.tar.gz`` of a store, or a folder of them; :func:`fp8lab.capacity.records.run_dirs`)."""
    allowed = (
        "allowed: a list of existing paths, each a results store folder (runs/, $FP8LAB_RUNS), a study or run "
        "folder in one, a .tar.gz of a store, or a folder of them (reports/h200/records)"
    )
    if isinstance(roots, (str, bytes)) or not isinstance(roots, Sequence):
        raise SpecError("notebook", "ENGINE_RECORDS", roots, "not a list; " + allowed)
    for r in roots:
        if not isinstance(r, str) or not Path(r).exists():
            raise SpecError("notebook", "ENGINE_RECORDS", r, "no such path; " + allowed)
    return list(roots)


def _ints(name: str, value: Any, lo: int) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SpecError(NAME, name, value, f"a list of integers >= {lo}")
    for v in value:
        check_int(NAME, name, v, lo)
    return tuple(value)


@dataclass(frozen=True)
class CapacitySpec:
    """Notebook 00's parameters, checked. ``model``: the model folder (or ``config.json``) whose per-layer formula
    is shown and whose engines are measured; ``configs``: folder names under ``data/configs`` (or paths) tabulated
    beside it; ``kv_dtypes``: the first is the baseline of every ratio; ``tp``: tensor-parallel size (figures per
    rank). The curves: ``context_lens`` (tokens). The capacity plan: a GPU of ``gpu_memory_gib`` GiB at
    ``gpu_memory_utilization``, ``overhead_gib`` GiB for activations and CUDA graphs, sequences of
    ``plan_context_len`` tokens. Total memory: ``mem_batch`` sequences of ``mem_context_len`` tokens. Measured
    (``measure``): one engine per kv dtype with ``kv_cache_gib`` GiB of KV, ``block_size`` (None: vLLM's default),
    ``max_model_len``. ``engine_records``: results stores whose every engine is checked against the formula."""

    model: str
    configs: tuple[str, ...] = ()
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    tp: int = 1
    context_lens: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    gpu_memory_gib: float = 141.0
    gpu_memory_utilization: float = 0.9
    overhead_gib: float = 4.0
    plan_context_len: int = 32768
    mem_batch: int = 32
    mem_context_len: int = 8192
    measure: bool = True
    kv_cache_gib: float = 1.0
    block_size: int | None = None
    max_model_len: int | None = 2048
    engine_records: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise SpecError(NAME, "model", self.model, "a model folder or config.json path")
        if isinstance(self.configs, (str, bytes)) or not isinstance(self.configs, Sequence):
            raise SpecError(NAME, "configs", self.configs, "a list of folder names under data/configs (or paths)")
        object.__setattr__(self, "configs", tuple(self.configs))
        if isinstance(self.kv_dtypes, (str, bytes)) or not isinstance(self.kv_dtypes, Sequence) or not self.kv_dtypes:
            raise SpecError(NAME, "kv_dtypes", self.kv_dtypes, "a non-empty list; the first is the baseline")
        for d in self.kv_dtypes:
            check_kv_dtype(NAME, "kv_dtypes", d)
        if len(set(self.kv_dtypes)) != len(self.kv_dtypes):
            raise SpecError(NAME, "kv_dtypes", list(self.kv_dtypes), "each kv dtype once")
        object.__setattr__(self, "kv_dtypes", tuple(self.kv_dtypes))
        check_int(NAME, "tp", self.tp, 1, 1024)
        object.__setattr__(self, "context_lens", _ints("context_lens", self.context_lens, 1))
        check_float(NAME, "gpu_memory_gib", self.gpu_memory_gib, 0.0, 1e6, lo_open=True)
        check_float(NAME, "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, lo_open=True)
        check_float(NAME, "overhead_gib", self.overhead_gib, 0.0, 1e6)
        for name in ("plan_context_len", "mem_batch", "mem_context_len"):
            check_int(NAME, name, getattr(self, name), 1)
        check_bool(NAME, "measure", self.measure)
        check_float(NAME, "kv_cache_gib", self.kv_cache_gib, 0.0, 1e6, lo_open=True)
        if self.block_size is not None:
            check_choice(NAME, "block_size", self.block_size, BLOCK_SIZES)
        check_int(NAME, "max_model_len", self.max_model_len, 16, optional=True)
        object.__setattr__(self, "engine_records", tuple(check_record_roots(self.engine_records)))
        for src in (self.model, *self.configs):  # a bad path or config names its field here, before any engine
            kvmath.load_layout(src)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CapacitySpec:
        """From a notebook's UPPER_CASE parameters (``globals()``, or a profile's resolved parameters): ``TP`` is
        ``tp``; lower-case names and unknown names are ignored, missing ones take the defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k.lower(): v for k, v in params.items() if isinstance(k, str) and k.isupper() and k.lower() in names}
        return cls(**kw)

    @property
    def model_name(self) -> str:
        """The measured model's name (its folder's), as the formula table names it."""
        return kvmath.load_layout(self.model).name


__all__ = ["STUDY", "CapacitySpec", "check_record_roots"]
