"""Evaluate the shipped tiny model on held-out text and write its model card.

Measures, with ``transformers`` on the CPU (no vLLM):

- **held-out perplexity**: token-level, ``exp(mean NLL)`` over non-overlapping windows of the
  training sequence length taken from the held-out *test* documents (never trained on, never used
  to pick the checkpoint), each document followed by ``<|endoftext|>``; every token of a window
  except its first is predicted from the tokens before it in the window;
- **unigram baseline perplexity** on exactly the same predicted tokens: a unigram distribution
  fitted on the TRAIN split's tokens with add-one (Laplace) smoothing,
  ``p(t) = (count(t) + 1) / (N + V)`` (Jurafsky & Martin, *Speech and Language Processing*,
  3rd ed., section 3.5);
- **perplexity by position** in a few longer windows (4x the training length), to show how the
  model does beyond the length it was trained at;
- **greedy continuations** of five held-out prompts from ``data/prompts/quality_prompts.jsonl``.

Writes ``eval.json`` and ``README.md`` (the model card; every number on it comes from
``eval.json``, ``train_log.json`` or ``config.json``) into the model folder.

Usage, from the repository root (needs ``.corpus/train.txt`` from ``scripts/build_corpus.py``
for the unigram baseline)::

    python scripts/eval_tiny_model.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO_ROOT / "data" / "models" / "fp8lab-tiny-qwen3"
CORPUS_DIR = REPO_ROOT / ".corpus"
TEXT_DIR = REPO_ROOT / "data" / "text"
HELDOUT_DIR = TEXT_DIR / "heldout"
MANIFEST = TEXT_DIR / "heldout_manifest.json"
PROMPTS = REPO_ROOT / "data" / "prompts" / "quality_prompts.jsonl"
DOC_SEPARATOR = "<|endoftext|>"  # as in scripts/build_corpus.py
CONTINUATION_IDS = ("prose-00", "prose-01", "code-00", "reference-00", "mixed-00")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def encode_docs(tok: Any, docs: list[str]) -> np.ndarray:
    """Token ids of ``docs``, each followed by the eos id, ``[tokens]`` int64."""
    ids: list[int] = []
    for d in docs:
        ids.extend(tok(d, add_special_tokens=False)["input_ids"])
        ids.append(tok.eos_token_id)
    return np.asarray(ids, dtype=np.int64)


def windows(stream: np.ndarray, length: int, limit: int) -> np.ndarray:
    """Non-overlapping windows ``[n, length]`` from the start of ``stream`` (``limit`` 0: all)."""
    n = stream.size // length
    if limit:
        n = min(n, limit)
    if n == 0:
        raise ValueError(f"stream of {stream.size} tokens is shorter than one window of {length}")
    return stream[: n * length].reshape(n, length)


def token_nll(model: Any, wins: np.ndarray, batch: int) -> np.ndarray:
    """Next-token negative log-likelihood, nats, ``[n, length - 1]``: entry ``[i, j]`` is
    ``-log p(wins[i, j + 1] | wins[i, : j + 1])``."""
    import torch
    import torch.nn.functional as F

    out = []
    with torch.no_grad():
        for i in range(0, len(wins), batch):
            x = torch.from_numpy(wins[i : i + batch])
            logits = model(input_ids=x).logits.float()
            nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(), reduction="none")
            out.append(nll.view(x.shape[0], -1).numpy())
    return np.concatenate(out)


def unigram_logprobs(train_ids: np.ndarray, vocab: int) -> np.ndarray:
    """Add-one smoothed unigram log-probabilities, nats, ``[vocab]``."""
    counts = np.bincount(train_ids, minlength=vocab).astype(np.float64)
    return np.log((counts + 1.0) / (counts.sum() + vocab))


def kv_bytes_per_token(cfg: dict[str, Any], bytes_per_elem: int) -> int:
    """KV cache bytes per token: 2 (K and V) x layers x kv_heads x head_dim x bytes per element."""
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * bytes_per_elem


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    mdir = Path(args.model)
    tok = AutoTokenizer.from_pretrained(mdir)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=getattr(torch, args.dtype)).eval()
    train_log = json.loads((mdir / "train_log.json").read_text())
    seq_len = args.seq_len or int(train_log["hyperparameters"]["seq_len"])
    vocab = model.config.vocab_size

    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    test_files = sorted(r["file"] for r in manifest["documents"] if r["role"] == "test")
    from fp8lab.workloads import heldout_text  # the folder HELDOUT_DIR, or its shipped archive

    test_docs = [heldout_text(f, HELDOUT_DIR) for f in test_files]
    stream = encode_docs(tok, test_docs)

    train_txt = CORPUS_DIR / "train.txt"
    if not train_txt.exists():
        raise SystemExit(f"{train_txt} is missing: run python scripts/build_corpus.py (it is deterministic)")
    train_ids = encode_docs(tok, train_txt.read_text(encoding="utf-8").split(f"\n{DOC_SEPARATOR}\n"))
    uni = unigram_logprobs(train_ids, vocab)

    wins = windows(stream, seq_len, args.max_windows)
    nll = token_nll(model, wins, args.batch)
    targets = wins[:, 1:]
    model_nll = float(nll.mean())
    uni_nll = float(-uni[targets].mean())

    long_len = 4 * seq_len
    lwins = windows(stream, long_len, args.long_windows)
    lnll = token_nll(model, lwins, 1)
    edges = [1, seq_len // 2, seq_len, 2 * seq_len, long_len]
    by_pos = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        # lnll[:, j] predicts the token at position j + 1
        seg = lnll[:, lo - 1 : hi - 1]
        by_pos.append({"positions": f"{lo}-{hi - 1}", "ppl": round(math.exp(float(seg.mean())), 3)})

    prompts = {r["id"]: r for r in map(json.loads, PROMPTS.read_text(encoding="utf-8").splitlines())}
    conts = []
    for pid in CONTINUATION_IDS:
        text = prompts[pid]["text"]
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(
                **enc, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
            )
        new = gen[0, enc["input_ids"].shape[1] :]
        conts.append(
            {
                "id": pid,
                "category": prompts[pid]["category"],
                "prompt": text,
                "continuation": tok.decode(new, skip_special_tokens=False),
                "new_tokens": int(new.numel()),
            }
        )

    n_params = sum(p.numel() for p in model.parameters())
    return {
        "model_dir": str(mdir.relative_to(REPO_ROOT) if mdir.is_relative_to(REPO_ROOT) else mdir),
        "model_sha256": sha256_file(mdir / "model.safetensors"),
        "tokenizer_sha256": sha256_file(mdir / "tokenizer.json"),
        "parameters": n_params,
        "compute_dtype": args.dtype,
        "heldout_test": {
            "documents": len(test_docs),
            "tokens": int(stream.size),
            "seq_len": seq_len,
            "windows": int(wins.shape[0]),
            "predicted_tokens": int(targets.size),
            "model_nll": round(model_nll, 4),
            "model_ppl": round(math.exp(model_nll), 3),
            "unigram_nll": round(uni_nll, 4),
            "unigram_ppl": round(math.exp(uni_nll), 3),
            "ppl_ratio_model_over_unigram": round(math.exp(model_nll - uni_nll), 4),
        },
        "unigram_fit": {"train_tokens": int(train_ids.size), "smoothing": "add-one", "vocab": vocab},
        "long_windows": {"length": long_len, "windows": int(lwins.shape[0]), "ppl_by_position": by_pos},
        "continuations": conts,
        "max_new_tokens": args.max_new_tokens,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
        },
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python scripts/eval_tiny_model.py " + " ".join(sys.argv[1:]),
    }


def _block(text: str) -> str:
    fence = "````"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def model_card(cfg: dict[str, Any], log: dict[str, Any], ev: dict[str, Any], text_manifest: dict[str, Any]) -> str:
    """The model card (Markdown): every number from ``config.json``, ``train_log.json``, ``eval.json``."""
    h = ev["heldout_test"]
    hp = log["hyperparameters"]
    size = (REPO_ROOT / ev["model_dir"] / "model.safetensors").stat().st_size
    rope = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))
    arch_rows = [
        ("architecture", f"`{cfg['architectures'][0]}` (`model_type: {cfg['model_type']}`)"),
        ("parameters", f"{ev['parameters']:,} (embedding tied with the output head)"),
        ("layers", cfg["num_hidden_layers"]),
        ("hidden size", cfg["hidden_size"]),
        ("MLP intermediate size", f"{cfg['intermediate_size']} (SwiGLU)"),
        ("attention heads", cfg["num_attention_heads"]),
        (
            "KV heads",
            f"{cfg['num_key_value_heads']} (GQA, {cfg['num_attention_heads'] // cfg['num_key_value_heads']} query heads per KV head)",
        ),
        ("head dim", cfg["head_dim"]),
        ("vocabulary", cfg["vocab_size"]),
        ("RoPE theta", f"{rope:,.0f}"),
        ("max_position_embeddings", f"{cfg['max_position_embeddings']:,} (see Limits)"),
        ("weights dtype", cfg.get("torch_dtype", cfg.get("dtype"))),
        ("KV cache per token, bf16", f"{kv_bytes_per_token(cfg, 2):,} bytes"),
        ("KV cache per token, FP8", f"{kv_bytes_per_token(cfg, 1):,} bytes"),
        ("model.safetensors", f"{size / 1e6:.1f} MB"),
    ]
    hp_keys = [
        "steps",
        "batch_size",
        "seq_len",
        "lr",
        "schedule",
        "warmup",
        "decay_steps",
        "min_lr_ratio",
        "weight_decay",
        "beta1",
        "beta2",
        "grad_clip",
        "dropout",
        "attn_dropout",
        "eval_every",
        "patience",
        "seed",
    ]
    best = log["best"]
    events = "".join(f"\n- step {e['step']}: {e['event']}" for e in log.get("events", [])) or "\n- none"
    conts = "\n\n".join(
        f"**{c['id']}** ({c['category']}). Prompt:\n\n{_block(c['prompt'])}\n\nGreedy continuation "
        f"({c['new_tokens']} tokens):\n\n{_block(c['continuation'])}"
        for c in ev["continuations"]
    )
    pos_rows = "\n".join(f"| {r['positions']} | {r['ppl']:.2f} |" for r in ev["long_windows"]["ppl_by_position"])
    v = log["versions"]
    return f"""---
