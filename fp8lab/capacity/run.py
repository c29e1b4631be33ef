"""Run Study 00: :func:`run_capacity` reads every config's layout, measures one engine per kv dtype (or loads it
from the results store; none with ``measure=False``) and checks the engines on record, and returns a
:class:`CapacityRun`. Everything else of the study is arithmetic on the layouts (:mod:`fp8lab.capacity.tables`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp8lab import kvmath
from fp8lab.capacity.check import check_runs
from fp8lab.capacity.records import records_check
from fp8lab.capacity.spec import STUDY, CapacitySpec


@dataclass
class CapacityRun:
    """What :func:`run_capacity` produced: the spec, every layout by name (the model first, then the configs; a
    config of the same name as the model is the model's), the measured check (:func:`~fp8lab.capacity.check.
    capacity_check`'s table) with the engine result behind each of its rows (None: not started), and the table of
    the engines on record (None without ``engine_records``)."""

    spec: CapacitySpec
    layouts: dict[str, kvmath.KVLayout]
    check: Any
    check_results: list[Any] = field(default_factory=list)
    records: Any = None

    @property
    def device(self) -> str | None:
        """The device the measured engines ran on (their provenance), None when none ran."""
        for r in self.check_results:
            device = (getattr(r, "provenance", None) or {}).get("device")
            if device:
                return str(device)
        return None


def run_capacity(
    spec: CapacitySpec, store: Path | None = None, runner: Callable[..., Any] | None = None
) -> CapacityRun:
    """Layouts, the measured check (engines in the results store ``store``, None: ``$FP8LAB_RUNS`` or ``runs/``;
    ``runner`` replaces :func:`fp8lab.engine.results.run_cached`: tests give a fake engine) and the engines on record."""
    layouts = {lay.name: lay for lay in map(kvmath.load_layout, [spec.model, *spec.configs])}
    check, results = check_runs(
        spec.model,
        spec.kv_dtypes,
        spec.kv_cache_gib,
        spec.block_size,
        max_model_len=spec.max_model_len,
        tensor_parallel_size=spec.tp,
        measure=spec.measure,
        study=STUDY,
        runner=runner,
        store=store,
    )
    records = records_check(list(spec.engine_records)) if spec.engine_records else None
    return CapacityRun(spec, layouts, check, results, records)


__all__ = ["CapacityRun", "run_capacity"]
