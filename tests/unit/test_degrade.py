"""Degradation without the native FP8 KV kernel, forced with FP8LAB_NATIVE_FP8=0: no engine is started for
an FP8 spec (recorded unsupported, not stored), and a speed notebook is reduced to its not-measured cell."""

from __future__ import annotations

import nbformat
import pytest

from fp8lab.engine.capability import NATIVE_FP8_ENV
from fp8lab.engine.results import run_cached
from fp8lab.engine.run import run_engine
from fp8lab.paths import NOTEBOOKS_DIR, TINY_MODEL_DIR
from fp8lab.report import degrade
from fp8lab.specs import EngineSpec, Request

NB01 = NOTEBOOKS_DIR / "01_kv_dtype_auto_vs_fp8.ipynb"
PARAMS = {"MODEL": "data/models/fp8lab-tiny-qwen3", "KV_DTYPES": ["auto", "fp8"], "KV_CACHE_GIB": 1.0}


@pytest.fixture
def forced_off(monkeypatch):
    monkeypatch.setenv(NATIVE_FP8_ENV, "0")


def test_fp8_engine_is_not_started_and_not_stored(forced_off, tmp_path):
    spec = EngineSpec(model=str(TINY_MODEL_DIR), kv_cache_dtype="fp8", kv_cache_gib=0.1, timeout_s=5)
    res = run_engine(spec, [Request(prompt_token_ids=(1, 2, 3), max_tokens=2)], work_dir=tmp_path / "w")
    assert res.status == "unsupported" and "FP8LAB_NATIVE_FP8=0" in res.error
    assert res.extra["not_started"] and not (tmp_path / "w").exists()  # nothing was spawned
    stored = run_cached(spec, [Request(prompt_token_ids=(1, 2, 3), max_tokens=2)], study="t", root=tmp_path / "store")
    assert stored.status == "unsupported" and not (tmp_path / "store").exists()  # a later native run is not shadowed


def test_speed_notebooks_are_gated_and_numerical_ones_are_not(forced_off):
    s = degrade.gate(NB01, PARAMS)
    assert s.startswith("Not measured: the serving throughput") and "kv_cache_dtype fp8," in s
    assert degrade.gate(NOTEBOOKS_DIR / "06_decode_speed.ipynb", PARAMS).startswith(
        "Not measured: the decode step time"
    )
    assert degrade.gate(NOTEBOOKS_DIR / "03_quality_token_match.ipynb", PARAMS) is None
    assert degrade.gate(NB01, {**PARAMS, "KV_DTYPES": ["auto", "bfloat16"]}) is None  # nothing FP8 asked


def test_reduced_notebook_keeps_intro_and_parameters(forced_off, tmp_path):
    out = degrade.notebook_for(NB01, PARAMS, tmp_path)
    assert out != NB01 and out.parent == tmp_path
    orig, nb = nbformat.read(str(NB01), 4), nbformat.read(str(out), 4)
    k = next(i for i, c in enumerate(orig.cells) if "parameters" in (c.metadata.get("tags") or []))
    assert [c.source for c in nb.cells[: k + 1]] == [c.source for c in orig.cells[: k + 1]]
    assert len(nb.cells) == k + 3 and "degrade.summary" in nb.cells[-1].source


def test_summary_marks_capacity_as_predicted(forced_off):
    s = degrade.summary("01_kv_dtype_auto_vs_fp8", PARAMS)
    assert s["fp8.status"] == "unsupported" and s["auto.status"] == "not run"
    assert s["auto.predicted_num_blocks"] == 2730 and s["fp8.predicted_num_blocks"] == 5461
    rows = degrade.predicted_capacity(str(TINY_MODEL_DIR), ["auto", "fp8"], 1.0, None)
    assert {r["source"] for r in rows} == {"predicted"} and rows[1]["kv_capacity_tokens"] == 5461 * 128


def test_native_device_runs_notebooks_in_full(monkeypatch, tmp_path):
    """Where the kernel exists Study 01 runs in full; ``FP8LAB_NATIVE_FP8=1`` cannot switch it on where it does not
    (the switch only switches off): there the reduced notebook runs, giving the device's own reason."""
    monkeypatch.setenv(NATIVE_FP8_ENV, "1")
    from fp8lab.engine.capability import kv_support

    sup = kv_support("fp8", str(TINY_MODEL_DIR))
    if sup.native:
        assert degrade.notebook_for(NB01, PARAMS, None) == NB01
        return
    assert degrade.notebook_for(NB01, PARAMS, tmp_path) != NB01
    sentence = degrade.gate(NB01, PARAMS)
    assert sup.reason and sup.reason in sentence and NATIVE_FP8_ENV not in sentence


