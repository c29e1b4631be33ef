"""Inside Study 01's paired design: one spawned process per KV dtype keeps its engine alive for the whole
study and serves phases on command, so the dtypes' phases can be interleaved (A B, B A, ...) in time.

Only :mod:`fp8lab.serving` starts this (``spawn``; stdout/stderr go to the engine's worker log). Each engine
lives in its own process (unlike :mod:`fp8lab.decode.worker`, which holds two offline ``LLM`` objects in
one), because vLLM's Prometheus gauges (KV usage, preemptions) are process-global: a second ``AsyncLLM`` in
the same process would unregister the first one's. Only one engine runs a phase at a time; the other waits
idle with its KV cache allocated.

Protocol over the pipe: the worker sends ``{"status": "ready", "engine": facts, "provenance": ...}`` (or
``{"status": "error", "error": ..., "traceback": ...}`` and exits); then for each phase dict it receives
(:mod:`fp8lab.engine.worker`'s phase payload, optionally with ``min_seconds`` / ``min_requests``), it
replies ``{"status": "ok", "rows", "stats", "samples"}`` or ``{"status": "error", ...}``; ``None`` stops it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
import traceback
from typing import Any

from fp8lab.engine import devices


def serve(spec: dict[str, Any], options: dict[str, Any], conn: Any) -> None:
    from fp8lab.engine import worker as ew

    if hasattr(os, "setpgrp"):
        os.setpgrp()  # the caller kills the whole tree (engine core, workers) by process group
    mem = devices.MemoryProbe(tensor_parallel_size=spec["tensor_parallel_size"])
    base = mem.used_bytes()
    sampler = ew.Sampler(options.get("sample_interval_s", 0.25), mem).start()
    engine = None
    try:
        prov = devices.provenance(seed=spec["seed"])
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from fp8lab.engine.procs import core_from_forkserver

        core_start = core_from_forkserver()
        t0 = time.perf_counter()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**ew.engine_kwargs(spec)))
        facts = {
            "engine_start_s": time.perf_counter() - t0,
            "engine_core_start": core_start,
            "mem_kind": mem.kind,
            "mem_baseline_bytes": base,
            **ew.engine_facts(engine.vllm_config, mem, async_engine=True),
        }
        conn.send({"status": "ready", "engine": facts, "provenance": prov})
    except BaseException as exc:  # noqa: BLE001 - a failed start is a record
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        conn.send({"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        sampler.stop()
        return
    loop = asyncio.new_event_loop()
    try:
        while True:
            phase = conn.recv()
            if phase is None:
                break
            key = phase.get("key", phase["name"])
            try:
                sampler.phase = key
                before = ew.read_gauges().get("preemptions_total", 0.0)
                rows, wall = loop.run_until_complete(ew.run_stream(engine, phase))
                snap = sampler.sample()
                samples = [s for s in sampler.rows if s["phase"] == key]
                win = phase.get("window")
                stats = {
                    "wall_s": wall,
                    "requests": len(rows),
                    "prompt_tokens": win["prompt_tokens"] if win else sum(r["prompt_tokens"] for r in rows),
                    "output_tokens": win["output_tokens"] if win else sum(r["output_tokens"] for r in rows),
                    "preemptions": snap.get("preemptions_total", 0.0) - before,
                    "kv_usage_peak": max((s.get("kv_usage", 0.0) for s in samples), default=float("nan")),
                    "mem_peak_bytes": max(
                        (s["mem_bytes"] for s in samples if s["mem_bytes"] is not None), default=None
                    ),
                }
                if win:
                    stats.update(
                        sustained=True, issued=win["issued"], cancelled_in_flight=win["issued"] - win["finished"]
                    )
                sampler.rows = [s for s in sampler.rows if s["phase"] != key]  # sent: keep the process small
                for r in rows:
                    r.pop("output_token_ids", None)  # not read by the serving study; large
                conn.send({"status": "ok", "rows": rows, "stats": stats, "samples": samples})
            except BaseException as exc:  # noqa: BLE001 - the caller decides whether this engine goes on
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                conn.send(
                    {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                )
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        sampler.stop()
        try:
            engine.shutdown()
        except Exception:
            pass
        del engine
        gc.collect()
        sys.stdout.flush()
        sys.stderr.flush()


def entry(log_path: str, env: dict[str, str], spec: dict[str, Any], options: dict[str, Any], conn: Any) -> None:
    """Spawn target: :func:`fp8lab.engine.worker.prepare_worker` (log, environment), then the worker."""
    from fp8lab.engine.worker import prepare_worker

    prepare_worker(log_path, env)
    serve(spec, options, conn)
