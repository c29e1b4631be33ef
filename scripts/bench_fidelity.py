"""Fidelity check: fp8lab's offline throughput vs vLLM's own ``vllm bench throughput``, measured now.

Both run the same model, input/output lengths, request count, warm-up count, kv cache dtype and sampling
(temperature 1.0, top-p 1: vLLM's benchmark samples; greedy decoding is several % cheaper on a small model),
each in a fresh engine, alternating (bench, fp8lab, fp8lab, bench, ...) so slow drifts of a shared machine
cancel. vLLM's benchmark is called from Python (``vllm.benchmarks.throughput.main``: the CPU build's
``vllm`` command does not start, vllm-notes section 8; on a GPU it is the same code). Prints one row per
run and the median over rounds of total tokens/s fp8lab / vLLM bench (the two runs of a round ran back
to back); exits 1 when ``|ratio - 1|`` exceeds the tolerance (3% by default), 2 when a run failed.

    .venv/bin/python scripts/bench_fidelity.py --model data/models/fp8lab-tiny-qwen3 \\
        --input-len 512 --output-len 128 --num-prompts 96 --kv-dtype auto fp8 --rounds 3
    # dummy weights (GPU): vLLM's benchmark needs a tokenizer to make its random prompts
    python scripts/bench_fidelity.py --model data/configs/qwen3-8b --load-format dummy \\
        --tokenizer data/models/fp8lab-tiny-qwen3 --kv-cache-gib 40 --max-model-len 4096 --no-enforce-eager
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from fp8lab.serving import fidelity_check
    from fp8lab.specs import EngineSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="data/models/fp8lab-tiny-qwen3")
    ap.add_argument("--kv-dtype", nargs="+", default=["auto"], help="one or more kv cache dtypes (default: auto)")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--num-warmups", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="fp8lab's sampling temperature (default 1.0, as vLLM's benchmark samples; 0 is greedy)",
    )
    ap.add_argument("--tokenizer", default=None, help="tokenizer for vLLM's benchmark (a model folder without one)")
    ap.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "dummy"])
    ap.add_argument(
        "--prompt-source",
        default=None,
        choices=["text", "random"],
        help="fp8lab's prompts (default: random; vLLM's benchmark always uses random text)",
    )
    ap.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV budget in GiB (0 or less: vLLM sizes it)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--work-dir", default=None, help="keep the runs' logs here (default: a temporary folder)")
    ap.add_argument(
        "--store",
        default=None,
        help="keep every finished run here, so the same command resumes after a cut (per kv dtype)",
    )
    ap.add_argument("--json-out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    results, code = [], 0
    for dt in args.kv_dtype:
        spec = EngineSpec(
            model=args.model,
            kv_cache_dtype=dt,
            load_format=args.load_format,
            skip_tokenizer_init=args.load_format == "dummy",
            kv_cache_gib=args.kv_cache_gib if args.kv_cache_gib > 0 else None,
            # headroom: vLLM's benchmark re-tokenizes its random text, which can add a few tokens
            max_model_len=args.max_model_len or args.input_len + args.output_len + 128,
            max_num_seqs=args.max_num_seqs,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enforce_eager=args.enforce_eager,
        )
        wd = Path(args.work_dir) / dt if args.work_dir else None
        res = fidelity_check(
            spec,
            args.input_len,
            args.output_len,
            args.num_prompts,
            rounds=args.rounds,
            num_warmups=args.num_warmups,
            tokenizer=args.tokenizer,
            prompt_source=args.prompt_source or "random",
            temperature=args.temperature,
            tolerance=args.tolerance,
            work_dir=wd,
            store=args.store,
        )
        rows = res.pop("rows")
        print(rows.drop(columns=["error"]).to_string(index=False))
        for r in rows[rows.status != "ok"].itertuples():
            print(f"FAILED {r.who} round {r.round}: {r.error}", file=sys.stderr)
        ratio = res["ratio"]
        rounds = ", ".join(f"{r:.3f}" for r in res["round_ratios"])
        print(
            f"kv_cache_dtype={dt}: fp8lab / vllm bench throughput = "
            f"{'n/a' if ratio is None else f'{ratio:.4f}'} (rounds: {rounds}; tolerance {args.tolerance:.0%}): "
            f"{'PASS' if res['within_tolerance'] else 'FAIL'}",
            flush=True,
        )
        spread = ", ".join(f"{w} {v:.1f}%" for w, v in sorted(res["spread_pct"].items()))
        if spread:  # each tool against itself: above the tolerance, these runs are too short to resolve it
            print(f"  run to run: {spread}; resolvable at {args.tolerance:.0%}: {res['resolvable']}", flush=True)
        results.append({**res, "rows": rows.to_dict(orient="records")})
        if ratio is None:
            code = 2
        elif not res["within_tolerance"] and code == 0:
            code = 1
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
