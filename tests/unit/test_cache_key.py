"""The run cache key: the installed vLLM and torch versions and the engine-side code are part of it, so a normal run
after an upgrade or an engine edit measures anew; a re-render from committed stores (``$FP8LAB_STORE_ONLY``) still
finds runs stored under other versions or before those keys existed; a store copied to another folder or machine
(its model path gone) loads. No engine starts here: a run that is not loaded stops at the model-path check every
engine start runs first (this machine lacks the stored model folder), which is how these tests tell it apart."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fp8lab.engine import capability, devices, results
from fp8lab.engine.result import EngineResult
from fp8lab.specs import EngineSpec, Request, SpecError, spec_hash

REQS = [Request((1, 2, 3), 4)]


def _prefix_spec(model: str):
    from fp8lab.prefix import PrefixSpec

    return PrefixSpec(
        model=model,
        workloads=[["chat", 0, 0, 96, 16, 3]],
        active=[2],
        trials=2,
        kv_cache_gib=0.005859375,
        block_size=32,
        max_model_len=1024,
        correctness_prompts=0,
    )


def _versions(monkeypatch, vllm: str, torch: str) -> None:
    """What :func:`fp8lab.engine.devices.installed_version` (the installed-version lookup) answers, vLLM itself untouched."""
    real = devices.installed_version
    monkeypatch.setattr(devices, "installed_version", lambda mod: {"vllm": vllm, "torch": torch}.get(mod) or real(mod))


def _result(tokens: int = 5) -> EngineResult:
    return EngineResult(
        status="ok",
        error=None,
        engine={"kv_cache_dtype": "auto", "num_blocks": 10},
        records=pd.DataFrame({"phase": ["main"], "output_tokens": [tokens]}),
        samples=pd.DataFrame(),
        phases={"main": {"wall_s": 1.0, "requests": 1, "prompt_tokens": 3, "output_tokens": tokens}},
        provenance={"vllm": "0.26.0", "device": "NVIDIA H200"},
    )


def _model(folder: Path, tiny_model: str) -> str:
    folder.mkdir(parents=True)
    shutil.copy(Path(tiny_model) / "config.json", folder / "config.json")
    return str(folder)


def _store(root: Path, spec: EngineSpec, tokens: int = 5) -> Path:
    """One finished run of ``spec`` saved as ``run_cached`` would name it under the current versions."""
    desc = results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25)
    rd = results.run_dir_for("s", desc, root)
    results.save(_result(tokens), rd, desc)
    return rd


def _key(spec: EngineSpec) -> str:
    return results.run_dir_for("s", results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25)).name


def test_the_key_changes_with_vllm_torch_and_the_engine_code(monkeypatch, tiny_model):
    spec = EngineSpec(model=tiny_model)
    _versions(monkeypatch, "0.26.0", "2.9.0")
    base = _key(spec)
    assert _key(spec) == base  # the same versions and code: the same run
    desc = results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25)
    assert (desc["vllm"], desc["torch"], desc["engine_code"]) == ("0.26.0", "2.9.0", results.engine_code_hash())
    _versions(monkeypatch, "0.32.0", "2.9.0")
    after_vllm = _key(spec)
    _versions(monkeypatch, "0.26.0", "2.10.0")
    after_torch = _key(spec)
    _versions(monkeypatch, "0.26.0", "2.9.0")
    monkeypatch.setattr(results, "engine_code_hash", lambda files=None: "0123456789ab")
    after_code = _key(spec)
    assert len({base, after_vllm, after_torch, after_code}) == 4


def test_decode_and_prefix_keys_carry_the_same_versions(monkeypatch, tiny_model):
    from fp8lab.decode import DecodeSpec

    for make in (lambda: DecodeSpec(model=tiny_model), lambda: _prefix_spec(tiny_model)):
        _versions(monkeypatch, "0.26.0", "2.9.0")
        a = make().descriptor()
        _versions(monkeypatch, "0.26.0", "2.10.0")
        b = make().descriptor()
        assert (a["vllm"], a["torch"], b["torch"]) == ("0.26.0", "2.9.0", "2.10.0")
        assert a["engine_code"] == results.engine_code_hash() and spec_hash(a) != spec_hash(b)


def test_engine_code_hash_follows_each_listed_file(tmp_path):
    files = []
    for name in ("engine_worker.py", "devices.py"):
        (tmp_path / name).write_text(f"# {name}\nx = 1\n")
        files.append(tmp_path / name)
    before = results.engine_code_hash(files)
    assert results.engine_code_hash(files) == before and len(before) == 12
    (tmp_path / "devices.py").write_text("# devices.py\nx = 2\n")
    assert results.engine_code_hash(files) != before
    (tmp_path / "devices.py").write_bytes(b"# devices.py\r\nx = 2\r\n")  # a CRLF checkout of the same code
    crlf = results.engine_code_hash(files)
    (tmp_path / "devices.py").write_bytes(b"# devices.py\nx = 2\n")
    assert results.engine_code_hash(files) == crlf
    # the package's list names files that exist (a renamed one would drop out of the key unnoticed)
    pkg = Path(results.__file__).parents[1]
    assert all((pkg / f).is_file() for f in results.ENGINE_CODE_FILES)
    assert {"engine/run.py", "engine/worker.py", "engine/fp8emu.py", "engine/devices.py"} <= set(
        results.ENGINE_CODE_FILES
    )


def test_a_normal_run_after_an_upgrade_measures_anew(tmp_path, monkeypatch, tiny_model):
    """Stored under vLLM 0.26.0; the same versions load it (no engine, even though its model folder is gone);
    another vLLM, torch or engine code does not: the run goes to an engine start (stopped here by the missing
    model folder), and the stored run is left as it was."""
    model = _model(tmp_path / "model", tiny_model)
    spec = EngineSpec(model=model, kv_cache_gib=0.5)
    # the model's digest held fixed: the folder is removed below (to stop an engine start), which would change it
    monkeypatch.setattr(results, "model_digest", lambda model, load_format="auto": {"config": "c", "weights": "w"})
    _versions(monkeypatch, "0.26.0", "2.9.0")
    rd = _store(tmp_path / "runs", spec, tokens=7)
    shutil.rmtree(tmp_path / "model")
    same = results.run_cached(spec, REQS, study="s", root=tmp_path / "runs")
    assert same.extra.get("cached") and same.run_dir == rd and same.records.output_tokens.tolist() == [7]
    for vllm, torch, code in (("0.32.0", "2.9.0", None), ("0.26.0", "2.10.0", None), ("0.26.0", "2.9.0", "ab" * 6)):
        _versions(monkeypatch, vllm, torch)
        if code:
            monkeypatch.setattr(results, "engine_code_hash", lambda files=None, c=code: c)
        with pytest.raises(SpecError, match="EngineSpec.model = .*a folder holding config.json"):
            results.run_cached(spec, REQS, study="s", root=tmp_path / "runs")
    assert [p.name for p in (tmp_path / "runs" / "s").iterdir() if not p.name.startswith(".")] == [rd.name]


def test_store_only_loads_a_run_of_another_version_or_an_old_descriptor(tmp_path, monkeypatch, tiny_model):
    model = _model(tmp_path / "model", tiny_model)
    spec = EngineSpec(model=model, kv_cache_gib=0.5)
    _versions(monkeypatch, "0.26.0", "2.9.0")
    rd = _store(tmp_path / "runs", spec, tokens=7)
    # a run stored before the versions were part of the key: its spec.json has none of them, its folder the old hash
    old_desc = {k: v for k, v in json.loads((rd / "spec.json").read_text()).items() if k not in results.VERSION_KEYS}
    old_rd = results.run_dir_for("s", old_desc, tmp_path / "old")
    results.save(_result(11), old_rd, old_desc)
    shutil.rmtree(tmp_path / "model")  # re-rendered on another machine, too
    _versions(monkeypatch, "0.32.0", "2.10.0")
    monkeypatch.setattr(results, "engine_code_hash", lambda files=None: "ffffffffffff")
    assert (
        results.run_dir_for("s", results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25), tmp_path / "runs")
        != rd
    )
    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")
    got = results.run_cached(spec, REQS, study="s", root=tmp_path / "runs")
    assert got.status == "ok" and got.run_dir == rd and got.records.output_tokens.tolist() == [7]
    assert got.provenance["vllm"] == "0.26.0"  # the page names the vLLM that measured it
    got_old = results.run_cached(spec, REQS, study="s", root=tmp_path / "old")
    assert got_old.run_dir == old_rd and got_old.records.output_tokens.tolist() == [11]
    # a normal run does not take that fallback: it goes to an engine start (the model folder is gone here)
    monkeypatch.delenv(results.STORE_ONLY_ENV)
    with pytest.raises(SpecError, match="EngineSpec.model"):
        results.run_cached(spec, REQS, study="s", root=tmp_path / "old")


def test_store_only_shows_a_failure_stored_under_another_version_as_it_was(tmp_path, monkeypatch, tiny_model):
    """A run that failed on the measuring machine (not final: a normal run retries it) is shown with its own
    reason by a re-render under another vLLM, not reported missing."""
    spec = EngineSpec(model=tiny_model, kv_cache_dtype="fp8", kv_cache_gib=0.5)
    _versions(monkeypatch, "0.26.0", "2.9.0")
    desc = results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25)
    rd = results.run_dir_for("s", desc, tmp_path)
    failed = _result()
    failed.status, failed.error = "error", "ValueError: q dtype e5m2"
    results.save(failed, rd, desc)
    _versions(monkeypatch, "0.32.0", "2.10.0")
    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")
    # re-rendered where the FP8 kernel is missing (an AVX2 CPU): the store is read before the device is asked
    monkeypatch.setenv(capability.NATIVE_FP8_ENV, "0")
    got = results.run_cached(spec, REQS, study="s", root=tmp_path)
    assert (got.status, got.error, got.run_dir) == ("error", "ValueError: q dtype e5m2", rd)
    desc_now = results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25)
    results.save(failed, results.run_dir_for("s", desc_now, tmp_path), desc_now)
    got = results.run_cached(spec, REQS, study="s", root=tmp_path)  # stored under this very key: the same
    assert (got.status, got.error) == ("error", "ValueError: q dtype e5m2")
    monkeypatch.delenv(results.STORE_ONLY_ENV)  # a normal run on that device: not started, and says why
    assert results.run_cached(spec, REQS, study="s", root=tmp_path).status == "unsupported"


def test_store_only_prefix_run_of_an_old_descriptor_loads(tmp_path, monkeypatch, tiny_model):
    """Study 07's committed stores carry only ``vllm``: they still load store-only with the new keys."""
    from fp8lab import prefix

    spec = _prefix_spec(tiny_model)
    desc = spec.descriptor()
    old = {k: v for k, v in desc.items() if k not in ("torch", "engine_code")} | {"vllm": "0.26.0"}
    rd = tmp_path / prefix.STUDY / spec_hash(old)
    rd.mkdir(parents=True)
    (rd / "spec.json").write_text(json.dumps(old, default=str))
    (rd / "complete.json").write_text("{}")
    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")
    run = prefix.run_prefix(spec, root=tmp_path)
    assert run.run_dir == rd and run.complete


