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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    info = inspect_vllm()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(info, indent=1))
    print(f"vLLM {info['version']}: {len(info['serve_flags'])} serve flags, {len(info['engine_args'])} EngineArgs "
          f"fields, {len(info['request_headers'])} request headers -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
