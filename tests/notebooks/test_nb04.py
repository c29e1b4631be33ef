"""Notebook 04 executed top to bottom by papermill on the test profile (``cpu-ci``, or ``cpu-ci-emulated`` where FP8
runs emulated: both run the plan of tests/integration/test_longctx_cpu.py, whose engines the suite has then stored, so
the notebook loads them, and the block-size sweep of its own); asserts on its summary and its page.

Expectations are derived from the parameters the profile gives (the KV budget, the grid), by the
formula, so they hold for whichever budget the profile sets. Without the native FP8 KV kernel (``native_fp8``
False) auto is measured as natively, fp8's ramp, sweep and probe engines are recorded ``unsupported`` before any
start (its capacity is the formula's alone: twice auto's blocks), and fp8's divergence and passkey phases run on an
emulated engine (:mod:`fp8lab.fp8emu`) under ``fp8 (emulated)`` (``kv_label``); the page says what was not
measured and what ran emulated."""

from __future__ import annotations

import json
import re

import pytest

from fp8lab import kvmath
from fp8lab import longctx as lc
from fp8lab.paths import NOTEBOOKS_DIR

pytestmark = [
    pytest.mark.slow,
]  # its emulated path (no kernel) is not asserted here yet: test_degraded.py and the main job cover it there

NB04 = NOTEBOOKS_DIR / "04_long_context_ramp_128k.ipynb"


@pytest.fixture(scope="module")
def nb04(run_nb, tiny_model):
    params, summary = run_nb(NB04, {"MODEL": tiny_model, "QUALITY_MODEL": tiny_model})
    return params, lc.LongCtxPlan.from_params(params), summary


def _measured(plan: lc.LongCtxPlan, native_fp8: bool) -> list[str]:
    """The kv dtypes whose engines ran on this device: every one natively, auto alone without the kernel."""
    return list(plan.kv_dtypes) if native_fp8 else [d for d in plan.kv_dtypes if d == "auto"]


def _blocks(plan: lc.LongCtxPlan, dt: str, bs: int) -> int:
    return kvmath.predict_num_blocks(
        plan.model, int(plan.kv_cache_gib * kvmath.GIB), bs, dt, hybrid_kv_cache_manager=False
    )


def test_boundary_measured_equals_formula(nb04, native_fp8):
    _, plan, s = nb04
    bs = s["block_size"]
    assert bs == (plan.block_size or 128)  # vLLM's CPU default
    for dt in plan.kv_dtypes:
        assert s[f"{dt}.num_blocks_formula"] == _blocks(plan, dt, bs)
        assert s[f"{dt}.longest_formula"] == lc.longest_context(_blocks(plan, dt, bs), bs)
    for dt in _measured(plan, native_fp8):
        assert s[f"{dt}.num_blocks_engine"] == s[f"{dt}.num_blocks_formula"]
        assert s[f"{dt}.over_status"] == "oom"  # one block beyond the prediction fails at start...
        assert s[f"{dt}.longest_measured"] == s[f"{dt}.longest_formula"]
    if native_fp8:
        assert s["fp8.longest_measured"] >= 2 * s["auto.longest_measured"]  # ...and fp8 holds twice the context
        return
    # no kernel: fp8 refused before a start, so nothing measured; the formula gives it twice auto's blocks
    assert s["fp8.num_blocks_engine"] is None and s["fp8.longest_measured"] is None
    assert s["fp8.over_status"] == "unsupported" and s["fp8.holds_ramp"] is False
    assert s["fp8.num_blocks_formula"] >= 2 * s["auto.num_blocks_engine"] > 0
    assert s["fp8.longest_formula"] >= 2 * s["auto.longest_measured"]


def test_ramp_ran_every_length(nb04, native_fp8):
    _, plan, s = nb04
    assert s["lengths"] == list(plan.lengths) and s["max_context"] == plan.max_context
    for dt in _measured(plan, native_fp8):
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
    if not native_fp8:  # every fp8 point says it did not run, and no fp8 timing exists (an emulation is never timed)
        assert all(s[f"fp8.c1.L{L}.outcome"] == "unsupported" for L in plan.lengths)
        timed = re.compile(r"fp8( \(emulated\))?\.c\d+\.L\d+\.(?!outcome$)")
        assert not [k for k in s if timed.match(k)]


