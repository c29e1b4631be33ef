"""Capturing K/V amax where vLLM quantizes them (:func:`capture_amax`, through transformers' attention interface),
stored in the results store (:func:`stored_capture`, :func:`capture_path`), and held-out K/V for the error measures
(:func:`capture_heldout`). See :mod:`fp8lab.calibration` for where the capture point is and why."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fp8lab.calibration.spec import STUDY
from fp8lab.paths import runs_dir
from fp8lab.specs import (
    SpecError,
    check_int,
    resolve_model,
    spec_hash,
)

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


def batches(seqs: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
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

    from fp8lab.kvcapture import model_dtype

    torch_dtype = model_dtype(model_path, dtype)
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
        for idx in batches(seqs, batch_size):
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
    the device and the dtype (what the capture computes from), not the machine or checkout it ran on (the model as
    :func:`fp8lab.engine.results.model_id` names it: its path from the repository root and a digest of its files)."""
    from fp8lab.engine.results import model_id

    h = spec_hash(model_id(resolve_model(model_path)), [list(map(int, x)) for x in seqs], batch_size, device, dtype)
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
