"""Study 01's time plan before any engine starts: :func:`estimate_seconds` of a plan, :func:`profile_estimate` of
a profile, and ``python -m fp8lab.serving --profile NAME`` (:func:`main`) that prints it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from fp8lab.serving.schedule import min_requests, planned, schedule_table
from fp8lab.serving.spec import STUDY, ServingPlan, on_gpu, plan_from_params


def estimate_seconds(
    plan: ServingPlan,
    concurrency: Sequence[int] | None = None,
    *,
    engine_start_s: float | None = None,
    step_s: float = 0.02,
    overhead_s: float = 1.0,
    fidelity: tuple[int, int] | None = None,
    fidelity_run_s: float = 35.0,
    fidelity_start_s: float = 45.0,
    later_start_s: float | None = None,
) -> pd.DataFrame:
    """A time plan of the paired study before any engine starts: one row per part (``engine starts``,
    ``warm-up``, ``closed loop``, ``open loop``, ``capacity``, ``fidelity``) with ``seconds`` and how it was
    reckoned, then the ``total``. Assumptions (the arguments): each engine starts in ``engine_start_s`` (a
    fresh H200 host compiles and captures CUDA graphs in about 144 s per engine; default 144 on GPU, 30 on
    CPU); a decode step takes ``step_s``, so a request of the mix lasts its output length x ``step_s`` plus
    0.5 s and a wave of requests its longest output x ``step_s`` plus 2 s; every phase adds ``overhead_s``. A
    closed-loop phase lasts ``phase_seconds`` or its least requests' time, whichever is longer; an open-loop
    phase its schedule plus a wave; a warm-up one wave per ``concurrency`` requests; a capacity phase two waves
    of its output length; ``fidelity = (rounds, runs per round)`` costs ``fidelity_start_s + fidelity_run_s``
    per run. A replicated plan (issue 35) runs all of it once per engine set: ``engines x arms`` engines per dtype,
    the first start ``engine_start_s`` and every later one ``later_start_s`` (the host's compile cache warm: 35 s on
    GPU, as Study 06's replicated run measured 15-50 s; 30 s on CPU)."""
    conc = tuple(concurrency or planned(plan)[0])
    if engine_start_s is None:
        engine_start_s = 144.0 if on_gpu() else 30.0
    nd, t = len(plan.kv_dtypes), plan.trials
    w = sum(c.weight for c in plan.mix)
    mean_req = sum(c.weight * c.output_len for c in plan.mix) / w * step_s + 0.5
    wave = max(c.output_len for c in plan.mix) * step_s + 2.0
    closed = sum(max(plan.phase_seconds, min_requests(plan, c) * mean_req / c) + overhead_s for c in conc)
    naive = sum(min_requests(plan, c) * mean_req / c + overhead_s for c in plan.naive_concurrency)
    opened = sum(plan.open_loop_requests / r + wave + overhead_s for r in plan.rates) * len(plan.arrivals)
    cap, n_cap = 0.0, 3 + len(plan.capacity_factors)
    if plan.capacity_shape is not None and plan.capacity_trials:
        cap = nd * n_cap * (2 * (plan.capacity_shape[1] * step_s + 2.0) + overhead_s) * plan.capacity_trials
    warm = nd * math.ceil(plan.warmup_requests / max(conc)) * wave if plan.warmup_requests else 0.0
    sets = plan.engines * len(plan.arms) if plan.replicated else 1  # each engine serves every trial
    if later_start_s is None:
        later_start_s = 35.0 if on_gpu() else 30.0
    starts = (
        (
            engine_start_s + (nd * sets - 1) * later_start_s,
            f"{nd * sets} fresh engines in ABBA order ({plan.engines} "
            f"per dtype and arm, arms {', '.join(plan.arms)}): {engine_start_s:.0f} s, then {later_start_s:.0f} s each",
        )
        if plan.replicated
        else (nd * engine_start_s, f"{nd} engines x {engine_start_s:.0f} s, alive together")
    )
    closed, naive, opened, cap, warm = (x * sets for x in (closed, naive, opened, cap, warm))
    t_txt = f"{t} trials" + (f" x {sets} engines per dtype" if plan.replicated else "")
    rows = [
        ("engine starts", *starts),
        ("warm-up", warm, f"{plan.warmup_requests} requests per engine at c={max(conc)}"),
        (
            "closed loop",
            nd * t * (closed + naive),
            f"{nd} dtypes x {t_txt} x {len(conc) + len(plan.naive_concurrency)} phases, streamed ones >= "
            f"{plan.phase_seconds:g} s",
        ),
        ("open loop", nd * t * opened, f"{nd} dtypes x {t_txt} x {len(plan.rates) * len(plan.arrivals)} phases"),
        ("capacity", cap, f"{nd} ladders of {n_cap} phases"),
    ]
    if fidelity:
        r, k = fidelity
        rows.append(
            (
                "fidelity",
                r * k * (fidelity_start_s + fidelity_run_s),
                f"{r} rounds x {k} runs x ({fidelity_start_s:g} s start + {fidelity_run_s:g} s)",
            )
        )
    df = pd.DataFrame(rows, columns=["part", "seconds", "reckoned"])
    total = df.seconds.sum()
    df = pd.concat(
        [df, pd.DataFrame([("total", total, f"{total / 60:.1f} minutes")], columns=df.columns)], ignore_index=True
    )
    df["seconds"] = df.seconds.round(0)
    return df


def profile_estimate(profile: str, overrides: dict[str, Any] | None = None, gpu: bool = True) -> pd.DataFrame:
    """:func:`estimate_seconds` of notebook 01 under a profile (``fp8lab/profiles.yaml``), without starting
    anything: the parameters as papermill would pass them, engine starts of a fresh GPU host (``gpu``) or CPU."""
    from fp8lab.paths import NOTEBOOKS_DIR
    from fp8lab.profiles import load_profile, resolved_parameters

    params = resolved_parameters(NOTEBOOKS_DIR / f"{STUDY}.ipynb", load_profile(profile), overrides)
    plan = plan_from_params(params)
    fid = (params["FIDELITY_ROUNDS"], 2) if params["RUN_FIDELITY"] else None
    return estimate_seconds(
        plan,
        engine_start_s=144.0 if gpu else 30.0,
        later_start_s=35.0 if gpu else 30.0,
        step_s=0.02 if gpu else 0.01,
        fidelity=fid,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fp8lab.serving --profile h200-graphs [-p NAME VALUE ...]``: print Study 01's time plan."""
    import argparse
    import ast

    ap = argparse.ArgumentParser(prog="python -m fp8lab.serving", description=main.__doc__)
    ap.add_argument("--profile", required=True)
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    ap.add_argument("--cpu", action="store_true", help="CPU engine start times")
    a = ap.parse_args(argv)
    over = {}
    for k, v in a.p:
        try:
            over[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            over[k] = v
    from fp8lab.paths import NOTEBOOKS_DIR
    from fp8lab.profiles import load_profile, resolved_parameters

    est = profile_estimate(a.profile, over, gpu=not a.cpu)
    plan = plan_from_params(resolved_parameters(NOTEBOOKS_DIR / f"{STUDY}.ipynb", load_profile(a.profile), over))
    with pd.option_context("display.width", 200, "display.max_colwidth", 100):
        print(
            f"Study 01 time plan, profile {a.profile}: {len(schedule_table(plan))} phases in the paired schedule "
            f"(each kept as phase-*.json.gz when done)\n{est.to_string(index=False)}",
            flush=True,
        )
    return 0
