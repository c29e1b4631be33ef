"""``fp8lab estimate``: the KV-cache calculator at the command line (standard library only).

    fp8lab estimate PATH [--kv-dtype auto|fp8|...] [--tp N] [--block-size B]
                         [--context-len N] [--memory-gib G] [--json]

``PATH`` is a ``config.json``, a model folder holding one, or the name of a folder in ``data/configs``.
With ``--json`` it prints one JSON object; its integer ``kv_bytes_per_token`` is the KV cache of one
token of one sequence over all layers (per TP rank when ``--tp`` > 1; ``auto`` = the config's
``torch_dtype``). ``--memory-gib`` is the KV budget per GPU rank (what vLLM gets after weights and
activations), and adds blocks, capacity in tokens and, with ``--context-len``, max concurrency.
Bad input prints one line on stderr naming the field, the value and what is allowed, and exits 2.

``--kv-dtype`` takes any ``kv_cache_dtype`` the installed vLLM accepts (asked once per installation in a
subprocess, :func:`fp8lab.kvformats.check_kv_dtype`; this process never imports vLLM); without vLLM, any format the
calculator knows (:data:`fp8lab.kvformats.FORMATS`). A name vLLM accepts but the calculator has no byte rule for is
an "unknown format" error, never a guess. ``--skip-layers`` is vLLM's ``kv_cache_dtype_skip_layers`` (layers kept in
the model dtype).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, overload

from fp8lab import kvmath
from fp8lab.errors import SpecError
from fp8lab.kvformats import check_kv_dtype, known_format, skipped_layers

EXIT_BAD_INPUT = 2


def add_estimate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``estimate`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "estimate",
        help="KV-cache bytes per token, blocks and capacity for a model config (no torch, no vLLM)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("path", help="a config.json, a model folder holding one, or a name in data/configs")
    p.add_argument(
        "--kv-dtype",
        default="auto",
        help="a kv_cache_dtype of the installed vLLM (without vLLM: a format the calculator knows; default: auto)",
    )
    p.add_argument(
        "--skip-layers",
        default="",
        help="vLLM's kv_cache_dtype_skip_layers, comma-separated: layer indices or sliding_window (kept as auto)",
    )
    p.add_argument("--tp", default="1", help="tensor-parallel size; figures are per GPU rank (default: 1)")
    p.add_argument("--block-size", default="16", help="tokens per KV block (default: 16, vLLM's GPU default)")
    p.add_argument(
        "--context-len", default=None, help="tokens per sequence: adds bytes per sequence and max concurrency"
    )
    p.add_argument("--memory-gib", default=None, help="KV-cache budget per GPU rank in GiB: adds blocks and capacity")
    p.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="model vLLM with its hybrid KV-cache manager off (as on CPU): matters for models mixing "
        "sliding-window and full layers",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run_estimate)
    return p


@overload
def _int_arg(name: str, text: str, lo: int = 1) -> int: ...
@overload
def _int_arg(name: str, text: None, lo: int = 1) -> None: ...
@overload
def _int_arg(name: str, text: str | None, lo: int = 1) -> int | None: ...
def _int_arg(name: str, text: str | None, lo: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise SpecError("estimate", name, text, f"an integer >= {lo}") from None
    if value < lo:
        raise SpecError("estimate", name, value, f"an integer >= {lo}")
    return value


def _float_arg(name: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SpecError("estimate", name, text, "a number > 0 (GiB)") from None
    if not value > 0 or value == float("inf"):
        raise SpecError("estimate", name, value, "a number > 0 (GiB)")
    return value


def estimate(
    path: str,
    kv_dtype: str = "auto",
    tp: int = 1,
    block_size: int = 16,
    context_len: int | None = None,
    memory_gib: float | None = None,
    hybrid_kv_cache_manager: bool = True,
    skip_layers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The figures ``fp8lab estimate`` prints, as a dict (bytes, tokens; per TP rank)."""
    check_kv_dtype("estimate", "kv_dtype", kv_dtype)
    fmt = known_format(kv_dtype, "estimate")
    cfg_file = kvmath.config_path(path)
    lay = kvmath.load_layout(cfg_file)
    limit, source = kvmath.model_max_len(cfg_file)
    if context_len is not None and limit is not None and context_len > limit:
        raise SpecError(
            "estimate",
            "context_len",
            context_len,
            f"an integer in [1, {limit:,}]: the model's limit ({source} in {cfg_file})",
        )
    sk = {"skip_layers": skip_layers}
    per_token = kvmath.kv_bytes_per_token(lay, kv_dtype, tp, **sk)
    out: dict[str, Any] = {
        "model": lay.name,
        "config": str(cfg_file),
        "model_type": lay.model_type,
        "torch_dtype": lay.torch_dtype,
        "kv_dtype": kv_dtype,
        "kv_dtype_bytes": kvmath.dtype_bytes(kv_dtype, lay.torch_dtype) if fmt.rule in ("model", "dense") else None,
        "kv_scales": fmt.scales,
        "layers_kept_auto": sorted(skipped_layers(kv_dtype, lay.num_layers, lay.layer_kinds, skip_layers)),
        "tp": tp,
        "num_layers": lay.num_layers,
        "attention": lay.kind_counts,
        "sliding_window": lay.sliding_window,
        "num_kv_heads": lay.num_kv_heads,
        "kv_heads_per_rank": kvmath.kv_heads_per_rank(lay, tp),
        "head_dim": lay.head_dim,
        "v_head_dim": lay.v_head_dim,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_all_ranks": per_token * tp,
        "block_size": block_size,
        "page_bytes": kvmath.page_bytes(lay, block_size, kv_dtype, tp, **sk),
        "hybrid_kv_cache_manager": hybrid_kv_cache_manager,
        "bytes_per_block": kvmath.bytes_per_block(lay, block_size, kv_dtype, tp, hybrid_kv_cache_manager, **sk),
    }
    if lay.is_mla:
        out["mla"] = {"kv_lora_rank": lay.kv_lora_rank, "qk_rope_head_dim": lay.qk_rope_head_dim}
    try:
        out["approx_weight_bytes"] = kvmath.estimate_param_bytes(lay)
    except (SpecError, KeyError, TypeError):
        out["approx_weight_bytes"] = None  # the KV figures do not need the weights
    if context_len is not None:
        out["context_len"] = context_len
        out["kv_bytes_per_sequence"] = kvmath.kv_bytes_per_sequence(lay, context_len, kv_dtype, tp, **sk)
    if memory_gib is not None:
        budget = int(memory_gib * kvmath.GIB)
        blocks = kvmath.predict_num_blocks(lay, budget, block_size, kv_dtype, tp, hybrid_kv_cache_manager, **sk)
        out.update(
            memory_gib=memory_gib, kv_budget_bytes=budget, num_blocks=blocks, capacity_tokens=blocks * block_size
        )
        if context_len is not None:
            out["max_concurrency"] = blocks // kvmath.blocks_per_sequence(
                lay, context_len, block_size, hybrid_kv_cache_manager
            )
            if out["max_concurrency"] == 0:
                out["warning"] = (
                    f"one sequence of {context_len:,} tokens does not fit a KV budget of {memory_gib:g} GiB "
                    f"({blocks:,} blocks = {blocks * block_size:,} tokens): vLLM would refuse to start with "
                    f"max_model_len = {context_len:,}"
                )
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


