"""Studies 01 (serving) and 06 (decode speed) on the study contract (:mod:`fp8lab.study`), without an engine: each
``Spec.from_params`` builds from the cpu-tiny profile's parameters exactly what its notebook built before (the same
plan, the same decode spec and descriptor, so the same stored runs) and names a bad or missing parameter; ``run``
on a fake engine (Study 01: the fake paired study of test_metrics) or a stored run (Study 06) gives the tables, the
summary and rows the notebook records (the same as the study's own functions), and typed verdicts by the audit's
rules; a study whose fp8 engine did not start measures no bandwidth and judges nothing."""

from __future__ import annotations

import json
import os

import pytest
from test_decode_analysis import CTX, REPS, _rows
from test_metrics import _FakeEngine, _plan, engine  # noqa: F401 - the fake paired study of the serving tests

from fp8lab import audit, decode, serving, studies, study
from fp8lab.decode import study as s06
from fp8lab.errors import SpecError
from fp8lab.paths import NOTEBOOKS_DIR, TINY_MODEL_DIR
from fp8lab.profiles import load_profile, resolved_parameters
from fp8lab.serving import study as s01
from fp8lab.specs import spec_hash

MISSING = object()  # a parameter left out


def _params(name: str) -> dict:
    return resolved_parameters(NOTEBOOKS_DIR / f"{name}.ipynb", load_profile("cpu-tiny"))


# ------------------------------------------------------------------------------------------ Spec.from_params
def test_both_are_registered_and_satisfy_the_contract():
    assert studies.load(s01.NAME) is s01 and studies.load(s06.NAME) is s06
    assert s01.NAME == "01_kv_dtype_auto_vs_fp8" and s06.NAME == "06_decode_speed"
    ids = {c.id for c in audit.CLAIMS}
    assert set(s01.CLAIMS) <= ids and set(s06.CLAIMS) <= ids
    # each claim's rule is an audit function, and the study is among the claim's evidence
    for mod in (s01, s06):
        for cid in mod.CLAIMS:
            fn = mod.CLAIMS[cid][0] if isinstance(mod.CLAIMS[cid], tuple) else mod.CLAIMS[cid]
            assert callable(getattr(audit, fn)), fn
            assert audit.pages.page_name(mod.NAME) in next(c for c in audit.CLAIMS if c.id == cid).studies, cid


def test_study_01_spec_from_the_profile_is_the_plan_the_notebook_built():
    p = _params(s01.NAME)
    spec = s01.Spec.from_params(p)
    by_hand = serving.plan_from_params({k: v for k, v in p.items() if k.isupper()})  # notebook 01 before the contract
    assert type(spec) is serving.ServingSpec and spec.plan == by_hand
    assert spec_hash(spec.plan.to_dict()) == spec_hash(by_hand.to_dict())
    assert (spec.bandwidth_gbs, spec.run_fidelity) == (p["BANDWIDTH_GBS"], p["RUN_FIDELITY"])
    assert spec.fidelity_shape == tuple(p["FIDELITY_SHAPE"]) and spec.fidelity_rounds == p["FIDELITY_ROUNDS"]
    assert spec.plan.trials == p["TRIALS"] and spec.plan.kv_dtypes == tuple(p["KV_DTYPES"])
    # a notebook's globals() hold lower-case names too: they never fill a field
    assert s01.Spec.from_params({**p, "trials": 1, "seed": -1, "_": None, 1: 2}) == spec


def test_study_06_spec_from_the_profile_is_the_spec_the_notebook_built():
    p = _params(s06.NAME)
    spec = s06.Spec.from_params(p)
    by_hand = decode.DecodeSpec(  # notebook 06 before the contract, field by field
        model=p["MODEL"],
        kv_dtypes=p["KV_DTYPES"],
        contexts=p["CONTEXTS"],
        batches=p["BATCHES"],
        reps=p["REPS"],
        decode_tokens=p["DECODE_TOKENS"],
        warmup=p["WARMUP"],
        kv_cache_gib=p["KV_CACHE_GIB"],
        gpu_memory_utilization=p["GPU_MEMORY_UTILIZATION"],
        max_model_len=p["MAX_MODEL_LEN"],
        max_num_batched_tokens=p["MAX_NUM_BATCHED_TOKENS"],
        max_prefill_tokens=p["MAX_PREFILL_TOKENS"],
        block_size=p["BLOCK_SIZE"],
        enforce_eager=p["ENFORCE_EAGER"],
        load_format=p["LOAD_FORMAT"],
        skip_tokenizer_init=p["SKIP_TOKENIZER_INIT"],
        tensor_parallel_size=p["TP"],
        attention_backend=p["ATTENTION_BACKEND"],
        concurrent_engines=p["CONCURRENT_ENGINES"],
        gpu_groups=p["GPU_GROUPS"],
        env=p["ENV"],
        engine_args=p["ENGINE_ARGS"],
        engines=p["ENGINES"],  # issue 35: the engine-level replication
        arms=p["ARMS"],
        solo_gpu_memory_utilization=p["SOLO_GPU_MEMORY_UTILIZATION"],
        solo_kv_cache_gib=p["SOLO_KV_CACHE_GIB"],
    )
    assert spec.decode == by_hand and spec_hash(spec.decode.descriptor()) == spec_hash(by_hand.descriptor())
    assert (spec.bandwidth_gbs, spec.records) == (p["BANDWIDTH_GBS"], p["RECORDS"])
    assert spec.kv_dtypes == tuple(p["KV_DTYPES"])
    # an int budget stays as given (the H200 profile's KV_CACHE_GIB: 24): DecodeSpec.from_params would make it 24.0
    spec24 = s06.Spec.from_params({**p, "KV_CACHE_GIB": 24})
    assert spec24.decode.descriptor()["spec"]["kv_cache_gib"] == 24
    assert json.dumps(spec24.decode.descriptor()["spec"]["kv_cache_gib"]) == "24"