def test_a_store_copied_to_another_path_loads(tmp_path, tiny_model):
    """Written in one folder with a model folder that exists there; copied to another path where that model folder
    does not exist (another machine): ``load`` and ``collect`` read it whole."""
    model = _model(tmp_path / "machine-a" / "model", tiny_model)
    spec = EngineSpec(model=model, kv_cache_dtype="fp8", kv_cache_gib=0.5)
    rd = _store(tmp_path / "machine-a" / "runs", spec, tokens=9)
    shutil.copytree(tmp_path / "machine-a" / "runs", tmp_path / "machine-b" / "runs")
    shutil.rmtree(tmp_path / "machine-a")
    copied = tmp_path / "machine-b" / "runs" / "s" / rd.name
    res = results.load(copied)
    # a model folder outside the repository and the store is keyed by its name (and digest), never its path
    assert json.loads((copied / "spec.json").read_text())["engine"]["model"] == "model" != model
    assert res.status == "ok" and res.spec.model == "model" and res.spec.kv_cache_dtype == "fp8"
    assert res.records.output_tokens.tolist() == [9] and res.run_dir == copied
    table = results.collect("s", tmp_path / "machine-b" / "runs")
    assert table.run_id.tolist() == [rd.name] and table["spec.model"].tolist() == ["model"]
    assert table.status.tolist() == ["ok"] and table.num_blocks.tolist() == [10]


