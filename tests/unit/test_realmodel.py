"""The real model as a dependency (:mod:`fp8lab.realmodel`): its name resolves to the cache folder, a missing or
corrupt folder is a clear error naming the command that makes it, and the manifest check catches a changed file.

These tests work on a copy of the converted folder (made by ``scripts/setup_cpu.sh``; made here if missing) under a
private ``$FP8LAB_MODELS``, never on the cache itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab import realmodel
from fp8lab.errors import SpecError
from fp8lab.paths import REPO_ROOT, TINY_MODEL_DIR
from fp8lab.specs import EngineSpec, check_model_folder, resolve_model


@pytest.fixture(scope="module")
def made(real_model) -> Path:
    """The converted folder in the user's cache (tests/conftest.py's ``real_model``)."""
    return Path(real_model)


@pytest.fixture()
def copy(made, tmp_path, monkeypatch) -> Path:
    """A private copy of the converted folder, which ``$FP8LAB_MODELS`` now points at."""
    monkeypatch.setenv("FP8LAB_MODELS", str(tmp_path / "models"))
    dst = realmodel.model_dir()
    shutil.copytree(made, dst)
    return dst


def _cli(*args: str, models: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FP8LAB_MODELS": str(models), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "fp8lab.realmodel", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_models_dir_default_and_overrides(monkeypatch, tmp_path):
    monkeypatch.delenv("FP8LAB_MODELS", raising=False)
    monkeypatch.delenv("FP8LAB_CACHE", raising=False)
    assert realmodel.model_dir() == Path.home() / ".cache/fp8lab/models/SmolLM2-135M-Instruct"
    monkeypatch.setenv("FP8LAB_CACHE", str(tmp_path / "c"))
    assert realmodel.model_dir() == tmp_path / "c/models/SmolLM2-135M-Instruct"
    monkeypatch.setenv("FP8LAB_MODELS", str(tmp_path / "m"))
    assert realmodel.model_dir() == tmp_path / "m/SmolLM2-135M-Instruct"


def test_name_resolves_to_the_folder_others_unchanged(copy):
    assert resolve_model("smollm2-135m-instruct") == str(copy)
    assert resolve_model("SmolLM2-135M-Instruct ") == str(copy)
    assert check_model_folder("QualitySpec", "model", "smollm2-135m-instruct") == str(copy)
    assert EngineSpec(model="smollm2-135m-instruct").model == str(copy)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model("data/models/fp8lab-tiny-qwen3") == str(TINY_MODEL_DIR)
    assert check_model_folder("QualitySpec", "model", str(TINY_MODEL_DIR)) == str(TINY_MODEL_DIR)


def test_missing_model_is_a_spec_error_naming_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LAB_MODELS", str(tmp_path / "none"))
    with pytest.raises(SpecError) as err:
        check_model_folder("QualitySpec", "model", "smollm2-135m-instruct")
    e = err.value
    assert (e.spec, e.field, e.value) == ("QualitySpec", "model", "smollm2-135m-instruct")
    assert "does not exist" in e.allowed and "python -m fp8lab.realmodel" in e.allowed
    spec = EngineSpec(model="smollm2-135m-instruct")  # resolved, not checked, when built (stored specs load anywhere)
    with pytest.raises(SpecError, match=r"EngineSpec\.model = .*does not exist.*python -m fp8lab\.realmodel"):
        spec.check_paths()  # before an engine starts
    res = _cli("--check", models=tmp_path / "none")
    assert res.returncode == 1 and "python -m fp8lab.realmodel" in res.stderr, res.stderr


def test_manifest_check_catches_a_changed_weight_file(copy):
    assert realmodel.check() == copy
    st = copy / "model.safetensors"
    size = st.stat().st_size
    with open(st, "r+b") as f:  # one byte of a weight deep in the file, same size
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x01]))
    assert st.stat().st_size == size
    with pytest.raises(
        realmodel.ModelMissing, match=r"model\.safetensors does not match its SHA-256.*fp8lab\.realmodel"
    ):
        realmodel.check()
    with pytest.raises(SpecError, match=r"QualitySpec\.model = 'smollm2-135m-instruct'.*model\.safetensors"):
        check_model_folder("QualitySpec", "model", "smollm2-135m-instruct")
    res = _cli("--check", models=copy.parent)
    assert res.returncode == 1 and "does not match its SHA-256" in res.stderr, res.stderr


@pytest.mark.parametrize("damage", ["truncate", "drop_tokenizer", "drop_manifest", "edit_manifest", "old_converter"])
def test_manifest_check_catches_other_damage(copy, damage):
    man_path = copy / realmodel.MANIFEST
    man = json.loads(man_path.read_text())
    if damage == "truncate":
        with open(copy / "model.safetensors", "r+b") as f:
            f.truncate(1000)
        want = "model.safetensors has 1,000 bytes"
    elif damage == "drop_tokenizer":
        (copy / "tokenizer.json").unlink()
        want = "tokenizer.json is missing"
    elif damage == "drop_manifest":
        man_path.unlink()
        want = "has no manifest.json"
    elif damage == "edit_manifest":  # a manifest rewritten to accept a changed file, without its digest
        man["files"]["config.json"]["sha256"] = "0" * 64
        man_path.write_text(json.dumps(man))
        want = "digest does not match"
    else:
        man["converter_version"] = realmodel.CONVERTER_VERSION - 1
        man_path.write_text(json.dumps(man))
        want = "converter version"
    with pytest.raises(realmodel.ModelMissing, match=want):
        realmodel.check()


def test_ensure_returns_a_good_folder_untouched(copy):
    before = {p.name: p.stat().st_mtime_ns for p in copy.iterdir()}
    assert realmodel.ensure() == copy
    assert {p.name: p.stat().st_mtime_ns for p in copy.iterdir()} == before
    res = _cli(models=copy.parent)
    assert res.returncode == 0 and "ready in" in res.stdout, res.stderr


def test_converted_config_is_the_models(made):
    """The GGUF's metadata as transformers' Llama config (the numbers SmolLM2-135M's model card states)."""
    cfg = json.loads((made / "config.json").read_text())
    want = {
        "model_type": "llama",
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "max_position_embeddings": 8192,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "eos_token_id": 2,
    }
    assert {k: cfg[k] for k in want} == want
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert "<|im_start|>" in (made / "chat_template.jinja").read_text()


def test_the_tokenizers_special_tokens_are_the_ggufs(made):
    """The saved tokenizer's BOS, EOS and padding are the GGUF's ids (config.json), set by the converter: transformers
    5.17 read this GGUF's EOS as <|im_start|> (the H200 host's folder, 2026-12-04), so the held-out documents Study 03
    scores were joined by another token there. These come from the saved files, as every reader loads them."""
    tok = json.loads((made / "tokenizer_config.json").read_text())
    cfg = json.loads((made / "config.json").read_text())
    assert (tok["bos_token"], tok["eos_token"], tok["pad_token"]) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
