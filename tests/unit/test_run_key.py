"""The run key is what was measured, not where the checkout lies (issue 37): the model as given (its path from the
repository root, a path in the store, a hub id) plus a digest of its config and weights, the spec, vLLM and torch, the
engine code and the study's own worker. A copy of the repository at a second path computes the same keys and loads,
as a normal cached run (no store-only fallback), a run stored by this checkout; editing one study's worker changes
that study's keys only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fp8lab.engine import results
from fp8lab.engine.result import EngineResult
from fp8lab.paths import REPO_ROOT
from fp8lab.specs import EngineSpec, Request, resolve_model, spec_hash

REQS = [Request((1, 2, 3), 4)]
TINY = "data/models/fp8lab-tiny-qwen3"

#: Run in a checkout (``cwd``): the keys of a run_cached run, a dummy-weights run, a decode and a prefix run, a
#: scale-set folder in the store, and (argv[1]) loads the run stored there as a normal cached run.
KEYS = r"""
import json, sys
from fp8lab.engine import results
from fp8lab.decode import DecodeSpec
from fp8lab.prefix import PrefixSpec
from fp8lab.serving.paired import WORKER_CODE
from fp8lab.specs import EngineSpec, Request, spec_hash
reqs = [Request((1, 2, 3), 4)]
tiny = EngineSpec(model="data/models/fp8lab-tiny-qwen3", kv_cache_gib=0.5)
dummy = EngineSpec(model="data/configs/qwen3-8b", load_format="dummy", skip_tokenizer_init=True)
pre = PrefixSpec(model="data/models/fp8lab-tiny-qwen3", workloads=[["chat", 0, 0, 96, 16, 3]], active=[2], trials=2,
                 kv_cache_gib=0.005859375, block_size=32, max_model_len=1024, correctness_prompts=0)
out = {
    "run": results.run_dir_for("s", results.run_descriptor(tiny, results._as_phases(reqs), "llm", 0.25)).name,
    "dummy": spec_hash(results.run_descriptor(dummy, results._as_phases(reqs), "llm", 0.25)),
    "decode": spec_hash(DecodeSpec(model="data/models/fp8lab-tiny-qwen3").descriptor()),
    "prefix": spec_hash(pre.descriptor()),
    "paired": spec_hash(results.run_descriptor(tiny, results._as_phases(reqs), "async", 0.25, code=WORKER_CODE)),
    "scaleset": spec_hash(results.model_ref(str(results.runs_dir() / "02_calibration" / "scalesets" / "ab" / "x"))),
}
if len(sys.argv) > 1:
    res = results.run_cached(tiny, reqs, study="s")  # a normal run: loaded only if stored under this very key
    out["loaded"] = [res.status, bool(res.extra.get("cached")), res.records.output_tokens.tolist(), str(res.run_dir)]
print(json.dumps(out))
"""


def _keys(checkout: Path, store: Path, load: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "FP8LAB_RUNS": str(store)}
    env.pop("FP8LAB_STORE_ONLY", None)
    cmd = [sys.executable, "-c", KEYS, *(["load"] if load else [])]
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def second_checkout(tmp_path_factory) -> Path:
    """This repository's files (tracked and new, not ignored) copied to a second path, without its git history."""
    dest = tmp_path_factory.mktemp("elsewhere") / "fp8lab-copy"
    names = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for n in filter(None, names):
        src = REPO_ROOT / n.decode()
        if src.is_file() and not n.startswith(b"reports/"):  # the reports are not needed to compute a key
            (dest / n.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / n.decode())
    return dest


def _result(tokens: int) -> EngineResult:
    return EngineResult(
        status="ok",
        error=None,
        engine={"kv_cache_dtype": "auto", "num_blocks": 10},
        records=pd.DataFrame({"phase": ["main"], "output_tokens": [tokens]}),
        samples=pd.DataFrame(),
        phases={"main": {"wall_s": 1.0, "requests": 1, "prompt_tokens": 3, "output_tokens": tokens}},
        provenance={"vllm": "0.32.0"},
    )


def test_a_copy_of_the_repository_at_another_path_finds_the_same_runs(second_checkout, tmp_path):
    """The keys computed here and in the copy are equal (a run, a dummy-weights run, decode, prefix, a scale-set
    folder in the store); a run stored by this checkout, copied with its store, loads in the copy as a cached run
    of its own key (not the store-only fallback), and no key or stored spec holds either checkout's path."""
    here_store, there_store = tmp_path / "runs-here", tmp_path / "runs-there"
    spec = EngineSpec(model=TINY, kv_cache_gib=0.5)
    desc = results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25)
    rd = results.run_dir_for("s", desc, here_store)
    results.save(_result(13), rd, desc)
    shutil.copytree(here_store, there_store)
    here = _keys(REPO_ROOT, here_store)
    there = _keys(second_checkout, there_store, load=True)
    status, cached, tokens, run_dir = there.pop("loaded")
    assert here == there and here["run"] == rd.name
    assert (status, cached, tokens) == ("ok", True, [13]) and run_dir == str(there_store / "s" / rd.name)
    stored = (rd / "spec.json").read_text()
    assert str(REPO_ROOT) not in stored and str(second_checkout) not in stored and str(here_store) not in stored
    assert json.loads(stored)["engine"]["model"] == TINY and json.loads(stored)["model_digest"]["weights"]


