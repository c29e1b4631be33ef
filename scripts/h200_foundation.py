"""Issue 2, section 8: KV capacity of auto vs fp8 on one H200 (vLLM 0.26.0), engine vs formula.

Runs, each in its own engine (enforce_eager, to keep start-up short; capacity does not depend on it):
- the shipped model (real weights, real-text prompts) with a fixed 4 GiB KV budget;
- a Qwen3-8B-shaped model (dummy weights, random token ids) with a fixed 40 GiB KV budget, where the
  formula must match the engine exactly, and with vLLM's own sizing (gpu_memory_utilization 0.9),
  where the prediction uses the KV memory the worker reported after profiling.
Each engine also serves 16 requests of 1024 in / 128 out (after 2 warm-up requests) to show the path
works end to end. Writes capacity.json / capacity.csv and runs.tar.gz (the results store) to --out.

    python scripts/h200_foundation.py --out $OUT [--tiny-model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import tarfile
from pathlib import Path

if __name__ == "__main__":
    import pandas as pd

    from fp8lab import kvmath
    from fp8lab.engine.results import run_cached
    from fp8lab.paths import REPO_ROOT, TINY_MODEL_DIR
    from fp8lab.specs import EngineSpec, Phase
    from fp8lab.workloads import RequestClass, build_requests

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny-model", default=str(TINY_MODEL_DIR))
    ap.add_argument("--runs", default="/tmp/fp8lab-runs")
    ap.add_argument("--cases", default="tiny,qwen3-8b,qwen3-8b-util")
    ap.add_argument("--n-requests", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    os.environ["FP8LAB_RUNS"] = args.runs
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    q8 = str(REPO_ROOT / "data/configs/qwen3-8b")
    dummy = dict(load_format="dummy", skip_tokenizer_init=True)
    cases = {
        "tiny": (args.tiny_model, dict(kv_cache_gib=4.0, max_model_len=4096), "text"),
        "qwen3-8b": (q8, dict(kv_cache_gib=40.0, max_model_len=16384, **dummy), "random"),
        "qwen3-8b-util": (q8, dict(gpu_memory_utilization=0.9, max_model_len=16384, **dummy), "random"),
    }
    rows = []
    for name in args.cases.split(","):
        model, kw, source = cases[name]
        layout = kvmath.load_layout(model)
        reqs = build_requests(
            model, [RequestClass("c", args.input_len, args.output_len)], args.n_requests + 2, source=source, seed=1
        )
        for dt in ("auto", "fp8"):
            spec = EngineSpec(model=model, kv_cache_dtype=dt, enforce_eager=True, seed=0, **kw)
            res = run_cached(spec, [Phase("warmup", reqs[:2]), Phase("main", reqs[2:])], study="h200_foundation")
            e = res.engine
            budget = e.get("kv_budget_bytes") or (
                int(e["kv_available_gib_logged"] * 2**30) if e.get("kv_available_gib_logged") else None
            )
            row = {
                "case": name,
                "kv_cache_dtype": dt,
                "status": res.status,
                "error": res.error,
                "run_id": res.run_dir.name if res.run_dir else None,
                "kv_budget_bytes": budget,
                "budget_source": "spec" if e.get("kv_budget_bytes") else "engine log",
                "engine_blocks": e.get("num_blocks"),
                "block_size": e.get("block_size"),
                "engine_tokens": e.get("kv_capacity_tokens"),
                "engine_start_s": e.get("engine_start_s"),
                "mem_after_start_bytes": e.get("mem_after_start_bytes"),
                "mem_peak_bytes": e.get("mem_peak_bytes"),
                "kv_bytes_per_token": kvmath.kv_bytes_per_token(layout, dt),
            }
            if res.ok and budget:
                pred = kvmath.predict_num_blocks(layout, budget, e["block_size"], dt)
                row.update(
                    predicted_blocks=pred,
                    predicted_tokens=pred * e["block_size"],
                    rel_error=(pred - e["num_blocks"]) / e["num_blocks"],
                )
            if res.ok:
                main = res.records[res.records.phase == "main"]
                ph = res.phases["main"]
                row.update(
                    output_tok_s=ph["output_tokens"] / ph["wall_s"],
                    ttft_p50_s=main.ttft_s.median(),
                    tpot_p50_s=main.tpot_s.median(),
                    preemptions=ph["preemptions"],
                )
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
    df = pd.DataFrame(rows)
    for case, g in df.groupby("case"):
        ok = g[g.status == "ok"].set_index("kv_cache_dtype")
        if {"auto", "fp8"} <= set(ok.index):
            df.loc[df.case == case, "fp8_over_auto_tokens"] = (
                ok.loc["fp8", "engine_tokens"] / ok.loc["auto", "engine_tokens"]
            )
    df.to_csv(out / "capacity.csv", index=False)
    (out / "capacity.json").write_text(df.to_json(orient="records", indent=2))
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        tar.add(args.runs, arcname="runs")
    print(df.drop(columns=["error"]).to_string())
