"""The typed summary table (fp8lab.summary_table): its schema rejects what it does not declare, naming the row, the
field, the value and what is allowed; rows round-trip through JSON and Parquet; record_summary writes them beside the
summary (validated first); the serving study's rows carry the same numbers as its own delta table."""

from __future__ import annotations

import json
import math

import pytest
from test_metrics import _FakeEngine, _plan, engine  # noqa: F401 - the fake paired study of the serving tests

from fp8lab import serving
from fp8lab import summary_table as st
from fp8lab.report.run import record_summary
from fp8lab.specs import SpecError


def _row(**over):
    base = dict(
        study="serving",
        metric="output_tok_s",
        kv_dtype="fp8",
        baseline="auto",
        setting="closed loop",
        concurrency=8,
        value=0.4,
        ci_low=0.3,
        ci_high=0.6,
        n=5,
        unit="%",
        beyond_noise=False,
        detectable=0.6,
        evidence="gpu",
        device="NVIDIA H200",
        model="Qwen3-8B",
    )
    base.update(over)
    return st.make_row(**base)


def test_a_good_row_fills_the_nullable_fields_with_none():
    r = _row()
    assert list(r) != [] and set(r) == set(st.FIELDS)
    assert r["subset"] is None and r["batch"] is None and r["context_len"] is None
    assert st.validate([r]) == [{k: r[k] for k in st.FIELDS}]


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("n", "5", "an integer"),  # a wrong type
        ("n", 2.5, "an integer"),
        ("value", float("nan"), "a finite number"),
        ("value", True, "a finite number"),  # a bool is not a number here
        ("beyond_noise", 1, "True or False or None"),
        ("unit", "furlongs", "one of %"),  # an unknown unit
        ("kv_dtype", "fp4", "one of auto | float16 | bfloat16 | fp8 |"),  # an unknown dtype
        ("baseline", "int8", "one of auto | float16 | bfloat16 | fp8 |"),
        ("study", "throughput", "one of kv_memory | serving"),
        ("metric", "output tok/s @c=8", "one of output_tok_s"),  # a flat summary's key is not a metric
        ("evidence", "h200", "one of gpu | gpu analogue | cpu analogue | computed | unknown"),
        ("setting", "", "a non-empty string"),
        ("model", None, "a non-empty string"),  # not nullable
    ],
)
def test_a_bad_value_is_named_with_its_row_field_and_what_is_allowed(field, value, allowed):
    rows = [_row(), {**_row(concurrency=64), field: value}]
    with pytest.raises(SpecError) as e:
        st.validate(rows)
    assert e.value.field == field and e.value.spec.startswith("SummaryRow[1]")
    assert "concurrency" not in e.value.spec and "metric='output_tok_s'" in e.value.spec or field == "metric"
    assert allowed in e.value.allowed and repr(value) in str(e.value)


def test_a_missing_or_unknown_field_is_named():
    r = _row()
    del r["ci_high"]
    with pytest.raises(SpecError) as e:
        st.validate([r])
    assert e.value.field == "ci_high" and e.value.value == "<missing>" and "a finite number or None" in e.value.allowed
    with pytest.raises(SpecError) as e:
        st.validate([{**_row(), "ci_lo": 0.1}])  # a renamed field
    assert e.value.field == "ci_lo" and "not a field" in e.value.allowed and "ci_low" in e.value.allowed
    with pytest.raises(SpecError) as e:
        st.make_row(study="serving")
    assert e.value.field == "metric"


def test_rules_between_fields():
    with pytest.raises(SpecError, match=r"ci_high = None: a number: both interval ends or neither"):
        st.validate([{**_row(), "ci_high": None}])
    with pytest.raises(SpecError, match=r"ci_low = 0.9: at most ci_high \(0.6\)"):
        st.validate([{**_row(), "ci_low": 0.9}])
    with pytest.raises(SpecError, match=r"\.n = 0: an integer, 1 or more"):
        st.validate([{**_row(), "n": 0}])
    with pytest.raises(SpecError, match=r"baseline = 'fp8'"):
        st.validate([{**_row(), "baseline": "fp8"}])
    with pytest.raises(SpecError) as e:  # one row per key
        st.validate([_row(), _row(value=0.5)])
    assert e.value.field == "key" and "row 0 has the same" in e.value.allowed


