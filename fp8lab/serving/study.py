"""Study 01 on the study contract (:mod:`fp8lab.study`): :class:`Spec` (:class:`~fp8lab.serving.spec.ServingSpec`),
:func:`run` -> :class:`Results`, a thin adapter over :func:`~fp8lab.serving.run.run_study`, the memory bandwidth
(:func:`fp8lab.engine.bandwidth.resolve_bandwidth`), the fidelity check (:func:`~fp8lab.serving.fidelity.fidelity_check`)
and the existing tables, summary and verdict functions (it computes nothing of its own)::

    from fp8lab.serving import study as s01

    spec = s01.Spec.from_params(globals())
    res = s01.run(spec)
    res.tables()["deltas"], res.summary(), res.rows(), res.verdict(), res.markdown()

The verdicts: the claims audit's own rules (:mod:`fp8lab.audit`) for the claims this study is the evidence of
(:data:`CLAIMS`), applied to this run alone, as the audit applies them to each report before it weighs the
reports' settings; so a verdict here is what this run says on its own setting (a CPU run is an analogue the audit
never decides a GPU claim by). ``n``: the paired trials of a throughput claim, 1 for a count of KV blocks or a
capacity search; ``detectable``: the rule's smallest detectable effect."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fp8lab.paths import in_store
from fp8lab.serving.deltas import delta_table, method_table, noise_floor_table
from fp8lab.serving.fidelity import fidelity_check
from fp8lab.serving.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.serving.run import ServingResult, run_study
from fp8lab.serving.spec import ServingSpec
from fp8lab.serving.summary import run_device, summary_rows, summary_values
from fp8lab.serving.tables import (
    capacity_search,
    capacity_table,
    engine_table,
    itl_frame,
    kv_usage_timeline,
    latency_summary,
    open_loop_table,
    roofline_tables,
    throughput_table,
)
from fp8lab.serving.verdict import verdict
from fp8lab.study import Verdict

NAME = "01_kv_dtype_auto_vs_fp8"
#: What only the native FP8 KV kernel can measure here (an emulated cache is bf16-sized and slower): the report runs
#: no engine for it where the kernel is missing (:func:`fp8lab.report.degrade.gate`).
NATIVE_ONLY = "serving throughput, latency and measured KV capacity"
#: The claims audit's claims this study is the evidence of (:data:`fp8lab.audit.CLAIMS`), each with the audit's
#: per-report rule that judges it (a function of :mod:`fp8lab.audit`) and what ``n`` counts.
CLAIMS: dict[str, tuple[str, str]] = {
    "3a": ("rule_kv_halves", "blocks"),
    "4a": ("rule_concurrency_doubles", "search"),
    "5": ("rule_mix", "trials"),
    "8": ("rule_streaming_benchmark", "trials"),
    "24": ("rule_ttft_spread", "trials"),
}

#: The study contract's spec: the plan and the notebook's side measurements (``from_params`` reads UPPER_CASE names).
Spec = ServingSpec


@dataclass
class Results:
    """A Study 01 run (``result``, a :class:`~fp8lab.serving.run.ServingResult`), the spec it measured, the
    bandwidth the roofline used (``bandwidth``: :func:`fp8lab.engine.bandwidth.resolve_bandwidth`'s dict, None when the
    study did not run for every dtype) and the fidelity check's result (None when not asked for or not reached);
    every table, the summary and the verdicts computed once, on first use."""

    result: ServingResult
    spec: ServingSpec
    bandwidth: dict[str, Any] | None = None
    fidelity: dict[str, Any] | None = None

    @functools.cached_property
    def _tables(self) -> dict[str, Any]:
        res = self.result
        ladder, search = capacity_search(res)
        deltas = delta_table(res)
        roof = roofline_tables(res, self.bandwidth["bandwidth_gbs"]) if self.bandwidth else {}
        extra: dict[str, Any] = {}
        if res.plan.replicated:  # issue 35: every interval over engine pairs; the trial-level table kept beside it
            from fp8lab.serving import replication

            arms = res.arm_results or {res.plan.headline_arm: res}
            by_arm = {
                a: replication.engine_delta_table(r, a, trial_deltas=delta_table(r) if r is not res else deltas)
                for a, r in arms.items()
            }
            extra = {
                "trial_deltas": deltas,
                "deltas_by_arm": by_arm,
                "engine_values": pd.concat(
                    [replication.engine_values(r).assign(arm=a) for a, r in arms.items()], ignore_index=True
                ),
                "colocation": replication.colocation_table(by_arm),
            }
            deltas = by_arm[res.plan.headline_arm]
        return {
            "engines": engine_table(res),
            "capacity": capacity_table(res),
            "ladder": ladder,
            "search": search,
            "throughput": throughput_table(res),
            "latency": latency_summary(res),
            "latency_c1": latency_summary(res, concurrency=min(res.concurrency)),
            "itl": itl_frame(res),
            "open_loop": open_loop_table(res),
            "deltas": deltas,
            "methods": method_table(res, deltas),
            "noise_floor": noise_floor_table(res),
            "kv_usage": kv_usage_timeline(res, trial=0),
            "roofline_grid": roof.get("grid"),
            "roofline_measured": roof.get("measured"),
            **extra,
        }

    def tables(self) -> dict[str, Any]:
        """``engines`` (one row per engine run), ``capacity``, the capacity search's ``ladder`` and ``search``,
        ``throughput`` (closed-loop phases), ``latency`` (per class at the largest concurrency) and ``latency_c1``
        (at the smallest), ``itl`` (every gap at the largest concurrency), ``open_loop``, ``deltas`` (the paired
        comparisons), ``methods`` (streamed vs not), ``noise_floor``, ``kv_usage`` (the first trial's engines
        over time) and the roofline's ``roofline_grid`` / ``roofline_measured`` (None without a bandwidth). A
        replicated run (issue 35): every table of the headline arm (solo where it ran), ``deltas`` with the engine as
        the unit (:func:`~fp8lab.serving.replication.engine_delta_table`, ``n`` = engine pairs), ``trial_deltas``
        (the same over trials, as if independent), ``deltas_by_arm``, ``engine_values`` (one row per engine and
        metric) and ``colocation`` (:func:`~fp8lab.serving.replication.colocation_table`)."""
        return dict(self._tables)

    def _roof(self) -> dict[str, Any] | None:
        t = self._tables
        return None if t["roofline_grid"] is None else {"grid": t["roofline_grid"], "measured": t["roofline_measured"]}

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        t = self._tables
        out = summary_values(
            self.result,
            t["deltas"],
            t["capacity"],
            t["search"],
            t["open_loop"],
            bandwidth=self.bandwidth,
            fidelity=self.fidelity,
        )
        if "deltas_by_arm" in t:  # a replicated run's design, each arm's deltas and the co-location effect
            from fp8lab.serving.replication import summary_keys

            out |= summary_keys(self.result, t["deltas_by_arm"], t["colocation"])
        return out

    @functools.cached_property
    def _rows(self) -> list[dict[str, Any]]:
        t = self._tables
        return summary_rows(self.result, t["deltas"], t["capacity"], t["search"])

    def summary(self) -> dict[str, Any]:
        """:func:`fp8lab.serving.summary.summary_values` of the run: what the notebook records."""
        return self._summary

    def rows(self) -> list[dict[str, Any]]:
        """:func:`fp8lab.serving.summary.summary_rows`: the typed rows recorded beside the summary."""
        return self._rows

    def verdict(self) -> tuple[Verdict, ...]:
        """The claims of :data:`CLAIMS`, each judged by the audit's rule on this run alone."""
        from fp8lab import audit
        from fp8lab.paths import runs_dir

        res, plan = self.result, self.spec.plan
        vllm = next(
            (r["result"].provenance.get("vllm") for r in res.runs if r["result"].status == "ok"),
            None,
        )
        index = {
            "notebooks": {
                NAME: {
                    "ran_on": {"device": run_device(res), "vllm": vllm},
                    "parameters": {
                        "MODEL": plan.engine.model,
                        "ENFORCE_EAGER": plan.engine.enforce_eager,
                        "LOAD_FORMAT": plan.engine.load_format,
                    },
                }
            }
        }
        rep = audit.Report("this run", runs_dir() / NAME, {NAME: self._summary}, index, {NAME: self._rows})
        s = self._summary
        trials = int(s["engines_per_dtype"] if s.get("replicated") else s["trials"])  # what the intervals are over
        return audit.judge_run(
            rep, NAME, {c: fn for c, (fn, _) in CLAIMS.items()}, lambda c: trials if CLAIMS[c][1] == "trials" else 1
        )

    def markdown(self) -> str:
        """:func:`fp8lab.serving.verdict.verdict`: the Markdown bullets, every number from the tables."""
        t = self._tables
        text = verdict(self.result, t["deltas"], t["capacity"], t["search"], self._roof(), self.fidelity)
        if self._summary.get("replicated"):
            from fp8lab.serving.replication import verdict_lines

            text = "\n".join([*verdict_lines(self._summary), text])
        return text


