"""Studies 00, 04 and 07 on the study contract, with their typed rows (issue 16), from stored records and no engine.

Study 00 re-renders the committed H200 report's numbers (MEASURE False, every H200 engine on record) and checks a
fake engine's blocks; Studies 04 and 07 load the committed H200 stores (reports/h200/records/*.tar.gz, real vLLM
0.26.0 runs) under ``FP8LAB_STORE_ONLY``. The rows must fit the schema and carry the same numbers as the flat
summary the notebook records (the summary is the reference: a row under the wrong metric, unit, scale or dtype
fails here)."""

from __future__ import annotations

import json
import math
import re

import pytest
from test_kvmath import TINY, _fake_engine

from fp8lab import studies, study
from fp8lab import summary_table as st
from fp8lab.capacity import study as s00
from fp8lab.engine import results
from fp8lab.errors import SpecError
from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT
from fp8lab.profiles import load_profile, resolved_parameters
from fp8lab.report.run import _clean

H200 = REPO_ROOT / "reports" / "h200"


# ------------------------------------------------------------------------------------------------ Study 00
def test_study_00_satisfies_the_contract():
    assert study.check(s00) is s00 and studies.load(s00.NAME) is s00 and s00.NAME in studies.names()
    assert (NOTEBOOKS_DIR / f"{s00.NAME}.ipynb").is_file()


@pytest.mark.parametrize(
    ("bad", "spec_name", "field"),
    [
        ({"TP": 0}, "CapacitySpec", "tp"),
        ({"KV_DTYPES": ["auto", "fp4"]}, "CapacitySpec", "kv_dtypes"),
        ({"KV_DTYPES": []}, "CapacitySpec", "kv_dtypes"),
        ({"GPU_MEMORY_UTILIZATION": 1.5}, "CapacitySpec", "gpu_memory_utilization"),
        ({"BLOCK_SIZE": 48}, "CapacitySpec", "block_size"),
        ({"MEASURE": "yes"}, "CapacitySpec", "measure"),
        ({"ENGINE_RECORDS": ["/no/such/store"]}, "notebook", "ENGINE_RECORDS"),
        ({"CONFIGS": ["no-such-config"]}, "config", "path"),
    ],
)
def test_study_00_spec_names_a_bad_parameter(bad, spec_name, field, monkeypatch):
    def no_engine(*a, **k):
        raise AssertionError("an engine was asked for")

    monkeypatch.setattr(results, "run_cached", no_engine)
    p = resolved_parameters(NOTEBOOKS_DIR / f"{s00.NAME}.ipynb", load_profile("cpu-tiny")) | bad
    with pytest.raises(SpecError) as e:
        s00.Spec.from_params(p)
    assert (e.value.spec, e.value.field) == (spec_name, field)


def test_study_00_spec_ignores_lower_case_names():
    p = resolved_parameters(NOTEBOOKS_DIR / f"{s00.NAME}.ipynb", load_profile("cpu-tiny"))
    spec = s00.Spec.from_params(p)
    assert spec.kv_dtypes == tuple(p["KV_DTYPES"]) and spec.tp == p["TP"] and spec.measure is True
    assert s00.Spec.from_params({**p, "tp": 3, "measure": "x", 1: 2}) == spec


def test_study_00_summary_is_the_committed_reports(h200_00):
    """The contract's summary of the committed parameters is the committed summary, byte for byte."""
    got = json.dumps(_clean(h200_00.summary()), indent=2, sort_keys=True)
    assert got == json.dumps(json.loads((H200 / f"{s00.NAME}.summary.json").read_text()), indent=2, sort_keys=True)
    assert list(h200_00.tables()) == ["formula", "per_layer", "curve", "plan", "memory", "check", "records"]


