"""Study 01's A/B comparisons: the headline metrics (:class:`Metric`), each paired per trial with its t interval,
noise floor and the "beyond noise" rule (:func:`delta_row`, :func:`delta_table`; all statistics from
:mod:`fp8lab.stats`), the same config against itself (:func:`noise_floor_table`) and both benchmark methods on the
same engines (:func:`method_table`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fp8lab import metrics, stats
from fp8lab.serving.run import ServingResult
from fp8lab.serving.tables import phase_records, throughput_table


@dataclass(frozen=True)
class Metric:
    """A headline metric: which phase (``kind``, ``concurrency`` / ``process``, ``rate``), which
    quantity (``column`` of the phase table for throughput, else a request/gap column) and statistic."""

    name: str
    kind: str
    column: str
    statistic: str = "mean"
    concurrency: int | None = None
    process: str | None = None
    rate: float | None = None
    higher_is_better: bool = False

    @property
    def level(self) -> str:
        return "phase" if self.column.endswith("_tok_s") else "request"


def headline_metrics(res: ServingResult) -> list[Metric]:
    """The study's headline metrics: output tokens/s at every closed-loop concurrency; TTFT, TPOT and
    ITL P50/P99 at the largest and the smallest concurrency; TTFT and TPOT P50/P99 of every open-loop
    phase; output tokens/s of the non-streaming closed loop at every ``naive_concurrency``."""
    out = [
        Metric(f"output tok/s @c={c}", "closed", "output_tok_s", "mean", concurrency=c, higher_is_better=True)
        for c in res.concurrency
    ]
    out += [
        Metric(
            f"output tok/s (no stream) @c={c}", "naive", "output_tok_s", "mean", concurrency=c, higher_is_better=True
        )
        for c in res.plan.naive_concurrency
    ]
    for c in sorted({res.headline_concurrency, min(res.concurrency)}, reverse=True):
        for col, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL")):
            for st in ("p50", "p99"):
                out.append(Metric(f"{label} {st.upper()} @c={c}", "closed", col, st, concurrency=c))
    for rate in res.plan.rates:
        for proc in res.plan.arrivals:
            for col, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
                for st in ("p50", "p99"):
                    out.append(
                        Metric(f"{label} {st.upper()} @{proc} {rate:g}/s", "open", col, st, process=proc, rate=rate)
                    )
    return out


def metric_samples(res: ServingResult, m: Metric, kv_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, trial of each value) of one metric and dtype."""
    if m.level == "phase":
        tp = throughput_table(res, kinds=(m.kind,))
        g = (
            tp[(tp.kv_dtype == kv_dtype) & (tp.concurrency == m.concurrency)]
            if m.concurrency is not None
            else tp[(tp.kv_dtype == kv_dtype) & (tp.process == m.process) & np.isclose(tp.rate, m.rate)]
        )
        g = g.sort_values("trial")
        return g[m.column].to_numpy(float), g.trial.to_numpy()
    rec = phase_records(res, m.kind, m.concurrency, m.process, m.rate)
    rec = rec[rec.kv_dtype == kv_dtype]
    if m.column == "itl_s":
        ex = metrics.explode_itl(rec, keep=("trial",))
        return ex.itl_s.to_numpy(float), ex.trial.to_numpy()
    return rec[m.column].to_numpy(float), rec.trial.to_numpy()


def per_trial(values: np.ndarray, trials: np.ndarray, statistic: str) -> dict[int, float]:
    """The metric's statistic within each trial (a percentile of that trial's requests or gaps, never of
    requests pooled over trials)."""
    stat = stats.statistic_fn(statistic)
    out = {}
    for t in pd.unique(trials):
        v = values[(trials == t) & np.isfinite(values)]
        if v.size:
            out[int(t)] = stat(v)
    return out


DELTA_COLUMNS = [
    "metric",
    "kind",
    "baseline",
    "kv_dtype",
    "unit",
    "a",
    "b",
    "delta_pct",
    "lo_pct",
    "hi_pct",
    "n",
    "label",
    "noise_floor_pct",
    "noise_floor_q25_pct",
    "noise_floor_q75_pct",
    "noise_pairs",
    "detectable_pct",
    "beyond_noise_floor",
    "n_a",
    "n_b",
    "higher_is_better",
    "a_per_trial",
    "b_per_trial",
]


def delta_row(
    name: str, a_per_trial: dict[int, float], b_per_trial: dict[int, float], higher_is_better: bool, ci: float = 0.95
) -> dict[str, Any]:
    """One metric's A/B comparison from its per-trial values (``{trial: value}`` of A and of B): the paired
    delta over the trials both have (:func:`fp8lab.stats.paired_delta`: t interval on the log ratios, valid
    for that n), the noise floor of each config against itself over consecutive trials
    (:func:`fp8lab.stats.noise_floor`), the label, ``beyond_noise_floor`` (:func:`fp8lab.stats.beyond_noise`)
    and ``detectable_pct`` (:func:`fp8lab.stats.smallest_detectable_pct`)."""
    common = sorted(set(a_per_trial) & set(b_per_trial))
    d = stats.paired_delta([a_per_trial[t] for t in common], [b_per_trial[t] for t in common], ci)
    nf = stats.noise_floor(
        [[a_per_trial[t] for t in sorted(a_per_trial)], [b_per_trial[t] for t in sorted(b_per_trial)]]
    )
    return {
        "metric": name,
        "a": d.a,
        "b": d.b,
        "delta_pct": d.delta_pct,
        "lo_pct": d.lo_pct,
        "hi_pct": d.hi_pct,
        "n": d.n,
        "label": stats.delta_label(d, higher_is_better),
        "noise_floor_pct": nf.median_pct,
        "noise_floor_q25_pct": nf.q25_pct,
        "noise_floor_q75_pct": nf.q75_pct,
        "noise_pairs": nf.n_pairs,
        "detectable_pct": stats.smallest_detectable_pct(d, nf),
        "beyond_noise_floor": stats.beyond_noise(d, nf),
        "n_a": len(a_per_trial),
        "n_b": len(b_per_trial),
        "higher_is_better": higher_is_better,
        "a_per_trial": [float(a_per_trial[t]) for t in sorted(a_per_trial)],
        "b_per_trial": [float(b_per_trial[t]) for t in sorted(b_per_trial)],
    }