_UNITS = {
    "kv_bytes_per_token": "B  (all layers, 1 token, 1 sequence, per rank)",
    "kv_bytes_per_token_all_ranks": "B",
    "page_bytes": "B  (block_size tokens, all layers)",
    "bytes_per_block": "B  (largest KV-cache group)",
    "approx_weight_bytes": "B  (approximate, all ranks)",
    "kv_bytes_per_sequence": "B",
    "kv_budget_bytes": "B",
    "capacity_tokens": "tokens",
    "max_concurrency": "sequences at full length",
}


def format_table(result: dict[str, Any]) -> str:
    """The readable form: one ``name  value  unit`` line per figure."""
    width = max(len(k) for k in result)
    lines = [f"{k.ljust(width)}  {_fmt(v)}  {_UNITS.get(k, '')}".rstrip() for k, v in result.items()]
    return "\n".join(lines)


def run_estimate(args: argparse.Namespace) -> int:
    """Entry point of ``fp8lab estimate``: prints the figures, returns the exit code (0, or 2 on bad input)."""
    try:
        result = estimate(
            args.path,
            kv_dtype=args.kv_dtype,
            tp=_int_arg("tp", args.tp),
            block_size=_int_arg("block_size", args.block_size),
            context_len=_int_arg("context_len", args.context_len),
            memory_gib=_float_arg("memory_gib", args.memory_gib),
            hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager,
            skip_layers=tuple(x.strip() for x in args.skip_layers.split(",") if x.strip()),
        )
    except SpecError as exc:
        print(f"fp8lab estimate: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:  # unreadable file, permission denied
        print(f"fp8lab estimate: error: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    if result.get("warning"):
        print(f"fp8lab estimate: warning: {result['warning']}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m fp8lab.estimate_cli PATH ...``: the same command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="fp8lab")
    add_estimate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