def test_study_00_rows_from_the_committed_parameters(h200_00):
    rows = h200_00.rows()
    assert st.validate(rows) == rows and {r["study"] for r in rows} == {"kv_memory"}
    s = h200_00.summary()
    # Qwen3-8B: 2 x 36 layers x 8 KV heads x 128 x 2 B = 147,456 B per token (auto); fp8 halves it
    q = st.one(rows, metric="kv_bytes_per_token", kv_dtype="auto", model="qwen3-8b", baseline=None)
    assert (q["value"], q["unit"], q["evidence"]) == (147456.0, "bytes", "computed")
    assert st.one(rows, metric="kv_bytes_per_token", kv_dtype="fp8", model="qwen3-8b", baseline="auto")["value"] == 0.5
    for m, by in s["configs_bytes_per_token"].items():
        for d, v in by.items():
            assert st.one(rows, metric="kv_bytes_per_token", kv_dtype=d, model=m, baseline=None)["value"] == v
    for m, by in s["max_concurrency"].items():
        for d, v in by.items():
            r = st.one(rows, metric="max_concurrency_formula", kv_dtype=d, model=m)
            assert r["value"] == v and r["context_len"] == s["plan_context_len"] == 32768
    for m, by in s["total_memory_vs_first"].items():
        r = st.one(rows, metric="total_memory_gib_formula", kv_dtype="fp8", baseline="auto", model=m)
        assert r["value"] == pytest.approx(by["fp8"]) and (r["batch"], r["context_len"]) == (32, 8192)
    # the check ran no engine: the formula's blocks for the 4 GiB budget only (2**32 // (16 x 3,072) for auto)
    assert not st.select(rows, metric="num_blocks")
    auto = st.one(rows, metric="num_blocks_formula", kv_dtype="auto", baseline=None)
    assert auto["value"] == s["measured"]["auto"]["predicted_blocks"] == 2**32 // (16 * 3072)
    assert auto["setting"] == "4 GiB of KV, block 16"
    # every H200 engine on record: the formula gave all 29 block counts exactly (README)
    rec = st.one(rows, metric="formula_exact_share")
    assert (rec["value"], rec["n"], rec["evidence"], rec["device"]) == (1.0, 29, "gpu", "NVIDIA H200")
    assert s["records"]["compared"] == 29


def test_study_00_verdicts(h200_00):
    v = {x.claim_id: x for x in h200_00.verdict()}
    assert list(v) == ["3a", "00.formula"] and all(isinstance(x, study.Verdict) for x in v.values())
    assert (v["3a"].verdict, v["3a"].n) == ("confirmed", 11)  # the shipped model and 10 published configs
    assert "`fp8` stores 1,536 B/token vs 3,072 for `auto`" in v["3a"].sentence
    assert (v["00.formula"].verdict, v["00.formula"].n) == ("confirmed", 29)
    assert h200_00.markdown().startswith("- **KV per token** (fp8lab-tiny-qwen3): `fp8` stores 1,536 B/token")


def test_study_00_measured_rows_and_a_missed_block(tmp_path):
    """A fake engine's blocks become engine rows (evidence by the device its provenance names) and the paired
    ratio; one block off the formula refutes 00.formula."""
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    runner, calls = _fake_engine()

    def on_cpu(spec, phases, *, study):
        res = runner(spec, phases, study=study)
        res.provenance = {"device": "CPU: test"}
        return res

    spec = s00.Spec(model=str(tmp_path), configs=(), kv_cache_gib=1.0, plan_context_len=2048, mem_context_len=2048)
    res = s00.run(spec, runner=on_cpu)
    assert len(calls) == 2 and res.run.device == "CPU: test"
    rows = res.rows()
    eng = {d: st.one(rows, metric="num_blocks", kv_dtype=d, baseline=None) for d in ("auto", "fp8")}
    assert [eng[d]["value"] for d in ("auto", "fp8")] == [2730.0, 5461.0]  # 2**30 // (128 x 3,072 | 1,536)
    assert {r["evidence"] for r in eng.values()} == {"cpu analogue"} and eng["fp8"][
        "setting"
    ] == "1 GiB of KV, block 128"
    assert st.one(rows, metric="num_blocks", kv_dtype="fp8", baseline="auto")["value"] == 5461 / 2730
    assert st.one(rows, metric="kv_capacity_tokens", kv_dtype="fp8")["value"] == 5461 * 128
    v = {x.claim_id: x for x in res.verdict()}
    assert (v["00.formula"].verdict, v["00.formula"].n) == ("confirmed", 2) and v["3a"].verdict == "confirmed"

    def one_off(spec, phases, *, study):
        res = on_cpu(spec, phases, study=study)
        res.engine = {**res.engine, "num_blocks": res.engine["num_blocks"] + 1}
        return res

    v = {x.claim_id: x for x in s00.run(spec, runner=one_off).verdict()}
    assert v["00.formula"].verdict == "refuted" and re.search(
        r"exactly in 0, largest error 0\.0[34]%", v["00.formula"].sentence
    )


