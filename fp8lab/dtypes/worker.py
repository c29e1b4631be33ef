"""Inside one of Study 08's spawned workers: one engine for one row (a ``kv_cache_dtype``, perhaps with
``kv_cache_dtype_skip_layers``), measured and written to ``rows/<label>.json``, then the process exits. One process
per row, so an engine that crashes (or aborts the process) takes only its own row with it.

What the engine is asked, after it starts (:func:`engine_probe`, run inside the engine's worker through
``collective_rpc``, so it reads the engine's own objects, nothing assumed): each attention layer's
``kv_cache_dtype``, its ``k_scale`` / ``v_scale`` and its implementation class; the KV-cache groups' page sizes.
Then: greedy outputs and teacher-forced prompt logprobs of the quality prompts (scored against ``auto`` by
:mod:`fp8lab.dtypes.quality`), prefix-cache correctness with the block pool full, and decode step times.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def engine_probe(worker: Any) -> dict[str, Any]:
    """Run inside vLLM's worker (``LLM.collective_rpc``): the attention layers' dtype, scales and implementation, and
    the KV-cache groups' page sizes, read from the engine's objects."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    layers = []
    for name, mod in model.named_modules():
        if not hasattr(mod, "kv_cache_dtype") or not hasattr(mod, "impl"):
            continue

        def f(x: Any) -> float | None:
            try:
                return float(x.float().flatten()[0]) if hasattr(x, "flatten") else float(x)
            except Exception:  # noqa: BLE001 - a scale that is not a number is reported as None
                return None

        layers.append(
            {
                "layer": name,
                "kv_cache_dtype": str(mod.kv_cache_dtype),
                "k_scale": f(getattr(mod, "_k_scale_float", getattr(mod, "_k_scale", None))),
                "v_scale": f(getattr(mod, "_v_scale_float", getattr(mod, "_v_scale", None))),
                "impl": type(mod.impl).__name__,
            }
        )
    groups = []
    cfg = getattr(runner, "kv_cache_config", None)
    for g in getattr(cfg, "kv_cache_groups", []) or []:
        spec = g.kv_cache_spec
        groups.append(
            {
                "layers": len(g.layer_names),
                "spec": type(spec).__name__,
                "page_size_bytes": int(spec.page_size_bytes),
                "block_size": int(spec.block_size),
            }
        )
    return {"layers": layers, "groups": groups, "num_blocks": int(getattr(cfg, "num_blocks", 0) or 0)}


def _params(n: int, logprobs: int | None = None, prompt_logprobs: int | None = None) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=logprobs, prompt_logprobs=prompt_logprobs
    )


def _gen(llm: Any, prompts: list[list[int]], params: Any) -> list[Any]:
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def _ids(rng: Any, vocab: int, n: int) -> list[int]:
    return [int(x) for x in rng.integers(10, vocab - 10, size=n)]


def _quality_windows(spec: dict[str, Any], model: str, vocab: int) -> tuple[str, list[list[int]]]:
    """The quality windows (``quality_prompt_tokens`` of context + ``quality_gen_tokens`` scored), with where they
    come from: real held-out text in the model's own tokenizer (:func:`fp8lab.longctx.documents.document_ids`, a different
    place of the document per window) where the model has one, else seeded random token ids (a dummy-weights or
    tokenizer-less model, where text means nothing)."""
    import numpy as np

    n, ctx, gen = spec["quality_prompts"], spec["quality_prompt_tokens"], spec["quality_gen_tokens"]
    try:
        from fp8lab.workloads import document_ids

        return "held-out text", [list(document_ids(model, ctx + gen, offset=40_009 * i)) for i in range(n)]
    except Exception:  # noqa: BLE001 - no tokenizer for this model: random ids, said so in the record
        rng = np.random.default_rng(spec["seed"] + 8)
        return "random token ids", [_ids(rng, vocab, ctx + gen) for _ in range(n)]


def _forced_params(cont: list[int]) -> Any:
    from vllm import SamplingParams

    from fp8lab.scoring import FORCED_KEY

    return SamplingParams(
        max_tokens=len(cont), temperature=0.0, ignore_eos=True, logprobs=1, extra_args={FORCED_KEY: list(cont)}
    )