def test_longctx_without_the_kernel_emulates_only_the_quality_phases(forced_off, monkeypatch):
    """Study 04 on engines that behave like vLLM on the arithmetic (test_longctx's fake runner) behind the real
    capability guard: FP8 ramp/sweep/probe engines unsupported, the quality phases on an emulated engine."""
    import sys

    import fp8lab.engine.results
    from fp8lab import longctx as lc
    from fp8lab.engine import fp8emu
    from fp8lab.engine.capability import unsupported_result

    sys.path.insert(0, str(NOTEBOOKS_DIR.parent / "tests" / "unit"))
    from test_longctx import TINY, _fake_runner

    plan = lc.LongCtxPlan(
        model=TINY,
        lengths=lc.length_grid("geometric", 512, 4096, 32),
        output_tokens=32,
        concurrency=2,
        kv_cache_gib=0.03,
        block_size=128,
        random_token_lengths=(),
        quality_model=TINY,
        quality_length=600,
        passkey_lengths=(256,),
        passkey_depths=(0.5,),
    )
    fake, calls = _fake_runner(plan)
    seen = []

    def guarded(spec, phases, study, driver, sample_interval_s, env=None):
        seen.append((spec, study, env, phases))
        u = unsupported_result(spec)
        return u if u is not None else fake(spec, phases, study, driver, sample_interval_s, env)

    monkeypatch.setattr(fp8lab.engine.results, "run_cached", guarded)
    res = lc.run_study(plan, progress=False)
    emu = [(s, st, e, p) for s, st, e, p in seen if e and fp8emu.ENV in e]
    assert len(emu) == 1
    spec, study, env, phases = emu[0]
    assert spec.kv_cache_dtype == "auto" and env[fp8emu.ENV] == "e4m3" and study.endswith(".fp8emu-e4m3")
    assert plan.engine_spec("fp8", quality=True).kv_cache_gib is None  # the notebooks' default: no quality budget
    # never vLLM's CPU default (0.9 of the NUMA node, refused when other processes hold more than the rest): a budget
    # for the phases' longest sequence at their highest concurrency, in bf16 (TINY: 3,072 B/token), with 25% slack
    longest, conc = spec.max_model_len, max(p.concurrency for p in phases)
    assert longest == max(r.prompt_len + r.max_tokens for p in phases for r in p.requests) >= 600
    assert (
        conc * (longest + 128) * 3072 * 1.25
        <= spec.kv_cache_gib * 2**30
        < conc * (longest + 128) * 3072 * 1.25 + 2**30 / 64
    )
    assert res.emulated == ["fp8 (emulated)"]
    eng = res.engines.set_index(["role", "kv_dtype"])
    assert eng.loc[("ramp", "fp8"), "status"] == "unsupported"
    t = lc.tables(res)
    assert set(t.passkey.kv_dtype) == {"auto", "fp8 (emulated)"}
    assert set(t.divergence.kv_dtype) == {"fp8 (emulated)"}
    s = lc.summary_values(res, t)
    assert s["emulated"] == ["fp8 (emulated)"] and "FP8LAB_NATIVE_FP8=0" in s["not_measured"]
    assert "Divergence and passkey only" in lc.verdict_markdown(res, t)


def test_a_rerender_from_the_store_is_neither_reduced_nor_emulated(monkeypatch, tmp_path):
    """Re-rendering reports from a results store starts no engine, so this device's kernel does not decide what a
    study shows: an H200's fp8 runs re-render in full on an AVX2 CPU (it used to reduce Studies 01 and 06 to their
    not-measured cell and look for emulated runs in 02-04). Without the store switch the same model is refused."""
    from fp8lab.engine import capability
    from fp8lab.paths import STORE_ONLY_ENV

    monkeypatch.delenv(NATIVE_FP8_ENV, raising=False)
    monkeypatch.delenv(STORE_ONLY_ENV, raising=False)
    model = tmp_path / "head80"  # head_dim 80: no CPU runs an FP8 cache for it, whatever its ISA
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 32}')
    params = {**PARAMS, "MODEL": str(model)}
    if capability.detect().platform != "cpu":
        pytest.skip("a CPU rule: a GPU with the kernel runs head_dim 80")
    assert not capability.kv_support("fp8", str(model)).native and degrade.gate(NB01, params) is not None
    monkeypatch.setenv(STORE_ONLY_ENV, "1")
    sup = capability.kv_support("fp8", str(model))
    assert sup.native and not sup.emulated and "results store" in sup.backend
    assert degrade.gate(NB01, params) is None and degrade.notebook_for(NB01, params, tmp_path) == NB01
    assert capability.unsupported_result(EngineSpec(model=str(TINY_MODEL_DIR), kv_cache_dtype="fp8")) is None
    monkeypatch.setenv(NATIVE_FP8_ENV, "0")  # the explicit switch still wins: a deliberately reduced re-render
    assert degrade.gate(NB01, params) is not None


def test_reduced_notebook_keeps_its_verdict_section(forced_off, tmp_path):
    """The index links every study's #verdict: a study reduced on a device without the kernel keeps the anchor."""
    import nbformat

    from fp8lab.report import htmlexport

    nb = nbformat.read(str(degrade.notebook_for(NB01, PARAMS, tmp_path)), as_version=4)
    start, stop = htmlexport.verdict_span(nb)
    assert "degrade.summary" in nb.cells[stop - 1].source  # the not-measured sentence is the verdict's body
    page = htmlexport.prepare(nb)
    assert any('<h2 id="verdict">Verdict: not measured on this device</h2>' in c.source for c in page.cells)
