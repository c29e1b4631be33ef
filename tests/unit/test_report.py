"""The runner's plumbing without notebooks: summaries, profiles, notebook selection, index page."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fp8lab import kvmath
from fp8lab import longctx as lc
from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.profiles import TEST_PROFILE, list_notebooks, load_profile, load_profiles, resolved_parameters
from fp8lab.report.run import record_summary, write_index
from fp8lab.specs import SpecError


def test_record_summary_is_json_safe(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_SUMMARY_PATH", str(tmp_path / "s.json"))
    path = record_summary({"ratio": np.float64(2.0), "n": np.int64(3), "bad": math.nan, "pair": (1, 2)})
    assert json.loads(path.read_text()) == {"ratio": 2.0, "n": 3, "bad": None, "pair": [1, 2]}


def test_profiles_have_cpu_and_h200():
    profiles = load_profiles()
    assert {"cpu-tiny", "h200"} <= set(profiles)
    assert profiles["cpu-tiny"]["params"]["MODEL"] == "data/models/fp8lab-tiny-qwen3"
    with pytest.raises(SpecError, match="Profile.name = 'nope': one of cpu-tiny"):
        load_profile("nope")


#: cpu-tiny's settings of its quality studies on the shipped model, before they moved to the real model (issue 33:
#: the reference report's quality verdicts rest on SmolLM2-135M-Instruct; the main job and the test tier cannot
#: afford it on 2 cores). cpu-quick and cpu-ci pin these back ("shipped-model pins" in profiles.yaml): they are
#: compared with cpu-tiny as if it still ran them, and every pin must hold the value here.
TINY = "data/models/fp8lab-tiny-qwen3"
SHIPPED_MODEL_PINS = {
    "02_calibration_32_tokens": {
        "MODEL": TINY,
        "CALIB_SAMPLES": 512,
        "SAMPLE_TOKENS": 200,
        "SUBSET_SIZES": [1, 2, 4, 8, 16, 32, 64, 128, 256],
        "QUALITY_SETS": ["prompt32", "large"],
        "DETECT_HEAD_REDUCTION": True,
        "MAX_PROMPTS_PER_CATEGORY": None,
        "PPL_SCORED_TOKENS": 128,
        "TASK_ITEMS": 16,
        "PPL_WINDOW_TOKENS": 512,
    },
    "03_quality_token_match": {
        "MODEL": TINY,
        "KV_DTYPES": ["auto", "fp8", "fp8_e5m2"],
        "MAX_PROMPTS_PER_CATEGORY": None,
        "PPL_SCORED_TOKENS": 128,
        "TASK_ITEMS": 16,
        "KV_CAPTURE_PROMPTS": 8,
        "PPL_WINDOW_TOKENS": 512,
    },
    "04_long_context_ramp_128k": {
        "QUALITY_MODEL": TINY,
        "QUALITY_KV_CACHE_GIB": None,
        "QUALITY_LENGTH": 1024,
        "PASSKEY_LENGTHS": [256, 2048],
        "PASSKEY_DEPTHS": [0.1, 0.5, 0.9],
        "PASSKEY_TRIALS": 1,
        "PASSKEY_KEYS": [1],
    },
    "08_kv_dtype_matrix": {"MODEL": TINY, "KV_CACHE_GIB": 0.01},
}


def _tiny_as_pinned(profile: dict, tiny: dict) -> dict:
    """cpu-tiny's notebook entries with the shipped-model pins, asserting that cpu-tiny runs the real model there and
    ``profile`` the shipped model (a pin set to another value is then a changed entry, which the callers check)."""
    from fp8lab import realmodel

    out = {nb: dict(e) for nb, e in tiny["notebooks"].items()}
    for nb, pins in SHIPPED_MODEL_PINS.items():
        model_key = "QUALITY_MODEL" if "QUALITY_MODEL" in pins else "MODEL"
        assert tiny["notebooks"][nb][model_key] == realmodel.NAME, (nb, "cpu-tiny runs the real model")
        entry = profile["notebooks"].get(nb) or {}
        assert entry.get(model_key) == TINY, (nb, "pinned to the shipped model")
        out[nb].update(pins)
    return out


def test_the_quick_profile_measures_what_cpu_tiny_does_with_fewer_repetitions():
    """The main job's cpu-quick is cpu-tiny with fewer repetitions and fewer side checks, never another model, budget
    or workload: every entry it changes is one of these knobs, and it says so in its description."""
    quick, tiny = load_profile("cpu-quick"), load_profile("cpu-tiny")
    assert quick["extends"] == "cpu-tiny" and quick["params"] == tiny["params"]
    tiny = {**tiny, "notebooks": _tiny_as_pinned(quick, tiny)}
    knobs = {
        "TRIALS",
        "ARRIVALS",
        "NAIVE_CONCURRENCY",
        "CALIB_SAMPLES",
        "PPL_WINDOWS",
        "TASK_ITEMS",
        "DETECT_HEAD_REDUCTION",
        "SWEEP_BLOCK_SIZES",
        "PROBE_BOUNDARY",
        "CONTEXTS",
        "REPS",
        "ACTIVE",
        "PHASE_SECONDS",
        "MIN_LENGTH",
        "WORKLOADS",
        "MAX_PROMPTS_PER_CATEGORY",
        "QUALITY_LENGTH",
        "RANDOM_TOKEN_LENGTHS",
        "KV_DTYPES",
        "START_ANYWAY",  # Study 08: the engine started only to show its own refusal
        "MEASURE",  # Study 08: fewer measure phases (a part of PHASES, checked below)
        "ARMS",  # Study 06: fewer of cpu-tiny's arms (a part of its list, checked below)
        "BATCHES",  # Study 06: fewer of cpu-tiny's batch sizes (a part of its list, checked below)
    }
    changed = {
        (nb, k)
        for nb, entry in quick["notebooks"].items()
        for k, v in entry.items()
        if (tiny["notebooks"].get(nb) or {}).get(k, object()) != v
    }
    assert changed and {k for _, k in changed} <= knobs, changed
    for nb, k in changed:  # lists shrink to a part of cpu-tiny's, never to something else
        was, now = (tiny["notebooks"].get(nb) or {}).get(k), quick["notebooks"][nb][k]
        if isinstance(was, list) and k != "ARRIVALS":
            assert all(x in was for x in now), (nb, k, now, was)
        if k in ("ARMS", "BATCHES"):  # a part of cpu-tiny's list, never empty, never another value
            assert isinstance(was, list) and now and set(now) < set(was), (nb, k, now, was)
        if k == "MEASURE":  # cpu-tiny measures every phase (the notebook's default); quick measures fewer of them
            from fp8lab.dtypes.spec import PHASES

            assert "MEASURE" not in (tiny["notebooks"].get(nb) or {}) and set(now) < set(PHASES), (nb, now)
    assert "fewer" in quick["description"] and "cpu-tiny" in quick["description"]


#: Study 04's settings in cpu-ci that make it the plan of tests/integration/test_longctx_cpu.py (whose engines the
#: notebook tier then loads): a smaller budget, ramp and passkey, the same shape (checked below).
NB04_PLAN = {
    "KV_CACHE_GIB",
    "BLOCK_SIZE",
    "MIN_LENGTH",
    "MAX_CONTEXT",
    "OUTPUT_TOKENS",
    "RANDOM_TOKEN_LENGTHS",
    "QUALITY_LENGTH",
    "TOP_K",
    "POSITION_BINS",
    "PASSKEY_LENGTHS",
}


def test_the_test_profile_keeps_every_side_check_of_cpu_tiny():
    """The suite's notebook tier (cpu-ci) runs cpu-tiny's model, budgets and workloads, and every code path cpu-tiny
    exercises (what cpu-quick drops: both arrivals, the non-streaming client, the head-reduction twin, the boundary
    probes, the refused block size 16, all prefix-cache workloads); only repetitions, phase lengths and grid points
    shrink. Study 04 runs the long-context integration test's smaller plan, of the same shape: one request at the
    longest length fits auto's blocks, two do not, fp8's hold both (the boundary inside the run)."""
    ci, tiny = load_profile(TEST_PROFILE), load_profile("cpu-tiny")
    assert TEST_PROFILE == "cpu-ci" and ci["extends"] == "cpu-tiny" and ci["params"] == tiny["params"]
    tiny = {**tiny, "notebooks": _tiny_as_pinned(ci, tiny)}
    changed = {
        (nb, k)
        for nb, entry in ci["notebooks"].items()
        for k, v in entry.items()
        if (tiny["notebooks"].get(nb) or {}).get(k, object()) != v
    }
    nb04 = "04_long_context_ramp_128k"
    assert {k for nb, k in changed if nb == nb04} <= NB04_PLAN | {"SWEEP_BLOCK_SIZES"}, changed
    changed = {(nb, k) for nb, k in changed if nb != nb04}
    assert changed and {k for _, k in changed} <= {
        "TRIALS",
        "REPS",
        "CONTEXTS",
        "PPL_WINDOWS",
        "TASK_ITEMS",
        "BATCHES",  # Study 06: fewer batch sizes, every context of cpu-tiny's grid kept (a line per batch)
        "ACTIVE",  # Study 07: the sweep to just past auto's knees, as the main job (every workload kept)
        "TIMEOUT_S",  # Study 08: a row's time limit (a hang recorded sooner), no measurement changed
        "PHASE_SECONDS",  # Study 01: shorter sustained phases (still at least 4 N requests each)
        "CLOSED_LOOP_REQUESTS",
        "OPEN_LOOP_REQUESTS",
    }, changed
    for nb, k in changed:
        was, now = tiny["notebooks"][nb].get(k), ci["notebooks"][nb][k]
        if k == "BATCHES":  # a part of cpu-tiny's batches; the contexts (the line's points) stay as cpu-ci has them
            ctx = ci["notebooks"][nb]["CONTEXTS"]
            assert now and set(now) < set(was) and len(ctx) >= 2, (nb, k, now, was, ctx)
        elif isinstance(was, list):
            assert all(x in was for x in now) and len(now) >= 2, (nb, k, now, was)
        elif k == "PHASE_SECONDS":
            assert 0 < now < was, (nb, k, now, was)  # still sustained: a phase lasts at least this long
        elif k in ("CLOSED_LOOP_REQUESTS", "OPEN_LOOP_REQUESTS"):
            assert 4 <= now < was, (nb, k, now, was)  # a closed loop finishes max(this, 4 N): 64 at c=16
        elif k == "TIMEOUT_S":
            assert 30 <= now < (was or 900.0), (nb, k, now, was)  # 900 s: the notebook's default
        else:
            assert 3 <= now < was, (nb, k, now, was)  # t-intervals keep at least 2 degrees of freedom
    # Study 04: every side check of cpu-tiny (the probes, the refused block size 16 and a measured one, quality on
    # text and random tokens, the passkey), and the boundary inside the ramp
    entry = ci["notebooks"][nb04]
    assert 16 in entry["SWEEP_BLOCK_SIZES"] and any(b % 32 == 0 for b in entry["SWEEP_BLOCK_SIZES"])
    plan = lc.LongCtxPlan.from_params(resolved_parameters(NOTEBOOKS_DIR / f"{nb04}.ipynb", ci))
    assert plan.probe_boundary and plan.quality_docs and plan.quality_random_docs and plan.passkey_lengths
    assert plan.random_token_lengths and plan.quality_length >= 256
    blocks = {
        d: kvmath.predict_num_blocks(plan.model, int(plan.kv_cache_gib * kvmath.GIB), plan.block_size, d)
        for d in ("auto", "fp8")
    }
    longest = max(plan.lengths) + plan.output_tokens
    assert lc.longest_context(blocks["auto"], plan.block_size) >= max(longest, *plan.passkey_lengths)
    assert lc.max_concurrency_at(blocks["auto"], plan.block_size, longest) < plan.concurrency
    assert lc.max_concurrency_at(blocks["fp8"], plan.block_size, longest) >= plan.concurrency


def test_a_profile_extends_another(tmp_path):
    """``extends: BASE``: the base's params and notebook entries, updated name by name by the profile's own, through
    a chain; an unknown base or a cycle is a SpecError naming the field."""
    f = tmp_path / "profiles.yaml"
    f.write_text(
        "base:\n  params: {MODEL: m, KV_CACHE_GIB: 1.0}\n"
        "  notebooks:\n    01_x: {TRIALS: 5, CONCURRENCY: [1, 16]}\n    02_y: {SAMPLES: 512}\n"
        "quick:\n  extends: base\n  description: fast\n  params: {KV_CACHE_GIB: 0.5}\n"
        "  notebooks:\n    01_x: {TRIALS: 3}\n    03_z: {N: 1}\n"
        "quicker:\n  extends: quick\n  notebooks:\n    01_x: {CONCURRENCY: [1]}\n"
    )
    p = load_profiles(f)
    assert p["base"] == {
        "params": {"MODEL": "m", "KV_CACHE_GIB": 1.0},
        "notebooks": {"01_x": {"TRIALS": 5, "CONCURRENCY": [1, 16]}, "02_y": {"SAMPLES": 512}},
    }
    assert p["quick"]["params"] == {"MODEL": "m", "KV_CACHE_GIB": 0.5} and p["quick"]["description"] == "fast"
    assert p["quick"]["notebooks"] == {
        "01_x": {"TRIALS": 3, "CONCURRENCY": [1, 16]},
        "02_y": {"SAMPLES": 512},
        "03_z": {"N": 1},
    }
    assert p["quicker"]["notebooks"]["01_x"] == {"TRIALS": 3, "CONCURRENCY": [1]}
    assert p["quicker"]["params"]["KV_CACHE_GIB"] == 0.5
    f.write_text("a:\n  extends: nope\n")
    with pytest.raises(SpecError, match="Profile.a.extends = 'nope': the name of another profile"):
        load_profiles(f)
    f.write_text("a:\n  extends: b\nb:\n  extends: a\n")
    with pytest.raises(SpecError, match="a chain without a cycle"):
        load_profiles(f)


def test_notebook_selection_by_prefix_and_errors():
    everything = list_notebooks()
    # in name order, the claims audit last: it reads the other notebooks' summaries
    assert everything[-1].stem == "05_claims_audit"
    assert everything[:-1] == sorted(everything[:-1]) and "06_decode_speed" in [p.stem for p in everything]
    assert list_notebooks(["00"]) == [p for p in everything if p.stem.startswith("00")]
    with pytest.raises(SpecError, match="RunSpec.notebooks = 'zz'"):
        list_notebooks(["zz"])


def test_index_lists_each_notebook_with_status(tmp_path):
    summary = {
        "profile": "cpu-tiny",
        "created_utc": "2026-11-29T00:00:00+00:00",
        "provenance": {"device": "CPU"},
        "notebooks": {
            "00_x": {"status": "ok", "html": "00_x.html", "wall_s": 1.0, "summary": {"a": 1.5}},
            "01_y": {"status": "failed", "error": "boom", "wall_s": 2.0, "summary": None},
        },
    }
    page = write_index(tmp_path, summary).read_text()
    assert '<a href="00_x.html">00_x</a>' in page and "boom" in page and "failed" in page


def test_resolved_parameters_layers_defaults_profile_overrides():
    from fp8lab.paths import NOTEBOOKS_DIR
    from fp8lab.profiles import load_profile, resolved_parameters

    nb = NOTEBOOKS_DIR / "03_quality_token_match.ipynb"
    p = resolved_parameters(nb, load_profile("cpu-tiny"), {"GEN_TOKENS": 7})
    assert p["TOP_K"] == 5  # the notebook's own value (no profile sets it)
    assert p["TASK_ITEMS"] == load_profile("cpu-tiny")["notebooks"]["03_quality_token_match"]["TASK_ITEMS"]
    assert p["GEN_TOKENS"] == 7  # the override wins
    assert "CONCURRENCY" not in p  # another notebook's parameter is not passed


def test_compare_summaries_side_by_side(tmp_path, capsys):
    from fp8lab.cli import main
    from fp8lab.report.run import compare_summaries

    for name, vals in (
        ("cpu", {"fp8.top3": 0.91, "fp8.ppl": 8.9, "labels": ["a"], "ok": True}),
        ("gpu", {"fp8.top3": 0.95, "auto.ppl": 13.3}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "03_q.summary.json").write_text(json.dumps(vals))
    t = compare_summaries([tmp_path / "cpu", tmp_path / "gpu"], "03_q", r"^fp8\.")
    assert list(t.columns) == ["cpu", "gpu"] and list(t.index) == ["fp8.ppl", "fp8.top3"]  # lists, bools left out
    assert t.loc["fp8.top3", "gpu"] == 0.95 and math.isnan(t.loc["fp8.ppl", "gpu"])
    assert main(["compare", "03_q", str(tmp_path / "cpu"), str(tmp_path / "nowhere")]) == 2
    assert "no summary of 03_q" in capsys.readouterr().err
    assert main(["compare", "03_q", str(tmp_path / "cpu"), "--keys", "("]) == 2


def test_every_profile_entry_is_a_parameter_of_its_notebook():
    """A typo in a profile's per-notebook entry would otherwise be dropped without a word (papermill only warns)."""
    from fp8lab.profiles import parameters_for

    for name in load_profiles():
        profile = load_profile(name)
        for nb in list_notebooks():
            own = (profile.get("notebooks") or {}).get(nb.stem) or {}
            assert parameters_for(nb, profile).items() >= own.items(), (name, nb.stem)