def quality(llm: Any, spec: dict[str, Any], vocab: int, model: str = "") -> list[dict[str, Any]]:
    """Per quality window (context + continuation, :func:`_quality_windows`):

    - ``cache_logprobs`` / ``cache_top1``: the continuation forced token by token (:mod:`fp8lab.forcing`), so every
      scored position after the first is a decode step reading K/V back from the KV cache (the verdict's method,
      :mod:`fp8lab.scoring`); ``forced_ok`` whether the engine generated exactly the forced tokens;
    - ``prompt_logprobs`` / ``top1``: the whole window scored in one prefill (``prompt_logprobs``; whether that reads
      the cache depends on the backend: the gap between the two is this row's check of it);
    - ``greedy``: ``quality_gen_tokens`` greedy tokens after the context (divergence reads the cache everywhere)."""
    source, windows = _quality_windows(spec, model, vocab)
    ctx = spec["quality_prompt_tokens"]
    one = _gen(llm, windows, _params(1, prompt_logprobs=1))
    greedy = _gen(llm, [w[:ctx] for w in windows], _params(spec["quality_gen_tokens"]))
    forced = llm.generate(
        [{"prompt_token_ids": w[:ctx]} for w in windows], [_forced_params(w[ctx:]) for w in windows], use_tqdm=False
    )
    rows = []
    for i, (w, o, g, f) in enumerate(zip(windows, one, greedy, forced, strict=True)):
        lp, top1 = [], []
        for t, entry in zip(w[1:], (o.prompt_logprobs or [None])[1:], strict=False):
            if entry is None:
                continue
            lp.append(float(entry[t].logprob) if t in entry else None)
            top1.append(int(min(entry.items(), key=lambda kv: kv[1].rank)[0]))
        cont = w[ctx:]
        out = f.outputs[0]
        c_lp, c_top1 = [], []
        for t, entry in zip(cont, out.logprobs or [], strict=False):
            c_lp.append(float(entry[t].logprob) if t in entry else None)
            c_top1.append(int(min(entry.items(), key=lambda kv: kv[1].rank)[0]))
        rows.append(
            {
                "prompt": i,
                "source": source,
                "context_tokens": ctx,
                "greedy": list(g.outputs[0].token_ids),
                "prompt_logprobs": lp,
                "top1": top1,
                "cache_logprobs": c_lp,
                "cache_top1": c_top1,
                "forced_ok": list(out.token_ids) == list(cont),
            }
        )
    return rows


