"""Studies 01 and 07 with engine-level replication (issue 35) on real vLLM (CPU build), the shipped model, at the
``cpu-tiny-replicated`` profile's settings: 2 fresh engines per dtype in a co-located and a solo arm, started in ABBA
order, and every interval recomputed here from the stored measurements over engine pairs. The second "dtype" is
``bfloat16`` (the same bf16 cache as ``auto``: an A/A comparison), so it runs on any CPU, with or without the native
FP8 kernel, as tests/integration/test_decode_cpu.py does for Study 06."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.profiles import load_profile, resolved_parameters

pytestmark = pytest.mark.slow

PROFILE = "cpu-tiny-replicated"
ORDER = ["colocated/r0", "solo/r0/auto", "solo/r0/bfloat16", "solo/r1/bfloat16", "solo/r1/auto", "colocated/r1"]


def _params(stem: str, tiny_model: str) -> dict:
    return resolved_parameters(
        NOTEBOOKS_DIR / f"{stem}.ipynb",
        load_profile(PROFILE),
        {"MODEL": tiny_model, "KV_DTYPES": ["auto", "bfloat16"]},
    )


def _t_interval(logs: list[float]) -> tuple[float, float, float]:
    x = np.asarray(logs)
    h = sps.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - h, x.mean() + h


@pytest.fixture(scope="module")
def serving_run(tiny_model, runs_root):
    from fp8lab.serving import study as s01

    spec = s01.Spec.from_params(_params("01_kv_dtype_auto_vs_fp8", tiny_model))
    assert [s.key for s in spec.plan.schedule()] == ORDER
    return s01.run(spec, store=runs_root, progress=False)


@pytest.fixture(scope="module")
def prefix_run(tiny_model, runs_root):
    from fp8lab.prefix import study as s07

    spec = s07.Spec.from_params(_params("07_prefix_cache", tiny_model))
    assert [s.key for s in spec.schedule()] == ORDER
    res = s07.run(spec, store=runs_root)
    return s07.Results(res.run, spec, "auto", "bfloat16")


def test_serving_every_engine_fresh_and_the_deltas_over_engine_pairs(serving_run):
    res = serving_run
    arms = res.result.arm_results
    assert set(arms) == {"colocated", "solo"} and res.result is arms["solo"]  # the headline: one engine at a time
    for arm, r in arms.items():
        e = r.engines
        assert len(e) == 4 and (e.status == "ok").all(), e[["engine", "status", "error"]]
        assert sorted(e.engine) == sorted(f"{arm}/r{k}/{d}" for k in (0, 1) for d in ("auto", "bfloat16"))
        assert e.run_dir.nunique() == 4  # every engine its own stored run
    solo = arms["solo"].engines.set_index("engine")
    assert (solo.gpu_memory_utilization == 0.9).all() if "gpu_memory_utilization" in solo else True
    t = res.tables()
    deltas = t["deltas"].set_index("metric")
    assert (deltas.n == 2).all() and (deltas.arm == "solo").all()
    # recomputed from the phases: each engine's closed-loop output tokens / wall seconds, log ratio per round
    ph = arms["solo"].phases
    ph = ph[ph.phase == "closed-c2"]
    tput = {(int(r["round"]), r.kv_dtype): r.output_tokens / r.wall_s for _, r in ph.iterrows()}
    m, lo, hi = _t_interval([math.log(tput[(k, "bfloat16")] / tput[(k, "auto")]) for k in (0, 1)])
    row = deltas.loc["output tok/s @c=2"]
    assert (row.delta_pct, row.lo_pct, row.hi_pct) == pytest.approx(
        (100 * (math.exp(m) - 1), 100 * (math.exp(lo) - 1), 100 * (math.exp(hi) - 1))
    )
    colo = t["colocation"].set_index("metric")
    assert (colo.n_rounds == 2).all()
    by = t["deltas_by_arm"]
    co = by["colocated"].set_index("metric").loc["output tok/s @c=2"]
    d = [
        math.log(co.b_per_trial[k] / co.a_per_trial[k]) - math.log(tput[(k, "bfloat16")] / tput[(k, "auto")])
        for k in (0, 1)
    ]
    assert colo.loc["output tok/s @c=2"].effect_pct == pytest.approx(100 * (math.exp(np.mean(d)) - 1))
    s = res.summary()
    assert s["replicated"] and s["engines_per_dtype"] == 2 and s["primary_arm"] == "solo" and s["trials"] == 1
    md = res.markdown()
    assert "n = 2 engine pairs" in md and "**Co-location**" in md and "(n=2 engine pairs" in md
    assert all(v.n in (None, 1, 2) for v in res.verdict())  # a throughput claim's n counts engine pairs


def test_prefix_every_engine_fresh_and_the_intervals_over_engine_pairs(prefix_run):
    res = prefix_run
    run = res.run
    assert len(run.starts) == 8 and all(e["status"] == "ok" for e in run.starts.values())
    for es, sub in run.runs:  # every engine set is its own stored run, named by the set
        assert json.loads((sub.run_dir / "spec.json").read_text())["spec"]["engine_set"] == es.key
    t = res.tables()
    cells = t["cells"]
    assert len(cells) == 2 * 2 * 2 * 2 and (cells.trials == 1).all()  # arm x round x dtype x N
    # A/A: the hit counts follow the tokens, so both dtypes hit alike in every engine and the difference has no
    # interval; the TTFT ratio varies with the engine and gets a t interval over the 2 engine pairs
    sweep = t["sweep"].set_index("n_active")
    assert (sweep.arm == "solo").all() and (sweep.n_pairs == 2).all()
    assert sweep.dhit_deterministic.all() and sweep.dhit_pp_ci_low.isna().all() and (sweep.dhit_pp == 0).all()
    rows = run.rows
    solo = rows[rows.arm == "solo"]
    for n in (2, 8):
        g = solo[solo.n_active == n]
        ttft = {
            (int(k[0]), k[1]): float((x.ttft_mean_s * x.requests).sum() / x.requests.sum())
            for k, x in g.groupby(["round", "kv_dtype"])
        }
        m, lo, hi = _t_interval([math.log(ttft[(k, "bfloat16")] / ttft[(k, "auto")]) for k in (0, 1)])
        r = sweep.loc[n]
        assert (r.ttft_ratio, r.ttft_ratio_ci_low, r.ttft_ratio_ci_high) == pytest.approx(
            (math.exp(m), math.exp(lo), math.exp(hi))
        )
    colo = t["colocation"]
    assert len(colo) == 2 and (colo.n_rounds == 2).all()
    s = res.summary()
    assert s["replicated"] and s["engines_per_dtype"] == 2 and s["primary_arm"] == "solo"
    assert s["colocation_cells"] == 2
    text = "\n".join(res.markdown().splitlines())
    assert "n = 2 engine pairs" in text and "Co-location:" in text
    (v,) = res.verdict()
    assert v.n == 2  # the claim's n: engine pairs, not trials