def test_unknown_parameters_are_named():
    from fp8lab.profiles import check_overrides, parameters_for

    nb = list_notebooks(["01"])
    with pytest.raises(SpecError, match=r"Profile.notebooks.01_kv_dtype_auto_vs_fp8.KV_CAHCE_GIB = 2: not a parameter"):
        parameters_for(nb[0], {"notebooks": {"01_kv_dtype_auto_vs_fp8": {"KV_CAHCE_GIB": 2}}})
    # shared params may belong to other notebooks; overrides must belong to one of the notebooks run
    assert "RUN_FIDELITY" not in parameters_for(list_notebooks(["00"])[0], {"params": {"RUN_FIDELITY": True}})
    check_overrides(list_notebooks(["00", "01"]), {"RUN_FIDELITY": True, "ENGINE_RECORDS": []})
    with pytest.raises(
        SpecError, match=r"RunSpec.RUN_FIDELITY = True: not a parameter of 00_kv_memory_estimation; allowed: "
    ):
        check_overrides(list_notebooks(["00"]), {"RUN_FIDELITY": True})


def test_a_slimmed_index_keeps_every_studys_numbers_on_the_next_run(tmp_path):
    """scripts/slim_index.py drops each study's summary from ``summary.json`` only where ``NN_*.summary.json`` holds
    the same; a later run into the folder (:func:`fp8lab.report.previous_entries`) takes it back from that file, so
    the index it writes shows the same numbers; an entry whose file differs keeps its own copy."""
    import importlib.util
    import json

    from fp8lab.paths import REPO_ROOT
    from fp8lab.report.run import previous_entries

    spec = importlib.util.spec_from_file_location("slim_index", REPO_ROOT / "scripts" / "slim_index.py")
    slim_index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(slim_index)
    a, b = {"x": 1.5, "claim.y": "confirmed"}, {"z": [1, 2]}
    (tmp_path / "03_q.summary.json").write_text(json.dumps(a))
    (tmp_path / "04_l.summary.json").write_text(json.dumps({"z": [3]}))  # not the index's copy: kept
    entry = {"status": "ok", "ran_on": {"device": "CPU: x"}, "parameters": {"MODEL": "m"}}
    index = {"profile": "p", "notebooks": {"03_q": {**entry, "summary": a}, "04_l": {**entry, "summary": b}}}
    (tmp_path / "summary.json").write_text(json.dumps(index))
    before, after = slim_index.slim(tmp_path)
    slimmed = json.loads((tmp_path / "summary.json").read_text())["notebooks"]
    assert after < before and "summary" not in slimmed["03_q"] and slimmed["04_l"]["summary"] == b
    assert slimmed["03_q"]["ran_on"] == entry["ran_on"] and slimmed["03_q"]["parameters"] == entry["parameters"]
    prev = previous_entries(tmp_path, "p")
    assert prev["03_q"]["summary"] == a and prev["04_l"]["summary"] == b
    assert slim_index.slim(tmp_path)[1] == after  # idempotent