def prefix_full_pool(llm: Any, spec: dict[str, Any], vocab: int, num_blocks: int, block_size: int) -> dict[str, Any]:
    """Prefix-cache correctness with the block pool full: a prompt's greedy output computed cold, then served with a
    prefix hit in one batch with filler prompts that take the rest of the pool (about 95% of its blocks)."""
    import numpy as np

    rng = np.random.default_rng(spec["seed"] + 80)
    n_gen = spec["prefix_gen_tokens"]
    plen = min(spec["prefix_prompt_tokens"], max(block_size * 2, (num_blocks * block_size) // 4))
    p = _ids(rng, vocab, plen)
    llm.reset_prefix_cache()
    (cold,) = _gen(llm, [p], _params(n_gen, logprobs=1))
    free_tokens = int(0.95 * num_blocks * block_size) - plen - n_gen
    per = max(block_size, min(spec["max_model_len"] - n_gen - 1, free_tokens // 4 if free_tokens > 0 else block_size))
    fillers = [_ids(rng, vocab, per) for _ in range(max(1, free_tokens // (per + n_gen)))]
    hit, *_ = _gen(llm, [p, *fillers], _params(n_gen, logprobs=1))
    a, b = list(hit.outputs[0].token_ids), list(cold.outputs[0].token_ids)
    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    return {
        "prompt_tokens": plen,
        "fillers": len(fillers),
        "filler_tokens": per,
        "pool_tokens": num_blocks * block_size,
        "cached_tokens": int(hit.num_cached_tokens or 0),
        "tokens_equal": a == b,
        "first_diff": first,
    }


def decode_times(llm: Any, spec: dict[str, Any], vocab: int) -> list[dict[str, Any]]:
    """Decode step time at each context: ``(t(1 + k tokens) - t(1 token)) / k`` on the same prompt, cold each time
    (prefix cache reset), the median of ``decode_reps`` repetitions kept with every repetition."""
    import numpy as np

    rng = np.random.default_rng(spec["seed"] + 800)
    k = spec["decode_tokens"]
    rows = []
    for ctx in spec["decode_contexts"]:
        p = _ids(rng, vocab, ctx)
        reps = []
        for _ in range(spec["decode_reps"]):
            ts = []
            for n in (1, 1 + k):
                llm.reset_prefix_cache()
                t0 = time.perf_counter()
                _gen(llm, [p], _params(n))
                ts.append(time.perf_counter() - t0)
            reps.append((ts[1] - ts[0]) / k)
        rows.append({"context": ctx, "step_s": sorted(reps)[len(reps) // 2], "reps_s": reps})
    return rows


def measure(spec: dict[str, Any], row: dict[str, Any], out: Path, log: Path) -> dict[str, Any]:
    """Start the row's engine, probe and measure it; the row's record (never raises)."""
    from fp8lab.engine.result import classify_failure, root_cause
    from fp8lab.engine.worker import start_llm

    rec: dict[str, Any] = {**row}
    before = log.stat().st_size if log.exists() else 0
    extra: dict[str, Any] = {}
    if row["skip_layers"]:
        extra["kv_cache_dtype_skip_layers"] = list(row["skip_layers"])
    if "quality" in spec.get("measure", ("quality", "prefix", "decode")):
        from fp8lab.scoring import FORCING_FQCN

        extra["logits_processors"] = [FORCING_FQCN]  # forced decode: quality scored through the KV cache
    try:
        llm, facts = start_llm(row["engine"], log, extra)
    except BaseException as exc:  # noqa: BLE001 - a refusal is this row's result
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        text = log.read_text(errors="replace")[before:] if log.exists() else ""
        msg = f"{type(exc).__name__}: {exc}"
        cause = root_cause(text, msg)
        rec.update(status="refused", phase="start", cause=cause, failure=classify_failure(cause + "\n" + msg))
        return rec
    rec.update(status="started", engine_facts=facts)
    try:  # what the engine reports about itself; a vLLM whose objects differ leaves the probe out, not the row
        probe = llm.collective_rpc(engine_probe)
        rec["probe"] = probe[0] if probe else None
    except Exception as exc:  # noqa: BLE001
        rec["probe_error"] = f"{type(exc).__name__}: {exc}"
    try:
        vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
        todo = spec.get("measure", ("quality", "prefix", "decode"))
        if "quality" in todo:
            rec["phase"] = "quality"
            rec["quality"] = quality(llm, spec, vocab, row["engine"]["model"])
        if "prefix" in todo:
            rec["phase"] = "prefix"
            rec["prefix"] = prefix_full_pool(llm, spec, vocab, facts["num_blocks"], facts["block_size"])
        if "decode" in todo:
            rec["phase"] = "decode"
            rec["decode"] = decode_times(llm, spec, vocab)
        rec["phase"] = "done"
    except BaseException as exc:  # noqa: BLE001 - a crash mid-run is recorded with where it happened
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        text = log.read_text(errors="replace")[before:] if log.exists() else ""
        rec.update(status="crashed", cause=root_cause(text, f"{type(exc).__name__}: {exc}"))
    return rec


def worker_main(spec: dict[str, Any], row: dict[str, Any], out_dir: str, log_path: str) -> None:
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # the caller kills the whole tree (engine core, workers) by process group
    out = Path(out_dir)
    t0 = time.perf_counter()
    rec = measure(spec, row, out, Path(log_path))
    rec["wall_s"] = time.perf_counter() - t0
    path = out / "rows" / f"{row['label']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, default=str))
    os.replace(tmp, path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # an engine core that hangs on shutdown does not hold the row


def entry(log_path: str, env: dict[str, str], spec: dict[str, Any], row: dict[str, Any], out_dir: str) -> None:
    """Spawn target: :func:`fp8lab.engine.worker.prepare_worker` (log, environment), then the row."""
    from fp8lab.engine.worker import prepare_worker

    prepare_worker(log_path, {**env, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"})
    worker_main(spec, row, out_dir, log_path)
