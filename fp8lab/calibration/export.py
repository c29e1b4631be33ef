"""Exporting a scale set into a copy of the model that vLLM loads (compressed-tensors ``kv_cache_scheme``, strategy
``tensor`` or ``attn_head``; vllm-notes section 4): :func:`export_scale_set`, :func:`export_sets`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fp8lab.calibration.scales import ScaleSet
from fp8lab.calibration.spec import SCALES_FILE, STUDY, Strategy
from fp8lab.engine.results import model_id, model_ref
from fp8lab.paths import runs_dir
from fp8lab.specs import (
    SpecError,
    check_choice,
    resolve_model,
    spec_hash,
)


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
    h = spec_hash(
        model_id(resolve_model(model_path)), ss.format, ss.strategy, ss.k.round(12).tolist(), ss.v.round(12).tolist()
    )
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
    if (out / "fp8lab_scales.json").is_file():  # content-addressed: already exported
        for link in out.iterdir():  # a store copied from another checkout: its weight links point at that checkout's
            if link.is_symlink() and not link.exists() and (src / link.name).is_file():
                link.unlink()  # the same model here (its digest is in the folder's hash): link this checkout's
                link.symlink_to((src / link.name).resolve())
        return out
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
                "source_model": model_ref(str(src)),
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
