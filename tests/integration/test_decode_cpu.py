"""Study 06's engine-level replication (issue 35) on real vLLM (CPU build), the shipped model: fresh engines in ABBA
order, every engine measuring the whole grid, a run cut at a deadline resuming with the engine sets it had not
finished, and the intervals computed over engines from the stored rows. The two "dtypes" are ``auto`` and
``bfloat16`` (the same bf16 cache: an A/A comparison), so it runs on any CPU, with or without the native FP8 kernel
(the FP8 design itself is tests/notebooks/test_nb06.py, which needs the kernel)."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from scipy import stats as sps

from fp8lab import decode
from fp8lab.decode import replication
from fp8lab.decode.worker import DEADLINE_ENV

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def aa_run(tiny_model, runs_root, tmp_path_factory):
    """The solo arm, 3 engines per dtype, 3 contexts at batch 1, 2 repetitions: first with a deadline already
    passed (the first engine set runs, the rest wait), then again without one (the rest run; the first is kept)."""
    spec = decode.DecodeSpec(
        model=tiny_model,
        kv_dtypes=["auto", "bfloat16"],
        contexts=[64, 256, 512],
        batches=[1],
        reps=2,
        engines=3,
        arms=["solo"],
        decode_tokens=8,
        kv_cache_gib=0.05,
        solo_kv_cache_gib=0.05,
        enforce_eager=True,
        max_model_len=1024,
        max_num_batched_tokens=1024,
    )
    mp = pytest.MonkeyPatch()
    mp.setenv(DEADLINE_ENV, str(time.time() + 1))
    try:
        first = decode.run_decode(spec, runs_root)
    finally:
        mp.undo()
    second = decode.run_decode(spec, runs_root)
    return spec, first, second


def test_a_deadline_defers_whole_engine_sets_and_the_next_call_resumes(aa_run):
    spec, first, second = aa_run
    assert not first.complete and len(first.starts) == 1  # the first set ran (no estimate yet); then the deadline
    assert [s["configs"] for s in first.deferred] == [["bfloat16"], ["bfloat16"], ["auto"], ["auto"], ["bfloat16"]]
    assert second.complete and second.deferred == [] and not second.all_engines_failed()
    uid = first.starts["g0/solo/r0/auto"]["engine_uid"]
    assert second.starts["g0/solo/r0/auto"]["engine_uid"] == uid  # the finished set was not measured again


def test_every_engine_started_fresh_in_abba_order_and_measured_the_grid(aa_run):
    spec, _, run = aa_run
    m = run.measured()
    assert len(set(m.engine_uid)) == 6 and m.groupby("engine_uid").size().eq(3 * 2).all()
    first_row = m.sort_values("t_wall").drop_duplicates("engine_uid")
    assert list(first_row.kv_dtype) == ["auto", "bfloat16", "bfloat16", "auto", "auto", "bfloat16"]
    assert list(first_row["round"]) == [0, 0, 1, 1, 2, 2]
    assert all(e["status"] == "ok" and e["kv_cache_dtype_requested"] == e["kv_dtype"] for e in run.starts.values())


def test_point_intervals_are_over_engines(aa_run):
    """Recomputed here from the stored rows: the mean over each engine's repetitions, the log ratio per round, a t
    interval with 2 degrees of freedom."""
    spec, _, run = aa_run
    pts = replication.point_table(run.measured(), "solo", "auto", "bfloat16").set_index("context_len")
    rows = [json.loads(line) for line in (run.run_dir / "g0" / "rows.jsonl").read_text().splitlines()]
    for c in spec.contexts:
        mean = {}
        for r in rows:
            if r["context_len"] == c and r["rep"] >= 0:
                mean.setdefault((r["round"], r["kv_dtype"]), []).append(r["step_s"])
        logs = np.log([np.mean(mean[(k, "bfloat16")]) / np.mean(mean[(k, "auto")]) for k in range(3)])
        h = sps.t.ppf(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
        p = pts.loc[c]
        assert p.n_engines == 3 and p.reps == 2
        assert p.ratio == pytest.approx(math.exp(logs.mean()))
        assert (p.ratio_ci_low, p.ratio_ci_high) == pytest.approx(
            (math.exp(logs.mean() - h), math.exp(logs.mean() + h))
        )
