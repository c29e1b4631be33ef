"""What the real model (SmolLM2-135M-Instruct, :mod:`fp8lab.realmodel`) costs on this machine's vLLM: one engine
started on it, then a 1,024-token prefill of held-out text with and without ``prompt_logprobs`` (its perplexity too),
and greedy decode at batch 1 and batch 8. One engine, one run of each: a probe for planning, not a result.

    python scripts/bench_realmodel.py [--kv-dtype auto|fp8] [--dtype auto|float32] [--decode-tokens N] [--json FILE]

Conversion time is not measured here: ``python -m fp8lab.realmodel --force`` prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-dtype", default="auto")
    ap.add_argument("--dtype", default="auto", help="the model's compute dtype: auto (bf16) | float32")
    ap.add_argument("--json", help="write the numbers here too")
    ap.add_argument("--decode-tokens", type=int, default=128)
    args = ap.parse_args()

    from fp8lab import realmodel
    from fp8lab.engine.run import run_engine
    from fp8lab.specs import EngineSpec, Phase, Request
    from fp8lab.workloads import text_prompt

    folder = str(realmodel.ensure())
    window = text_prompt(folder, 1024)
    short = text_prompt(folder, 64, offset=4096)
    n = args.decode_tokens
    phases = [
        Phase("warmup", (Request(prompt_token_ids=short, max_tokens=8),)),
        Phase("prefill1024_logprobs", (Request(prompt_token_ids=window, max_tokens=1, prompt_logprobs=0),)),
        Phase("prefill1024", (Request(prompt_token_ids=window, max_tokens=1),)),
        Phase("decode_b1", (Request(prompt_token_ids=short, max_tokens=n),)),
        Phase(
            "decode_b8",
            tuple(
                Request(prompt_token_ids=text_prompt(folder, 64, offset=4096 + 64 * i), max_tokens=n) for i in range(8)
            ),
        ),
    ]
    spec = EngineSpec(
        model=realmodel.NAME,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_dtype,
        kv_cache_gib=0.25,
        max_model_len=2048,
        max_num_seqs=8,
    )
    t0 = time.perf_counter()
    res = run_engine(spec, phases)
    total = time.perf_counter() - t0
    if not res.ok:
        print(res.error, res.log_tail[-3000:])
        return 1
    rec = res.records
    ph = res.phases
    lp = [x for x in rec.iloc[1].prompt_token_logprobs if x is not None and math.isfinite(x)]
    out = {
        "kv_cache_dtype": args.kv_dtype,
        "dtype": args.dtype,
        "decode_tokens": n,
        "engine_start_s": res.engine.get("engine_start_s"),
        "run_engine_total_s": total,
        "prefill1024_logprobs_s": ph["prefill1024_logprobs"]["wall_s"],
        "prefill1024_s": ph["prefill1024"]["wall_s"],
        "ppl_1024": float(np.exp(-np.mean(lp))),
        "ppl_tokens": len(lp),
    }
    for b in (1, 8):
        r = rec.iloc[-8:] if b == 8 else rec.iloc[-9:-8]
        out[f"decode_b{b}_wall_s"] = ph[f"decode_b{b}"]["wall_s"]
        out[f"decode_b{b}_output_tok_per_s"] = ph[f"decode_b{b}"]["output_tokens"] / ph[f"decode_b{b}"]["wall_s"]
        out[f"decode_b{b}_median_tpot_s"] = float(np.median(r.tpot_s))
        out[f"decode_b{b}_step_tok_per_s"] = b / float(np.median(r.tpot_s))
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
