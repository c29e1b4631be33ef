"""The shipped tiny model, its held-out text and prompt sets are what the studies rely on.

Fast (no vLLM, no forward pass): reads config and file headers, the tokenizer and ``eval.json``.
The assets are written by ``scripts/build_corpus.py``, ``scripts/train_tiny_model.py`` and
``scripts/eval_tiny_model.py``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from fp8lab.paths import PROMPTS_DIR, TEXT_DIR, TINY_MODEL_DIR
from fp8lab.workloads import heldout_documents, heldout_text

EOT = "<|endoftext|>"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "train_log.json",
    "eval.json",
    "README.md",
)


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return _json(TINY_MODEL_DIR / "config.json")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TINY_MODEL_DIR / "tokenizer.json"))


@pytest.fixture(scope="module")
def heldout_paragraph() -> str:
    """A multi-line paragraph of a held-out test document (prose with inline code)."""
    text = heldout_text("library__csv.txt")
    para = next(p for p in text.split("\n\n") if "``csv``" in p and p.count("\n") >= 3)
    return para


def test_model_folder_has_its_files_and_fits_20_mb() -> None:
    for name in REQUIRED_FILES:
        assert (TINY_MODEL_DIR / name).is_file(), name
    total = sum(p.stat().st_size for p in TINY_MODEL_DIR.rglob("*") if p.is_file())
    assert total <= 20 * 1024 * 1024, f"{total} bytes"


def test_config_is_the_fixed_qwen3_architecture(config: dict[str, Any], tokenizer: Any) -> None:
    expected = {
        "model_type": "qwen3",
        "vocab_size": 8192,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "tie_word_embeddings": True,
    }
    assert {k: config.get(k) for k in expected} == expected
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["max_position_embeddings"] >= 131072
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 1_000_000
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    eot_id = tokenizer.token_to_id(EOT)
    assert config["bos_token_id"] == config["eos_token_id"] == config["pad_token_id"] == eot_id
    gen = _json(TINY_MODEL_DIR / "generation_config.json")
    assert gen["bos_token_id"] == gen["eos_token_id"] == eot_id


def test_gqa_and_head_dim_suit_the_cpu_fp8_kernel(config: dict[str, Any]) -> None:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    assert kv_heads < heads and heads % kv_heads == 0  # GQA
    assert config["head_dim"] % 32 == 0  # vLLM's CPU FP8 KV kernel needs it


def test_weights_are_bf16_with_a_tied_embedding(config: dict[str, Any]) -> None:
    """Reads the safetensors header only (8-byte little-endian length + JSON)."""
    with open(TINY_MODEL_DIR / "model.safetensors", "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    assert "lm_head.weight" not in header  # tied to model.embed_tokens.weight
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    n_layers = {int(k.split(".")[2]) for k in header if k.startswith("model.layers.")}
    assert n_layers == set(range(config["num_hidden_layers"]))


def test_tokenizer_round_trips_heldout_text(tokenizer: Any, heldout_paragraph: str) -> None:
    ids = tokenizer.encode(heldout_paragraph, add_special_tokens=False).ids
    assert tokenizer.get_vocab_size() == 8192
    assert 0 < len(ids) < len(heldout_paragraph.encode())  # BPE compresses
    assert tokenizer.decode(ids, skip_special_tokens=False) == heldout_paragraph


def test_auto_tokenizer_loads_fast_with_eos(heldout_paragraph: str, tokenizer: Any) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    assert tok.is_fast
    eot_id = tokenizer.token_to_id(EOT)
    assert tok.eos_token == tok.bos_token == tok.pad_token == EOT
    assert tok.eos_token_id == tok.bos_token_id == eot_id
    ids = tok(heldout_paragraph)["input_ids"]
    assert ids[0] != eot_id  # no bos is prepended
    assert tok.decode(ids) == heldout_paragraph


def test_eval_shows_a_trained_model_far_below_unigram() -> None:
    ev = _json(TINY_MODEL_DIR / "eval.json")
    h = ev["heldout_test"]
    assert h["predicted_tokens"] >= 100_000
    assert h["model_ppl"] < 0.5 * h["unigram_ppl"]
    assert h["ppl_ratio_model_over_unigram"] == pytest.approx(h["model_ppl"] / h["unigram_ppl"], rel=1e-2)
    # eval.json (and the card made from it) describes the shipped weights and tokenizer
    digest = hashlib.sha256((TINY_MODEL_DIR / "model.safetensors").read_bytes()).hexdigest()
    assert ev["model_sha256"] == digest
    tok_digest = hashlib.sha256((TINY_MODEL_DIR / "tokenizer.json").read_bytes()).hexdigest()
    assert ev["tokenizer_sha256"] == tok_digest
    assert f"{h['model_ppl']:.2f}" in (TINY_MODEL_DIR / "README.md").read_text(encoding="utf-8")
    assert len(ev["continuations"]) == 5


def test_train_log_records_the_run() -> None:
    log = _json(TINY_MODEL_DIR / "train_log.json")
    for key in ("seed", "device", "wall_seconds", "versions", "evals", "best", "hyperparameters"):
        assert key in log, key
    assert log["hyperparameters"]["seq_len"] == 512
    assert log["best"]["val_loss"] == min(e["val_loss"] for e in log["evals"])


def test_heldout_text_is_shipped_with_manifest_and_license() -> None:
    manifest = _json(TEXT_DIR / "heldout_manifest.json")
    assert not (TEXT_DIR / "heldout").exists() and (TEXT_DIR / "heldout.tar.xz").is_file()  # shipped packed
    docs = dict(heldout_documents())
    assert set(docs) == {d["file"].removesuffix(".txt") for d in manifest["documents"]}
    assert {d["role"] for d in manifest["documents"]} == {"val", "test"}
    # every document is the same bytes the manifest recorded when build_corpus.py wrote it
    assert all(len(docs[d["file"].removesuffix(".txt")].encode()) == d["bytes"] for d in manifest["documents"])
    total = sum(len(t.encode()) for t in docs.values())
    assert 1_500_000 <= total <= 2_500_000
    assert manifest["package"] == "python3.11-doc" and manifest["license"] == "PSF-2.0"
    assert (TEXT_DIR / "LICENSE-PSF-2.0.txt").read_text().startswith("PYTHON SOFTWARE FOUNDATION LICENSE")


def test_quality_prompts_are_heldout_spans_of_32_to_256_tokens(tokenizer: Any) -> None:
    rows = [json.loads(line) for line in (PROMPTS_DIR / "quality_prompts.jsonl").read_text().splitlines()]
    assert len(rows) >= 40
    assert len({r["id"] for r in rows}) == len(rows)
    assert {r["category"] for r in rows} == {"prose", "code", "reference", "mixed"}
    roles = {d["file"]: d["role"] for d in _json(TEXT_DIR / "heldout_manifest.json")["documents"]}
    for r in rows:
        n = len(tokenizer.encode(r["text"], add_special_tokens=False).ids)
        assert 32 <= n <= 256 and n == r["n_tokens"], r["id"]
        assert roles[r["source"]] == "test"
        assert r["text"] in heldout_text(r["source"])


def test_calibration_prompt_is_three_qa_lines() -> None:
    text = (PROMPTS_DIR / "calib_32_tokens.txt").read_text(encoding="utf-8")
    lines = text.split("\n")
    assert len(lines) == 3 and all(ln.startswith("Q: ") and " A: " in ln for ln in lines)
    assert "reconstruction" in (PROMPTS_DIR / "README.md").read_text(encoding="utf-8")