def delta_table(res: ServingResult, metric_list: Sequence[Metric] | None = None, ci: float = 0.95) -> pd.DataFrame:
    """For each headline metric and each non-baseline dtype B, the paired comparison of :func:`delta_row`:
    one value per engine and trial (throughput: the phase's; a latency percentile: that percentile of the
    trial's own requests or gaps), A and B of a trial paired (their phases ran back to back, alternating
    which went first). ``a`` / ``b`` are the per-trial means (ms for latencies), ``delta_pct`` the geometric-mean
    ratio's change with its t interval (``lo_pct``, ``hi_pct``; ``n`` pairs), ``label`` "within noise" when
    the interval contains 0, else "better" / "worse" for B; ``noise_floor_pct`` the median absolute difference
    between consecutive trials of the same config (with its IQR); ``beyond_noise_floor`` only when the
    interval excludes 0 and ``|delta|`` exceeds the floor; ``detectable_pct`` the smallest delta this run
    could have called beyond noise."""
    metric_list = list(metric_list) if metric_list is not None else headline_metrics(res)
    a_dt = res.plan.baseline
    rows = []
    for m in metric_list:
        va, ta = metric_samples(res, m, a_dt)
        pa = per_trial(va, ta, m.statistic)
        scale = 1.0 if m.level == "phase" else 1e3
        for b_dt in res.plan.kv_dtypes[1:]:
            vb, tb = metric_samples(res, m, b_dt)
            pb = per_trial(vb, tb, m.statistic)
            row = delta_row(
                m.name,
                {t: v * scale for t, v in pa.items()},
                {t: v * scale for t, v in pb.items()},
                m.higher_is_better,
                ci,
            )
            rows.append(
                {
                    **row,
                    "kind": m.kind,
                    "baseline": a_dt,
                    "kv_dtype": b_dt,
                    "unit": "tok/s" if m.level == "phase" else "ms",
                }
            )
    return pd.DataFrame(rows, columns=DELTA_COLUMNS)


def noise_floor_table(res: ServingResult) -> pd.DataFrame:
    """The same config against itself, for the closed-loop throughput at every concurrency: per dtype and
    concurrency the per-trial output tokens/s (in trial order) and the median absolute relative difference
    between consecutive trials (%), with its IQR and the number of differences."""
    tp = throughput_table(res)
    rows = []
    for (d, c), g in tp.groupby(["kv_dtype", "concurrency"]):
        g = g.sort_values("trial")
        nf = stats.noise_floor([g.output_tok_s.to_numpy(float)])
        rows.append(
            {
                "kv_dtype": d,
                "concurrency": c,
                "output_tok_s_per_trial": g.output_tok_s.round(1).tolist(),
                "median_pct": nf.median_pct,
                "q25_pct": nf.q25_pct,
                "q75_pct": nf.q75_pct,
                "n_pairs": nf.n_pairs,
            }
        )
    return pd.DataFrame(rows)


def method_table(res: ServingResult, deltas: pd.DataFrame) -> pd.DataFrame:
    """Both benchmark methods on the same engines (claim 8): per non-baseline dtype and ``naive_concurrency``
    point, the fp8-vs-baseline output tokens/s delta (% with its 95% CI and label) measured by the streamed
    closed loop and by the client that does not read the stream, and their difference in points."""
    rows = []
    for c in res.plan.naive_concurrency:
        for d in res.plan.kv_dtypes[1:]:
            st = deltas[(deltas.metric == f"output tok/s @c={c}") & (deltas.kv_dtype == d)]
            nv = deltas[(deltas.metric == f"output tok/s (no stream) @c={c}") & (deltas.kv_dtype == d)]
            if st.empty or nv.empty:
                continue
            a, b = st.iloc[0], nv.iloc[0]
            rows.append(
                {
                    "kv_dtype": d,
                    "concurrency": c,
                    "streamed_delta_pct": a.delta_pct,
                    "streamed_ci": f"{a.lo_pct:+.1f} to {a.hi_pct:+.1f}",
                    "streamed_label": a.label,
                    "no_stream_delta_pct": b.delta_pct,
                    "no_stream_ci": f"{b.lo_pct:+.1f} to {b.hi_pct:+.1f}",
                    "no_stream_label": b.label,
                    "difference_pts": b.delta_pct - a.delta_pct,
                }
            )
    return pd.DataFrame(rows)
