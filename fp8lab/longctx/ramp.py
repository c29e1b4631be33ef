"""Tables of Study 04's ramp engines, from a :class:`~fp8lab.longctx.run.LongCtxResult`: latency, memory and
outcome per (dtype, concurrency, length) (:func:`ramp_table`), the longest context per dtype beside the formula
(:func:`boundary_table`), the concurrency each dtype holds per length (:func:`capacity_frontier`, and
:func:`frontier_at_budgets` for other budgets, arithmetic only) and the block-size sweep
(:func:`blocksize_table`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fp8lab import kvmath
from fp8lab.longctx.boundary import (
    NULL_BLOCKS,
    blocks_for,
    longest_context,
    max_concurrency_at,
    predicted_num_blocks,
)
from fp8lab.longctx.run import LongCtxResult
from fp8lab.longctx.spec import LongCtxPlan


def overlap_peak(g: pd.DataFrame) -> int:
    """Most requests of ``g`` decoding at the same moment, from client timestamps: request ``i`` decodes
    over ``[sent + ttft, sent + e2e]``. ``C`` requests that all held their KV at once overlap ``C``-fold;
    requests the pool could not hold together run one after another."""
    if not {"sent_s", "ttft_s", "e2e_s"} <= set(g.columns) or g.empty:
        return 0
    ev = []
    for s, t, e in zip(g.sent_s, g.ttft_s, g.e2e_s, strict=True):
        if np.isfinite(s) and np.isfinite(t) and np.isfinite(e):
            ev += [(s + t, 1), (s + e, -1)]
    peak = cur = 0
    for _, d in sorted(ev, key=lambda x: (x[0], -x[1])):
        cur += d
        peak = max(peak, cur)
    return peak


def _bytes_per_block(plan: LongCtxPlan, kv_dtype: str, block_size: int) -> int:
    return kvmath.bytes_per_block(plan.model, block_size, kv_dtype, hybrid_kv_cache_manager=False)


def _ramp_engine(res: LongCtxResult, kv_dtype: str) -> tuple[Any | None, str]:
    """The ramp engine that ran for ``kv_dtype`` and, when none did, the status of its first attempt."""
    runs = res.results("ramp", kv_dtype)
    ok = [r for r in runs if r.status == "ok"]
    return (ok[-1] if ok else None), (runs[0].status if runs else "not run")


def stats(g: pd.DataFrame) -> dict[str, float]:
    from fp8lab import metrics

    itl = metrics.explode_itl(g)["itl_s"].to_numpy() if "itl_s" in g else np.array([])
    pi = metrics.percentiles(itl)
    return {
        "n": len(g),
        "ttft_p50_s": float(g.ttft_s.median()),
        "ttft_mean_s": float(g.ttft_s.mean()),
        "itl_p50_s": pi["p50"],
        "itl_p95_s": pi["p95"],
        "n_itl": pi["n"],
        "tpot_p50_s": float(g.tpot_s.median()),
        "e2e_p50_s": float(g.e2e_s.median()),
        "rec_preemptions": float(g.num_preemptions.sum()) if "num_preemptions" in g else np.nan,
    }


def ramp_table(res: LongCtxResult) -> pd.DataFrame:
    """One row per (kv_dtype, concurrency, length) of the ramp: ``outcome`` and, where it ran, latency
    (seconds: TTFT median/mean, ITL P50/P95 pooled over every gap, TPOT and E2E medians), the phase's
    ``preemptions``, sampled peaks (``kv_usage_peak`` fraction, ``mem_peak_bytes`` device memory or CPU
    RSS, ``running_peak``), ``kv_used_bytes`` (= usage x usable blocks x bytes per block),
    ``decode_overlap_peak`` (most requests decoding at once, from client timestamps).

    ``outcome``: ``ok`` (one at a time), ``held`` (all ``C`` requests ran together, no preemption),
    ``preempted`` (vLLM preempted a request: the pool could not hold them), ``serialized`` (no
    preemption, but their KV was never resident together: they never all decoded at once and the sampled
    KV use never reached ``C`` full prompts; the pool admitted them one after another),
    ``over_capacity`` (longer than the engine's ``max_model_len``: not sent), or the engine's failure
    status (``oom``, ``unsupported``, ...)."""
    plan = res.plan
    rows = []
    recs = res.records
    ph = res.phases
    concs = [1] + ([plan.concurrency] if plan.concurrency > 1 else [])
    for dt in plan.kv_dtypes:
        eng, first_status = _ramp_engine(res, dt)
        for c in concs:
            for L in plan.lengths:
                row: dict[str, Any] = {"kv_dtype": dt, "concurrency": c, "length": L, "context": L + plan.output_tokens}
                if eng is None:
                    rows.append({**row, "outcome": first_status})
                    continue
                mml = int(eng.engine.get("max_model_len") or 0)
                name = f"ramp-c{c}-L{L}"
                sel = (recs.role == "ramp") & (recs.kv_dtype == dt) & (recs.phase == name) if len(recs) else None
                g = recs[sel] if sel is not None else pd.DataFrame()
                if L + plan.output_tokens > mml or g.empty:
                    rows.append(
                        {
                            **row,
                            "outcome": "over_capacity" if L + plan.output_tokens > mml else "missing",
                            "max_model_len": mml,
                        }
                    )
                    continue
                g = g[g.engine == g.engine.max()]
                p = ph[(ph.engine == g.engine.iloc[0]) & (ph.phase == name)].iloc[0]
                nb, ebs = int(p.num_blocks), int(p.engine_block_size)
                # 0 means the sampler (every 0.1 s) caught no step of a short phase: not measured
                usage = float(p.kv_usage_peak) if pd.notna(p.kv_usage_peak) and p.kv_usage_peak > 0 else np.nan
                overlap = overlap_peak(g)
                preempt = float(p.preemptions)
                blocks_peak = round(usage * (nb - NULL_BLOCKS)) if np.isfinite(usage) else 0
                # co-resident: all C decoded at once, or the pool held C full prompts at once (a short generation
                # can end before the next request's chunked prefill does, without any lack of KV)
                together = overlap >= c or blocks_peak >= c * blocks_for(L, ebs)
                if c == 1:
                    outcome = "ok"
                elif preempt > 0:
                    outcome = "preempted"
                else:
                    outcome = "held" if together else "serialized"
                rows.append(
                    {
                        **row,
                        "outcome": outcome,
                        "max_model_len": mml,
                        **stats(g),
                        "preemptions": preempt,
                        "kv_usage_peak": usage,
                        "blocks_used_peak": round(usage * (nb - NULL_BLOCKS)) if np.isfinite(usage) else np.nan,
                        "kv_used_bytes": usage * (nb - NULL_BLOCKS) * _bytes_per_block(plan, dt, ebs),
                        "mem_peak_bytes": p.mem_peak_bytes,
                        "running_peak": p.running_peak,
                        "decode_overlap_peak": overlap,
                        "num_blocks": nb,
                        "block_size": ebs,
                    }
                )
    return pd.DataFrame(rows)


def boundary_table(res: LongCtxResult) -> pd.DataFrame:
    """Longest context per dtype: the formula's prediction beside what vLLM did.

    ``num_blocks_formula`` (:func:`predicted_num_blocks`, when the budget is known) and
    ``num_blocks_engine`` (the ramp engine's); ``longest_formula`` / ``longest_engine``
    (:func:`longest_context` of each); ``longest_measured``: vLLM's own estimate from the start-up
    error of the engine that asked for more (the probe, or a ramp attempt), with that engine's
    ``max_model_len_over`` and ``over_status`` (``oom`` confirms the boundary); ``holds_ramp``: whether
    the dtype holds the ramp's longest request; ``model_limit``: the config's max_position_embeddings."""
    plan, bs = res.plan, res.block_size
    limit = kvmath.load_layout(plan.model).max_position_embeddings
    eng = res.engines
    rows = []
    for dt in plan.kv_dtypes:
        ramp, first_status = _ramp_engine(res, dt)
        nb_f = predicted_num_blocks(plan, dt, bs)
        nb_e = int(ramp.engine["num_blocks"]) if ramp is not None else None
        over = (
            eng[(eng.kv_dtype == dt) & eng.role.isin(["probe", "ramp"]) & eng.vllm_estimated_max_len.notna()]
            if len(eng)
            else eng
        )
        probe = eng[(eng.kv_dtype == dt) & (eng.role == "probe")] if len(eng) else eng
        o = over.iloc[-1] if len(over) else (probe.iloc[-1] if len(probe) else None)
        rows.append(
            {
                "kv_dtype": dt,
                "block_size": bs,
                "kv_bytes_per_token": kvmath.kv_bytes_per_token(plan.model, dt),
                "kv_budget_bytes": (ramp.engine.get("kv_budget_bytes") if ramp is not None else None)
                or (int(plan.kv_cache_gib * kvmath.GIB) if plan.kv_cache_gib else None),
                "num_blocks_formula": nb_f,
                "num_blocks_engine": nb_e,
                "longest_formula": longest_context(nb_f, bs) if nb_f is not None else None,
                "longest_engine": longest_context(nb_e, bs) if nb_e is not None else None,
                "longest_measured": o["vllm_estimated_max_len"] if o is not None else None,
                "max_model_len_over": o["max_model_len_asked"] if o is not None else None,
                "over_status": o["status"] if o is not None else None,
                "ramp_status": first_status if ramp is None else "ok",
                "ramp_max_model_len": int(ramp.engine["max_model_len"]) if ramp is not None else None,
                "holds_ramp": (ramp is not None and int(ramp.engine["max_model_len"]) >= plan.max_context),
                "model_limit": limit,
            }
        )
    out = pd.DataFrame(rows)
    for c in (
        "num_blocks_formula",
        "num_blocks_engine",
        "longest_formula",
        "longest_engine",
        "longest_measured",
        "max_model_len_over",
        "ramp_max_model_len",
        "kv_budget_bytes",
    ):
        out[c] = out[c].astype("Int64")
    return out


def capacity_frontier(res: LongCtxResult, ramp: pd.DataFrame | None = None) -> pd.DataFrame:
    """Largest concurrency each dtype holds at each length (prompt + output, every sequence at full
    length): ``max_conc_formula`` (blocks from the formula), ``max_conc_engine`` (the engine's block
    count), ``max_conc_measured`` (usable blocks over the blocks one sequence was measured to hold:
    sampled ``kv_usage`` of the one-at-a-time phase), all capped by the engine's ``max_num_seqs``, and
    ``outcome_c<C>``: what happened when ``C`` requests of that length ran at once."""
    plan, bs = res.plan, res.block_size
    ramp = ramp_table(res) if ramp is None else ramp
    rows = []
    for dt in plan.kv_dtypes:
        eng, _ = _ramp_engine(res, dt)
        nb_f = predicted_num_blocks(plan, dt, bs)
        nb_e = int(eng.engine["num_blocks"]) if eng is not None else None
        seqs = int(eng.engine.get("max_num_seqs") or 0) or plan.max_num_seqs if eng is not None else plan.max_num_seqs
        for L in plan.lengths:
            ctx = L + plan.output_tokens
            r1 = ramp[(ramp.kv_dtype == dt) & (ramp.concurrency == 1) & (ramp.length == L)]
            measured_blocks = r1.blocks_used_peak.iloc[0] if len(r1) and "blocks_used_peak" in r1 else np.nan
            row = {
                "kv_dtype": dt,
                "length": L,
                "context": ctx,
                "blocks_per_seq": blocks_for(ctx, bs),
                "max_conc_formula": max_concurrency_at(nb_f, bs, ctx, seqs) if nb_f is not None else np.nan,
                "max_conc_engine": max_concurrency_at(nb_e, bs, ctx, seqs) if nb_e is not None else np.nan,
                "blocks_per_seq_measured": measured_blocks,
                "max_conc_measured": (
                    min((nb_e - NULL_BLOCKS) // int(measured_blocks), seqs or 10**9)
                    if nb_e is not None and pd.notna(measured_blocks) and measured_blocks > 0
                    else np.nan
                ),
            }
            if plan.concurrency > 1:
                rc = ramp[(ramp.kv_dtype == dt) & (ramp.concurrency == plan.concurrency) & (ramp.length == L)]
                row[f"outcome_c{plan.concurrency}"] = rc.outcome.iloc[0] if len(rc) else None
            rows.append(row)
    return pd.DataFrame(rows)


def frontier_at_budgets(
    model: str,
    kv_dtypes: Sequence[str],
    budgets_gib: Sequence[float],
    lengths: Sequence[int],
    block_size: int,
    output_tokens: int = 0,
) -> pd.DataFrame:
    """Arithmetic only: longest context and concurrency per length for other KV budgets (GiB), e.g. a
    whole GPU's. One row per (budget, kv_dtype, length)."""
    rows = []
    for gib in budgets_gib:
        for dt in kv_dtypes:
            nb = kvmath.predict_num_blocks(model, int(gib * kvmath.GIB), block_size, dt, hybrid_kv_cache_manager=False)
            for L in lengths:
                rows.append(
                    {
                        "kv_gib": gib,
                        "kv_dtype": dt,
                        "length": L,
                        "longest": longest_context(nb, block_size),
                        "max_conc": max_concurrency_at(nb, block_size, L + output_tokens),
                    }
                )
    return pd.DataFrame(rows)


# ============================================================================ block-size sweep
def blocksize_table(res: LongCtxResult) -> pd.DataFrame:
    """One row per (kv_dtype, block_size, sweep length): ``outcome`` (``ok`` or the engine's failure
    status, e.g. ``unsupported`` for a size the attention backend rejects), the ramp metrics, and
    ``e2e_vs_best`` / ``itl_vs_best`` (ratio to the best block size of that dtype and length). When the
    ramp's block size is one of the sweep sizes, the ramp engine is that sweep point (``source = ramp``:
    measured after the shorter lengths; a sweep engine runs only a warm-up first)."""
    plan = res.plan
    rows = []
    rec = res.records
    sweep = [(r["kv_dtype"], r["block_size"], "sweep") for r in res.runs if r["role"] == "sweep"]
    # the ramp engine runs every sweep length too: it is a point of the sweep at its own block size, also when that
    # size is not among SWEEP_BLOCK_SIZES (the H200 profile sweeps 256 against the ramp's 16)
    points = [
        (dt, res.block_size, "ramp")
        for dt in plan.kv_dtypes
        if dt in plan.sweep_dtypes
        and res.block_size is not None
        and (dt, res.block_size) not in {(d, b) for d, b, _ in sweep}
    ]
    points += sweep
    for dt, b, role in points:
        if role == "ramp":
            r, status = _ramp_engine(res, dt)
        else:
            r = next(
                x["result"] for x in res.runs if x["role"] == "sweep" and x["kv_dtype"] == dt and x["block_size"] == b
            )
            status = r.status
            r = r if r.status == "ok" else None
        for L in plan.sweep_lengths:
            row: dict[str, Any] = {"kv_dtype": dt, "block_size": b, "length": L, "source": role}
            if r is None:
                rows.append({**row, "outcome": status})
                continue
            g = rec[(rec.role == role) & (rec.kv_dtype == dt) & (rec.block_size == b) & (rec.phase == f"ramp-c1-L{L}")]
            if g.empty:
                rows.append({**row, "outcome": "over_capacity"})
                continue
            rows.append({**row, "outcome": "ok", **stats(g[g.engine == g.engine.max()])})
    out = pd.DataFrame(rows)
    if len(out) and "e2e_p50_s" in out:
        for m, col in (("e2e_p50_s", "e2e_vs_best"), ("itl_p50_s", "itl_vs_best"), ("ttft_p50_s", "ttft_vs_best")):
            out[col] = out[m] / out.groupby(["kv_dtype", "length"])[m].transform("min")
    return out.sort_values(["kv_dtype", "length", "block_size"], ignore_index=True) if len(out) else out