# ------------------------------------------------------------------------------------------ Studies 04, 07
def test_study_04_rows_from_the_h200_store(h200_study):
    res, s, rows = h200_study("04_long_context_ramp_128k")
    eng = res.run.engines
    # every H200 engine came from the store (a CPU without the FP8 kernel also asks for emulated quality engines,
    # which the store lacks: those are errors, and no row reads them)
    assert set(eng[eng.role != "quality-emulated"].status) == {"ok"}
    assert st.validate(rows) == rows and {r["study"] for r in rows} == {"long_context"}
    assert {r["device"] for r in rows if r["evidence"] == "gpu"} == {"NVIDIA H200"}
    n = 0
    for key, v in s.items():  # every ramp latency of the summary is a row, in ms (E2E in s)
        m = re.fullmatch(r"(\w+)\.c(\d+)\.L(\d+)\.(ttft_p50|itl_p50|itl_p95|e2e_p50)_s", key)
        if m and v is not None and math.isfinite(v):
            dt, c, L, metric = m.groups()
            r = st.one(
                rows, metric=metric, kv_dtype=dt, concurrency=int(c), context_len=int(L), setting="ramp, block 16"
            )
            assert r["value"] == pytest.approx(v * (1 if metric == "e2e_p50" else 1000)) and r["evidence"] == "gpu"
            n += 1
    assert n == 4 * 2 * 2 * len(s["lengths"])  # 4 metrics x 2 dtypes x concurrency 1 and 2 x every length
    # 128K, one request: auto's TTFT 11.26 s (README), and the block-size sweep's 256 beside the ramp's 16
    assert st.one(
        rows, metric="ttft_p50", kv_dtype="auto", concurrency=1, context_len=131040, setting="ramp, block 16"
    )["value"] == pytest.approx(11255.4, abs=0.1)
    for bs in (16, 256):
        for d in ("auto", "fp8"):
            r = st.one(rows, metric="e2e_p50", kv_dtype=d, setting=f"block-size sweep, block {bs}")
            assert r["value"] == s[f"{d}.bs{bs}.L131040.e2e_p50_s"] and r["context_len"] == 131040
    for d in ("auto", "fp8"):
        assert st.one(rows, metric="num_blocks", kv_dtype=d)["value"] == s[f"{d}.num_blocks_engine"]
        assert st.one(rows, metric="num_blocks_formula", kv_dtype=d)["value"] == s[f"{d}.num_blocks_formula"]
        r = st.one(rows, metric="longest_context", kv_dtype=d, setting="engine blocks")
        assert r["value"] == s[f"{d}.longest_engine"] and r["unit"] == "tokens"
        for L in s["lengths"]:
            f = st.one(rows, metric="max_concurrency_formula", kv_dtype=d, context_len=L)
            assert f["value"] == s[f"{d}.max_conc_formula.L{L}"] and f["evidence"] == "computed"
    # fp8 holds twice the blocks of the same 24 GiB (each a floor: 21,845 and 10,922)
    assert s["fp8.num_blocks_engine"] // 2 == s["auto.num_blocks_engine"] == 10922