@pytest.mark.parametrize(
    ("name", "bad", "spec_name", "field"),
    [
        (s01.NAME, {"TRIALS": 2}, "ServingPlan", "trials"),
        (s01.NAME, {"KV_DTYPES": ["auto"]}, "ServingPlan", "kv_dtypes"),
        (s01.NAME, {"FIDELITY_ROUNDS": 0}, "ServingSpec", "fidelity_rounds"),
        (s01.NAME, {"FIDELITY_SHAPE": [512, 128]}, "ServingSpec", "fidelity_shape"),
        (s01.NAME, {"BANDWIDTH_GBS": -1.0}, "ServingSpec", "bandwidth_gbs"),
        (s01.NAME, {"SEED": MISSING}, "ServingSpec", "SEED"),
        (s06.NAME, {"REPS": 1}, "DecodeSpec", "reps"),
        (s06.NAME, {"REPS": 2, "ENGINES": 1}, "DecodeSpec", "reps"),  # one engine per dtype: its repetitions, 3+
        (s06.NAME, {"ENGINES": 0}, "DecodeSpec", "engines"),
        (s06.NAME, {"ARMS": ["colocated", "nearby"]}, "DecodeSpec", "arms"),
        (s06.NAME, {"SOLO_GPU_MEMORY_UTILIZATION": 1.5}, "DecodeSpec", "solo_gpu_memory_utilization"),
        (s06.NAME, {"ENGINES": MISSING}, "DecodeStudySpec", "ENGINES"),
        (s06.NAME, {"BANDWIDTH_GBS": 0.0}, "DecodeStudySpec", "bandwidth_gbs"),
        (s06.NAME, {"RECORDS": MISSING}, "DecodeStudySpec", "RECORDS"),
    ],
)
def test_a_bad_parameter_is_a_spec_error_naming_the_field(name, bad, spec_name, field):
    p = {k: v for k, v in (_params(name) | bad).items() if v is not MISSING}
    with pytest.raises(SpecError) as e:
        studies.load(name).Spec.from_params(p)
    assert (e.value.spec, e.value.field) == (spec_name, field)


# ------------------------------------------------------------------------------------------ Study 01's results
def test_study_01_results_on_the_fake_paired_study(engine, tmp_path):  # noqa: F811 - the fixture
    spec = serving.ServingSpec(_plan(engine, capacity_factors=(0.5,)), bandwidth_gbs=20.0)
    before = os.environ.get("FP8LAB_RUNS")
    calls: list = []
    res = s01.run(
        spec, store=tmp_path / "runs", progress=False, engine_factory=lambda sp, log: _FakeEngine(sp, log, calls)
    )
    assert os.environ.get("FP8LAB_RUNS") == before  # the store is set for the run only
    assert len(list((tmp_path / "runs" / serving.STUDY).glob("*/engine.json"))) == 6  # 3 trials x 2 dtypes
    assert res.spec == spec and res.bandwidth == {"bandwidth_gbs": 20.0, "source": "parameter", "device": "auto"}
    assert res.fidelity is None  # not asked for
    t = res.tables()
    assert {"engines", "capacity", "search", "throughput", "deltas", "open_loop", "roofline_grid"} <= set(t)
    assert list(t["capacity"].set_index("kv_dtype").num_blocks) == [64, 128]
    # the summary and rows are the study's own functions' (what notebook 01 recorded before the contract)
    r = res.result
    d, cap, (_, search), ol = (
        serving.delta_table(r),
        serving.capacity_table(r),
        serving.capacity_search(r),
        serving.open_loop_table(r),
    )
    want = serving.summary_values(r, d, cap, search, ol, bandwidth=res.bandwidth)
    assert json.dumps(res.summary(), sort_keys=True, default=str) == json.dumps(want, sort_keys=True, default=str)
    assert res.rows() == serving.summary_rows(r, d, cap, search)
    roof = serving.roofline_tables(r, 20.0)
    assert res.markdown() == serving.verdict(r, d, cap, search, roof, None)
    v = {x.claim_id: x for x in res.verdict()}
    assert list(v) == list(s01.CLAIMS)
    assert all(isinstance(x, study.Verdict) for x in v.values())
    # fp8's engine has 128 blocks to auto's 64 at the same budget: claim 3a holds, counted in blocks
    assert (v["3a"].verdict, v["3a"].n, v["3a"].detectable) == ("confirmed", 1, "one KV block (integer counts)")
    # the fake's capacity search: 31 -> 63 requests without preemption, x2.03
    assert v["4a"].verdict == "confirmed" and "31 -> 63 requests" in v["4a"].sentence
    # fp8's gaps are 0.8 x auto's: throughput rises, TPOT falls, where the claim has -7.9% and +21.4%
    # refuted by the rule on this run, capped as the audit caps it (the claim's setting is not this run's)
    assert (v["5"].verdict, v["5"].n) == ("not reproduced here", 3)
    assert v["5"].sentence.startswith("Claim 'On a 6:3:1 short/medium/long mix FP8 lowers throughput 7.9%")
    assert (v["8"].verdict, v["8"].n) == ("not testable here", None)  # no non-reading client in this plan


