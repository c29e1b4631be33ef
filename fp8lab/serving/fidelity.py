"""Study 01's fidelity check: fp8lab's offline throughput against vLLM's own ``vllm bench throughput`` on the same
settings (:func:`fidelity_check`, :func:`fidelity_summary`), each run in a fresh process (:func:`run_vllm_bench`,
:func:`run_fp8lab_offline`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.serving.schedule import tagged_requests
from fp8lab.specs import EngineSpec, Phase, check_float, check_int, resolve_model
from fp8lab.workloads import PromptSource, RequestClass, build_requests

_BENCH_CODE = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.throughput import add_cli_args, main
if __name__ == "__main__":
    p = FlexibleArgumentParser()
    add_cli_args(p)
    main(p.parse_args(sys.argv[1:]))
"""


def bench_args(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    num_warmups: int,
    output_json: str,
    tokenizer: str | None = None,
) -> list[str]:
    """``vllm bench throughput`` arguments for the same engine settings as ``spec``: random dataset with
    exact lengths (``--random-range-ratio 0``), prefix caching as in the spec, no detokenization."""
    args = [
        "--backend",
        "vllm",
        "--model",
        spec.model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(num_prompts),
        "--num-warmups",
        str(num_warmups),
        "--output-json",
        output_json,
        "--kv-cache-dtype",
        spec.kv_cache_dtype,
        "--dtype",
        spec.dtype,
        "--seed",
        str(spec.seed),
        "--load-format",
        spec.load_format,
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(spec.gpu_memory_utilization),
        "--disable-detokenize",
        "--enforce-eager" if spec.enforce_eager else "--no-enforce-eager",
        "--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if tokenizer:  # a folder path is made absolute: the benchmark's working directory need not be the repo's
        args += ["--tokenizer", resolve_model(tokenizer)]
    for flag, value in (
        ("--max-model-len", spec.max_model_len),
        ("--block-size", spec.block_size),
        ("--max-num-seqs", spec.max_num_seqs),
        ("--max-num-batched-tokens", spec.max_num_batched_tokens),
        ("--attention-backend", spec.attention_backend),
    ):
        if value is not None:
            args += [flag, str(value)]
    if spec.kv_cache_gib is not None:
        args += ["--kv-cache-memory-bytes", str(int(spec.kv_cache_gib * 2**30))]
    if getattr(spec, "calculate_kv_scales", False):
        args.append("--calculate-kv-scales")
    return args


def run_vllm_bench(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    num_warmups: int = 0,
    tokenizer: str | None = None,
    work_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run vLLM's offline throughput benchmark in a fresh Python process (the CPU build's ``vllm`` command
    does not start, vllm-notes section 8; this is the same code). Returns its JSON (``elapsed_time``,
    ``num_requests``, ``total_num_tokens``, ``tokens_per_second``) plus ``status``, ``log`` path and
    ``wall_s``."""
    wd = Path(work_dir or tempfile.mkdtemp(prefix="fp8lab-bench-"))
    wd.mkdir(parents=True, exist_ok=True)
    out_json, log = wd / "bench.json", wd / "bench.log"
    out_json.unlink(missing_ok=True)
    # the spec's budget is the one; the same vLLM process layout as fp8lab's own engines (devices.engine_env)
    from fp8lab.engine.devices import engine_env

    env = {**{k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}, **engine_env()}
    cmd = [
        sys.executable,
        "-c",
        _BENCH_CODE,
        *bench_args(spec, input_len, output_len, num_prompts, num_warmups, str(out_json), tokenizer),
    ]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=spec.timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    out: dict[str, Any] = {
        "status": "ok" if rc == 0 and out_json.exists() else "error",
        "returncode": rc,
        "log": str(log),
        "wall_s": time.perf_counter() - t0,
        "cmd": cmd[3:],
    }
    if out_json.exists():
        out.update(json.loads(out_json.read_text()))
    else:
        from fp8lab.engine.result import root_cause

        out["error"] = root_cause(log.read_text(errors="replace"), f"exit code {rc}")
    return out


def run_fp8lab_offline(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    num_warmups: int = 0,
    prompt_source: PromptSource = "random",
    seed: int = 0,
    work_dir: str | Path | None = None,
    tag: str = "",
    temperature: float = 0.0,
) -> dict[str, Any]:
    """fp8lab's offline throughput: ``num_prompts`` requests of exactly ``input_len`` / ``output_len``
    tokens through ``LLM.generate`` (the ``llm`` driver), after ``num_warmups`` warm-up requests; total
    tokens per second of the timed phase, as vLLM's benchmark counts them. ``temperature``: 0 greedy, else
    sampled (vLLM's benchmark samples at 1.0)."""
    from fp8lab.engine.run import run_engine

    cls = [RequestClass("fidelity", input_len, output_len)]
    phases = []
    if num_warmups:
        phases.append(
            Phase(
                "warmup",
                tagged_requests(
                    build_requests(spec.model, cls, num_warmups, source=prompt_source, seed=seed + 1),
                    tag,
                    temperature=temperature,
                ),
            )
        )
    phases.append(
        Phase(
            "main",
            tagged_requests(
                build_requests(spec.model, cls, num_prompts, source=prompt_source, seed=seed),
                tag,
                temperature=temperature,
            ),
        )
    )
    res = run_engine(spec, phases, driver="llm", work_dir=work_dir)
    out: dict[str, Any] = {"status": res.status, "error": res.error, "wall_s": res.engine.get("run_wall_s")}
    if res.ok:
        ph = res.phases["main"]
        total = ph["prompt_tokens"] + ph["output_tokens"]
        out.update(
            elapsed_time=ph["wall_s"],
            num_requests=ph["requests"],
            total_num_tokens=total,
            tokens_per_second=total / ph["wall_s"],
            requests_per_second=ph["requests"] / ph["wall_s"],
        )
    return out


def fidelity_check(
    spec: EngineSpec,
    input_len: int,
    output_len: int,
    num_prompts: int,
    *,
    rounds: int = 2,
    num_warmups: int = 4,
    tokenizer: str | None = None,
    prompt_source: PromptSource = "random",
    temperature: float = 1.0,
    tolerance: float = 0.03,
    work_dir: str | Path | None = None,
    store: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """fp8lab's offline throughput vs ``vllm bench throughput`` on the same model, lengths, request count
    and kv dtype (``spec``), measured now, ``rounds`` times in alternating order (bench, fp8lab, fp8lab,
    bench, ...) so slow drifts of a shared machine cancel. Returns :func:`fidelity_summary` of the runs (``rows``,
    one per run; ``ratio``, ``within_tolerance``, each tool's own ``spread_pct`` and ``resolvable``) with the
    settings.

    vLLM's benchmark samples at temperature 1.0 (top-p 1), so fp8lab samples at ``temperature`` = 1.0 too
    (sampling costs more than greedy decoding: about 5-8% of the step for the tiny model on CPU, measured on
    one engine). Remaining difference: its random prompts are re-tokenized text (fp8lab: token ids), a few
    tokens longer or shorter. ``tokenizer`` is needed by the benchmark for a model folder without one (e.g.
    dummy weights: pass the shipped model's).

    ``store``: a folder that keeps each finished run (``<store>/<hash of settings.json>/round<r>-<who>.json``
    with its provenance, and the run's logs beside it), so that a check cut short (a time limit, a dead
    kernel) resumes: runs already finished with status ``ok`` are loaded (``cached`` True), the others run.
    """
    from fp8lab.engine import results
    from fp8lab.engine.devices import provenance
    from fp8lab.specs import spec_hash

    check_int("fidelity", "rounds", rounds, 1, 100)
    check_float("fidelity", "tolerance", tolerance, 0.0, 1.0, lo_open=True)
    digest = results.model_digest(spec.model, spec.load_format)
    settings = {
        "engine": results.engine_key(spec),  # the model as given: no absolute path in the key
        **({"model_digest": digest} if digest is not None else {}),
        "input_len": input_len,
        "output_len": output_len,
        "num_prompts": num_prompts,
        "num_warmups": num_warmups,
        "tokenizer": results.model_ref(resolve_model(tokenizer)) if tokenizer else tokenizer,
        "prompt_source": prompt_source,
        "temperature": temperature,
    }
    keep = Path(store) / spec_hash(settings) if store is not None else None
    wd = Path(work_dir) if work_dir else keep or Path(tempfile.mkdtemp(prefix="fp8lab-fidelity-"))
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "settings.json").write_text(json.dumps(settings, indent=2, sort_keys=True, default=str))
    rows = []
    for r in range(rounds):
        order = ("bench", "fp8lab") if r % 2 == 0 else ("fp8lab", "bench")
        for who in order:
            t = time.perf_counter()
            sub = wd / f"round{r}-{who}"
            kept = keep / f"round{r}-{who}.json" if keep is not None else None
            stored = json.loads(kept.read_text()) if kept is not None and kept.is_file() else {}
            if stored.get("status") == "ok":
                rows.append({**{k: v for k, v in stored.items() if k != "provenance"}, "cached": True})
                if progress:
                    print(
                        f"fidelity round {r} {who}: ok (stored), {rows[-1]['tokens_per_second']:.1f} tok/s", flush=True
                    )
                continue
            if results.store_only():  # re-rendering from committed stores: never start an engine
                out = {
                    "status": "error",
                    "error": f"not in the fidelity store ({kept}); ${results.STORE_ONLY_ENV} is set, so nothing is run",
                }
            elif who == "bench":
                out = run_vllm_bench(spec, input_len, output_len, num_prompts, num_warmups, tokenizer, sub)
            else:
                out = run_fp8lab_offline(
                    spec,
                    input_len,
                    output_len,
                    num_prompts,
                    num_warmups,
                    prompt_source,
                    work_dir=sub,
                    tag=f"fidelity-round{r}",
                    temperature=temperature,
                )
                (sub / "result.pkl").unlink(missing_ok=True)  # the worker's raw records: the row keeps the figures
            row = {
                "round": r,
                "who": who,
                "status": out["status"],
                "tokens_per_second": out.get("tokens_per_second"),
                "elapsed_time": out.get("elapsed_time"),
                "total_num_tokens": out.get("total_num_tokens"),
                "num_requests": out.get("num_requests"),
                "error": out.get("error"),
            }
            if kept is not None:  # with where and with what it ran
                kept.write_text(json.dumps({**row, "provenance": provenance(with_torch=False)}, indent=2, default=str))
            rows.append({**row, "cached": False})
            if progress:
                tps = row["tokens_per_second"]
                print(
                    f"fidelity round {r} {who}: {row['status']}, "
                    f"{'n/a' if tps is None else f'{tps:.1f}'} tok/s ({time.perf_counter() - t:.0f} s)",
                    flush=True,
                )
    return {
        **fidelity_summary(pd.DataFrame(rows), tolerance),
        "kv_dtype": spec.kv_cache_dtype,
        "temperature": temperature,
        "input_len": input_len,
        "output_len": output_len,
        "num_prompts": num_prompts,
        "rounds": rounds,
        "work_dir": str(wd),
    }


def fidelity_summary(rows: pd.DataFrame, tolerance: float = 0.03) -> dict[str, Any]:
    """The fidelity check's verdict from its ``rows`` (``round, who, status, tokens_per_second``; ``who`` is
    ``bench`` or ``fp8lab``): ``round_ratios`` (fp8lab / bench of each round, whose two runs ran back to back),
    ``ratio`` (their median), ``within_tolerance`` (``|ratio - 1| <= tolerance``), ``spread_pct`` (per tool with
    two or more runs: its fastest run over its slowest, minus 1, in %) and ``resolvable``: whether the check
    can tell ``tolerance`` apart at all (both tools' own spread within it; ``None`` with fewer than 2 rounds).
    A ratio outside the tolerance while a tool disagrees with itself by more is run-to-run variation of
    runs too short for this machine, not a disagreement between the tools: run more requests."""
    ok = rows[rows.status == "ok"]
    per_round = ok.pivot_table(index="round", columns="who", values="tokens_per_second")
    ratios = (per_round["fp8lab"] / per_round["bench"]).dropna() if {"fp8lab", "bench"} <= set(per_round) else []
    ratio = float(np.median(ratios)) if len(ratios) else None
    spread = {
        str(w): 100.0 * (float(g.max()) / float(g.min()) - 1.0)
        for w, g in ok.groupby("who").tokens_per_second
        if len(g) >= 2 and float(g.min()) > 0
    }
    resolvable = None if len(spread) < 2 else bool(max(spread.values()) <= 100.0 * tolerance)
    return {
        "ratio": ratio,
        "round_ratios": [float(r) for r in ratios],
        "within_tolerance": ratio is not None and abs(ratio - 1) <= tolerance,
        "tolerance": tolerance,
        "spread_pct": spread,
        "resolvable": resolvable,
        "rows": rows,
    }