def test_the_key_follows_the_weights_and_config_not_the_folder(tmp_path, tiny_model):
    """Two copies of the shipped model under one name in two places key alike; a changed weight byte or config value
    changes the key; with dummy weights only the config counts; a hub id is its name."""

    def key(folder: Path, load_format: str = "auto") -> str:
        spec = EngineSpec(model=str(folder), load_format=load_format)
        return spec_hash(results.run_descriptor(spec, results._as_phases(REQS), "llm", 0.25))

    a, b = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny"
    for d in (a, b):
        d.mkdir(parents=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(Path(tiny_model) / f, d / f)
    assert results.model_ref(str(a)) == "tiny" and key(a) == key(b)
    assert results.model_ref(resolve_model(TINY)) == TINY and results.model_ref(tiny_model) == TINY
    assert results.model_ref("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B" and results.model_digest("Qwen/Qwen3-8B") is None
    dummy = key(b, "dummy")
    blob = bytearray((b / "model.safetensors").read_bytes())
    blob[-1] ^= 1  # one bit of one weight
    (b / "model.safetensors").write_bytes(bytes(blob))
    assert key(b) != key(a) and key(b, "dummy") == dummy
    cfg = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps(cfg, indent=4))  # the same config, written differently
    assert key(b, "dummy") == dummy
    cfg["rms_norm_eps"] = cfg.get("rms_norm_eps", 1e-6) * 2
    (b / "config.json").write_text(json.dumps(cfg))
    assert key(b, "dummy") != dummy


def test_file_digests_are_read_once_per_file_version(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x" * 1000)
    first = results.file_digest(f)
    assert json.loads((tmp_path / "cache" / "fp8lab" / "file-digests.json").read_text())
    results._DIGESTS.clear()
    reads = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: reads.append(p) or real_open(p, *a, **k))
    assert results.file_digest(f) == first and reads == []  # from the cache on disk: the file is not read
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    f.write_bytes(b"y" * 1000)  # same size, new bytes (and a new mtime): hashed again
    os.utime(f, ns=(1, 1))
    assert results.file_digest(f) != first


def test_one_studys_worker_is_in_that_studys_key_only(second_checkout, tmp_path):
    """In the copy: editing decode/worker.py changes the decode keys only, prefix/worker.py the prefix keys only,
    serving/worker.py Study 01's paired runs only;
    editing engine/run.py (engine code every run shares) changes every key."""
    base = _keys(second_checkout, tmp_path)
    pkg = second_checkout / "fp8lab"
    changed = {}
    for f in ("decode/worker.py", "prefix/worker.py", "serving/worker.py", "engine/run.py"):
        text = (pkg / f).read_text()
        (pkg / f).write_text(text + "\n# edited\n")
        try:
            now = _keys(second_checkout, tmp_path)
        finally:
            (pkg / f).write_text(text)
        changed[f] = sorted(k for k in base if base[k] != now[k])
    assert changed == {
        "decode/worker.py": ["decode"],
        "prefix/worker.py": ["prefix"],
        "serving/worker.py": ["paired"],
        "engine/run.py": ["decode", "dummy", "paired", "prefix", "run"],
    }


def test_requests_digest_is_the_json_of_every_field_as_dataclasses_asdict_gave_it():
    """The digest reads the fields directly (asdict's deep copy of every token id was most of a stored run's load);
    the JSON it hashes is what ``dataclasses.asdict`` gave, so every committed run keeps its key."""
    import dataclasses
    import hashlib
    import json

    from fp8lab.engine.results import _requests_digest
    from fp8lab.specs import Request

    reqs = [
        Request(prompt_token_ids=(5, 6, 7), max_tokens=4, cls="long", arrival_s=0.25, prompt_logprobs=2, tag="t"),
        Request(prompt_token_ids=(1,), max_tokens=2, forced_token_ids=(3, 4), logprobs=1),
    ]
    h = hashlib.sha256()
    for r in reqs:
        d = dataclasses.asdict(r)
        if d["forced_token_ids"] is None:
            del d["forced_token_ids"]
        h.update(json.dumps(d, sort_keys=True).encode())
    assert _requests_digest(reqs) == h.hexdigest()[:16]
    assert _requests_digest(reqs[:1]) != _requests_digest(reqs[1:])
