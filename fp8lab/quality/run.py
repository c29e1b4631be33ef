"""Running Study 03's engines: :func:`run_quality` (a reference ``auto`` run, then every KV config, each through the
results store) -> :class:`QualityRuns`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.quality.inputs import CopyItem, copy_task_items, greedy_phase, load_prompt_set, ppl_windows, study_phases
from fp8lab.quality.metrics import as_ids
from fp8lab.quality.spec import BASELINE, KVConfig, QualitySpec
from fp8lab.specs import (
    Phase,
)


@dataclass
class QualityRuns:
    """The runs of one study: the reference ``auto`` run and one measured run per KV config."""

    spec: QualitySpec
    configs: tuple[KVConfig, ...]
    prompts: pd.DataFrame
    reference: Any
    results: dict[str, Any]
    windows: list[tuple[int, ...]] = field(default_factory=list)
    task: list[CopyItem] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)  # what every measured config ran (add configs with these)
    notes: list[str] = field(default_factory=list)  # what was not measured natively and why (fp8lab.engine.capability)

    @property
    def ok_labels(self) -> list[str]:
        return [c.label for c in self.configs if self.results[c.label].ok]

    def records(self, label: str, phase: str) -> pd.DataFrame:
        r = self.results[label].records
        return r[r.phase == phase].set_index("tag") if len(r) else pd.DataFrame()

    def reference_outputs(self) -> dict[str, list[int]]:
        r = self.reference.records
        return {t: as_ids(ids) for t, ids in zip(r.tag, r.output_token_ids, strict=True)}

    def status_table(self) -> pd.DataFrame:
        """One row per engine run: label, dtype, model, status (a failure keeps its reason), timings."""
        rows = []
        for lab, res in [("auto (reference)", self.reference)] + [
            (c.label, self.results[c.label]) for c in self.configs
        ]:
            e = res.engine or {}
            rows.append(
                {
                    "label": lab,
                    "kv_cache_dtype": res.spec.kv_cache_dtype if res.spec else None,
                    "model": Path(res.spec.model).name if res.spec else None,
                    "status": res.status,
                    "error": res.error,
                    "engine_start_s": e.get("engine_start_s"),
                    "run_wall_s": e.get("run_wall_s"),
                    "num_blocks": e.get("num_blocks"),
                    "cached": bool(res.extra.get("cached")),
                    "run_dir": str(res.run_dir),
                    # an emulated run's engine had an auto cache holding FP8-rounded K/V (fp8lab.engine.fp8emu)
                    "fp8_emulation": res.extra.get("emulated"),
                }
            )
        return pd.DataFrame(rows)


def run_quality(spec: QualitySpec, study: str = "03_quality", progress: bool = True) -> QualityRuns:
    """Run (or load from the results store) every engine of the study; see the module docstring.

    A failing candidate config is kept with its status and reason; a failing baseline raises.
    """
    from fp8lab.engine.results import run_cached

    def log(msg: str) -> None:
        if progress:
            print(msg, flush=True)

    configs = spec.configs
    prompts = load_prompt_set(spec.prompts, spec.tokenizer, spec.max_prompts_per_category)
    windows = ppl_windows(spec.tokenizer, spec.ppl_windows, spec.ppl_window_tokens)
    task = copy_task_items(
        spec.tokenizer,
        spec.task_items,
        spec.task_context_tokens,
        spec.task_cue_tokens,
        spec.task_answer_tokens,
        offset=spec.ppl_windows * spec.ppl_window_tokens,
        seed=spec.seed,
    )
    greedy = greedy_phase(prompts, spec)
    t0 = time.perf_counter()
    ref = run_cached(spec.engine_spec(configs[0]), [greedy], study=study)
    log(
        f"[reference auto] {ref.status} in {time.perf_counter() - t0:.0f} s{' (cached)' if ref.extra.get('cached') else ''}"
    )
    if not ref.ok:
        raise RuntimeError(f"the baseline (auto) failed: {ref.status}: {ref.error}")
    conts = {t: as_ids(ids) for t, ids in zip(ref.records.tag, ref.records.output_token_ids, strict=True)}
    phases = study_phases(spec, prompts, conts, windows, task)
    from fp8lab.engine import fp8emu
    from fp8lab.engine.capability import emulation_note, kv_support
    from fp8lab.engine.results import run_emulated

    results = {}
    ran, emulated, reasons = [], [], []
    for cfg in configs:
        t0 = time.perf_counter()
        sup = kv_support(cfg.kv_cache_dtype, cfg.model)
        if not sup.native and sup.emulated:  # no FP8 kernel here: the same engine, FP8-rounded K/V (fp8emu)
            cfg = KVConfig(fp8emu.emulated_label(cfg.label), cfg.model, cfg.kv_cache_dtype)
            res = run_emulated(
                spec.engine_spec(cfg),
                phases,
                study=study,
                base_model=spec.model,
                scale_set=cfg.model if cfg.model != spec.model else None,
            )
            emulated.append(cfg.label)
            reasons.append(sup.reason)
        else:
            res = run_cached(spec.engine_spec(cfg), phases, study=study)
        ran.append(cfg)
        results[cfg.label] = res
        log(
            f"[{cfg.label}] {res.status} in {time.perf_counter() - t0:.0f} s"
            f"{' (cached)' if res.extra.get('cached') else ''}{': ' + str(res.error) if not res.ok else ''}"
        )
    if not results[BASELINE].ok:
        raise RuntimeError(f"the baseline (auto) failed: {results[BASELINE].status}: {results[BASELINE].error}")
    notes = [emulation_note(emulated, reasons[0])] if emulated else []
    return QualityRuns(spec, tuple(ran), prompts, ref, results, windows, task, phases, notes)
