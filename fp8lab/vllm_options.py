"""What the installed vLLM actually offers: its ``vllm serve`` flags, ``EngineArgs`` fields and the HTTP
request headers its server reads. Claim 15 of the audit (invented options) is checked against this,
never against a hard-coded list.

``python -m fp8lab.vllm_options --out FILE.json`` writes :func:`inspect_vllm` as JSON (the GPU runner
does this on the host, so the audit can check vLLM 0.26.0 there as well as the CPU build here).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
from pathlib import Path
from typing import Any

# `vllm serve`'s parser moved between releases: 0.26 has it in entrypoints.openai.cli_args,
# 0.32 in entrypoints.launchers.cli_args.
_SERVE_PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
_HEADER_RE = re.compile(r"""headers\.get\(\s*["']([A-Za-z0-9-]+)["']""")


def _serve_flags() -> tuple[list[str], str]:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    errors = []
    for mod_name in _SERVE_PARSER_MODULES:
        try:
            mod = importlib.import_module(mod_name)
            parser = mod.make_arg_parser(FlexibleArgumentParser())
        except Exception as e:  # noqa: BLE001 - try the next location, report all if none works
            errors.append(f"{mod_name}: {type(e).__name__}: {e}")
            continue
        flags = sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")})
        return flags, mod_name
    raise RuntimeError("no `vllm serve` argument parser found: " + "; ".join(errors))


def _request_headers(vllm_dir: Path) -> list[str]:
    """Header names that vLLM's server code reads (``headers.get("X")`` anywhere under entrypoints/)."""
    found: set[str] = set()
    for py in (vllm_dir / "entrypoints").rglob("*.py"):
        found.update(_HEADER_RE.findall(py.read_text(errors="replace")))
    return sorted(found, key=str.lower)


def inspect_vllm() -> dict[str, Any]:
    """``version``, ``serve_flags`` (every ``--flag`` of ``vllm serve``), ``serve_parser`` (its module),
    ``engine_args`` (``EngineArgs`` dataclass fields), ``request_headers`` (names the server reads)."""
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    flags, where = _serve_flags()
    return {
        "version": vllm.__version__,
        "serve_flags": flags,
        "serve_parser": where,
        "engine_args": sorted(f.name for f in dataclasses.fields(EngineArgs)),
        "request_headers": _request_headers(Path(vllm.__file__).parent),
    }


def engine_choices() -> dict[str, Any]:
    """What the installed vLLM accepts for ``kv_cache_dtype``, ``block_size`` and head size, asked of vLLM itself
    (never a list written here): ``kv_cache_dtypes`` (``vllm.config.cache.CacheDType``), ``platform``, ``default_backend``
    (the attention backend this platform always uses, ``CPU_ATTN`` on CPU; None on GPUs, where it depends on the
    model) and per backend this platform can import (on a CPU, the ``CPU_*`` ones) its ``kv_cache_dtypes``
    (``supports_kv_cache_dtype``), ``block_sizes`` (the sizes 1..4096 its ``supports_block_size`` accepts) and
    ``head_sizes``."""
    from typing import get_args

    import vllm
    from vllm.config.cache import CacheDType
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    dtypes = list(get_args(CacheDType))
    backends: dict[str, Any] = {}
    # On a CPU only the CPU backends: importing a GPU backend's kernels aborts the process there (vLLM 0.32 on an
    # AVX2-only CPU has loaded its _C_AVX2 library; ROCM_FLASHMLA_SPARSE_DSV4's import loads _C as well, and torch
    # aborts on the second registration of the namespace: no exception to catch).
    members = [m for m in AttentionBackendEnum if not current_platform.is_cpu() or m.name.startswith("CPU_")]
    for member in members:
        try:
            cls = member.get_class()
            backends[member.name] = {
                "kv_cache_dtypes": [d for d in dtypes if cls.supports_kv_cache_dtype(d)],
                "block_sizes": [b for b in range(1, 4097) if cls.supports_block_size(b)],
                "head_sizes": list(cls.get_supported_head_sizes() or []),
            }
        except Exception:  # noqa: BLE001 - a backend this build cannot import is not offered
            continue
    return {
        "version": vllm.__version__,
        "platform": current_platform.device_type,
        "kv_cache_dtypes": dtypes,
        "default_backend": "CPU_ATTN" if current_platform.is_cpu() and "CPU_ATTN" in backends else None,
        "backends": backends,
    }


def _cache_file(kind: str) -> Path | None:
    """Where the answer ``kind`` about the installed vLLM is kept: ``~/.cache/fp8lab/`` (``$FP8LAB_CACHE``), under a
    key of the interpreter, vLLM's install (its ``__init__.py`` and that file's mtime) and this module's own code (a
    changed question is asked again); None when vLLM is not installed."""
    import hashlib
    import importlib.util
    import os
    import sys

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    init = Path(spec.origin)
    h = hashlib.sha256(f"{sys.executable}|{init}|{init.stat().st_mtime_ns}|".encode())
    h.update(Path(__file__).read_bytes())
    root = Path(os.environ.get("FP8LAB_CACHE") or Path.home() / ".cache" / "fp8lab")
    return root / f"vllm-{kind}-{h.hexdigest()[:16]}.json"


def _read_cache(cache: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(cache.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _write_cache(cache: Path, info: dict[str, Any]) -> None:
    import os

    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, cache)


#: The key of a cached :func:`cached_engine_choices` answer that says the installed vLLM could not answer (with why);
#: the question is asked again only when vLLM's install or this module changes (:func:`_cache_file`).
UNANSWERED = "unanswered"


def cached_engine_choices(timeout_s: float = 600.0) -> dict[str, Any] | None:
    """:func:`engine_choices`, asked once per vLLM installation in a subprocess (this process never imports vLLM) and
    kept in the cache of :func:`_cache_file`; None when vLLM is not installed or cannot answer (then nothing is
    checked ahead of the engine). An installation that cannot answer is kept too (:data:`UNANSWERED`, with the
    subprocess's exit code and stderr), so every engine start does not pay the 15 s of asking again."""
    import subprocess
    import sys

    cache = _cache_file("choices")
    if cache is None:
        return None
    if (info := _read_cache(cache)) is not None:
        return None if UNANSWERED in info else info
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fp8lab.vllm_options", "--choices"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (subprocess.SubprocessError, OSError):  # a timeout, a missing interpreter: asked again next time
        return None
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (ValueError, IndexError):
        info = None
    if not isinstance(info, dict):  # this installation cannot answer: kept, so each engine start does not ask again
        _write_cache(cache, {UNANSWERED: f"exit code {proc.returncode}: {proc.stderr.strip()[-2000:]}"})
        return None
    _write_cache(cache, info)
    return info


def cached_inspect_vllm() -> dict[str, Any]:
    """:func:`inspect_vllm`, computed once per vLLM installation and kept in the cache of :func:`_cache_file`
    (importing vLLM to read its parsers takes 10-15 s on 2 cores; the audit asks on every run). Raises what
    :func:`inspect_vllm` raises (ModuleNotFoundError without vLLM); a failure is not cached."""
    cache = _cache_file("options")
    if cache is not None and (info := _read_cache(cache)) is not None:
        return info
    info = inspect_vllm()
    if cache is not None:
        _write_cache(cache, info)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--choices", action="store_true", help="print engine_choices() as one JSON line and exit")
    ap.add_argument(
        "--warm",
        action="store_true",
        help="ask the installed vLLM both cached questions now, in this process (scripts/setup_cpu.sh), so no study "
        "pays them",
    )
    args = ap.parse_args(argv)
    if args.choices:
        print(json.dumps(engine_choices()))
        return 0
    if args.warm:  # both answers from one vLLM import (setup_cpu.sh falls back to a plain import check if this fails)
        options = cached_inspect_vllm()
        choices = engine_choices()
        if (cache := _cache_file("choices")) is not None:
            _write_cache(cache, choices)
        print(
            f"vLLM {options['version']}: {len(choices['kv_cache_dtypes'])} KV cache dtypes, attention backends "
            f"{', '.join(choices['backends'])}; {len(options['serve_flags'])} serve flags"
        )
        return 0
    if not args.out:
        ap.error("--out is required")
    info = inspect_vllm()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(info, indent=1))
    print(
        f"vLLM {info['version']}: {len(info['serve_flags'])} serve flags, {len(info['engine_args'])} EngineArgs "
        f"fields, {len(info['request_headers'])} request headers -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