def test_concurrency_outcome_follows_the_formula(nb04, native_fp8):
    _, plan, s = nb04
    bs, C = s["block_size"], plan.concurrency
    for dt in plan.kv_dtypes:
        for L in plan.lengths:
            outcome = s.get(f"{dt}.c{C}.L{L}.outcome")
            if dt not in _measured(plan, native_fp8):
                assert outcome in (None, "unsupported"), (dt, L, outcome)
                continue
            if outcome in (None, "over_capacity"):
                continue
            fits = lc.max_concurrency_at(_blocks(plan, dt, bs), bs, L + plan.output_tokens) >= C
            assert (outcome == "held") == fits, (dt, L, outcome)
            assert outcome in ("held", "preempted", "serialized")


def test_block_size_sweep(nb04, native_fp8):
    params, plan, s = nb04
    L = plan.sweep_lengths[-1]
    for dt in plan.sweep_dtypes:
        for b in params["SWEEP_BLOCK_SIZES"]:
            # the CPU attention backend takes multiples of 32 (CPU_ATTN: MultipleOf(32)); vLLM rejects the rest;
            # without the kernel an fp8 point is refused at every size
            ok = b % 32 == 0 and (native_fp8 or dt not in ("fp8", "fp8_e4m3", "fp8_e5m2"))
            assert s[f"{dt}.bs{b}.L{L}.outcome"] == ("ok" if ok else "unsupported")
    if 16 in params["SWEEP_BLOCK_SIZES"]:
        assert 16 in s["claim.block256.unsupported"]


def test_quality_along_the_context(nb04, kv_label, native_fp8):
    _, plan, s = nb04
    for dt in plan.kv_dtypes[1:]:
        for src in (["text"] if plan.quality_docs else []) + (["random"] if plan.quality_random_docs else []):
            lab = kv_label(dt)
            assert s[f"{lab}.{src}.div.abs_dlogprob"] > 0  # FP8 changes the logprobs, silently
            assert 0.0 <= s[f"{lab}.{src}.div.flip_rate"] < 0.5
    for L in plan.passkey_lengths:
        for dt in plan.kv_dtypes:
            assert 0.0 <= s[f"{kv_label(dt)}.passkey.L{L}"] <= 1.0
    # the shipped model (512-token training) cannot retrieve a passkey at all: the verdict must say so
    assert s["silent.baseline_can_retrieve"] is False
    if not native_fp8:  # fp8's quality phases under the emulated label only, never a native one beside it
        assert s["emulated"] == [kv_label("fp8")]
        assert not any(k.startswith(("fp8.text.", "fp8.random.", "fp8.passkey")) for k in s)


def test_claims_are_labelled(nb04, native_fp8, no_kernel):
    _, _, s = nb04
    for k in ("oom", "gains_grow", "block256", "silent", "random_tokens"):
        assert isinstance(s[f"claim.{k}"], str) and s[f"claim.{k}"]
    assert s["engines"] >= 4 and s["study_wall_s"] > 0
    if not native_fp8:  # what was not measured and why, then what ran emulated
        assert s["not_measured"].startswith(
            f"Not measured: the long-context speed and capacity of kv_cache_dtype fp8, because {no_kernel}"
        )
        assert "fp8 (emulated) ran emulated" in s["not_measured"]


def test_the_page_says_what_ran_emulated(nb04, tmp_path_factory, native_fp8):
    """The page carries its verdict, and without the kernel says in it what was not measured and what ran
    emulated."""
    _, _, s = nb04
    pages = {
        f.parent.resolve(): f.with_suffix("").with_suffix(".html")
        for f in tmp_path_factory.getbasetemp().glob(f"*/{NB04.stem}.summary.json")
        if json.loads(f.read_text()) == s
    }
    assert len(pages) == 1, pages
    html = pages.popitem()[1].read_text(encoding="utf-8")
    assert "Verdict" in html
    if native_fp8:
        assert "(emulated)" not in html
    else:
        assert "Not measured: the long-context speed and capacity" in html and "fp8 (emulated)" in html
