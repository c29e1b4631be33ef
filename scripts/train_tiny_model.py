"""Train the shipped tiny model ``fp8lab-tiny-qwen3``: a 6-layer Qwen3 with GQA, on Python docs.

Two stages, so that the heavy one can run on a remote GPU machine that only gets ``.corpus/``:

``--prepare`` (here; needs ``tokenizers`` training and ``.corpus/train.txt`` from
``scripts/build_corpus.py``)
    Train a byte-level BPE tokenizer (vocabulary 8192, special token ``<|endoftext|>`` used as
    bos/eos/pad) on the train split; tokenize the train split and the held-out validation and
    test parts into uint16 ``.npy`` files; write the prompt sets of ``data/prompts/``.
    Writes ``.corpus/tokenizer/``, ``.corpus/{train,val,test}_tokens.npy``,
    ``.corpus/prepare.json``.

``--train`` (anywhere with torch >= 2.4 and transformers >= 5.0; reads only ``.corpus/``)
    Train ``Qwen3ForCausalLM`` from scratch on random windows of the train tokens (a seeded,
    device-independent order), AdamW with linear warmup + cosine decay, bf16 autocast on CUDA,
    residual dropout; evaluate the validation loss every ``--eval-every`` steps and keep the best
    checkpoint, written to ``--out`` in bf16 each time it improves (so a killed run still leaves
    its best model). Writes ``config.json``, ``model.safetensors``, ``generation_config.json``,
    ``tokenizer.json``, ``tokenizer_config.json`` and ``train_log.json``.

Usage, from the repository root::

    python scripts/build_corpus.py
    python scripts/train_tiny_model.py --prepare
    python scripts/train_tiny_model.py --train --device cuda            # the shipped model
    python scripts/train_tiny_model.py --train --device cpu --steps 20 --batch-size 4 \\
        --out /tmp/tiny-smoke                                           # smoke test
    python scripts/eval_tiny_model.py                                   # eval.json + README.md

The architecture (:data:`ARCH`) is fixed: it is what the studies' KV-cache arithmetic and the
CPU FP8 KV kernel (head_dim % 32 == 0) rely on.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = REPO_ROOT / ".corpus"
TOKENIZER_DIR = CORPUS_DIR / "tokenizer"
DEFAULT_OUT = REPO_ROOT / "data" / "models" / "fp8lab-tiny-qwen3"

EOT = "<|endoftext|>"
VOCAB_SIZE = 8192

#: The fixed architecture of the shipped model (Qwen3; ``transformers.Qwen3Config`` fields).
#: KV cache per token = 2 (K and V) * layers 6 * kv_heads 2 * head_dim 64 = 1536 elements:
#: 3072 bytes in bf16, 1536 bytes in FP8.
ARCH: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 131072,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "attention_bias": False,
}


# --------------------------------------------------------------------------------------------
# Stage (a): tokenizer + token files


def train_tokenizer(docs: list[str], vocab_size: int = VOCAB_SIZE) -> Any:
    """Byte-level BPE (GPT-2 style pre-tokenization), trained on ``docs``; returns a Tokenizer.

    Byte-level: every byte sequence is representable, so there is no unknown token. The only
    special token is :data:`EOT` (id 0). Nothing is added automatically when encoding (like
    Qwen3's tokenizer, no bos is prepended).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def tokenizer_config(eot: str = EOT) -> dict[str, Any]:
    """``tokenizer_config.json`` that makes ``AutoTokenizer`` load ``tokenizer.json`` as fast."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eot,
        "eos_token": eot,
        "pad_token": eot,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ARCH["max_position_embeddings"],
        "padding_side": "left",
    }


def encode_docs(tok: Any, docs: list[str], eot_id: int) -> np.ndarray:
    """Token ids of ``docs``, each followed by ``eot_id``, as one uint16 array ``[tokens]``."""
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eot_id)
    arr = np.asarray(ids, dtype=np.int64)
    if arr.max() >= 2**16:
        raise ValueError("token id does not fit uint16")
    return arr.astype(np.uint16)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(corpus_dir: Path = CORPUS_DIR) -> dict[str, Any]:
    """Stage (a): tokenizer, token files and prompt sets. Returns the ``prepare.json`` record."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import build_corpus as bc

    train_txt = corpus_dir / "train.txt"
    if not train_txt.exists():
        raise SystemExit(f"{train_txt} is missing: run python scripts/build_corpus.py first")
    t0 = time.time()
    train_docs = train_txt.read_text(encoding="utf-8").split(f"\n{bc.DOC_SEPARATOR}\n")
    manifest = json.loads(bc.MANIFEST_PATH.read_text(encoding="utf-8"))
    held = {"val": [], "test": []}
    for rec in manifest["documents"]:
        held[rec["role"]].append(bc.heldout_text(rec["file"]))

    tok = train_tokenizer(train_docs)
    tok_dir = corpus_dir / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    eot_id = tok.token_to_id(EOT)

    record: dict[str, Any] = {
        "tokenizer_sha256": sha256_file(tok_dir / "tokenizer.json"),
        "vocab_size": tok.get_vocab_size(),
        "eot_id": eot_id,
        "splits": {},
    }
    for name, docs in (("train", train_docs), ("val", held["val"]), ("test", held["test"])):
        arr = encode_docs(tok, docs, eot_id)
        np.save(corpus_dir / f"{name}_tokens.npy", arr)
        nbytes = sum(len(d.encode("utf-8")) for d in docs)
        record["splits"][name] = {
            "documents": len(docs),
            "text_bytes": nbytes,
            "tokens": int(arr.size),
            "bytes_per_token": round(nbytes / arr.size, 3),
            "file_bytes": (corpus_dir / f"{name}_tokens.npy").stat().st_size,
        }
    record["prepare_seconds"] = round(time.time() - t0, 1)
    (corpus_dir / "prepare.json").write_text(json.dumps(record, indent=2) + "\n")
    bc.write_prompts(tok_dir / "tokenizer.json")
    return record


# --------------------------------------------------------------------------------------------
# Stage (b): training


def build_config(eot_id: int, attention_dropout: float = 0.0) -> Any:
    """The ``Qwen3Config`` of :data:`ARCH` (bos = eos = pad = ``eot_id``, bf16)."""
    from transformers import Qwen3Config

    kw = {k: v for k, v in ARCH.items() if k != "rope_theta"}
    return Qwen3Config(
        **kw,
        rope_parameters={"rope_type": "default", "rope_theta": ARCH["rope_theta"]},
        attention_dropout=attention_dropout,
        use_sliding_window=False,
        max_window_layers=ARCH["num_hidden_layers"],
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        dtype="bfloat16",
        architectures=["Qwen3ForCausalLM"],
    )


@dataclass
class Schedule:
    """Learning rate per 1-based optimizer step.

    ``cosine``: linear warmup to ``peak``, then cosine decay to ``min_ratio * peak`` at ``total``
    (SGDR, Loshchilov & Hutter 2017; as in GPT-3 and nanoGPT).

    ``wsd`` (warmup-stable-decay; Hu et al. 2024, MiniCPM; Hagele et al. 2024): linear warmup,
    constant ``peak``, then a linear decay to ``min_ratio * peak`` over ``decay`` steps that starts
    at ``decay_start``: at ``total - decay`` at the latest, earlier when the trainer calls
    :meth:`start_decay` because the validation loss stalled (it then restores the best checkpoint
    first). On a small corpus the model starts to overfit at an epoch count nobody knows in
    advance; WSD anneals from wherever the validation minimum turns out to be.
    """

    kind: str
    peak: float
    warmup: int
    total: int
    decay: int
    min_ratio: float
    decay_start: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "wsd"):
            raise ValueError(f"Schedule.kind = {self.kind!r}: allowed: cosine | wsd")
        if self.kind == "wsd" and not 0 < self.decay < self.total:
            raise ValueError(f"Schedule.decay = {self.decay}: must be in (0, total={self.total})")

    def start_decay(self, after_step: int) -> None:
        """Begin the WSD decay right after ``after_step`` (no-op once started)."""
        if self.decay_start is None:
            self.decay_start = after_step

    @property
    def end(self) -> int:
        """The last step."""
        if self.kind == "wsd" and self.decay_start is not None:
            return self.decay_start + self.decay
        return self.total

    def lr(self, step: int) -> float:
        """Learning rate at ``step`` (1-based). For ``wsd``, starts the decay when it is due."""
        floor = self.min_ratio * self.peak
        if step <= self.warmup:
            return self.peak * step / max(1, self.warmup)
        if self.kind == "cosine":
            frac = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
            return floor + (self.peak - floor) * 0.5 * (1 + math.cos(math.pi * frac))
        if self.decay_start is None and step > self.total - self.decay:
            self.decay_start = self.total - self.decay
        if self.decay_start is None or step <= self.decay_start:
            return self.peak
        frac = min(1.0, (step - self.decay_start) / self.decay)
        return self.peak - (self.peak - floor) * frac


