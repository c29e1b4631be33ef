"""Notebook 04 executed top to bottom by papermill on the test profile (``cpu-ci``, cpu-tiny with fewer repetitions); asserts on its summary.

Expectations are derived from the parameters the profile gives (the KV budget, the grid), by the
formula, so they hold for whichever budget the profile sets."""

from __future__ import annotations

import pytest

from fp8lab import kvmath
from fp8lab import longctx as lc
from fp8lab.paths import NOTEBOOKS_DIR

pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_fp8,
]  # its emulated path (no kernel) is not asserted here yet: test_degraded.py and the main job cover it there

NB04 = NOTEBOOKS_DIR / "04_long_context_ramp_128k.ipynb"


@pytest.fixture(scope="module")
def nb04(run_nb, tiny_model):
    params, summary = run_nb(NB04, {"MODEL": tiny_model, "QUALITY_MODEL": tiny_model})
    return params, lc.LongCtxPlan.from_params(params), summary


def _blocks(plan: lc.LongCtxPlan, dt: str, bs: int) -> int:
    return kvmath.predict_num_blocks(
        plan.model, int(plan.kv_cache_gib * kvmath.GIB), bs, dt, hybrid_kv_cache_manager=False
    )


def test_boundary_measured_equals_formula(nb04):
    _, plan, s = nb04
    bs = s["block_size"]
    assert bs == (plan.block_size or 128)  # vLLM's CPU default
    for dt in plan.kv_dtypes:
        assert s[f"{dt}.num_blocks_engine"] == s[f"{dt}.num_blocks_formula"] == _blocks(plan, dt, bs)
        assert s[f"{dt}.over_status"] == "oom"  # one block beyond the prediction fails at start...
        assert (
            s[f"{dt}.longest_measured"] == s[f"{dt}.longest_formula"] == lc.longest_context(_blocks(plan, dt, bs), bs)
        )
    assert s["fp8.longest_measured"] >= 2 * s["auto.longest_measured"]  # ...and fp8 holds twice the context


def test_ramp_ran_every_length(nb04):
    _, plan, s = nb04
    assert s["lengths"] == list(plan.lengths) and s["max_context"] == plan.max_context
    for dt in plan.kv_dtypes:
        holds = s[f"{dt}.longest_formula"] >= plan.max_context
        assert s[f"{dt}.holds_ramp"] == holds
        for L in plan.lengths:
            fits = L + plan.output_tokens <= (plan.max_context if holds else s[f"{dt}.longest_formula"])
            assert s[f"{dt}.c1.L{L}.outcome"] == ("ok" if fits else "over_capacity")
        short, long_ = plan.lengths[0], max(L for L in plan.lengths if s[f"{dt}.c1.L{L}.outcome"] == "ok")
        assert s[f"{dt}.c1.L{long_}.ttft_p50_s"] > s[f"{dt}.c1.L{short}.ttft_p50_s"] > 0  # prefill grows with length
        assert (
            s[f"{dt}.c1.L{short}.itl_p50_s"] > 0
            and s[f"{dt}.c1.L{short}.itl_p95_s"] >= s[f"{dt}.c1.L{short}.itl_p50_s"]
        )


def test_concurrency_outcome_follows_the_formula(nb04):
    _, plan, s = nb04
    bs, C = s["block_size"], plan.concurrency
    for dt in plan.kv_dtypes:
        for L in plan.lengths:
            outcome = s.get(f"{dt}.c{C}.L{L}.outcome")
            if outcome in (None, "over_capacity"):
                continue
            fits = lc.max_concurrency_at(_blocks(plan, dt, bs), bs, L + plan.output_tokens) >= C
            assert (outcome == "held") == fits, (dt, L, outcome)
            assert outcome in ("held", "preempted", "serialized")


def test_block_size_sweep(nb04):
    params, plan, s = nb04
    L = plan.sweep_lengths[-1]
    for dt in plan.sweep_dtypes:
        for b in params["SWEEP_BLOCK_SIZES"]:
            # the CPU attention backend takes multiples of 32 (CPU_ATTN: MultipleOf(32)); vLLM rejects the rest
            assert s[f"{dt}.bs{b}.L{L}.outcome"] == ("ok" if b % 32 == 0 else "unsupported")
    if 16 in params["SWEEP_BLOCK_SIZES"]:
        assert 16 in s["claim.block256.unsupported"]


def test_quality_along_the_context(nb04):
    _, plan, s = nb04
    for dt in plan.kv_dtypes[1:]:
        for src in (["text"] if plan.quality_docs else []) + (["random"] if plan.quality_random_docs else []):
            assert s[f"{dt}.{src}.div.abs_dlogprob"] > 0  # FP8 changes the logprobs, silently
            assert 0.0 <= s[f"{dt}.{src}.div.flip_rate"] < 0.5
    for L in plan.passkey_lengths:
        for dt in plan.kv_dtypes:
            assert 0.0 <= s[f"{dt}.passkey.L{L}"] <= 1.0
    # the shipped model (512-token training) cannot retrieve a passkey at all: the verdict must say so
    assert s["silent.baseline_can_retrieve"] is False


def test_claims_are_labelled(nb04):
    _, _, s = nb04
    for k in ("oom", "gains_grow", "block256", "silent", "random_tokens"):
        assert isinstance(s[f"claim.{k}"], str) and s[f"claim.{k}"]
    assert s["engines"] >= 4 and s["study_wall_s"] > 0