license: apache-2.0
language: en
pipeline_tag: text-generation
tags: [qwen3, tiny, test-fixture, fp8lab]
---

# fp8lab-tiny-qwen3

A very small Qwen3-architecture causal language model trained from scratch on the Python 3.11
documentation. It exists so that fp8lab's studies of the FP8 KV cache in vLLM run end to end on a
laptop CPU with a real model that has real attention patterns (GQA, RoPE, a trained tokenizer)
and a measurable quality. It is a test fixture, not a useful assistant.

*This card is written by `python scripts/eval_tiny_model.py` from `config.json`,
`train_log.json` and `eval.json`; do not edit the numbers by hand.*

## Architecture

| field | value |
|---|---|
{chr(10).join(f"| {k} | {val} |" for k, val in arch_rows)}

Tokenizer: byte-level BPE (`tokenizers`), {cfg["vocab_size"]} entries, trained on the training
split; `<|endoftext|>` (id {cfg["eos_token_id"]}) is bos, eos and pad; nothing is added when
encoding (no bos, like Qwen3). Loads with `AutoTokenizer.from_pretrained` as a fast tokenizer
and with vLLM.

## Training data

The reStructuredText sources of the Python 3.11 documentation from the Debian package
`{text_manifest["package"]}` version `{text_manifest["version"]}` (license: PSF License 2.0,
`data/text/LICENSE-PSF-2.0.txt`), lightly cleaned and split **by document** by
`scripts/build_corpus.py`: documents ordered by `sha256(relative path)` go to the held-out set
until it holds {text_manifest["heldout_bytes_target"]:,} bytes, the rest is training text
(see `data/text/README.md`). Held-out documents are shipped in `data/text/heldout.tar.xz`: a
validation part (checkpoint selection) and a test part (all numbers below). Training tokens:
{log["train_tokens"]:,}.

