"""The study contract (:mod:`fp8lab.study`) without an engine: every registered study satisfies it and
:func:`~fp8lab.study.check` names what a study lacks; each study's ``Spec.from_params`` builds the spec its notebook
built before from the cpu-tiny profile's parameters and names a bad field (SpecError) before any engine; and the
results object of a stored run (Study 07: a run written to a store and loaded by ``run``; Study 04: the fake engine
runner of test_longctx) gives the tables, the summary the notebook records, and typed verdicts on the audit's scale."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
from typing import get_args

import pandas as pd
import pytest
from test_longctx import TINY, _fake_runner

from fp8lab import audit, studies, study
from fp8lab import longctx as lc
from fp8lab import prefix as px
from fp8lab.audit import study as s05
from fp8lab.audit.rules_longctx import fp8_quality_label
from fp8lab.errors import SpecError
from fp8lab.longctx import study as s04
from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.prefix import study as s07
from fp8lab.profiles import load_profile, resolved_parameters
from fp8lab.specs import spec_hash


# ------------------------------------------------------------------------------------------ the contract itself
def test_every_registered_study_satisfies_the_contract():
    assert set(studies.names()) == {
        "00_kv_memory_estimation",
        "01_kv_dtype_auto_vs_fp8",
        "02_calibration_32_tokens",
        "03_quality_token_match",
        "04_long_context_ramp_128k",
        "05_claims_audit",
        "06_decode_speed",
        "07_prefix_cache",
        "08_kv_dtype_matrix",
    }
    for name in studies.names():
        mod = studies.load(name)
        assert study.missing(mod) == [] and study.check(mod) is mod
        assert mod.NAME == name and (NOTEBOOKS_DIR / f"{name}.ipynb").is_file()
        assert isinstance(mod, study.Study)  # the runtime-checkable Protocol: NAME, Spec, run


def _study(drop: str = "") -> types.SimpleNamespace:
    """A study with every member of the contract but ``drop`` (``"run"``, ``"Results.verdict"``, ...)."""
    res_ns: dict = {m: (lambda self: None) for m in study.RESULTS_MEMBERS[1:]}
    res_ns["spec"] = None
    spec_ns: dict = {"from_params": classmethod(lambda cls, params: None)}
    if drop.startswith("Results."):
        del res_ns[drop.split(".")[1]]
    if drop == "Spec.from_params":
        del spec_ns["from_params"]
    members = {
        "NAME": "99_x",
        "Spec": type("Spec", (), spec_ns),
        "run": lambda spec, store=None: None,
        "Results": type("Results", (), res_ns),
    }
    members.pop(drop, None)
    return types.SimpleNamespace(**members)


@pytest.mark.parametrize("member", [*study.STUDY_MEMBERS, *(f"Results.{m}" for m in study.RESULTS_MEMBERS)])
def test_check_names_the_missing_member(member):
    assert study.missing(_study()) == []
    s = _study(drop=member)
    assert study.missing(s) == [member]
    with pytest.raises(study.ContractError, match=re.escape(f"missing {member}") + "$"):
        study.check(s)


def test_load_refuses_an_unregistered_study():
    with pytest.raises(
        KeyError, match=re.escape("registered are 00_kv_memory_estimation | 01_kv_dtype_auto_vs_fp8 | 02_cal")
    ):
        studies.load("08_nothing")


def test_verdict_words_are_the_audits():
    assert study.VERDICT_WORDS == get_args(study.VerdictWord) == audit.VERDICTS
    # Study 07's claim words map as the audit reads them; "not measured" has no audit word: not testable here
    assert {k: v for k, v in s07.VERDICT_WORDS.items() if k in audit.PREFIX_VERDICTS} == audit.PREFIX_VERDICTS
    assert s07.VERDICT_WORDS["not measured"] == audit.NOT_TESTABLE
    assert set(s07.VERDICT_WORDS.values()) <= set(audit.VERDICTS)
    with pytest.raises(ValueError, match=re.escape("Verdict.verdict = 'supported': allowed confirmed | refuted")):
        study.Verdict("16", "a claim", "supported", "a sentence")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Verdict.n = -1"):
        study.Verdict("16", "a claim", "refuted", "a sentence", n=-1)


def test_claim_ids_are_the_audits_or_the_studys_own():
    ids = {c.id for c in audit.CLAIMS}
    for cid, _ in s04.CLAIMS.values():
        assert cid in ids or cid.startswith("04.")
    assert {"12a", "28"} <= {cid for cid, _ in s04.CLAIMS.values()}
    assert (
        s07.CLAIM_ID in ids
        and audit.pages.page_name(s07.NAME) in next(c for c in audit.CLAIMS if c.id == s07.CLAIM_ID).studies
    )
    assert list(s04.CLAIMS) == ["oom", "gains_grow", "block256", "silent", "random_tokens"]


@pytest.mark.parametrize(
    ("key", "label", "word"),
    [
        ("oom", "supported", "confirmed"),
        ("oom", "not seen at this budget", "inconclusive"),
        ("gains_grow", "not supported", "inconclusive"),  # not shown is not excluded: never refuted from a label
        ("gains_grow", "partly: the fp8/auto ITL ratio falls with length, but ...", "inconclusive"),
        ("block256", "256 fastest of [32, 256]", "inconclusive"),
        ("block256", "not measured", "not testable here"),
        ("silent", "divergence grows along the context", "confirmed"),
        ("silent", "no growth along the context", "inconclusive"),
        ("random_tokens", "quality: ...; speed: the same within noise", "inconclusive"),
    ],
)
def test_study_04_labels_on_the_audits_scale(key, label, word):
    assert s04.verdict_word(key, label) == word


# ------------------------------------------------------------------------------------------ Spec.from_params
MISSING = object()  # a parameter left out


def _params(name: str) -> dict:
    return resolved_parameters(NOTEBOOKS_DIR / f"{name}.ipynb", load_profile("cpu-tiny"))


def test_study_07_spec_from_the_profile_is_the_spec_the_notebook_built():
    p = _params(s07.NAME)
    spec = s07.Spec.from_params(p)
    # what notebook 07 built by hand before the contract: the same descriptor, so the same stored run
    by_hand = px.PrefixSpec(
        **{k.lower(): v for k, v in p.items() if k not in ("TP", "KV_CACHE_GIB")},
        tensor_parallel_size=p["TP"],
        kv_cache_gib=p["KV_CACHE_GIB"],
    )
    assert type(spec) is px.PrefixSpec and spec == by_hand
    assert spec_hash(spec.descriptor()) == spec_hash(by_hand.descriptor())
    assert spec.trials == p["TRIALS"] and spec.active == tuple(sorted(p["ACTIVE"]))
    # a notebook's globals() hold lower-case names too: they never fill a field
    assert s07.Spec.from_params({**p, "trials": 1, "model": "nowhere", "_": None, 1: 2}) == spec


def test_study_04_spec_from_the_profile_is_the_plan_the_notebook_built():
    p = _params(s04.NAME)
    spec = s04.Spec.from_params(p)
    assert type(spec) is lc.LongCtxPlan and spec == lc.LongCtxPlan.from_params(p)
    assert spec.kv_dtypes == tuple(p["KV_DTYPES"]) and spec.max_context == p["MAX_CONTEXT"]


@pytest.mark.parametrize(
    ("name", "bad", "spec_name", "field"),
    [
        (s07.NAME, {"TRIALS": 1}, "PrefixSpec", "trials"),
        (s07.NAME, {"KV_DTYPES": ["auto", "fp4"]}, "PrefixSpec", "kv_dtypes"),
        (s07.NAME, {"WORKLOADS": [["chat", 0, 0, 96, 16, 1]]}, "Shape", "turns"),
        (s04.NAME, {"OUTPUT_TOKENS": 1}, "LongCtxPlan", "output_tokens"),
        (s04.NAME, {"KV_DTYPES": ["fp8", "auto"]}, "LongCtxPlan", "kv_dtypes"),
        (s04.NAME, {"SEED": MISSING}, "LongCtxPlan", "SEED"),
        (s05.NAME, {"INTROSPECT_INSTALLED": "yes"}, "AuditSpec", "introspect_installed"),
        (s05.NAME, {"OTHER_REPORTS": "reports/h200"}, "AuditSpec", "other_reports"),
    ],
)
def test_a_bad_parameter_is_a_spec_error_naming_the_field(name, bad, spec_name, field, monkeypatch):
    from fp8lab.engine import results

    def no_engine(*a, **k):
        raise AssertionError("an engine was asked for")

    monkeypatch.setattr(results, "run_cached", no_engine)
    p = {k: v for k, v in (_params(name) | bad).items() if v is not MISSING}
    mod = studies.load(name)
    with pytest.raises(SpecError) as e:
        mod.Spec.from_params(p)
    assert (e.value.spec, e.value.field) == (spec_name, field)


# ------------------------------------------------------------------------------------------ Study 07's results
def _store_07(root, fp8_ok: bool = True) -> px.PrefixSpec:
    """A complete Study 07 run in the store ``root``, rows from the block-pool replay (fp8: twice auto's blocks),
    as :func:`fp8lab.prefix.run.run_prefix` leaves it: the run loads without an engine."""
    spec = px.PrefixSpec(
        model=TINY,
        workloads=[["chat", 0, 0, 96, 16, 3]],
        active=[2, 8],
        trials=2,
        kv_cache_gib=0.005859375,
        block_size=32,
        max_model_len=1024,
        correctness_prompts=0,
    )
    rd = root / px.STUDY / spec_hash(spec.descriptor())
    rd.mkdir(parents=True)
    (rd / "spec.json").write_text(json.dumps(spec.descriptor(), default=str))
    blocks = {"auto": 64, "fp8": 128}
    engines = {d: {"status": "ok", "num_blocks": blocks[d], "block_size": 32} for d in blocks}
    if not fp8_ok:
        engines["fp8"] = {"status": "unsupported", "error": "NotImplementedError: no FP8 KV on this CPU"}
    (rd / "engines.json").write_text(json.dumps({"provenance": {"device": "cpu"}, "engines": engines}))
    rows = []
    for d in [d for d in blocks if engines[d]["status"] == "ok"]:
        for n in (2, 8):
            for t in range(2):
                for turn, r in enumerate(px.simulate(spec.workloads[0], n, blocks[d], 32, 4)):
                    rows.append(
                        {
                            "workload": "chat",
                            "n_active": n,
                            "trial": t,
                            "kv_dtype": d,
                            **r,
                            "prompt_tokens": r["queries"],
                            "cached_tokens": r["hits"],
                            "requests": n,
                            "ttft_mean_s": 0.01 * (turn + 1) * (1 + t),
                            "wall_s": 1.0,
                            "output_tokens": 16 * n,
                            "preemptions": 0,
                            "kv_usage_max": 0.9,
                        }
                    )
    (rd / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (rd / "complete.json").write_text("{}")
    return spec


def test_study_07_results_from_a_stored_run(tmp_path, monkeypatch):
    from fp8lab.engine import results

    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")  # never start a worker: what is not in the store is an error
    spec = _store_07(tmp_path)
    res = s07.run(spec, store=tmp_path)
    assert res.spec == spec and res.run.run_dir.parent.parent == tmp_path and res.run.complete
    t = res.tables()
    assert list(t) == ["predicted", "cells", "sweep", "knees", "correctness", "engines"]
    assert all(isinstance(v, pd.DataFrame) for v in t.values())
    assert list(t["engines"].kv_dtype) == ["auto", "fp8"] and list(t["engines"].num_blocks) == [64, 128]
    assert set(t["sweep"].n_active) == {2, 8}
    s = res.summary()
    assert json.dumps(s, sort_keys=True, default=str) == json.dumps(px.summary(res.run), sort_keys=True, default=str)
    assert s["engines_status"] == {"auto": "ok", "fp8": "ok"}
    gain = s["chat.gain"]  # at N=8 fp8's twice the blocks keep hits auto loses: the claim "unchanged" is refuted
    assert gain["n_active"] == 8 and gain["dhit_pp"] > 1
    assert s["claim_verdict"] == "refuted"
    (v,) = res.verdict()
    assert isinstance(v, study.Verdict)
    # refuted on this run, capped as the audit caps it (the claim's setting is not this run's)
    assert (v.claim_id, v.verdict, v.n) == ("16", "not reproduced here", 2) and v.claim == px.CLAIM["text"]
    assert v.sentence.startswith(f"Claim '{px.CLAIM['text']}': refuted on this setting (a CPU analogue")
    # the stored CPU replay hits alike in every trial: no interval, said so (not "+-0.00 pp")
    assert s["dhit_min_detectable_pp"] is None and s["dhit_deterministic_cells"] > 0
    assert v.detectable == "deterministic replay, no interval"
    assert res.markdown() == "\n".join(f"- {line}" for line in px.verdict(s))


def test_study_07_verdict_without_fp8_is_not_testable(tmp_path):
    spec = _store_07(tmp_path, fp8_ok=False)
    run = px.load(tmp_path / px.STUDY / spec_hash(spec.descriptor()))
    (v,) = s07.Results(run, spec).verdict()
    assert (v.verdict, v.n, v.detectable) == ("not testable here", None, None)
    assert v.sentence.startswith(f"Claim '{px.CLAIM['text']}': not measured on this setting")


# ------------------------------------------------------------------------------------------ Study 04's results
@pytest.fixture(scope="module")
def fake_04(tmp_path_factory):
    plan = lc.LongCtxPlan(
        model=TINY,
        lengths=lc.length_grid("geometric", 512, 8192, 32),
        output_tokens=32,
        concurrency=2,
        kv_cache_gib=0.03,
        block_size=128,
        random_token_lengths=(8160,),
        sweep_block_sizes=(16, 256),
        sweep_dtypes=("auto", "fp8"),
        sweep_lengths=(8160,),
        quality_model=TINY,
        quality_length=600,
        passkey_lengths=(256,),
        passkey_depths=(0.5,),
    )
    runner, _ = _fake_runner(plan)
    store, seen = tmp_path_factory.mktemp("store04"), []

    def recording(*a, **k):  # where run_cached would store this engine's run
        seen.append(os.environ.get("FP8LAB_RUNS"))
        return runner(*a, **k)

    before = os.environ.get("FP8LAB_RUNS")
    res = s04.run(plan, store=store, runner=recording, progress=False)
    assert os.environ.get("FP8LAB_RUNS") == before  # restored after the run
    return plan, res, store, seen


def test_study_04_run_stores_in_the_store_given(fake_04):
    plan, res, store, seen = fake_04
    assert res.spec is plan and len(seen) == len(res.run.runs) == 8 and set(seen) == {str(store)}


def test_study_04_results_tables_summary_verdict(fake_04):
    plan, res, _, _ = fake_04
    t = res.tables()
    assert list(t) == ["engines", *(f.name for f in dataclasses.fields(lc.Tables))]
    assert all(isinstance(v, pd.DataFrame) for v in t.values()) and t["engines"] is res.run.engines
    assert t["boundary"].set_index("kv_dtype").loc["fp8", "longest_measured"] == 20736
    lt = lc.tables(res.run)
    s = res.summary()
    assert json.dumps(s, sort_keys=True, default=str) == json.dumps(
        lc.summary_values(res.run, lt, lc.claims(res.run, lt)), sort_keys=True, default=str
    )
    # issue 35: ITL intervals resample requests; one request per dtype and length gives none, so "grow" is partly
    assert s["auto.longest_measured"] == 10240 and s["claim.gains_grow"].startswith("partly:")
    v = {x.claim_id: x for x in res.verdict()}
    assert list(v) == ["04.oom", "04.gains_grow", "12a", "04.silent", "28"]
    assert all(isinstance(x, study.Verdict) and x.verdict in study.VERDICT_WORDS for x in v.values())
    assert v["04.gains_grow"].verdict == "inconclusive" and v["04.gains_grow"].n == len(plan.lengths)  # "partly"
    assert v["04.gains_grow"].detectable is None  # one request per point: no interval over requests (issue 35)
    # the sweep ran 128 (the ramp's) and 256 at the longest length (16 rejected): 256 is no faster (x1.000), and the
    # ramp's own scatter (+-4%) excludes the claimed x0.46: refuted by the audit's rule 12a (Study 04's label alone
    # said "inconclusive" here before the rule was shared: test_claim_12a_is_judged_once)
    assert (v["12a"].verdict, v["12a"].n) == ("not reproduced here", 2)  # the rule refutes; capped as the audit caps
    assert (
        v["12a"].detectable.startswith("6% at 80% power (95% interval +-4%; one request per point")
        and "x1.000; claimed x0.46" in v["12a"].sentence
    )
    assert (v["04.oom"].n, v["04.oom"].detectable) == (2, "one KV block (128 tokens)")
    assert v["04.silent"].n == 599  # one real-text document of 600 tokens, positions 1..599, one candidate dtype
    assert v["04.oom"].sentence.startswith('"bf16 runs out of memory where fp8 keeps going": ')
    assert "fp8lab-tiny-qwen3, 0.03 GiB of KV, block size 128, prompts up to 8,160 tokens" in v["04.oom"].sentence
    assert res.markdown() == lc.verdict_markdown(res.run, lt)


# ------------------------------------------------------------------------------------------ claim 12a, judged once
def _report_04(summary: dict, label: str = "r") -> audit.Report:
    return audit.Report(label, NOTEBOOKS_DIR, {"04_long_context_ramp_128k": summary})


def test_claim_12a_is_judged_once(fake_04):
    """Study 04's verdict on claim 12a and the audit's are one rule (fp8lab.audit.rules_longctx.block_size_finding)
    on one input, the summary Study 04 records; before, Study 04 mapped its label ("256 fastest?") to a verdict of
    its own, which disagreed with the audit on this fake run and on both committed reports."""
    _, res, _, _ = fake_04
    s = res.summary()
    mine = {x.claim_id: x for x in res.verdict()}["12a"]
    theirs = audit.rule_block_size(_report_04(s))
    assert theirs.verdict == "refuted"  # the rule, before the setting check
    theirs = audit.cap(audit.CLAIMS_BY_ID["12a"], theirs)  # as the audit and Study 04 state it
    assert (mine.verdict, mine.detectable) == (theirs.verdict, theirs.detectable)
    assert mine.verdict == "not reproduced here"
    assert theirs.details["fp8"]["ratio"] == pytest.approx(1.0) and theirs.details["fp8"]["ref_block"] == 128
    # the old Study 04 verdict: its label put on the audit's scale
    assert s04.verdict_word("block256", s["claim.block256"]) == "inconclusive" != mine.verdict
    # the committed H200 report: 256 vs 16 at 131,040 tokens, one request each; the audit's row for it is refuted,
    # Study 04's label "not supported" gave inconclusive
    h200 = json.loads((NOTEBOOKS_DIR.parent / "reports/h200/04_long_context_ramp_128k.summary.json").read_text())
    f = audit.block_size_finding(h200)
    assert f.verdict == "refuted" and f.details["fp8"]["ratio"] == pytest.approx(11.2425 / 11.1235, abs=1e-3)
    assert s04.verdict_word("block256", h200["claim.block256"]) == "inconclusive"
    committed = json.loads((NOTEBOOKS_DIR.parent / "reports/h200/05_claims_audit.summary.json").read_text())
    # the audit then caps the rule's refutation: the claim's setting (an unstated engine and GPU) is not the H200's
    assert next(r for r in committed["audit_rows"] if r["id"] == "12a")["by_report"]["h200"] == "not reproduced here"


def test_claim_12a_a_small_gain_is_not_the_claimed_one():
    """256 1% faster than 16 at 128K: Study 04's label would say "supported" (256 fastest, 16 measured), which its
    old mapping made confirmed; the shared rule refutes it: the ramp's +-4% around x0.99 excludes the claimed x0.46."""
    lengths = [32768, 65536, 131040]
    s: dict = {"lengths": lengths, "kv_dtypes": ["auto", "fp8"], "block_size": 16}
    for dt in ("auto", "fp8"):
        s |= {f"{dt}.fit.e2e_p50_s.a": 0.0, f"{dt}.fit.e2e_p50_s.b": 1e-4, f"{dt}.fit.e2e_p50_s.c": 0.0}
        for L, e in zip(lengths, (1.01, 0.99, 1.0), strict=True):  # 1% scatter around the fit
            s[f"{dt}.c1.L{L}.e2e_p50_s"] = 1e-4 * L * e
        s |= {f"{dt}.bs256.L131040.outcome": "ok", f"{dt}.bs256.L131040.e2e_p50_s": 0.99 * 13.104}
    f = audit.block_size_finding(s)
    assert f.verdict == "refuted" and f.details["parts"] == {"auto": "contradicted", "fp8": "contradicted"}
    assert f.details["auto"] == {
        "length": 131040,
        "ref_block": 16,
        "ratio": pytest.approx(0.99),
        "outcome": "contradicted",
    }
    # the median |residual| of the six ramp points is 0.99%: 1.96 x sqrt(2) x 1.4826 x 0.99% = 4.1%
    # stated at 80% power (issue 35): (1.96 + 0.84) / 1.96 x the 95% half-width of 4%
    assert (
        f.detectable.startswith("6% at 80% power (95% interval +-4%; one request per point")
        and "0.99 x" not in f.detectable
    )
    assert s04.verdict_word("block256", "supported") == "confirmed"  # what Study 04 said before
    assert audit.rule_block_size(_report_04(s)).verdict == f.verdict  # the audit reads the same summary the same way


# ------------------------------------------------------------------------------------------ claim 28, FP8 emulated
def _as_emulated(res: s04.Results) -> s04.Results:
    """``res`` as a CPU without the FP8 KV kernel records it (fp8lab.longctx.run._run_emulated): the fp8 engine's
    quality phases (divergence, passkey) on an emulated engine, labelled ``fp8 (emulated)``."""
    from fp8lab.longctx.run import EMULATED_ROLE

    rec = res.run.records.copy()
    q = (rec.kv_dtype == "fp8") & rec.phase.isin(["div-text", "div-random", "passkey"]) & (rec.role == "ramp")
    rec.loc[q, "kv_dtype"], rec.loc[q, "role"] = "fp8 (emulated)", EMULATED_ROLE
    return s04.Results(dataclasses.replace(res.run, records=rec, emulated=["fp8 (emulated)"]))


def test_claim_28_reads_the_fp8_candidate_native_or_emulated(fake_04):
    """On an AVX2-only CPU Study 04's divergence runs on ``fp8 (emulated)``: its random-token ratio, its divergence
    section and claim 28 must read that candidate as they read ``fp8``. Before, the random-vs-real table and the
    silent-failure section looked for ``fp8`` only ("not measured"), and the audit's rule read
    ``fp8.random.divergence_ratio`` only (not testable), while Study 04's own verdict table said inconclusive."""
    _, native, _, _ = fake_04
    emu = _as_emulated(native)
    s, sn = emu.summary(), native.summary()
    assert "fp8.random.divergence_ratio" not in s
    assert s["fp8 (emulated).random.divergence_ratio"] == sn["fp8.random.divergence_ratio"] == pytest.approx(1.0)
    assert s["claim.silent"] == sn["claim.silent"] == "no growth along the context"  # old: "not measured"
    assert "`fp8 (emulated)` vs `auto`, teacher-forced on real text" in emu.markdown()
    for res, lab in ((native, "fp8"), (emu, "fp8 (emulated)")):
        summary = res.summary()
        assert fp8_quality_label(summary, "random.divergence_ratio") == lab
        theirs = audit.cap(audit.CLAIMS_BY_ID["28"], audit.rule_random_tokens(_report_04(summary)))
        mine = {x.claim_id: x for x in res.verdict()}["28"]
        assert (
            (mine.verdict, mine.detectable)
            == (theirs.verdict, theirs.detectable)
            == (
                "inconclusive",
                "unknown (one document each, no interval)",
            )
        )
        assert "rule 28" in mine.sentence and "x1.00" in mine.sentence
    assert audit.rule_random_tokens(_report_04(s)).measured.startswith("fp8 (emulated): random / real text: FP8 ")
    # the divergence rests on the quality model, which the setting names (cpu-tiny: the real model, the ramp tiny)
    assert s["quality_model"] == s["model"] == "fp8lab-tiny-qwen3"
    real = audit.rule_random_tokens(_report_04(s | {"quality_model": "SmolLM2-135M-Instruct"}))
    assert "SmolLM2-135M-Instruct" in real.setting and "fp8lab-tiny-qwen3" not in real.setting
    # a run that timed random tokens but scored no divergence: the claim (quality only) is not testable on either page
    bare = {k: v for k, v in s.items() if ".random.divergence_ratio" not in k and ".random.flip_ratio" not in k}
    assert fp8_quality_label(bare, "random.divergence_ratio") is None
    assert audit.safe(audit.rule_random_tokens, _report_04(bare)).verdict == "not testable here"


# ------------------------------------------------------------------------------------------ Study 05 (the audit)
def test_study_05_spec_from_the_profile_is_the_spec_the_notebook_built():
    p = _params(s05.NAME)
    spec = s05.Spec.from_params(p)
    assert type(spec) is audit.AuditSpec and spec == audit.AuditSpec.from_params(p)
    assert spec.other_reports == tuple(p["OTHER_REPORTS"]) and spec.introspect_installed is p["INTROSPECT_INSTALLED"]
    # a notebook's globals() hold other names too: they never fill a field
    assert s05.Spec.from_params({**p, "other_reports": [], "spec": None, "_": 1}) == spec


def test_study_05_results_from_the_committed_reports():
    """The audit on the committed reports (no engine; the saved vLLM 0.26.0 options only): the verdicts the committed
    H200 audit recorded, one typed Verdict per claim in the claims' order, and the tables and prose the notebook
    shows."""
    spec = s05.Spec.from_params(
        {
            "REPORT_DIR": "reports/h200",
            "OTHER_REPORTS": ["reports/h200/shipped", "reports/cpu-tiny"],
            "VLLM_OPTIONS_FILES": "reports/h200/vllm-options-*.json",
            "INTROSPECT_INSTALLED": False,
        }
    )
    res = s05.run(spec, store=None)
    assert res.spec is spec and [r.label for r in res.evidence.reports] == ["h200", "h200/shipped", "cpu-tiny"]
    s = res.summary()
    assert s == audit.summary_values(audit.audit(res.evidence), res.evidence) and s["vllm_versions"] == ["0.26.0"]
    committed = json.loads((NOTEBOOKS_DIR.parent / "reports/h200/05_claims_audit.summary.json").read_text())
    # without introspecting the installed vLLM claim 14 (calculate_kv_scales) cannot be decided; the committed audit did
    assert {k: v for k, v in s["verdicts"].items() if k != "14"} == {
        k: v for k, v in committed["verdicts"].items() if k != "14"
    }
    assert (s["verdicts"]["14"], committed["verdicts"]["14"]) == ("not testable here", "refuted")
    assert s["verdict_counts"] == {  # claim 17 inconclusive on the replicated Study 06 (batch 1 only)
        "confirmed": 5,
        "refuted": 22,
        "not reproduced here": 12,
        "inconclusive": 7,
        "not testable here": 6,
    }
    v = res.verdict()
    assert all(isinstance(x, study.Verdict) and x.n is None for x in v)
    assert [x.claim_id for x in v] == [c.id for c in audit.CLAIMS] and len(v) == 52
    assert {x.claim_id: x.verdict for x in v} == s["verdicts"]
    by = {x.claim_id: x for x in v}
    assert by["12a"].verdict == "not reproduced here" and "+-24%" in by["12a"].detectable
    assert by["5"].sentence == (
        "Claim 5 (On a 6:3:1 short/medium/long mix FP8 lowers throughput 7.9%, improves TTFT slightly and worsens "
        "TPOT): not reproduced here, by GPU evidence ([h200] NVIDIA H200, qwen3-8b (dummy weights), vLLM 0.26.0, "
        "KV-only FP8, CUDA graphs, closed-loop concurrency)."
    )
    assert by["15"].detectable == next(r["detectable"] for r in res.rows if r["id"] == "15")
    t = res.tables()
    assert list(t) == ["evidence", "claims", "formats", "options"] and all(
        isinstance(x, pd.DataFrame) for x in t.values()
    )
    assert list(t["claims"].index) == [c.id for c in audit.CLAIMS] and list(t["claims"].verdict) == list(
        s["verdicts"].values()
    )
    assert res.markdown() == audit.verdict_markdown(res.rows, res.evidence)
    assert res.markdown().startswith("- " + s["headline"][0])
    assert res.details_markdown() == audit.details_markdown(res.rows)