def test_study_07_rows_from_the_h200_store(h200_study):
    res, s, rows = h200_study("07_prefix_cache")
    assert st.validate(rows) == rows and {r["study"] for r in rows} == {"prefix_cache"}
    committed = json.loads((H200 / "07_prefix_cache.summary.json").read_text())
    assert json.dumps(_clean(s), sort_keys=True) == json.dumps(committed, sort_keys=True)
    for cell in s["sweep"]:  # every cell's hit rates, TTFT and paired changes, by field
        at = {"subset": cell["workload"], "concurrency": cell["n_active"]}
        for d in ("auto", "fp8"):
            assert (
                st.one(rows, metric="prefix_hit_rate", kv_dtype=d, baseline=None, **at)["value"]
                == cell[f"{d}_hit_rate"]
            )
            assert st.one(rows, metric="ttft_mean", kv_dtype=d, baseline=None, **at)["value"] == cell[f"{d}_ttft_ms"]
            p = st.one(rows, metric="prefix_hit_rate_predicted", kv_dtype=d, **at)
            assert p["value"] == cell[f"{d}_hit_rate_pred"] and p["evidence"] == "computed"
        dh = st.one(rows, metric="prefix_hit_rate", kv_dtype="fp8", baseline="auto", **at)
        assert (dh["value"], dh["ci_low"], dh["ci_high"], dh["unit"], dh["n"]) == (
            cell["dhit_pp"],
            cell["dhit_pp_ci_low"],
            cell["dhit_pp_ci_high"],
            "pp",
            3,
        )
        tt = st.one(rows, metric="ttft_mean", kv_dtype="fp8", baseline="auto", **at)
        assert tt["value"] == cell["ttft_ratio"] and tt["detectable"] == pytest.approx(
            cell["ttft_detectable_pct"] / 100
        )
        assert st.one(rows, metric="output_tok_s", kv_dtype="fp8", baseline="auto", **at)["value"] == cell["tput_ratio"]
    # chat at 64 conversations: 10.9% -> 51.0% (README), TTFT x0.68 beyond noise
    g = st.one(rows, metric="prefix_hit_rate", kv_dtype="fp8", baseline="auto", subset="chat", concurrency=64)
    assert g["value"] == pytest.approx(51.0 - 10.9, abs=0.1)
    assert st.one(rows, metric="ttft_mean", kv_dtype="fp8", baseline="auto", subset="chat", concurrency=64)[
        "beyond_noise"
    ]
    for k in s["knees"]:  # the replay's knee and the last N measured to hold, per workload and dtype
        at = {"kv_dtype": k["kv_dtype"], "subset": k["workload"]}
        assert st.one(rows, metric="prefix_knee_predicted", **at)["value"] == k["knee_simulated"]
        assert st.one(rows, metric="prefix_knee_measured", **at)["value"] == k["measured_last_held"]
    assert st.one(rows, metric="prefix_knee_predicted", kv_dtype="auto", subset="chat")["value"] == 34


def test_study_00_counts_an_engine_on_record_once(h200_00):
    """Engines measured here into the store that ENGINE_RECORDS names are on record too: counted once."""
    from fp8lab.capacity.verdict import verdicts

    s = h200_00.summary()
    ok = {"status": "ok", "rel_error": 0.0, "engine_blocks": 2730, "predicted_blocks": 2730}
    measured = {**s, "measured": {"auto": ok, "fp8": {**ok, "engine_blocks": 5461, "predicted_blocks": 5461}}}
    assert verdicts(measured)[1].n == 29 + 2
    assert verdicts(measured, duplicates=2)[1].n == 29
    assert "block count of 29 engines exactly" in verdicts(measured, duplicates=2)[1].sentence