def test_json_and_parquet_round_trip(tmp_path):
    rows = [
        _row(),
        _row(kv_dtype="auto", baseline=None, value=1842.0, ci_low=None, ci_high=None, unit="tok/s", detectable=None),
        _row(study="quality", metric="top3_match", setting="fp8", subset="code", concurrency=None, unit="fraction"),
        _row(metric="preemptions", baseline=None, value=18, ci_low=None, ci_high=None, unit="preemptions"),
    ]
    path = st.write_rows(rows, tmp_path / "01_x.rows.json")
    assert path.name == "01_x.rows.json" and st.parquet_path(path).name == "01_x.rows.parquet"
    assert st.read_rows(path) == st.validate(rows)
    back = st.read_parquet(st.parquet_path(path))
    assert back == st.read_rows(path)
    assert rows[3]["value"] == 18.0 and isinstance(rows[3]["value"], float)  # make_row: one type per field
    assert isinstance(back[3]["value"], float) and back[0]["concurrency"] == 8 and back[2]["concurrency"] is None
    assert back[1]["beyond_noise"] is False and back[1]["ci_low"] is None
    assert not list(tmp_path.glob(".*"))  # no temporary file left
    with pytest.raises(SpecError):  # a bad row: nothing written
        st.write_rows([{**rows[0], "unit": "furlongs"}], tmp_path / "bad.rows.json")
    assert not (tmp_path / "bad.rows.json").exists()
    (tmp_path / "edited.rows.json").write_text(json.dumps([{**rows[0], "n": "5"}]))
    with pytest.raises(SpecError, match=r"\.n = '5'"):  # a file edited by hand is validated on read
        st.read_rows(tmp_path / "edited.rows.json")


def test_select_and_one_by_field():
    rows = [_row(), _row(concurrency=64, value=13.2), _row(kv_dtype="fp8_e5m2", value=-1.0)]
    assert [r["value"] for r in st.select(rows, kv_dtype="fp8")] == [0.4, 13.2]
    assert st.one(rows, kv_dtype="fp8", concurrency=64)["value"] == 13.2
    with pytest.raises(LookupError, match="no summary rows with metric='ttft_p50'"):
        st.one(rows, metric="ttft_p50")
    with pytest.raises(LookupError, match="2 summary rows"):
        st.one(rows, kv_dtype="fp8")
    with pytest.raises(SpecError) as e:
        st.select(rows, concurrrency=8)
    assert e.value.field == "concurrrency"


def test_evidence_of():
    assert st.evidence_of("NVIDIA H200", "Qwen3-8B") == "gpu"
    assert st.evidence_of("NVIDIA H200", "fp8lab-tiny-qwen3") == "gpu analogue"
    assert st.evidence_of("CPU: Intel(R) Xeon(R)", "Qwen3-8B") == "cpu analogue"
    assert st.evidence_of(None, "Qwen3-8B") == "unknown"


def test_record_summary_writes_validated_rows_beside_the_summary(tmp_path, monkeypatch):
    target = tmp_path / "01_x.summary.json"
    record_summary({"a": 1}, target, rows=[_row()])
    assert json.loads(target.read_text()) == {"a": 1}
    assert st.read_rows(tmp_path / "01_x.rows.json") == [_row()]
    assert (tmp_path / "01_x.rows.parquet").is_file()
    with pytest.raises(SpecError, match="unit"):  # validated before anything is written
        record_summary({"a": 2}, target, rows=[{**_row(), "unit": "furlongs"}])
    assert json.loads(target.read_text()) == {"a": 1}
    record_summary({"a": 3}, target)  # a summary without rows leaves no stale rows beside it
    assert not (tmp_path / "01_x.rows.json").exists() and not (tmp_path / "01_x.rows.parquet").exists()
    monkeypatch.setenv("FP8LAB_SUMMARY_PATH", str(tmp_path / ".01_x.running.summary.json"))
    record_summary({"a": 4}, rows=[_row()])
    assert (tmp_path / ".01_x.running.rows.json").is_file()