def batch_offsets(rng: np.random.Generator, n_tokens: int, batch: int, seq_len: int) -> np.ndarray:
    """``batch`` random window starts in ``[0, n_tokens - seq_len - 1)``; the data order.

    Drawn on the CPU from a seeded numpy generator, so the order is the same on every device.
    """
    return rng.integers(0, n_tokens - seq_len - 1, size=batch)


def add_residual_dropout(model: Any, p: float) -> None:
    """Dropout on each attention and MLP output before it joins the residual stream.

    The GPT-2 ``resid_pdrop`` regulariser (Radford et al., 2019), which ``Qwen3`` lacks; added as
    forward hooks, active only in ``model.train()`` mode, so the saved model is plain Qwen3.
    """
    import torch.nn.functional as F

    if p <= 0:
        return

    def hook(module: Any, _inp: Any, out: Any) -> Any:
        return F.dropout(out, p=p, training=module.training)

    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(hook)
        layer.mlp.down_proj.register_forward_hook(hook)


def _versions() -> dict[str, str]:
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "cuda": str(torch.version.cuda),
    }
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["git_commit"] = "unknown"
    return info


def save_model(export_model: Any, state: dict[str, Any], out: Path) -> None:
    """Write ``state`` as a bf16 Hugging Face checkpoint into ``out``.

    ``export_model`` is a bf16 CPU model whose tied weights stay tied when ``state`` is loaded,
    so ``model.safetensors`` holds the embedding once. ``config.json`` also gets the flat
    ``rope_theta`` / ``torch_dtype`` keys that readers of the pre-5.0 layout look for.
    """
    export_model.load_state_dict(state, strict=False)
    export_model.save_pretrained(out)
    (out / "model.safetensors").chmod(0o644)  # written as 0600 through a temporary file
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["rope_theta"] = ARCH["rope_theta"]
    cfg["torch_dtype"] = "bfloat16"
    cfg["attention_dropout"] = 0.0
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Stage (b): train and write the model + ``train_log.json`` into ``args.out``."""
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per saved checkpoint
    t_start = time.time()
    corpus = Path(args.corpus)
    prep = json.loads((corpus / "prepare.json").read_text())
    tok_dir = corpus / "tokenizer"
    if sha256_file(tok_dir / "tokenizer.json") != prep["tokenizer_sha256"]:
        raise SystemExit("tokenizer.json does not match prepare.json: rerun --prepare")
    eot_id = int(prep["eot_id"])

    if args.device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    torch.manual_seed(args.seed)
    np_rng = np.random.default_rng(args.seed)

    train_tok = torch.from_numpy(np.load(corpus / "train_tokens.npy").astype(np.int64)).to(device)
    val_tok = torch.from_numpy(np.load(corpus / "val_tokens.npy").astype(np.int64))
    # Fixed validation windows: non-overlapping, seq_len inputs + the 1-shifted targets.
    n_val = min(args.eval_windows, (val_tok.numel() - 1) // args.seq_len)
    L = args.seq_len
    val_x = torch.stack([val_tok[i * L : (i + 1) * L] for i in range(n_val)]).to(device)
    val_y = torch.stack([val_tok[i * L + 1 : (i + 1) * L + 1] for i in range(n_val)]).to(device)

    model = Qwen3ForCausalLM(build_config(eot_id, args.attn_dropout)).to(device, torch.float32)
    add_residual_dropout(model, args.dropout)
    n_params = sum(p.numel() for p in model.parameters())  # the tied embedding counted once
    export_model = Qwen3ForCausalLM(build_config(eot_id)).to(torch.bfloat16)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        eps=1e-8,
        **({"fused": True} if device == "cuda" else {}),
    )
    sched = Schedule(args.schedule, args.lr, args.warmup, args.steps, args.decay_steps, args.min_lr_ratio)

    def logits_of(x: Any) -> Any:
        if device == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(input_ids=x).logits
        return model(input_ids=x).logits

    def evaluate() -> float:
        """Mean next-token cross-entropy on the validation windows, nats per token."""
        model.eval()
        tot = 0.0
        with torch.no_grad():
            for i in range(0, n_val, args.batch_size):
                x, y = val_x[i : i + args.batch_size], val_y[i : i + args.batch_size]
                tot += F.cross_entropy(logits_of(x).float().flatten(0, 1), y.flatten(), reduction="sum").item()
        model.train()
        return tot / (n_val * L)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok_dir / name, out / name)

    log: dict[str, Any] = {
        "command": "python scripts/train_tiny_model.py " + " ".join(sys.argv[1:]),
        "hyperparameters": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in sorted(vars(args).items())
            if k not in ("prepare", "train")
        },
        "seed": args.seed,
        "device": device,
        "device_name": torch.cuda.get_device_name()
        if device == "cuda"
        else (platform.processor() or platform.machine()),
        "versions": _versions(),
        "parameters": n_params,
        "tokens_per_step": args.batch_size * L,
        "train_tokens": int(train_tok.numel()),
        "val_tokens_evaluated": n_val * L,
        "tokenizer_sha256": prep["tokenizer_sha256"],
        "events": [],
        "evals": [],
        "train_loss": [],
    }

    def write_log() -> None:
        log["wall_seconds"] = round(time.time() - t_start, 1)
        (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")

    best, best_step, bad_evals = math.inf, 0, 0
    best_model: dict[str, Any] = {}
    best_opt: dict[str, Any] = {}
    stop_reason = "schedule complete"
    t_train = time.time()
    model.train()
    step = 0
    while step < sched.end:
        step += 1
        lr = sched.lr(step)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.from_numpy(batch_offsets(np_rng, train_tok.numel(), args.batch_size, L)).to(device)
        win = train_tok[starts[:, None] + torch.arange(L + 1, device=device)[None, :]]
        loss = F.cross_entropy(logits_of(win[:, :-1]).float().flatten(0, 1), win[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        if step % args.log_every == 0:
            log["train_loss"].append({"step": step, "loss": round(loss.item(), 4), "lr": lr})

        over_time = args.time_limit_s is not None and time.time() - t_start > args.time_limit_s
        if step % args.eval_every and step != sched.end and not over_time:
            continue
        vl = evaluate()
        elapsed = time.time() - t_train
        improved = vl < best - 1e-4
        if improved:
            best, best_step, bad_evals = vl, step, 0
            best_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
            best_opt = copy.deepcopy(opt.state_dict())
            save_model(export_model, {k: v.to("cpu") for k, v in best_model.items()}, out)
            log["best"] = {"step": step, "val_loss": round(vl, 4), "val_ppl": round(math.exp(vl), 3)}
        else:
            bad_evals += 1
        rec = {
            "step": step,
            "val_loss": round(vl, 4),
            "val_ppl": round(math.exp(vl), 3),
            "train_loss": round(loss.item(), 4),
            "lr": lr,
            "tokens_per_s": round(step * args.batch_size * L / elapsed),
            "elapsed_s": round(elapsed, 1),
        }
        log["evals"].append(rec)
        print(
            f"step {step:5d}/{sched.end} lr {lr:.2e} train {rec['train_loss']:.4f} val {vl:.4f} "
            f"({'best' if improved else f'no gain x{bad_evals}'}) {rec['tokens_per_s']} tok/s {elapsed:.0f}s",
            flush=True,
        )
        stalled = args.patience > 0 and bad_evals >= args.patience
        if over_time:
            stop_reason = f"time limit {args.time_limit_s} s"
        elif stalled and sched.kind == "wsd" and sched.decay_start is None:
            # Validation stalled in the constant phase: go back to the best checkpoint and anneal.
            model.load_state_dict(best_model)
            opt.load_state_dict(best_opt)
            sched.start_decay(step)
            bad_evals = 0
            log["events"].append(
                {
                    "step": step,
                    "event": f"val stalled {args.patience} evals: restored step {best_step}, decay to {sched.end}",
                }
            )
            print(f"  -> {log['events'][-1]['event']}", flush=True)
        elif stalled and sched.kind == "cosine":
            stop_reason = f"early stop: no val gain in {args.patience} evals"
        else:
            write_log()
            continue
        write_log()
        if stop_reason != "schedule complete":
            break

    log["steps_done"] = step
    log["stop_reason"] = stop_reason
    log["train_seconds"] = round(time.time() - t_train, 1)
    write_log()
    print(f"done ({stop_reason}): best val loss {best:.4f} at step {best_step}; model in {out}", flush=True)
    return log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stage = ap.add_mutually_exclusive_group(required=True)
    stage.add_argument("--prepare", action="store_true", help="stage (a): tokenizer + tokens")
    stage.add_argument("--train", action="store_true", help="stage (b): train the model")
    ap.add_argument("--corpus", type=Path, default=CORPUS_DIR, help="the .corpus folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model output folder")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps (max)")
    ap.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    ap.add_argument("--schedule", choices=["wsd", "cosine"], default="wsd", help="see Schedule")
    ap.add_argument("--min-lr-ratio", type=float, default=0.02, help="final lr / peak lr")
    ap.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    ap.add_argument("--decay-steps", type=int, default=None, help="wsd: length of the decay (default: steps // 5)")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW, on matrices only")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="max global grad norm")
    ap.add_argument("--dropout", type=float, default=0.1, help="residual dropout (training)")
    ap.add_argument("--attn-dropout", type=float, default=0.0, help="attention dropout")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between val evals")
    ap.add_argument("--eval-windows", type=int, default=256, help="max validation windows of --seq-len tokens")
    ap.add_argument(
        "--patience",
        type=int,
        default=3,
        help="evals without val gain before wsd decays from the best (cosine: stops); 0: never",
    )
    ap.add_argument("--log-every", type=int, default=10, help="steps between train-loss logs")
    ap.add_argument(
        "--time-limit-s", type=float, default=None, help="stop (keeping the best checkpoint) after this many seconds"
    )
    args = ap.parse_args(argv)
    if args.decay_steps is None:
        args.decay_steps = max(1, args.steps // 5)
    if args.train:
        for name in ("steps", "batch_size", "seq_len", "eval_every", "log_every", "eval_windows"):
            if getattr(args, name) < 1:
                ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if not 0 <= args.dropout < 1 or not 0 <= args.attn_dropout < 1:
            ap.error("dropout must be in [0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prepare:
        rec = prepare(args.corpus)
        print(json.dumps(rec, indent=2))
    else:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
