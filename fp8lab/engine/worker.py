"""The code that runs inside the isolated worker process: build one vLLM engine, run its phases.

Only :mod:`fp8lab.engine.run` calls :func:`worker_main`, in a freshly spawned process whose stdout and
stderr go to the run's ``worker.log`` (the engine's own child processes inherit them, so the root
cause of a failed start lands there too). Results are written to ``result.pkl`` after engine start
and again after every phase, so a run that dies keeps whatever it had measured.

vLLM, torch and pynvml are imported here and nowhere in the caller's process.
"""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import re
import select
import signal
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from fp8lab.engine import devices
from fp8lab.engine.procs import caller_pid, core_from_forkserver
from fp8lab.scoring import FORCED_KEY, FORCING_FQCN


def _write(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(payload, f)
    os.replace(tmp, path)


def engine_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        model=spec["model"],
        kv_cache_dtype=spec["kv_cache_dtype"],
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        enforce_eager=spec["enforce_eager"],
        load_format=spec["load_format"],
        tensor_parallel_size=spec["tensor_parallel_size"],
        dtype=spec["dtype"],
        seed=spec["seed"],
        enable_prefix_caching=spec["enable_prefix_caching"],
        skip_tokenizer_init=spec["skip_tokenizer_init"],
        disable_log_stats=False,
        max_logprobs=20,
    )
    for key in ("block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "attention_backend"):
        if spec.get(key) is not None:
            kw[key] = spec[key]
    if spec.get("kv_cache_gib") is not None:
        kw["kv_cache_memory_bytes"] = int(spec["kv_cache_gib"] * 2**30)
    if spec.get("calculate_kv_scales"):  # only when asked: vLLM 0.32 no longer accepts the argument
        kw["calculate_kv_scales"] = True
    return kw


#: How vLLM logs the attention backend it picked (:func:`start_llm`).
BACKEND_RE = re.compile(r"Using ([\w.]+) (?:attention )?backend")


def start_llm(spec: dict[str, Any], log_path: Path, extra: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Build an offline ``LLM`` for ``spec`` (its :func:`engine_kwargs` with ``extra`` on top) in this worker and
    return it with the facts every study records of an engine start: its KV blocks and dtype, limits, attention
    backend (from the part of ``log_path`` this start wrote), engine-core layout and memory after the start.
    The studies whose workers keep engines of their own (decode, prefix, dtypes) start them here."""
    before = log_path.stat().st_size if log_path.exists() else 0
    facts: dict[str, Any] = {"kv_cache_dtype_requested": spec["kv_cache_dtype"]}
    t0 = time.perf_counter()
    from vllm import LLM

    llm = LLM(**{**engine_kwargs(spec), **extra})
    facts["engine_start_s"] = time.perf_counter() - t0
    vcfg = llm.llm_engine.vllm_config
    cc = vcfg.cache_config
    facts.update(
        num_blocks=int(cc.num_gpu_blocks or 0),
        block_size=int(cc.block_size),
        kv_cache_dtype=str(cc.cache_dtype),
        max_model_len=int(vcfg.model_config.max_model_len),
        max_num_seqs=int(vcfg.scheduler_config.max_num_seqs),
        max_num_batched_tokens=int(vcfg.scheduler_config.max_num_batched_tokens),
        cuda_graphs=not bool(vcfg.model_config.enforce_eager),
        engine_core=devices.engine_core_layout(),
    )
    facts["kv_capacity_tokens"] = facts["num_blocks"] * facts["block_size"]
    sys.stdout.flush()
    sys.stderr.flush()
    text = log_path.read_text(errors="replace")[before:] if log_path.exists() else ""
    facts["attention_backend"] = sorted(set(BACKEND_RE.findall(text))) or silent_backend(spec, vcfg)
    probe = devices.MemoryProbe(tensor_parallel_size=spec["tensor_parallel_size"])
    facts["mem_kind"] = probe.kind
    facts["mem_per_device_after_start_bytes"] = probe.per_device_used()
    facts["mem_after_start_bytes"] = probe.used_bytes()
    return llm, facts


def silent_backend(spec: dict[str, Any], vcfg: Any) -> list[str] | None:
    """The attention backend of a platform that selects it without logging it: vLLM's CPU platform returns
    ``CPU_ATTN`` for every non-MLA model silently (``vllm/platforms/cpu.py``, ``get_attn_backend_cls``), so
    its own selector is asked with this engine's model. ``None`` where that is not possible."""
    try:
        from types import SimpleNamespace

        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        if not current_platform.is_cpu():
            return None
        asked = spec.get("attention_backend")
        path = current_platform.get_attn_backend_cls(
            AttentionBackendEnum[asked] if asked else None,
            attn_selector_config=SimpleNamespace(use_sparse=False, use_mla=bool(vcfg.model_config.use_mla)),
        )
        names = []
        for e in AttentionBackendEnum:
            try:
                if e.get_path() == path:
                    names.append(e.name)
            except Exception:  # noqa: BLE001 - a member without a path in this build
                continue
        return names or [str(path).rsplit(".", 1)[-1]]
    except Exception:  # noqa: BLE001 - the fact is optional; the engine ran
        return None


def stop_llm(llm: Any) -> None:
    """Shut an engine of :func:`start_llm` down in this worker and free it."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()


def settle_heap() -> None:
    """In a worker that starts engines one set after another, with none alive: collect what the last set left, then
    freeze what survives (the worker's own state, the modules vLLM imported on its first start) out of the garbage
    collector's reach. vLLM calls ``gc.collect`` five times per engine start; over a heap that already held an engine
    those took about 1.2 s of a 2.1 s CPU start of the tiny model, which took 0.4-1.1 s once frozen. Only objects
    alive now are frozen, never an engine of the coming set, so stopping that engine still frees all of it; the caller
    drops every reference to the last set's engines first (a loop variable included). On a CPU only: a GPU engine
    start is dominated by other work, and GPU memory must never be held by a reference frozen by mistake."""
    gc.collect()
    if devices.cpu_layout():
        gc.freeze()


class Sampler:
    """Samples vLLM's gauges (KV usage, running/waiting requests) and device memory in a thread.

    Rows: ``t_s`` (seconds since the sampler started), ``phase``, ``kv_usage`` (fraction 0..1),
    ``running``, ``waiting``, ``mem_bytes`` (GPU used memory summed over the engine's devices, or the
    RSS of this process tree on CPU).
    """

    def __init__(self, interval_s: float, mem: devices.MemoryProbe):
        self.interval_s, self.mem, self.rows, self.phase = interval_s, mem, [], "start"
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "t_s": time.perf_counter() - self._t0,
            "phase": self.phase,
            "mem_bytes": self.mem.used_bytes(),
        }
        row.update(read_gauges())
        self.rows.append(row)
        return row

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # a failed sample must not kill the run
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def read_gauges() -> dict[str, float]:
    """vLLM's Prometheus gauges and counters of interest, summed over engines/labels."""
    from vllm.v1.metrics.reader import Counter, Gauge, get_metrics_snapshot

    names = {
        "vllm:kv_cache_usage_perc": "kv_usage",
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
        "vllm:num_preemptions": "preemptions_total",
    }
    out: dict[str, float] = {}
    for m in get_metrics_snapshot():
        key = names.get(m.name)
        if key and isinstance(m, (Gauge, Counter)):
            out[key] = out.get(key, 0.0) + float(m.value)
    return out


def _logprob_columns(entries: Any, token_ids: list[int], prefix: str, k: int) -> dict[str, Any]:
    """Flatten vLLM's per-position ``{token_id: Logprob}`` dicts into lists.

    ``<prefix>_token_logprobs[i]``: logprob of the actual token at position i (NaN where absent,
    e.g. the first prompt token); ``<prefix>_topk_ids[i]`` / ``_topk_logprobs[i]``: the top-k by rank.
    """
    tok_lp, top_ids, top_lps = [], [], []
    for i, pos in enumerate(entries or []):
        if pos is None:
            tok_lp.append(float("nan"))
            top_ids.append([])
            top_lps.append([])
            continue
        actual = token_ids[i] if i < len(token_ids) else None
        tok_lp.append(float(pos[actual].logprob) if actual in pos else float("nan"))
        ranked = sorted(((lp.rank if lp.rank is not None else 10**9, tid, lp.logprob) for tid, lp in pos.items()))
        ranked = [r for r in ranked if r[0] <= k][:k] if k else []
        top_ids.append([int(r[1]) for r in ranked])
        top_lps.append([float(r[2]) for r in ranked])
    return {f"{prefix}_token_logprobs": tok_lp, f"{prefix}_topk_ids": top_ids, f"{prefix}_topk_logprobs": top_lps}


def _sampling_params(req: dict[str, Any], stream: bool = False, final_only: bool = False):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    kw: dict[str, Any] = dict(
        temperature=float(req.get("temperature", 0.0)),  # 0: greedy
        max_tokens=req["max_tokens"],
        ignore_eos=not req["stop_at_eos"],
        detokenize=False,
    )
    if req["prompt_logprobs"] is not None:
        kw["prompt_logprobs"] = req["prompt_logprobs"]
    if req["logprobs"] is not None:
        kw["logprobs"] = req["logprobs"]
    if req.get("forced_token_ids"):  # scoring through the cache: fp8lab.forcing generates exactly these tokens
        kw["extra_args"] = {FORCED_KEY: [int(t) for t in req["forced_token_ids"]]}
    if stream:
        kw["output_kind"] = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA
    return SamplingParams(**kw)


def _record(idx: int, req: dict[str, Any], out: Any, phase: str) -> dict[str, Any]:
    """One tidy row per finished request, from vLLM's own per-request stats.

    TTFT = ``first_token_latency`` (front-end time minus arrival); TPOT = mean of the decode gaps,
    ``(last_token_ts - first_token_ts) / (n - 1)``, which excludes the first token; E2E = TTFT +
    (last - first). All in seconds. See vllm-notes section 1.
    """
    comp = out.outputs[0]
    m = out.metrics
    n = len(comp.token_ids)
    row: dict[str, Any] = {
        "phase": phase,
        "request": idx,
        "cls": req["cls"],
        "tag": req["tag"],
        "prompt_tokens": len(req["prompt_token_ids"]),
        "output_tokens": n,
        "finish_reason": comp.finish_reason,
        "output_token_ids": [int(t) for t in comp.token_ids],
    }
    if m is not None:
        ttft = float(m.first_token_latency)
        decode = float(m.last_token_ts - m.first_token_ts)
        row.update(
            ttft_s=ttft,
            tpot_s=decode / (n - 1) if n > 1 else float("nan"),
            e2e_s=ttft + decode,
            queue_s=float(m.scheduled_ts - m.queued_ts),
            num_preemptions=int(getattr(m, "num_preemptions", 0)),
        )
    if req["prompt_logprobs"] is not None:
        row.update(
            _logprob_columns(out.prompt_logprobs, list(req["prompt_token_ids"]), "prompt", req["prompt_logprobs"])
        )
    if req["logprobs"] is not None:
        row.update(_logprob_columns(comp.logprobs, row["output_token_ids"], "output", req["logprobs"]))
    if req.get("forced_token_ids"):
        row.update(_forced_columns(req, row["output_token_ids"]))
    return row


def _forced_columns(req: dict[str, Any], output_ids: list[int]) -> dict[str, Any]:
    """``forced_token_ids`` (what was asked) and ``forced_ok`` (the engine generated exactly those: the forcing
    worked, so ``output_token_logprobs`` are the forced tokens' scores)."""
    forced = [int(t) for t in req["forced_token_ids"]]
    return {"forced_token_ids": forced, "forced_ok": [int(t) for t in output_ids] == forced}


def needs_forcing(phases: list[dict[str, Any]]) -> bool:
    """Whether any request forces its output (then the engine gets fp8lab's logits processor; only then, because
    vLLM 0.26 runs engines with custom logits processors on its V1 model runner: fp8lab.forcing)."""
    return any(r.get("forced_token_ids") for p in phases for r in p["requests"])


def _tokens_prompt(req: dict[str, Any]):
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(req["prompt_token_ids"]))


# --------------------------------------------------------------------------------------------- drivers
def _run_offline(llm: Any, phase: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    reqs = phase["requests"]
    t0 = time.perf_counter()
    outs = llm.generate([_tokens_prompt(r) for r in reqs], [_sampling_params(r) for r in reqs], use_tqdm=False)
    wall = time.perf_counter() - t0
    # LLM.generate returns outputs in the order of its inputs.
    return [_record(i, r, o, phase["name"]) for i, (r, o) in enumerate(zip(reqs, outs, strict=True))], wall


async def _stream_one(
    engine: Any,
    idx: int,
    req: dict[str, Any],
    phase: str,
    t_start: float,
    rid: str,
    tally: dict[str, list] | None = None,
) -> dict:
    """Send one request and timestamp every streamed delta (client-side, ``time.perf_counter``).
    ``tally`` (sustained phases): every delta's ``(time, tokens)`` goes to ``tally["tokens"]`` and the
    prompt length of each request at its first token to ``tally["prefilled"]``, so a phase cut at a
    deadline counts what was produced before it, also by requests still in flight."""
    sent = time.perf_counter()
    token_times: list[float] = []
    token_counts: list[int] = []
    token_ids: list[int] = []
    prompt_lp, output_lp = None, []  # DELTA mode: prompt logprobs come once, at the end of prefill
    final = None
    async for out in engine.generate(_tokens_prompt(req), _sampling_params(req, stream=True), rid):
        now = time.perf_counter()
        k = len(out.outputs[0].token_ids)
        if k:
            if tally is not None:
                tally["tokens"].append((now, k))
                if not token_times:
                    tally["prefilled"].append((now, len(req["prompt_token_ids"])))
            token_times.append(now)
            token_counts.append(k)
            token_ids.extend(int(t) for t in out.outputs[0].token_ids)
        if prompt_lp is None and out.prompt_logprobs:
            prompt_lp = out.prompt_logprobs
        output_lp.extend(out.outputs[0].logprobs or [])
        final = out
    row: dict[str, Any] = {
        "phase": phase,
        "request": idx,
        "cls": req["cls"],
        "tag": req["tag"],
        "prompt_tokens": len(req["prompt_token_ids"]),
        "sent_s": sent - t_start,
    }
    n = sum(token_counts)
    row["output_tokens"] = n
    row["finish_reason"] = final.outputs[0].finish_reason if final is not None else None
    row["output_token_ids"] = token_ids
    if req["prompt_logprobs"] is not None:
        row.update(_logprob_columns(prompt_lp, list(req["prompt_token_ids"]), "prompt", req["prompt_logprobs"]))
    if req["logprobs"] is not None:
        row.update(_logprob_columns(output_lp, token_ids, "output", req["logprobs"]))
    if req.get("forced_token_ids"):
        row.update(_forced_columns(req, token_ids))
    if token_times:
        # client-observed: TTFT from send to first delta; ITL between consecutive deltas, a delta of k
        # tokens (merged when the consumer lags) counts as k gaps of equal size.
        itl: list[float] = []
        for prev, cur, k in zip(token_times, token_times[1:], token_counts[1:], strict=False):
            itl.extend([(cur - prev) / k] * k)
        row.update(
            ttft_s=token_times[0] - sent,
            e2e_s=token_times[-1] - sent,
            itl_s=itl,
            tpot_s=(token_times[-1] - token_times[0]) / (n - 1) if n > 1 else float("nan"),
            merged_deltas=sum(1 for k in token_counts if k > 1),
        )
    m = getattr(final, "metrics", None) if final is not None else None
    if m is not None:
        row["engine_ttft_s"] = float(m.first_token_latency)
        row["num_preemptions"] = int(getattr(m, "num_preemptions", 0))
    return row


async def _final_one(engine: Any, idx: int, req: dict[str, Any], phase: str, t_start: float, rid: str) -> dict:
    """Send one request and wait for its final output only (the benchmark that does not read the stream):
    E2E is seen by the client, TTFT and ITL are not (NaN); the engine's own TTFT is kept beside."""
    sent = time.perf_counter()
    final = None
    async for out in engine.generate(_tokens_prompt(req), _sampling_params(req, stream=True, final_only=True), rid):
        final = out
    done = time.perf_counter()
    comp = final.outputs[0] if final is not None else None
    row: dict[str, Any] = {
        "phase": phase,
        "request": idx,
        "cls": req["cls"],
        "tag": req["tag"],
        "prompt_tokens": len(req["prompt_token_ids"]),
        "sent_s": sent - t_start,
        "output_tokens": len(comp.token_ids) if comp is not None else 0,
        "finish_reason": comp.finish_reason if comp is not None else None,
        "output_token_ids": [int(t) for t in comp.token_ids] if comp is not None else [],
        "ttft_s": float("nan"),
        "tpot_s": float("nan"),
        "e2e_s": done - sent,
    }
    m = getattr(final, "metrics", None) if final is not None else None
    if m is not None:
        row["engine_ttft_s"] = float(m.first_token_latency)
        row["num_preemptions"] = int(getattr(m, "num_preemptions", 0))
    return row


async def run_stream(engine: Any, phase: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """Open loop (each request sent at its ``arrival_s``, whether or not earlier ones finished) or,
    with ``concurrency`` set, closed loop (at most N requests in flight, the next sent as one ends)."""
    reqs = phase["requests"]
    t0 = time.perf_counter()
    prefix = f"{phase['name']}-{time.time_ns()}"
    conc = phase.get("concurrency")
    if conc and phase.get("min_seconds") is not None:
        return await _run_sustained(engine, phase, t0, prefix)
    if conc:
        queue = list(enumerate(reqs))
        rows: list[dict[str, Any]] = []
        one = _final_one if phase.get("client", "stream") == "final" else _stream_one

        async def worker() -> None:
            while queue:
                i, r = queue.pop(0)
                rows.append(await one(engine, i, r, phase["name"], t0, f"{prefix}-{i}"))

        await asyncio.gather(*(worker() for _ in range(conc)))
    else:

        async def delayed(i: int, r: dict[str, Any]) -> dict[str, Any]:
            delay = (r["arrival_s"] or 0.0) - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            return await _stream_one(engine, i, r, phase["name"], t0, f"{prefix}-{i}")

        rows = list(await asyncio.gather(*(delayed(i, r) for i, r in enumerate(reqs))))
    wall = time.perf_counter() - t0
    return sorted(rows, key=lambda r: r["request"]), wall


async def _run_sustained(
    engine: Any, phase: dict[str, Any], t0: float, prefix: str
) -> tuple[list[dict[str, Any]], float]:
    """A sustained closed loop: ``concurrency`` workers take requests from the phase's pool in turn (the pool
    repeats) until at least ``min_requests`` have finished **and** ``min_seconds`` have passed; then the
    requests still in flight are cancelled (vLLM aborts them), so the phase ends at its deadline with the
    concurrency held to the end. The phase's figures (``window``) are what the engine produced up to that
    moment: tokens streamed before it, over its length; the rows are the requests that finished."""
    pool, conc = phase["requests"], int(phase["concurrency"])
    min_s, min_n = float(phase["min_seconds"]), int(phase.get("min_requests") or 0)
    tally: dict[str, list] = {"tokens": [], "prefilled": []}
    rows: list[dict[str, Any]] = []
    counter = iter(range(10**9))
    stop = asyncio.Event()

    async def worker() -> None:
        while not stop.is_set():
            i = next(counter)
            row = await _stream_one(engine, i, pool[i % len(pool)], phase["name"], t0, f"{prefix}-{i}", tally)
            row["pool_index"] = i % len(pool)
            rows.append(row)

    tasks = [asyncio.ensure_future(worker()) for _ in range(conc)]
    while not (time.perf_counter() - t0 >= min_s and len(rows) >= min_n) and not any(t.done() for t in tasks):
        await asyncio.sleep(0.02)
    t_stop = time.perf_counter()
    stop.set()
    for t in tasks:
        t.cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [e for e in done if isinstance(e, BaseException) and not isinstance(e, asyncio.CancelledError)]
    if errors:
        raise errors[0]
    window = t_stop - t0
    phase["window"] = {
        "window_s": window,
        "output_tokens": int(sum(k for t, k in tally["tokens"] if t <= t_stop)),
        "prompt_tokens": int(sum(n for t, n in tally["prefilled"] if t <= t_stop)),
        "issued": int(next(counter)),
        "finished": len(rows),
    }
    return sorted(rows, key=lambda r: r["request"]), window


def engine_facts(vcfg: Any, mem: devices.MemoryProbe, async_engine: bool = False) -> dict[str, Any]:
    """What a started engine reports about itself: KV blocks, block size, capacity, budget, limits, memory."""
    e: dict[str, Any] = {}
    cc = vcfg.cache_config
    e["num_blocks"] = int(cc.num_gpu_blocks or 0)
    e["block_size"] = int(cc.block_size)
    e["kv_capacity_tokens"] = e["num_blocks"] * e["block_size"]
    e["kv_cache_dtype"] = str(cc.cache_dtype)
    e["kv_budget_bytes"] = getattr(cc, "kv_cache_memory_bytes", None)
    e["max_model_len"] = int(vcfg.model_config.max_model_len)
    e["max_num_seqs"] = int(vcfg.scheduler_config.max_num_seqs)
    e["max_num_batched_tokens"] = int(vcfg.scheduler_config.max_num_batched_tokens)
    e["hybrid_kv_cache_manager"] = not bool(getattr(vcfg.scheduler_config, "disable_hybrid_kv_cache_manager", False))
    e["kv_cache_size_tokens_vllm"] = getattr(cc, "kv_cache_size_tokens", None)
    e["cuda_graphs"] = not bool(vcfg.model_config.enforce_eager)
    e["engine_core"] = devices.engine_core_layout(async_engine)
    try:  # vLLM 0.26 (CUDA): the V2 model runner unless something it lacks (e.g. custom logits processors) is on
        e["model_runner_v2"] = bool(vcfg.use_v2_model_runner)
    except Exception:  # noqa: BLE001 - a version without the property
        e["model_runner_v2"] = None
    e["mem_after_start_bytes"] = mem.used_bytes()
    e["mem_per_device_after_start_bytes"] = mem.per_device_used()  # one entry per GPU of the run
    return e


# --------------------------------------------------------------------------------------------- main
def worker_main(spec: dict[str, Any], phases: list[dict[str, Any]], options: dict[str, Any], result_path: str) -> None:
    """Entry point of the spawned worker. Never raises: failures are written to the result file."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # so the caller can kill the whole engine tree by process group
    path = Path(result_path)
    res: dict[str, Any] = {
        "status": "running",
        "error": None,
        "engine": {},
        "records": [],
        "samples": [],
        "phases": {},
        "provenance": {},
    }
    mem = devices.MemoryProbe(tensor_parallel_size=spec["tensor_parallel_size"])
    res["engine"]["mem_kind"] = mem.kind
    res["engine"]["mem_baseline_bytes"] = mem.used_bytes()
    sampler = Sampler(options.get("sample_interval_s", 0.25), mem).start()
    llm = engine = None
    try:
        res["provenance"] = devices.provenance(seed=spec["seed"])
        _write(path, res)
        kw = engine_kwargs(spec)
        if needs_forcing(phases):
            kw["logits_processors"] = [FORCING_FQCN]
        t0 = time.perf_counter()
        if options.get("driver", "llm") == "async":
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            res["engine"]["engine_core_start"] = core_from_forkserver()
            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
            vcfg = engine.vllm_config
        else:
            from vllm import LLM

            llm = LLM(**kw)
            vcfg = llm.llm_engine.vllm_config
        e = res["engine"]
        e["engine_start_s"] = time.perf_counter() - t0
        e.update(engine_facts(vcfg, mem, async_engine=engine is not None))
        e["forced_decode"] = "logits_processors" in kw
        _write(path, res)

        loop = asyncio.new_event_loop() if engine is not None else None
        for phase in phases:
            sampler.phase = phase["name"]
            before = read_gauges().get("preemptions_total", 0.0)
            if engine is not None:
                rows, wall = loop.run_until_complete(run_stream(engine, phase))
            else:
                rows, wall = _run_offline(llm, phase)
            snap = sampler.sample()
            ptoks = sum(r["prompt_tokens"] for r in rows)
            otoks = sum(r["output_tokens"] for r in rows)
            phase_samples = [s for s in sampler.rows if s["phase"] == phase["name"]]
            res["phases"][phase["name"]] = {
                "wall_s": wall,
                "requests": len(rows),
                "prompt_tokens": ptoks,
                "output_tokens": otoks,
                "preemptions": snap.get("preemptions_total", 0.0) - before,
                "kv_usage_peak": max((s.get("kv_usage", 0.0) for s in phase_samples), default=float("nan")),
                "mem_peak_bytes": max(
                    (s["mem_bytes"] for s in phase_samples if s["mem_bytes"] is not None), default=None
                ),
            }
            res["records"].extend(rows)
            res["samples"] = list(sampler.rows)
            _write(path, res)
        mems = [s["mem_bytes"] for s in sampler.rows if s["mem_bytes"] is not None]
        busy = [s["mem_bytes"] for s in sampler.rows if s["mem_bytes"] is not None and s["phase"] != "start"]
        e["mem_peak_bytes"] = max(mems) if mems else None
        # steady state: the median while phases ran (after start-up), else the figure right after start
        e["mem_steady_bytes"] = statistics.median(busy) if busy else e.get("mem_after_start_bytes")
        e["preemptions_total"] = read_gauges().get("preemptions_total", 0.0)
        res["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a record
        res["status"] = "error"
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()
        print(res["traceback"], file=sys.stderr, flush=True)
    finally:
        sampler.stop()
        res["samples"] = list(sampler.rows)
        _write(path, res)
        try:
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()
            if engine is not None:
                engine.shutdown()
        except Exception:
            pass
        del llm, engine
        gc.collect()
        sys.stdout.flush()
        sys.stderr.flush()


def _die_with_parent(parent: int, interval_s: float = 0.5) -> None:
    """Kill this worker's process group (the engine and its children) once ``parent`` is gone: a caller killed
    by SIGKILL cannot clean up, and an orphaned engine would hold memory and devices until it finished. ``parent``
    is the process that started this worker (:func:`fp8lab.engine.run.caller_pid`): this process's parent when it was
    spawned, else the caller of a forkserver (which may be shared and outlive it), watched through a pidfd."""
    pidfd: int | None = None
    if parent != os.getppid():
        try:
            pidfd = os.pidfd_open(parent)
        except ProcessLookupError:  # gone already
            pidfd = -1
        except (OSError, AttributeError):  # no pidfd here: poll the pid instead
            pidfd = None

    def alive() -> bool:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return False
        except OSError:  # exists, not ours to signal
            pass
        return True

    def watch() -> None:
        if pidfd is not None and pidfd >= 0:
            select.select([pidfd], [], [])  # readable once the process exits
        elif pidfd is None and parent == os.getppid():
            while os.getppid() == parent:
                time.sleep(interval_s)
        elif pidfd is None:
            while alive():
                time.sleep(interval_s)
        try:  # children that left the group too
            import psutil

            for child in psutil.Process().children(recursive=True):
                child.kill()
        except Exception:  # noqa: BLE001 - the group kill below still runs
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="fp8lab-parent-watch", daemon=True).start()


def prepare_worker(log_path: str, env: dict[str, Any]) -> None:
    """First steps of every spawned engine worker, before vLLM is imported: this process's (and its children's)
    stdout/stderr go to ``log_path``; the spec's ``kv_cache_gib`` is the one KV budget (``VLLM_CPU_KVCACHE_SPACE``
    dropped); :func:`fp8lab.engine.devices.engine_env` (vLLM's process layout on a CPU), then ``env`` on top."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    os.environ.update(devices.engine_env())
    os.environ.update({k: str(v) for k, v in env.items()})


def entry(
    log_path: str, spec: dict[str, Any], phases: list[dict[str, Any]], options: dict[str, Any], result_path: str
) -> None:
    """Spawn target: :func:`prepare_worker`, then one engine runs every phase."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # so the caller can kill the whole engine tree by process group
        _die_with_parent(caller_pid())
    prepare_worker(log_path, options.get("env", {}))
    worker_main(spec, phases, options, result_path)