## Training

```bash
python scripts/build_corpus.py
python scripts/train_tiny_model.py --prepare
{log["command"]}
```

| hyperparameter | value |
|---|---|
{chr(10).join(f"| {k} | {hp[k]} |" for k in hp_keys if k in hp)}
| tokens per step | {log["tokens_per_step"]:,} |
| optimizer | AdamW (weight decay on matrices only), bf16 autocast on CUDA |

Device: {log["device"]} ({log["device_name"]}); python {v["python"]}, torch {v["torch"]},
transformers {v["transformers"]}. Steps run: {log["steps_done"]} of at most {hp["steps"]}
({log["stop_reason"]}); wall time {log["wall_seconds"]:.0f} s. Schedule events:{events}

The kept checkpoint is the one with the lowest validation loss: step {best["step"]}, validation
loss {best["val_loss"]:.4f} nats/token (perplexity {best["val_ppl"]:.2f}) over
{log["val_tokens_evaluated"]:,} validation tokens.

## Evaluation (held-out test documents)

Computed by `scripts/eval_tiny_model.py` with transformers on CPU ({ev["compute_dtype"]}
compute, bf16 weights); {h["documents"]} test documents, {h["tokens"]:,} tokens, cut into
{h["windows"]} non-overlapping windows of {h["seq_len"]} tokens; {h["predicted_tokens"]:,}
predicted tokens.

