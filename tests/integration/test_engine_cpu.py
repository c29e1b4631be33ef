"""Real vLLM (CPU build) on the shipped model: capacity, timings, failures, process hygiene.

Where the native FP8 KV kernel is missing (an AVX2-only CPU) the fp8 engine runs emulated, as the numerical studies
run it there (:func:`fp8lab.engine.results.run_emulated`: a bf16 cache holding FP8-rounded K/V): the same engine checks hold,
and its capacity is auto's, never FP8's."""

from __future__ import annotations

import pytest

from fp8lab import kvmath
from fp8lab.engine.capability import kv_support
from fp8lab.engine.results import load, run_cached, run_emulated
from fp8lab.engine.run import run_engine
from fp8lab.specs import EngineSpec, Phase, Request, SpecError

pytestmark = pytest.mark.slow

NATIVE = kv_support("fp8").native  # else fp8 runs emulated (fp8lab.engine.fp8emu)

KV_GIB = 1.0
PROMPT = tuple(range(100, 164))  # 64 token ids
N_OUT = 12


def _ab_run(tiny_model: str, dt: str):
    reqs = tuple(Request(prompt_token_ids=PROMPT, max_tokens=N_OUT, cls="c64") for _ in range(4))
    spec = EngineSpec(model=tiny_model, kv_cache_dtype=dt, kv_cache_gib=KV_GIB, max_model_len=2048)
    phases = [Phase("warmup", reqs[:1]), Phase("main", reqs)]
    if dt != "auto" and not NATIVE:
        return run_emulated(spec, phases, study="test_engine")
    return run_cached(spec, phases, study="test_engine")


@pytest.fixture(scope="module")
def ab_runs(tiny_model, runs_root):
    """auto and fp8 on the same KV budget, four greedy requests each (one engine per dtype; fp8 emulated where the
    kernel is missing)."""
    return {dt: _ab_run(tiny_model, dt) for dt in ("auto", "fp8")}


def test_both_dtypes_ran(ab_runs):
    for dt, res in ab_runs.items():
        assert res.status == "ok", (dt, res.error, res.log_tail[-2000:])
        if dt == "auto" or NATIVE:
            assert res.engine["kv_cache_dtype"] == dt and "fp8_emulation" not in res.engine
        else:  # a bf16 cache into which the plugin writes E4M3-rounded K/V
            assert res.engine["kv_cache_dtype"] == "auto" and res.engine["fp8_emulation"] == "e4m3"
            assert res.extra["emulated"] == "e4m3"
        # on a CPU the engine core runs inside fp8lab's worker (fp8lab.engine.devices.engine_env): no second vLLM import
        assert res.engine["engine_core"] == "in_process"


def test_fp8_doubles_capacity_for_the_same_budget(ab_runs):
    auto, fp8 = ab_runs["auto"].engine, ab_runs["fp8"].engine
    assert auto["kv_budget_bytes"] == fp8["kv_budget_bytes"] == int(KV_GIB * 2**30)
    ratio = fp8["kv_capacity_tokens"] / auto["kv_capacity_tokens"]
    # an emulated FP8 cache is bf16-sized: auto's capacity, which is why no study reads capacity from it
    assert ratio == (pytest.approx(2.0, rel=0.02) if NATIVE else 1.0)


def test_formula_predicts_engine_capacity(ab_runs, tiny_model):
    layout = kvmath.load_layout(tiny_model)
    for dt, res in ab_runs.items():
        e = res.engine
        # the cache's own dtype: dt, or auto for an emulated fp8 engine
        predicted = kvmath.predict_num_blocks(layout, e["kv_budget_bytes"], e["block_size"], e["kv_cache_dtype"])
        assert abs(predicted - e["num_blocks"]) <= 0.01 * e["num_blocks"], (dt, predicted, e["num_blocks"])


def test_timings_present_and_sane(ab_runs):
    for res in ab_runs.values():
        main = res.records[res.records.phase == "main"]
        assert len(main) == 4
        assert (main.output_tokens == N_OUT).all() and (main.prompt_tokens == len(PROMPT)).all()
        assert (main.ttft_s > 0).all() and (main.tpot_s > 0).all()
        # E2E = TTFT + (n-1) TPOT by construction of vLLM's timestamps; and TTFT < E2E < the phase's wall time
        assert main.e2e_s.to_numpy() == pytest.approx((main.ttft_s + (N_OUT - 1) * main.tpot_s).to_numpy(), rel=1e-6)
        assert (main.e2e_s > main.ttft_s).all()
        assert (main.e2e_s <= res.phases["main"]["wall_s"] + 0.05).all()
        assert res.engine["engine_start_s"] > 0 and res.engine["mem_peak_bytes"] > 0
        assert res.phases["main"]["output_tokens"] == 4 * N_OUT


def test_greedy_outputs_deterministic_within_engine(ab_runs):
    for res in ab_runs.values():
        main = res.records[res.records.phase == "main"]
        first = list(main.output_token_ids.iloc[0])
        assert all(list(ids) == first for ids in main.output_token_ids)


def test_completed_run_is_loaded_not_rerun(ab_runs, tiny_model):
    res = ab_runs["auto"]
    again = load(res.run_dir)
    assert again.status == "ok" and again.engine["num_blocks"] == res.engine["num_blocks"]
    assert (res.run_dir / "provenance.json").exists() and (res.run_dir / "records.parquet").exists()
    assert again.provenance["vllm"] and again.provenance["fp8lab_commit"]
    # the same run asked for again is loaded from the store (the same cache key), not measured anew; its key names
    # the vLLM and torch it ran on and the engine-side code
    import json

    from fp8lab.engine.results import engine_code_hash

    second = _ab_run(tiny_model, "auto")
    assert second.extra.get("cached") and second.run_dir == res.run_dir
    assert len(second.records) == len(res.records) and second.engine["num_blocks"] == res.engine["num_blocks"]
    key = json.loads((res.run_dir / "spec.json").read_text())
    assert key["vllm"] == res.provenance["vllm"] and key["engine_code"] == engine_code_hash()
    assert key["torch"] and key["torch"] == res.provenance["torch"]


def test_no_processes_left_behind(ab_runs, engine_processes):
    assert engine_processes() == []


def test_impossible_max_model_len_is_a_clear_failure(tiny_model, tmp_path, engine_processes):
    # 16 MiB of fp8 KV holds 16*2**20 / (128*1536) = 85 blocks = 10880 tokens; a 32768-token sequence cannot fit,
    # so vLLM refuses to start and the run comes back as a record, not a crash. Where fp8 cannot start: 8 MiB of
    # auto KV, 8*2**20 / (128*3072) = 21 blocks = 2688 tokens, against a 4096-token sequence (vLLM's profiling
    # pass over 32768 tokens took minutes on a 2-core AVX2 CPU).
    dt, gib, max_len = ("fp8", 16 / 1024, 32768) if NATIVE else ("auto", 8 / 1024, 4096)
    spec = EngineSpec(model=tiny_model, kv_cache_dtype=dt, kv_cache_gib=gib, max_model_len=max_len)
    res = run_engine(spec, work_dir=tmp_path)
    assert res.status == "oom", (res.status, res.error)
    assert "KV cache" in res.error and str(max_len) in res.error
    assert engine_processes() == []


def test_request_longer_than_max_model_len_rejected_before_start(tiny_model):
    spec = EngineSpec(model=tiny_model, max_model_len=128, kv_cache_gib=KV_GIB)
    with pytest.raises(SpecError, match="prompt_len \\+ max_tokens"):
        run_engine(spec, [Request(prompt_token_ids=PROMPT * 2, max_tokens=10)])
