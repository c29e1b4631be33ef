"""Study 06 on the study contract (:mod:`fp8lab.study`): :class:`Spec` (:class:`DecodeStudySpec`: the
:class:`~fp8lab.decode.spec.DecodeSpec`, the roofline's bandwidth and a store to render from), :func:`run` ->
:class:`Results`, a thin adapter over :func:`~fp8lab.decode.run.run_decode` (or :func:`~fp8lab.decode.run.find_run`),
:func:`~fp8lab.decode.run.store_bandwidth` and the existing tables, summary and verdict functions (it computes
nothing of its own)::

    from fp8lab.decode import study as s06

    spec = s06.Spec.from_params(globals())
    res = s06.run(spec)
    res.tables()["points"], res.summary(), res.rows(), res.verdict(), res.markdown()

The verdicts: the claims audit's own rules (:mod:`fp8lab.audit`) for the decode-speed claims this study is the
evidence of (:data:`CLAIMS`), applied to this run alone, as the audit applies them to each report before it weighs
the reports' settings (a CPU run is an analogue the audit never decides a GPU claim by). ``n``: the engines per dtype
(a replicated run, issue 35), else the paired repetitions per point; ``detectable``: the rule's smallest detectable effect."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab.decode.keynumbers import key_numbers  # noqa: F401  (the contract's: the index's numbers of this study)
from fp8lab.decode.run import DecodeRun, find_run, run_decode, store_bandwidth
from fp8lab.decode.spec import DecodeSpec, plan
from fp8lab.decode.summary import summary, summary_rows
from fp8lab.decode.tables import (
    ANCHORS,
    arm_table,
    capacity_table,
    crossover_table,
    fit_table,
    point_table,
    roofline_table,
)
from fp8lab.decode.verdict import verdict
from fp8lab.errors import SpecError
from fp8lab.specs import check_float
from fp8lab.study import Verdict

NAME = "06_decode_speed"
#: What only the native FP8 KV kernel can measure (:func:`fp8lab.report.degrade.gate`).
NATIVE_ONLY = "decode step time"
#: The claims audit's claims this study is the evidence of, each with the audit's per-report rule that judges it.
CLAIMS: dict[str, str] = {
    "6b": "rule_long_speed",
    "13a": "rule_gain_at_batch_1",
    "13b": "rule_cuts_at_128k",
    "17": "rule_long_tpot",
}


@dataclass(frozen=True)
class DecodeStudySpec:
    """Study 06 as its notebook runs it: the grid and its engines (``decode``, a
    :class:`~fp8lab.decode.spec.DecodeSpec`), the memory bandwidth of the roofline (``bandwidth_gbs`` in GB/s;
    None: the figure stored with the run, else measured; :func:`~fp8lab.decode.run.store_bandwidth`) and
    ``records``: a results store (or ``.tar.gz`` of one, or a folder of them) holding this spec's run, to render
    from without starting an engine (None: measure, or load from the results store)."""

    decode: DecodeSpec
    bandwidth_gbs: float | None = None
    records: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.decode, DecodeSpec):
            raise SpecError("DecodeStudySpec", "decode", type(self.decode).__name__, "a DecodeSpec")
        check_float(self, "bandwidth_gbs", self.bandwidth_gbs, 0.0, 1e6, lo_open=True, optional=True)
        if self.records is not None and not isinstance(self.records, (str, Path)):
            raise SpecError("DecodeStudySpec", "records", self.records, "a results store, .tar.gz of one, or None")

    @property
    def kv_dtypes(self) -> tuple[str, ...]:
        return self.decode.kv_dtypes

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DecodeStudySpec:
        """From notebook 06's UPPER_CASE parameters (``globals()``, or a profile's resolved parameters), the
        :class:`~fp8lab.decode.spec.DecodeSpec` built field by field as the notebook built it (so the same
        descriptor, the same stored run). A missing or bad parameter raises :class:`SpecError` naming it."""
        p = {k: v for k, v in params.items() if isinstance(k, str) and k.isupper()}
        try:
            decode = DecodeSpec(
                model=p["MODEL"],
                kv_dtypes=p["KV_DTYPES"],
                contexts=p["CONTEXTS"],
                batches=p["BATCHES"],
                reps=p["REPS"],
                decode_tokens=p["DECODE_TOKENS"],
                warmup=p["WARMUP"],
                kv_cache_gib=p["KV_CACHE_GIB"],
                gpu_memory_utilization=p["GPU_MEMORY_UTILIZATION"],
                max_model_len=p["MAX_MODEL_LEN"],
                max_num_batched_tokens=p["MAX_NUM_BATCHED_TOKENS"],
                max_prefill_tokens=p["MAX_PREFILL_TOKENS"],
                block_size=p["BLOCK_SIZE"],
                enforce_eager=p["ENFORCE_EAGER"],
                load_format=p["LOAD_FORMAT"],
                skip_tokenizer_init=p["SKIP_TOKENIZER_INIT"],
                tensor_parallel_size=p["TP"],
                attention_backend=p["ATTENTION_BACKEND"],
                concurrent_engines=p["CONCURRENT_ENGINES"],
                gpu_groups=p["GPU_GROUPS"],
                env=p["ENV"],
                engine_args=p["ENGINE_ARGS"],
                engines=p["ENGINES"],
                arms=p["ARMS"],
                solo_gpu_memory_utilization=p["SOLO_GPU_MEMORY_UTILIZATION"],
                solo_kv_cache_gib=p["SOLO_KV_CACHE_GIB"],
            )
            return cls(decode, bandwidth_gbs=p["BANDWIDTH_GBS"], records=p["RECORDS"])
        except KeyError as e:
            raise SpecError(
                "DecodeStudySpec", str(e.args[0]), "missing", "a parameter of notebook 06's parameters cell"
            ) from None


#: The study contract's spec.
Spec = DecodeStudySpec


@dataclass
class Results:
    """A stored Study 06 run (``run``, a :class:`~fp8lab.decode.run.DecodeRun`), the spec it measured and the
    bandwidth of its roofline (:func:`~fp8lab.decode.run.store_bandwidth`'s dict); every table, the summary and the
    verdicts computed once, on first use."""

    run: DecodeRun
    spec: DecodeStudySpec
    bandwidth: dict[str, Any]

    @functools.cached_property
    def _tables(self) -> dict[str, Any]:
        import pandas as pd

        run = self.run
        return {
            "grid": plan(self.spec.decode),
            "capacity": capacity_table(run),
            "points": point_table(run),
            "fits": fit_table(run),
            "crossovers": crossover_table(run),
            "colocation": arm_table(run),
            "roofline": roofline_table(run, self.bandwidth["bandwidth_gbs"]),
            "anchors": pd.DataFrame(ANCHORS),
        }

    def tables(self) -> dict[str, Any]:
        """``grid`` (the points and why any is left out), ``capacity`` (KV blocks against the formula), ``points``
        (per batch and context: both dtypes' steps, the paired ratio), ``fits`` (per dtype and batch, step against
        context), ``crossovers`` (per batch; per arm in a replicated run), ``colocation`` (co-located against solo: the fixed
        cost's difference per round, issue 35; empty unless both arms ran), ``roofline`` (the bandwidth bound's fraction) and ``anchors`` (the
        published fits, with their setting)."""
        return dict(self._tables)

    @functools.cached_property
    def _summary(self) -> dict[str, Any]:
        return summary(self.run, self.bandwidth["bandwidth_gbs"])

    @functools.cached_property
    def _rows(self) -> list[dict[str, Any]]:
        return summary_rows(self.run)

    def summary(self) -> dict[str, Any]:
        """:func:`fp8lab.decode.summary.summary` of the run: what the notebook records."""
        return self._summary

    def rows(self) -> list[dict[str, Any]]:
        """:func:`fp8lab.decode.summary.summary_rows`: the typed rows recorded beside the summary."""
        return self._rows

    def verdict(self) -> tuple[Verdict, ...]:
        """The claims of :data:`CLAIMS`, each judged by the audit's rule on this run alone."""
        from fp8lab import audit

        rep = audit.Report("this run", self.run.run_dir, {NAME: self._summary}, {}, {NAME: self._rows})
        s = self._summary
        n = int(s["engines_per_dtype"]) if s.get("replicated") else int(s["n_reps"])  # what the intervals are over
        return audit.judge_run(rep, NAME, CLAIMS, lambda c: n)

    def markdown(self) -> str:
        """:func:`fp8lab.decode.verdict.verdict`'s headline bullets as a Markdown list."""
        return "\n".join(f"- {line}" for line in verdict(self._summary))


def run(spec: DecodeStudySpec, store: Path | None = None) -> Results:
    """Measure (or load, or resume) the grid of ``spec`` in the results store ``store`` (None: ``$FP8LAB_RUNS`` or
    ``runs/``; :func:`~fp8lab.decode.run.run_decode`), or, with ``spec.records``, find its run there
    (:func:`~fp8lab.decode.run.find_run`: no engine); then the roofline's bandwidth
    (:func:`~fp8lab.decode.run.store_bandwidth`)."""
    d = spec.decode
    found = find_run(spec.records, d) if spec.records else run_decode(d, store)
    return Results(found, spec, store_bandwidth(found, spec.bandwidth_gbs))