| model | perplexity | NLL (nats/token) |
|---|---:|---:|
| fp8lab-tiny-qwen3 | {h["model_ppl"]:.2f} | {h["model_nll"]:.4f} |
| unigram baseline (train counts, add-one smoothing) | {h["unigram_ppl"]:.2f} | {h["unigram_nll"]:.4f} |
| ratio model / unigram | {h["ppl_ratio_model_over_unigram"]:.3f} | |

Perplexity by position inside {ev["long_windows"]["windows"]} windows of
{ev["long_windows"]["length"]} tokens (trained at {hp["seq_len"]}):

| positions | perplexity |
|---|---:|
{pos_rows}

### Greedy continuations ({ev["max_new_tokens"]} new tokens at most)

{conts}

## Limits

- Trained on sequences of {hp["seq_len"]} tokens only: it has never seen a position beyond
  that, and its perplexity past it (table above) shows it. `max_position_embeddings` is
  {cfg["max_position_embeddings"]:,} only so that vLLM accepts long contexts for the KV-cache
  memory and long-context *mechanics* studies; quality numbers far beyond {hp["seq_len"]} tokens
  say nothing about how a real long-context model behaves.
- {ev["parameters"]:,} parameters and {log["train_tokens"]:,} training tokens of one narrow
  domain (Python documentation): it continues reStructuredText and Python code plausibly, knows no
  facts, follows no instructions, has no chat template.
- Its FP8-vs-bf16 KV sensitivity need not match a large model's: use it to test the machinery,
  and real models to decide.

## Files

`config.json`, `generation_config.json`, `model.safetensors` (bf16), `tokenizer.json`,
`tokenizer_config.json`, `train_log.json` (every evaluation of the run), `eval.json` (the
numbers above), this `README.md`. Model sha256 `{ev["model_sha256"][:16]}...`.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--seq-len", type=int, default=0, help="window length (0: the training --seq-len)")
    ap.add_argument("--max-windows", type=int, default=0, help="test windows to score (0: all)")
    ap.add_argument("--long-windows", type=int, default=8, help="windows of 4x seq-len for the position table")
    ap.add_argument("--batch", type=int, default=8, help="windows per forward pass")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="compute dtype")
    args = ap.parse_args(argv)

    ev = evaluate(args)
    mdir = Path(args.model)
    (mdir / "eval.json").write_text(json.dumps(ev, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    cfg = json.loads((mdir / "config.json").read_text())
    log = json.loads((mdir / "train_log.json").read_text())
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    (mdir / "README.md").write_text(model_card(cfg, log, ev, manifest), encoding="utf-8")
    h = ev["heldout_test"]
    print(
        f"held-out ppl {h['model_ppl']:.2f} vs unigram {h['unigram_ppl']:.2f} "
        f"(ratio {h['ppl_ratio_model_over_unigram']:.3f}) over {h['predicted_tokens']:,} tokens; wrote "
        f"{mdir / 'eval.json'} and {mdir / 'README.md'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