def test_paired_serving_study_remeasures_after_an_upgrade_and_rerenders_store_only(tmp_path, monkeypatch):
    """Study 01's paired design (engines stood in by test_metrics' fake, no vLLM): stored under vLLM 0.26.0; a
    store-only re-render under 0.32.0 loads all six runs and starts nothing; a normal run under 0.32.0 measures."""
    from test_metrics import TINY_CONFIG, _FakeEngine, _plan

    from fp8lab import serving

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_CONFIG))
    engine = EngineSpec(
        model=str(tmp_path / "model"),
        kv_cache_gib=0.0234375,
        max_model_len=2048,
        load_format="dummy",
        skip_tokenizer_init=True,
    )
    monkeypatch.setenv("FP8LAB_RUNS", str(tmp_path / "runs"))
    plan = _plan(engine, capacity_factors=(0.5,))
    _versions(monkeypatch, "0.26.0", "2.9.0")
    calls: list = []
    full = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, calls))
    stored = sorted(p.parent for p in (tmp_path / "runs").glob("*/*/engine.json"))
    assert len(stored) == 6 and calls
    _versions(monkeypatch, "0.32.0", "2.9.0")
    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")
    started: list = []
    again = serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, started))
    assert started == [] and (again.engines.status == "ok").all() and len(again.records) == len(full.records)
    assert sorted(p.parent for p in (tmp_path / "runs").glob("*/*/engine.json")) == stored  # nothing written
    monkeypatch.delenv(results.STORE_ONLY_ENV)
    anew: list = []
    serving.run_study(plan, progress=False, engine_factory=lambda spec, log: _FakeEngine(spec, log, anew))
    assert len(anew) == len(calls)  # every phase measured again under the new vLLM
    assert len(list((tmp_path / "runs").glob("*/*/engine.json"))) == 12
