"""Running Study 04: :func:`run_study` starts (or loads, through :func:`fp8lab.engine.results.run_cached`) every engine of
a :class:`~fp8lab.longctx.spec.LongCtxPlan` (the ramps, the block-size sweep, the boundary probes, the separate
quality engines, and on a device without the native FP8 KV kernel the emulated quality engines) and collects
what they recorded into one :class:`LongCtxResult` of tidy frames; :func:`plan_table` shows the engines before
any starts. The tables are computed from that result by :mod:`fp8lab.longctx.tables`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.longctx.boundary import longest_context, parse_estimated_max_len, predicted_num_blocks
from fp8lab.longctx.documents import PasskeyItem
from fp8lab.longctx.phases import fit_phases, phase_meta, quality_phases, ramp_phases, sweep_phases
from fp8lab.longctx.spec import STUDY, LongCtxPlan
from fp8lab.specs import EngineSpec, Phase


@dataclass
class LongCtxResult:
    """What :func:`run_study` produced: one entry per engine in ``runs`` (``role``: ramp | sweep | probe |
    quality, ``kv_dtype``, ``block_size`` asked for, ``max_model_len``, ``result``), the ramp's resolved
    block size, the passkey items, and tidy frames: ``engines`` (one row per engine), ``records`` (one
    row per request, with ``role, kv_dtype, block_size, kind, concurrency, length``) and ``phases`` (one
    row per engine and phase, with the sampled peaks)."""

    plan: LongCtxPlan
    runs: list[dict[str, Any]]
    block_size: int
    passkey: list[PasskeyItem]
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)
    records: pd.DataFrame = field(default_factory=pd.DataFrame)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)
    wall_s: float = 0.0
    emulated: list[str] = field(default_factory=list)  # labels of FP8 dtypes whose quality phases ran emulated
    notes: list[str] = field(default_factory=list)  # what was not measured natively and why (fp8lab.engine.capability)

    @property
    def quality_candidates(self) -> list[str]:
        """The candidate labels whose quality phases (divergence, passkey) may have run, each compared with
        ``auto``: the plan's FP8 dtypes (native), then those that ran emulated (``fp8 (emulated)``, on a device
        without the FP8 KV kernel). Every quality table and claim reads its candidates from here."""
        return [*self.plan.kv_dtypes[1:], *self.emulated]

    def results(self, role: str, kv_dtype: str | None = None) -> list[Any]:
        """The engine results of ``role`` (and ``kv_dtype``), in run order."""
        return [r["result"] for r in self.runs if r["role"] == role and (kv_dtype is None or r["kv_dtype"] == kv_dtype)]


def ramp_max_model_len(plan: LongCtxPlan, kv_dtype: str, block_size: int) -> int:
    """The ramp engine's ``max_model_len``: the plan's, unless the formula says the KV budget cannot hold
    it; then the longest context it holds (when that still fits the shortest ramp request), so the
    engine starts and measures every length that fits instead of crashing into the boundary."""
    mml = plan.engine_spec(kv_dtype).max_model_len
    nb = predicted_num_blocks(plan, kv_dtype, block_size)
    if nb is not None and plan.lengths[0] + plan.output_tokens <= longest_context(nb, block_size) < mml:
        return longest_context(nb, block_size)
    return mml


def plan_table(plan: LongCtxPlan) -> pd.DataFrame:
    """The engines the study will start (before any starts): role, dtype, block size, max_model_len,
    phases and prompt tokens, so the cost is visible up front (probes: start only)."""
    bs = plan.resolved_block_size()
    rows = []
    ramp = ramp_phases(plan) + (quality_phases(plan)[0] if plan.quality_merged else [])
    for dt in plan.kv_dtypes:
        mml = ramp_max_model_len(plan, dt, bs)
        fit = fit_phases(ramp, mml)
        rows.append(
            {
                "role": "ramp",
                "kv_dtype": dt,
                "block_size": bs,
                "max_model_len": mml,
                "phases": len(fit),
                "requests": sum(len(p.requests) for p in fit),
                "prompt_tokens": sum(r.prompt_len for p in fit for r in p.requests),
            }
        )
    sw = sweep_phases(plan)
    for dt in plan.sweep_dtypes:
        for b in plan.sweep_block_sizes:
            if b == bs and dt in plan.kv_dtypes:
                continue
            rows.append(
                {
                    "role": "sweep",
                    "kv_dtype": dt,
                    "block_size": b,
                    "max_model_len": max(plan.sweep_lengths, default=0) + plan.output_tokens,
                    "phases": len(sw),
                    "requests": sum(len(p.requests) for p in sw),
                    "prompt_tokens": sum(r.prompt_len for p in sw for r in p.requests),
                }
            )
    if plan.probe_boundary:
        for dt in plan.kv_dtypes:
            nb = predicted_num_blocks(plan, dt, bs)
            rows.append(
                {
                    "role": "probe",
                    "kv_dtype": dt,
                    "block_size": bs,
                    "max_model_len": longest_context(nb, bs) + bs if nb is not None else None,
                    "phases": 0,
                    "requests": 0,
                    "prompt_tokens": 0,
                }
            )
    if plan.quality_model is not None and not plan.quality_merged:
        qp = quality_phases(plan)[0]
        for dt in plan.kv_dtypes:
            rows.append(
                {
                    "role": "quality",
                    "kv_dtype": dt,
                    "block_size": plan.block_size,
                    "max_model_len": plan.quality_context,
                    "phases": len(qp),
                    "requests": sum(len(p.requests) for p in qp),
                    "prompt_tokens": sum(r.prompt_len for p in qp for r in p.requests),
                }
            )
    return pd.DataFrame(rows)


def run_study(
    plan: LongCtxPlan, study: str = STUDY, runner: Callable[..., Any] | None = None, progress: bool = True
) -> LongCtxResult:
    """Run (or load) every engine of ``plan``: the ramps, the block-size sweep, the boundary probes and the
    separate quality engines, in that order; every failure is kept as an outcome and the study goes on.

    A ramp engine whose dtype cannot hold the ramp's ``max_model_len`` (predicted from the budget, or
    reported by vLLM's start-up error when vLLM sizes the cache) runs at the longest length it holds,
    and the longer lengths become ``over_capacity`` outcomes. ``runner`` replaces
    :func:`fp8lab.engine.results.run_cached` (same signature; tests pass a fake).
    """
    real_engines = runner is None  # a fake runner (tests) cannot emulate: the device's capability is not asked
    if runner is None:
        from fp8lab.engine.results import run_cached as runner
    t_start = time.perf_counter()
    bs = plan.resolved_block_size()
    runs: list[dict[str, Any]] = []
    q_phases, items = quality_phases(plan)

    def run(
        role: str,
        dt: str,
        spec: EngineSpec,
        phases: Sequence[Phase],
        emulate: bool = False,
        driver: str = "async",
        **kw: Any,
    ) -> Any:
        t = time.perf_counter()
        if emulate:  # an FP8 spec on an emulated-FP8 engine (fp8lab.engine.fp8emu), stored apart from native runs
            from fp8lab.engine import fp8emu

            env = fp8emu.env_for(spec.kv_cache_dtype)
            res = runner(
                spec.replace(kv_cache_dtype="auto"),
                list(phases),
                study=f"{study}.fp8emu-{env[fp8emu.ENV]}",
                driver=driver,
                sample_interval_s=0.1,
                env=env,
                **kw,
            )
            res.extra["emulated"] = env[fp8emu.ENV]
        else:
            res = runner(spec, list(phases), study=study, driver=driver, sample_interval_s=0.1, **kw)
        runs.append(
            {
                "role": role,
                "kv_dtype": dt,
                "block_size": spec.block_size or bs,
                "max_model_len": spec.max_model_len,
                "result": res,
            }
        )
        if progress:
            cached = " (cached)" if getattr(res, "extra", {}).get("cached") else ""
            err = f" - {res.error}" if res.status != "ok" else ""
            print(
                f"[{role}] kv_cache_dtype={dt} block_size={spec.block_size or bs} max_model_len={spec.max_model_len}: "
                f"{res.status}{cached} in {time.perf_counter() - t:.0f} s{err[:300]}",
                flush=True,
            )
        return res

    ramp_all = ramp_phases(plan) + (q_phases if plan.quality_merged else [])
    for dt in plan.kv_dtypes:
        spec = plan.engine_spec(dt)
        mml = ramp_max_model_len(plan, dt, bs)
        res = run("ramp", dt, spec.replace(max_model_len=mml), fit_phases(ramp_all, mml))
        est = parse_estimated_max_len(res.error) if res.status == "oom" else None
        if est is not None and plan.lengths[0] + plan.output_tokens <= est < mml:
            run("ramp", dt, spec.replace(max_model_len=est), fit_phases(ramp_all, est))

    if plan.sweep_lengths:
        sw = sweep_phases(plan)
        mml = max(plan.sweep_lengths) + plan.output_tokens
        for dt in plan.sweep_dtypes:
            for b in plan.sweep_block_sizes:
                if b == bs and dt in plan.kv_dtypes:
                    continue  # the ramp engine is this sweep point
                run("sweep", dt, plan.engine_spec(dt, block_size=b, max_model_len=mml), sw)

    if plan.probe_boundary:
        for dt in plan.kv_dtypes:
            ramp_runs = [r for r in runs if r["role"] == "ramp" and r["kv_dtype"] == dt]
            if any(parse_estimated_max_len(r["result"].error) for r in ramp_runs):
                continue  # the ramp itself crossed the boundary (vLLM sized the cache): no probe needed
            nb = predicted_num_blocks(plan, dt, bs)
            ok = [r["result"] for r in ramp_runs if r["result"].status == "ok"]
            if nb is None and ok:
                nb = int(ok[-1].engine["num_blocks"])
            if nb is None:
                continue
            over = longest_context(nb, bs) + bs
            if over > 10_000_000:
                continue
            # the probe is about memory, not positions; it only starts, so the offline driver (on a CPU its engine
            # core runs in the worker: no second process to start, fp8lab.engine.devices.engine_env)
            run(
                "probe",
                dt,
                plan.engine_spec(dt, max_model_len=over),
                (),
                driver="llm",
                env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
            )

    if plan.quality_model is not None and not plan.quality_merged and q_phases:
        for dt in plan.kv_dtypes:
            run("quality", dt, plan.engine_spec(dt, quality=True), q_phases)

    emulated, notes = _run_emulated(plan, q_phases, study, run) if real_engines else ([], [])
    out = LongCtxResult(plan=plan, runs=runs, block_size=bs, passkey=items, emulated=emulated, notes=notes)
    _collect(out)
    out.wall_s = time.perf_counter() - t_start
    return out


EMULATED_ROLE = "quality-emulated"


def emulated_kv_gib(model: str, phases: Sequence[Phase], longest: int) -> float:
    """A bf16 KV budget (GiB) for the emulated quality engine when the plan sets none: its phases' most concurrent
    sequences at their longest length, one 128-token block of slack each, x1.25, rounded up to 1/64 GiB. Without a
    budget vLLM's CPU backend reserves ``gpu_memory_utilization`` (0.9) of the NUMA node's memory and refuses to
    start when other processes hold more than the rest (seen on a 2-core AVX2 machine in the main job)."""
    import math

    from fp8lab import kvmath

    conc = max((p.concurrency for p in phases), default=1)
    need = conc * (longest + 128) * kvmath.kv_bytes_per_token(kvmath.load_layout(model), "auto") * 1.25
    return math.ceil(need / kvmath.GIB * 64) / 64


def _run_emulated(
    plan: LongCtxPlan, q_phases: Sequence[Phase], study: str, run: Callable[..., Any]
) -> tuple[list[str], list[str]]:
    """On a device without the native FP8 KV kernel: the quality phases (divergence, passkey) of each FP8
    dtype again on an emulated-FP8 engine (:mod:`fp8lab.engine.fp8emu`), labelled ``<dtype> (emulated)``; its ramp,
    sweep and probe engines stay ``unsupported`` (speed and capacity are never emulated). Returns the
    emulated labels and the sentences saying what was not measured and why."""
    from fp8lab.engine import fp8emu
    from fp8lab.engine.capability import emulation_note, kv_support

    qmodel = plan.quality_model or plan.model
    missing = [(dt, kv_support(dt, plan.model)) for dt in plan.kv_dtypes]
    missing = [(dt, sup) for dt, sup in missing if not sup.native]
    if not missing:
        return [], []
    notes = [
        f"Not measured: the long-context speed and capacity of kv_cache_dtype {', '.join(d for d, _ in missing)}, "
        f"because {missing[0][1].reason} (capacities shown for it are the formula's prediction)."
    ]
    labels = []
    if q_phases:
        for dt, sup in missing:
            if not sup.emulated or not kv_support(dt, qmodel).emulated:
                continue
            label = fp8emu.emulated_label(dt)
            spec = plan.engine_spec(dt, quality=plan.quality_model is not None)
            # a bf16 cache takes twice the bytes: twice the budget holds the tokens the FP8 engine would
            longest = max(r.prompt_len + r.max_tokens for p in q_phases for r in p.requests)
            spec = spec.replace(
                max_model_len=longest,
                kv_cache_gib=2 * spec.kv_cache_gib if spec.kv_cache_gib else emulated_kv_gib(qmodel, q_phases, longest),
            )
            run(EMULATED_ROLE, label, spec, q_phases, emulate=True)
            labels.append(label)
        if labels:
            notes.append(emulation_note(labels, missing[0][1].reason) + " Divergence and passkey only.")
    return labels, notes


def _collect(res: LongCtxResult) -> None:
    engines, recs, phases = [], [], []
    for i, run in enumerate(res.runs):
        r = run["result"]
        e = dict(r.engine or {})
        key = {"engine": i, "role": run["role"], "kv_dtype": run["kv_dtype"], "block_size": run["block_size"]}
        engines.append(
            {
                **key,
                "max_model_len_asked": run["max_model_len"],
                "status": r.status,
                "error": r.error,
                "vllm_estimated_max_len": parse_estimated_max_len(r.error),
                "cached": bool(getattr(r, "extra", {}).get("cached")),
                "run_dir": str(getattr(r, "run_dir", "") or ""),
                **{k: v for k, v in e.items() if not isinstance(v, (list, dict))},
            }
        )
        if r.status != "ok":
            continue
        if len(r.records):
            df = r.records.copy()
            for k, v in key.items():
                df[k] = v
            meta = pd.DataFrame([phase_meta(p) for p in df["phase"]], index=df.index)
            recs.append(pd.concat([df, meta], axis=1))
        smp = r.samples if len(r.samples) else pd.DataFrame(columns=["phase"])
        for name, ph in (r.phases or {}).items():
            s = smp[smp["phase"] == name] if "phase" in smp else smp.iloc[0:0]
            phases.append(
                {
                    **key,
                    "phase": name,
                    **phase_meta(name),
                    **{k: v for k, v in ph.items() if not isinstance(v, (list, dict))},
                    "running_peak": float(s["running"].max()) if "running" in s and len(s) else np.nan,
                    "waiting_peak": float(s["waiting"].max()) if "waiting" in s and len(s) else np.nan,
                    "num_blocks": e.get("num_blocks"),
                    "engine_block_size": e.get("block_size"),
                }
            )
    res.engines = pd.DataFrame(engines)
    res.records = pd.concat(recs, ignore_index=True) if recs else pd.DataFrame()
    res.phases = pd.DataFrame(phases)
