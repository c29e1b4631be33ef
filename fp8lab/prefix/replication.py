"""Study 07 with the engine as the experimental unit (issue 35, as Study 06: :mod:`fp8lab.decode.replication`).

The design (:mod:`fp8lab.engine.schedule`): every KV dtype is started ``engines`` times (rounds) in ABBA order, in
a co-located arm (a round's auto and fp8 engines alive together, alternating cell by cell) and/or a solo arm (one
engine at a time at vLLM's default ``gpu_memory_utilization``). Each engine set is an ordinary Study 07 run of its
own (:meth:`~fp8lab.prefix.spec.PrefixSpec.set_spec`, stored under its own key by
:func:`~fp8lab.prefix.run.run_prefix`, so a cut run resumes set by set); every engine serves every cell
(workload x active conversations) ``trials`` times on the same conversations (the text is seeded by trial, not by
engine: engines differ, inputs do not).

**Statistics**: per engine, a cell's hit rate, mean TTFT and output tokens/s are averaged over the engine's trials
(:func:`engine_cells`); a cell's fp8 - auto difference is then paired by round (round ``k``'s auto and fp8 engines)
and its interval is Student's t over the engine pairs (:func:`~fp8lab.prefix.tables.sweep_table` on the per-engine
means, ``n_pairs`` = engine pairs): the two-stage estimator of a nested design with the engine as a random effect
(the reasoning and references are :mod:`fp8lab.decode.replication`'s). Hit counts follow token counts (the replay is
deterministic), so a hit-rate difference every engine pair reproduces has no interval and says so; TTFT and
throughput vary from engine to engine and carry the interval. The co-location effect (:func:`colocation_table`):
per cell and round, the co-located arm's log fp8/auto TTFT ratio minus the solo arm's, a t interval over rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8lab import stats
from fp8lab.engine.schedule import EngineSet
from fp8lab.prefix.run import PrefixRun, run_prefix
from fp8lab.prefix.spec import PrefixSpec
from fp8lab.prefix.tables import cell_table, sweep_table

#: Per-engine cell columns averaged over the engine's trials (the rest: preemptions summed, KV usage's maximum).
MEAN_COLUMNS = ("hit_rate", "ttft_mean_ms", "ttft_followup_ms", "output_tok_s")


@dataclass
class ReplicatedRun:
    """A replicated Study 07 run: the spec (``engines``, ``arms``) and one stored sub-run per engine set, in start
    order. ``rows`` / ``correctness`` are the sub-runs' rows with ``arm``, ``round`` and ``engine`` added;
    ``engines`` is per dtype (``ok`` where every engine of the dtype started; else the first failure), ``starts``
    per engine id (``<arm>/r<round>/<dtype>``)."""

    spec_: PrefixSpec
    runs: list[tuple[EngineSet, PrefixRun]]

    @property
    def spec(self) -> PrefixSpec:
        return self.spec_

    @property
    def replicated(self) -> bool:
        return True

    @property
    def run_dir(self) -> Path | None:
        return self.runs[0][1].run_dir.parent if self.runs else None

    @property
    def complete(self) -> bool:
        return bool(self.runs) and all(r.complete for _, r in self.runs)

    @property
    def provenance(self) -> dict[str, Any]:
        return next((r.provenance for _, r in self.runs if r.provenance), {})

    def _tagged(self, attr: str) -> Any:
        import pandas as pd

        parts = []
        for es, r in self.runs:
            df = getattr(r, attr)
            if len(df):
                parts.append(
                    df.assign(arm=es.arm, round=es.round, engine=es.arm + f"/r{es.round}/" + df.kv_dtype.astype(str))
                )
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def rows(self) -> Any:
        return self._tagged("rows")

    @property
    def correctness(self) -> Any:
        return self._tagged("correctness")

    @property
    def starts(self) -> dict[str, dict[str, Any]]:
        return {es.engine_id(d): e for es, r in self.runs for d, e in r.engines.items()}

    @property
    def engines(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for eid, e in self.starts.items():
            d = eid.rsplit("/", 1)[1]
            if d not in out or (out[d].get("status") == "ok" and e.get("status") != "ok"):
                out[d] = {**e, "error": None if e.get("status") == "ok" else f"engine {eid}: {e.get('error')}"}
        return out

    def ok_dtypes(self) -> list[str]:
        return [d for d in self.spec.kv_dtypes if self.engines.get(d, {}).get("status") == "ok"]


def run_replicated(spec: PrefixSpec, root: Path | None = None, force: bool = False) -> ReplicatedRun:
    """Every engine set of ``spec.schedule()`` in order, each a sub-run (:func:`~fp8lab.prefix.run.run_prefix` of
    :meth:`~fp8lab.prefix.spec.PrefixSpec.set_spec`: a fresh worker, fresh engines); a stored set is loaded."""
    return ReplicatedRun(spec, [(es, run_prefix(spec.set_spec(es), root=root, force=force)) for es in spec.schedule()])


def engine_cells(rows: Any, block_size: int | None = None) -> Any:
    """One row per engine and cell: :func:`~fp8lab.prefix.tables.cell_table` of each engine's turns, then per
    (arm, round, kv_dtype, workload, n_active) the mean over the engine's trials of :data:`MEAN_COLUMNS`,
    ``preemptions`` summed, ``kv_usage_max`` the maximum, ``queries`` / ``hits`` summed, ``trials`` counted."""
    import pandas as pd

    if rows is None or not len(rows):
        return pd.DataFrame()
    parts = []
    for (arm, rnd), g in rows.groupby(["arm", "round"], sort=True):
        c = cell_table(g.drop(columns=["arm", "round", "engine"]), block_size)
        if len(c):
            parts.append(c.assign(arm=arm, round=int(rnd)))
    if not parts:
        return pd.DataFrame()
    cells = pd.concat(parts, ignore_index=True)
    keys = ["arm", "round", "kv_dtype", "workload", "n_active"]
    g = cells.groupby(keys, sort=True)
    out = g[list(MEAN_COLUMNS)].mean()
    out["queries"] = g.queries.sum()
    out["hits"] = g.hits.sum()
    out["preemptions"] = g.preemptions.sum()
    out["kv_usage_max"] = g.kv_usage_max.max()
    out["counter_turns"] = g.counter_turns.sum()
    out["counter_turns_complete"] = g.counter_turns_complete.sum()
    out["trials"] = g.size()
    out = out.reset_index()
    out["engine"] = out.arm + "/r" + out["round"].astype(str) + "/" + out.kv_dtype.astype(str)
    return out


def engine_sweep(cells: Any, arm: str, predicted: Any = None, base: str = "auto", other: str = "fp8") -> Any:
    """:func:`~fp8lab.prefix.tables.sweep_table` of ``arm``'s per-engine cells, paired by round: every interval is
    over engine pairs (``n_pairs``), ``n_engines`` beside it; a column ``arm``."""
    import pandas as pd

    if cells is None or not len(cells) or arm not in set(cells.arm):
        return pd.DataFrame()
    sub = cells[cells.arm == arm].rename(columns={"round": "trial"})
    out = sweep_table(sub, predicted, base, other)
    if len(out):
        out.insert(0, "arm", arm)
        out["n_engines"] = out.get("n_pairs")
    return out


def colocation_table(cells: Any, base: str = "auto", other: str = "fp8") -> Any:
    """Does co-location change fp8's TTFT cost? Per (workload, n_active): per round the co-located arm's
    ``log(other / base)`` mean TTFT minus the solo arm's; ``effect_ratio`` = exp of the mean (the co-located
    fp8/auto ratio over the solo one; 1 = no effect) with its 95% t interval over rounds (``n_rounds``),
    ``resolved`` when the interval excludes 1; each arm's geometric-mean ratio beside it."""
    import pandas as pd

    if cells is None or not len(cells) or not {"colocated", "solo"} <= set(cells.arm):
        return pd.DataFrame()
    w = cells.pivot_table(index=["workload", "n_active", "round"], columns=["arm", "kv_dtype"], values="ttft_mean_ms")
    rows = []
    for (wl, n), g in w.groupby(level=["workload", "n_active"]):
        try:
            co = g[("colocated", other)] / g[("colocated", base)]
            so = g[("solo", other)] / g[("solo", base)]
        except KeyError:
            continue
        d = (co.apply(math.log) - so.apply(math.log)).dropna()
        if d.empty:
            continue
        i = stats.t_interval(d)
        ok = i.n > 1
        rows.append(
            {
                "workload": wl,
                "n_active": int(n),
                "colocated_ttft_ratio": float(math.exp(co.apply(math.log).mean())),
                "solo_ttft_ratio": float(math.exp(so.apply(math.log).mean())),
                "effect_ratio": math.exp(i.estimate),
                "effect_ratio_ci_low": math.exp(i.lo) if ok else None,
                "effect_ratio_ci_high": math.exp(i.hi) if ok else None,
                "n_rounds": i.n,
                "resolved": bool(ok and (i.lo > 0 or i.hi < 0)),
            }
        )
    return pd.DataFrame(rows)