def test_serving_rows_are_the_studys_own_tables(engine, tmp_path, monkeypatch):  # noqa: F811
    """The fake paired study of the serving tests (fp8 20% faster, no vLLM): every delta of delta_table is one row,
    by field, with its interval, n, noise verdict and detectable effect; the per-trial means, capacity, the measured
    limit and preemptions are rows too; all validate."""
    monkeypatch.setenv("FP8LAB_RUNS", str(tmp_path / "runs"))
    plan = _plan(engine, capacity_factors=(0.5,))
    res = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, []))
    deltas = serving.delta_table(res)
    capacity = serving.capacity_table(res)
    _, search = serving.capacity_search(res)
    rows = serving.summary_rows(res, deltas, capacity, search)
    assert st.validate(rows) == rows
    assert {r["study"] for r in rows} == {"serving"} and {r["evidence"] for r in rows} == {"unknown"}
    changes = [r for r in rows if r["baseline"] is not None]
    assert len(changes) == len(deltas)  # one row per delta, none lost
    for d in deltas.to_dict("records"):
        c = int(d["metric"].split("@c=")[1]) if "@c=" in d["metric"] else None
        metric = {"output tok/s": "output_tok_s", "output tok/s (no stream)": "output_tok_s_no_stream"}.get(
            d["metric"].split(" @")[0], d["metric"].split(" @")[0].lower().replace(" ", "_")
        )
        setting = (
            "closed loop, not streamed"
            if "no stream" in d["metric"]
            else "closed loop"
            if c is not None
            else "open loop " + d["metric"].split("@")[1]
        )
        r = st.one(rows, metric=metric, kv_dtype="fp8", baseline="auto", setting=setting, concurrency=c)
        assert (r["value"], r["ci_low"], r["ci_high"], r["n"]) == (d["delta_pct"], d["lo_pct"], d["hi_pct"], d["n"])
        assert r["beyond_noise"] == bool(d["beyond_noise_floor"]) and r["detectable"] == d["detectable_pct"]
        assert r["unit"] == "%"
        for dt, col in (("auto", "a"), ("fp8", "b")):
            own = st.one(rows, metric=metric, kv_dtype=dt, baseline=None, setting=setting, concurrency=c)
            assert own["value"] == d[col] and own["unit"] == d["unit"] and own["ci_low"] is None
    tput = st.one(rows, metric="output_tok_s", kv_dtype="fp8", baseline="auto", concurrency=4)
    assert tput["value"] > 10 and tput["beyond_noise"]  # the fake fp8's requests take 0.8 x as long
    assert st.one(rows, metric="kv_capacity_tokens", kv_dtype="fp8")["value"] == 2 * 64 * 128
    assert st.one(rows, metric="num_blocks", kv_dtype="auto")["unit"] == "blocks"
    lim = {r["kv_dtype"]: r["value"] for r in st.select(rows, metric="max_concurrency_no_preemption")}
    assert lim == {r.kv_dtype: r.measured for r in search.itertuples() if not r.censored}
    pre = st.select(rows, metric="preemptions", setting="closed loop")
    assert {(r["kv_dtype"], r["concurrency"]) for r in pre} == {(d, c) for d in ("auto", "fp8") for c in (1, 4)}
    assert all(r["value"] == 0 and r["n"] == plan.trials for r in pre)
    ttft = st.one(rows, metric="ttft_p50_pooled", kv_dtype="fp8", concurrency=4)
    lat = serving.latency_summary(res, by=("kv_dtype",))
    assert ttft["value"] == lat[(lat.metric == "ttft_ms") & (lat.kv_dtype == "fp8")].p50.iloc[0]
    assert all(math.isfinite(r["value"]) for r in rows)