def run(
    spec: ServingSpec,
    store: Path | None = None,
    progress: bool = True,
    engine_factory: Callable[..., Any] | None = None,
) -> Results:
    """Run (or load) the paired study of ``spec`` in the results store ``store`` (None: ``$FP8LAB_RUNS`` or
    ``runs/``): :func:`~fp8lab.serving.run.run_study` (``progress`` and ``engine_factory`` passed on: tests give a
    fake engine); then, once every dtype has an engine that ran, the bandwidth of the roofline and, when
    ``spec.run_fidelity``, the fidelity check (its runs kept under ``<store>/fidelity``, so a check cut short
    resumes). A failed engine stays in the result (:func:`~fp8lab.serving.tables.require_ok` names it)."""
    from fp8lab.engine.bandwidth import resolve_bandwidth
    from fp8lab.paths import runs_dir

    plan = spec.plan
    with in_store(store):
        res = run_study(plan, progress=progress, engine_factory=engine_factory)
        ok = set(res.engines[res.engines.status == "ok"].kv_dtype) if len(res.engines) else set()
        if not set(plan.kv_dtypes) <= ok:
            return Results(res, spec)
        bw = resolve_bandwidth(spec.bandwidth_gbs)
        fid = None
        if spec.run_fidelity:
            fid = fidelity_check(
                plan.spec_for(plan.kv_dtypes[-1]),
                *spec.fidelity_shape,
                rounds=spec.fidelity_rounds,
                tolerance=spec.fidelity_tolerance,
                tokenizer=spec.fidelity_tokenizer,
                prompt_source=plan.prompt_source,
                store=runs_dir() / "fidelity",
                progress=progress,
            )
    return Results(res, spec, bw, fid)
