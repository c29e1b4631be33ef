"""Every table of Study 04, computed once from a :class:`~fp8lab.longctx.run.LongCtxResult` (:func:`tables`). The
tables themselves live by subject: the ramp, boundary, capacity frontier and block-size sweep in
:mod:`fp8lab.longctx.ramp`, the growth fits, speed ratios and crossovers in :mod:`fp8lab.longctx.growth`, the
divergence along the context, passkey and random tokens in :mod:`fp8lab.longctx.divergence`."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from fp8lab.longctx.divergence import (
    divergence_by_position,
    divergence_table,
    divergence_trend,
    passkey_paired,
    passkey_table,
    random_token_table,
)
from fp8lab.longctx.growth import crossover_table, growth_table, speed_table
from fp8lab.longctx.ramp import blocksize_table, boundary_table, capacity_frontier, ramp_table
from fp8lab.longctx.run import LongCtxResult


@dataclass
class Tables:
    """Every table of the study, computed once (:func:`tables`)."""

    ramp: pd.DataFrame
    boundary: pd.DataFrame
    frontier: pd.DataFrame
    growth: pd.DataFrame
    speed: pd.DataFrame
    crossover: pd.DataFrame
    blocksize: pd.DataFrame
    divergence: pd.DataFrame
    bypos: pd.DataFrame
    trend: pd.DataFrame
    passkey: pd.DataFrame
    random: pd.DataFrame
    passkey_paired: pd.DataFrame = field(default_factory=pd.DataFrame)


def tables(res: LongCtxResult) -> Tables:
    ramp = ramp_table(res)
    growth = growth_table(ramp)
    div = divergence_table(res)
    bypos = divergence_by_position(div, res.plan.position_bins, res.plan.doc_length)
    trend = divergence_trend(bypos) if len(bypos) else pd.DataFrame()
    return Tables(
        ramp=ramp,
        boundary=boundary_table(res),
        frontier=capacity_frontier(res, ramp),
        growth=growth,
        speed=speed_table(res, ramp),
        crossover=crossover_table(ramp, growth, res.plan.kv_dtypes),
        blocksize=blocksize_table(res),
        divergence=div,
        bypos=bypos,
        trend=trend,
        passkey=(pk := passkey_table(res)),
        random=random_token_table(res, trend),
        passkey_paired=passkey_paired(pk),
    )