def test_the_audit_reads_serving_rows_by_field_and_agrees_with_the_flat_summary(engine, tmp_path, monkeypatch):  # noqa: F811
    """The fake paired study's summary and rows written as a notebook writes them: the audit's Study 01 claims read
    the rows (``read_from: rows``); with the rows file gone they read the flat summary, and every verdict and every
    number they state is the same; a rows file without the rows a claim selects leaves that claim untested."""
    from fp8lab import audit

    monkeypatch.setenv("FP8LAB_RUNS", str(tmp_path / "runs"))
    plan = _plan(engine, capacity_factors=(0.5,))
    res = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, []))
    deltas, capacity = serving.delta_table(res), serving.capacity_table(res)
    _, search = serving.capacity_search(res)
    values = serving.summary_values(res, deltas, capacity, search, serving.open_loop_table(res))
    out = tmp_path / "report"
    record_summary(
        values, out / "01_kv_dtype_auto_vs_fp8.summary.json", rows=serving.summary_rows(res, deltas, capacity, search)
    )
    rules = (audit.rule_mix, audit.rule_ttft_spread, audit.rule_total_memory, audit.rule_loss_grows_with_batch)
    with_rows = audit.load_report(out)
    assert with_rows.study_rows(audit.pages.SERVING) and audit.rows_note(
        with_rows, "01_kv_dtype_auto_vs_fp8"
    ).startswith("; its claims read")
    found = [audit.safe(f, with_rows) for f in rules]
    assert found[0].details["output tok/s"]["read_from"] == "rows"
    assert all(f.verdict != audit.NOT_TESTABLE or f is found[3] for f in found), [f.measured for f in found]
    (out / "01_kv_dtype_auto_vs_fp8.rows.json").unlink()
    flat = audit.load_report(out)
    assert flat.study_rows(audit.pages.SERVING) is None and "flat summary" in audit.rows_note(
        flat, "01_kv_dtype_auto_vs_fp8"
    )
    legacy = [audit.safe(f, flat) for f in rules]
    for a, b in zip(found, legacy, strict=True):
        assert (a.verdict, a.measured, a.on_what, a.detectable) == (b.verdict, b.measured, b.on_what, b.detectable)
    rows = [r for r in serving.summary_rows(res, deltas, capacity, search) if r["metric"] != "tpot_p50"]
    st.write_rows(rows, out / "01_kv_dtype_auto_vs_fp8.rows.json")
    gone = audit.safe(audit.rule_mix, audit.load_report(out))
    assert gone.verdict == audit.NOT_TESTABLE and "metric='tpot_p50'" in gone.measured


def test_decode_rows_and_the_audit_reading_them(tmp_path):
    """Study 06 on hand-written decode rows (tests/unit/test_decode_analysis.py): every point of point_table is one
    change row (the paired ratio and its interval, by batch and context) beside each dtype's mean step; the audit's
    decode claims read them by field and state the same verdicts and numbers as from the flat summary."""
    import dataclasses

    from test_decode_analysis import _auto, _run

    from fp8lab import audit, decode

    def fp8(c):
        return 1.2 + 0.0015 * c

    run = _run(tmp_path / "run", {1: (_auto, fp8), 8: (lambda c: 2 * _auto(c), lambda c: 1.9 * fp8(c))})
    run = dataclasses.replace(run, provenance={"device": "NVIDIA H200", "vllm": "0.26.0"})
    rows = decode.summary_rows(run)
    pts = decode.point_table(run)
    assert st.validate(rows) == rows and len(rows) == 3 * len(pts)
    for p in pts.itertuples():
        r = st.one(rows, kv_dtype="fp8", baseline="auto", batch=p.batch, context_len=p.context_len)
        assert (r["value"], r["ci_low"], r["ci_high"], r["n"]) == (p.ratio, p.ratio_ci_low, p.ratio_ci_high, p.n)
        assert r["unit"] == "ratio" and r["beyond_noise"] == p.beyond_noise
        assert r["detectable"] == pytest.approx(p.ci_half_width_pct / 100)
        own = st.one(rows, kv_dtype="auto", baseline=None, batch=p.batch, context_len=p.context_len)
        assert own["value"] == p.auto_step_ms and own["unit"] == "ms"
    assert {r["evidence"] for r in rows} == {"gpu analogue"}  # the shipped model's shape on a GPU
    out = tmp_path / "report"
    record_summary(decode.summary(run), out / "06_decode_speed.summary.json", rows=rows)
    with_rows = audit.load_report(out)
    rules = (audit.rule_long_speed, audit.rule_gain_at_batch_1, audit.rule_long_tpot, audit.rule_128k_throughput)
    assert audit.decode_grid(with_rows)[0]["read_from"] == "rows"
    found = [audit.safe(f, with_rows) for f in rules]
    assert [f.verdict for f in found[:3]] == [audit.CONFIRMED, audit.REFUTED, audit.CONFIRMED], found
    (out / "06_decode_speed.rows.json").unlink()
    flat = audit.load_report(out)
    legacy = [audit.safe(f, flat) for f in rules]
    for a, b in zip(found, legacy, strict=True):
        assert (a.verdict, a.measured, a.on_what, a.detectable) == (b.verdict, b.measured, b.on_what, b.detectable)