def test_study_01_without_an_fp8_engine_measures_no_bandwidth_and_judges_nothing(engine, tmp_path):  # noqa: F811
    class NoFp8(_FakeEngine):
        def start(self):
            if self.spec.kv_cache_dtype == "fp8":
                return {"status": "error", "error": "NotImplementedError: no FP8 KV on this CPU"}
            return super().start()

    spec = serving.ServingSpec(_plan(engine), bandwidth_gbs=20.0, run_fidelity=True)
    res = s01.run(spec, store=tmp_path / "runs", progress=False, engine_factory=lambda sp, log: NoFp8(sp, log, []))
    assert (res.bandwidth, res.fidelity) == (None, None)  # nothing after a study without both dtypes
    with pytest.raises(RuntimeError, match="no successful engine for kv_cache_dtype fp8"):
        serving.require_ok(res.result)
    assert res.tables()["roofline_grid"] is None
    assert {x.verdict for x in res.verdict()} == {"not testable here"}
    assert {x.n for x in res.verdict()} == {None}


# ------------------------------------------------------------------------------------------ Study 06's results
def _store_06(root) -> s06.DecodeStudySpec:
    """A complete Study 06 run in the store ``root`` as :func:`fp8lab.decode.run.run_decode` leaves it (batch 1:
    auto's step 1 + 0.002 ms per token, fp8's 1.2 + 0.001: fp8 faster from 200 tokens on)."""
    d = decode.DecodeSpec(
        model=str(TINY_MODEL_DIR),
        contexts=CTX,
        batches=(1,),
        reps=REPS,
        decode_tokens=16,
        kv_cache_gib=0.25,
        max_model_len=2048,
        enforce_eager=True,
    )
    rd = root / decode.STUDY / spec_hash(d.descriptor())
    (rd / "g0").mkdir(parents=True)
    (rd / "spec.json").write_text(json.dumps(d.descriptor()))
    rows = _rows(1, lambda c: 1.0 + 0.002 * c, lambda c: 1.2 + 0.001 * c)
    (rd / "g0" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    engines = {k: {"status": "ok", "num_blocks": 1, "block_size": 128, "cuda_graphs": False} for k in d.kv_dtypes}
    (rd / "g0" / "engines.json").write_text(json.dumps({"provenance": {"device": "cpu"}, "engines": engines}))
    (rd / "complete.json").write_text("{}")
    return s06.DecodeStudySpec(d, bandwidth_gbs=20.0)


def test_study_06_results_from_a_stored_run(tmp_path, monkeypatch):
    from fp8lab.engine import results

    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")  # never start a worker: what is not in the store is an error
    spec = _store_06(tmp_path)
    res = s06.run(spec, store=tmp_path)
    assert res.run.complete and res.run.run_dir.parent.parent == tmp_path
    assert res.bandwidth["bandwidth_gbs"] == 20.0
    t = res.tables()
    assert list(t) == ["grid", "capacity", "points", "fits", "crossovers", "colocation", "roofline", "anchors"]
    assert t["colocation"].empty  # one engine per dtype, one arm: nothing to compare
    assert list(t["points"].context_len) == list(CTX) and list(t["anchors"].source) == [decode.ANCHORS[0]["source"]]
    (cross,) = t["crossovers"].to_dict("records")
    assert cross["status"] == "in_grid" and cross["context_len"] == pytest.approx(200, rel=0.05)
    run = decode.load(res.run.run_dir)
    want = decode.summary(run, 20.0)
    assert json.dumps(res.summary(), sort_keys=True, default=str) == json.dumps(want, sort_keys=True, default=str)
    assert res.rows() == decode.summary_rows(run)
    assert res.markdown() == "\n".join(f"- {line}" for line in decode.verdict(want))
    v = res.verdict()
    assert [x.claim_id for x in v] == list(s06.CLAIMS) and all(isinstance(x, study.Verdict) for x in v)
    assert {x.n for x in v if x.verdict != "not testable here"} <= {REPS}
    assert all(x.sentence.startswith(f"Claim '{x.claim.rstrip('.')}': {x.verdict} on this run (cpu, ") for x in v)
