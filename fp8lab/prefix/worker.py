"""Inside Study 07's spawned worker: one engine per KV dtype (prefix caching on) serves the whole sweep.

Only :mod:`fp8lab.prefix` starts this, in a fresh ``spawn`` process whose stdout/stderr go to the run's
``worker.log``. With ``concurrent_engines`` both engines are alive at once and the dtypes alternate within each
cell pair (AB, BA, ...); otherwise they run one after the other.

Hit counts: vLLM's scheduler reports per step ``prefix_cache_stats`` (queries and hits, in tokens), which its
Prometheus logger adds to ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``. Two engines in one process
share one Prometheus registry and the second unregisters the first's collectors (vllm-notes section 2), so the
worker taps the same per-step figures where the engine hands them to its loggers (``logger_manager.record``)
and sums them per turn, with the preempted requests and the peak ``kv_cache_usage`` of the same steps.

Each cell's rows are appended to ``rows.jsonl`` (flushed and synced) when the cell ends: a worker that dies keeps
every finished cell, and a rerun skips them.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _append(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


class _Tap:
    """Sums the scheduler's prefix-cache stats, preemptions and peak KV usage between two ``take()`` calls."""

    def __init__(self, llm: Any):
        self.q = self.h = self.pq = self.ph = self.preempted = 0
        self.kv_max = 0.0
        mgr = llm.llm_engine.logger_manager
        if mgr is None:
            raise RuntimeError("vLLM stats are off (disable_log_stats): no prefix-cache counters to read")
        orig = mgr.record

        def record(scheduler_stats: Any, iteration_stats: Any, *a: Any, **kw: Any) -> Any:
            if scheduler_stats is not None:
                pc = scheduler_stats.prefix_cache_stats
                if pc is not None:
                    self.q += int(pc.queries)
                    self.h += int(pc.hits)
                    self.pq += int(getattr(pc, "preempted_queries", 0))
                    self.ph += int(getattr(pc, "preempted_hits", 0))
                self.kv_max = max(self.kv_max, float(scheduler_stats.kv_cache_usage))
            if iteration_stats is not None:
                self.preempted += int(getattr(iteration_stats, "num_preempted_reqs", 0))
            return orig(scheduler_stats, iteration_stats, *a, **kw)

        mgr.record = record

    def take(self) -> dict[str, Any]:
        out = {
            "queries": self.q,
            "hits": self.h,
            "preempted_queries": self.pq,
            "preempted_hits": self.ph,
            "preemptions": self.preempted,
            "kv_usage_max": self.kv_max,
        }
        self.q = self.h = self.pq = self.ph = self.preempted = 0
        self.kv_max = 0.0
        return out


def _params(n: int, logprobs: int | None = None) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False, logprobs=logprobs)


def _generate(llm: Any, prompts: list[list[int]], n: int, logprobs: int | None = None) -> tuple[list[Any], float]:
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], _params(n, logprobs), use_tqdm=False)
    return outs, time.perf_counter() - t0


def _prompt(conv: dict[str, Any], answers: list[list[int]], turn: int) -> list[int]:
    ids = list(conv["shared"]) + list(conv["private"])
    for t in range(turn):
        ids += list(conv["users"][t]) + list(answers[t])
    return ids + list(conv["users"][turn])


def run_cell(llm: Any, tap: _Tap, shape: Any, convs: list[dict[str, Any]], in_flight: int) -> list[dict[str, Any]]:
    """Serve ``convs`` round robin for ``shape.turns`` turns, waves of ``in_flight``; one row per turn."""
    answers: list[list[list[int]]] = [[] for _ in convs]
    llm.reset_prefix_cache()
    tap.take()
    rows = []
    for t in range(shape.turns):
        ttft, cached, plen, wall, out_tok, req_pre = [], [], [], 0.0, 0, 0
        for w0 in range(0, len(convs), in_flight):
            idx = list(range(w0, min(w0 + in_flight, len(convs))))
            prompts = [_prompt(convs[i], answers[i], t) for i in idx]
            outs, dt = _generate(llm, prompts, shape.answer)
            wall += dt
            for i, o in zip(idx, outs, strict=True):
                toks = list(o.outputs[0].token_ids)
                answers[i].append(toks)
                out_tok += len(toks)
                m = o.metrics
                ttft.append(float(m.first_token_latency))
                req_pre += int(getattr(m, "num_preemptions", 0) or 0)
                cached.append(int(o.num_cached_tokens or 0))
                plen.append(len(o.prompt_token_ids))
        st = tap.take()
        rows.append(
            {
                "turn": t,
                "requests": len(convs),
                "prompt_tokens": sum(plen),
                "cached_tokens": sum(cached),
                "ttft_mean_s": sum(ttft) / len(ttft),
                "ttft_s": ttft,
                "wall_s": wall,
                "output_tokens": out_tok,
                "request_preemptions": req_pre,
                **st,
            }
        )
    return rows


def correctness(llm: Any, shape: Any, convs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per conversation: the last turn's prompt served alone with a prefix hit (``hit_decode``: the prefix KV was
    written by the previous turn's prefill and decode; ``hit_repeat``: the same prompt again) and cold (after
    ``reset_prefix_cache``); greedy tokens and the chosen tokens' logprobs compared."""
    from fp8lab.prefix import compare_outputs

    def run1(p: list[int]) -> tuple[list[int], list[float], int]:
        (o,), _ = _generate(llm, [p], shape.answer, logprobs=1)
        c = o.outputs[0]
        toks = list(c.token_ids)
        lps = [float(lp[t].logprob) for t, lp in zip(toks, c.logprobs, strict=True)]
        return toks, lps, int(o.num_cached_tokens or 0)

    rows = []
    last = shape.turns - 1
    for i, conv in enumerate(convs):
        llm.reset_prefix_cache()
        answers: list[list[int]] = []
        for t in range(last):  # the conversation up to its last turn, alone
            (o,), _ = _generate(llm, [_prompt(conv, answers, t)], shape.answer)
            answers.append(list(o.outputs[0].token_ids))
        p = _prompt(conv, answers, last)
        hit_d = run1(p)
        hit_r = run1(p)
        llm.reset_prefix_cache()
        cold = run1(p)
        for kind, hit in (("hit_decode", hit_d), ("hit_repeat", hit_r)):
            rows.append(
                {
                    "conv": i,
                    "kind": kind,
                    "prompt_len": len(p),
                    "cached_tokens": hit[2],
                    "cold_cached": cold[2],
                    **compare_outputs(hit[0], hit[1], cold[0], cold[1]),
                }
            )
    return rows


def _failure(exc: BaseException, log: Path, before: int) -> dict[str, Any]:
    from fp8lab.engine.result import classify_failure, root_cause

    text = log.read_text(errors="replace")[before:] if log.exists() else ""
    msg = f"{type(exc).__name__}: {exc}"
    cause = root_cause(text, msg)
    return {"status": classify_failure(cause + "\n" + msg), "error": cause}


def worker_main(spec_d: dict[str, Any], out_dir: str, log_path: str) -> None:
    """Run every missing cell and the correctness check. Never raises: failures land in ``engines.json``."""
    from fp8lab import prefix as px
    from fp8lab.engine import capability, devices
    from fp8lab.engine.worker import settle_heap, start_llm, stop_llm

    if hasattr(os, "setpgrp"):
        os.setpgrp()  # the caller kills the whole tree (engine cores, workers) by process group
    out, log = Path(out_dir), Path(log_path)
    rows_path, corr_path, eng_path = out / "rows.jsonl", out / "correctness.jsonl", out / "engines.json"
    spec = px.PrefixSpec(**{**spec_d, "workloads": [px.Shape(**w) for w in spec_d["workloads"]]})
    prev = json.loads(eng_path.read_text()) if eng_path.exists() else {}
    engines: dict[str, Any] = {
        "provenance": devices.provenance(seed=spec.seed),
        "engines": prev.get("engines", {}),
        "engine_core": devices.engine_core_layout(),
    }

    def save() -> None:
        tmp = eng_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(engines, indent=2, default=str))
        os.replace(tmp, eng_path)

    save()
    run = px.load(out)
    have = set()  # cells stored with every turn
    if len(run.rows):
        for key, g in run.rows.groupby(["workload", "n_active", "trial", "kv_dtype"]):
            if g.turn.nunique() == spec.workload(key[0]).turns:
                have.add(tuple(key))
    corr_done = set(run.correctness.kv_dtype) if len(run.correctness) else set()
    final = ("oom", "invalid")  # "unsupported" is asked again: the same store may later meet a device that can
    dtypes = [d for d in spec.kv_dtypes if engines["engines"].get(d, {}).get("status") not in final]

    def todo(d: str) -> bool:
        return any(
            (w.kind, n, t, d) not in have for t in range(spec.trials) for w in spec.workloads for n in spec.active
        ) or (spec.correctness_prompts > 0 and d not in corr_done)

    dtypes = [d for d in dtypes if todo(d)]
    sets = [dtypes] if spec.concurrent_engines else [[d] for d in dtypes]
    pools: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def pool(shape: Any, trial: int, n: int) -> list[dict[str, Any]]:
        key = (shape.kind, trial)
        if key not in pools or len(pools[key]) < n:
            pools[key] = px.conversation_pool(spec, shape, trial, max(n, max(spec.active)))
        return pools[key][:n]

    for group in sets:
        live: dict[str, Any] = {}
        taps: dict[str, _Tap] = {}
        llm = None  # the last set's engine, left bound by its loops: dropped before the heap settles
        settle_heap()
        for d in group:
            sup = capability.kv_support(d, spec.model)
            if not sup.native:  # no engine this device cannot run natively (an emulated cache has auto's blocks)
                engines["engines"][d] = {
                    "status": "unsupported",
                    "error": sup.reason,
                    "not_started": True,
                    "kv_cache_dtype": d,
                    "capability": sup.to_dict(),
                }
                save()
                continue
            before = log.stat().st_size if log.exists() else 0
            try:
                llm, facts = start_llm(spec.engine_spec(d).to_dict(), log, spec.engine_args)
                live[d], taps[d] = llm, _Tap(llm)
                engines["engines"][d] = {"status": "ok", "error": None, **facts}
            except BaseException as exc:  # noqa: BLE001 - a failed start is a record, the rest goes on
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                engines["engines"][d] = _failure(exc, log, before)
            save()
        if not live:
            continue
        try:
            warm = spec.workloads[0]
            for d, llm in live.items():
                for _ in range(spec.warmup):
                    run_cell(llm, taps[d], warm, pool(warm, 0, 1), spec.max_in_flight)
            k = 0
            for trial in range(spec.trials):
                for shape in spec.workloads:
                    for n in spec.active:
                        order = list(live) if k % 2 == 0 else list(live)[::-1]
                        k += 1
                        for slot, d in enumerate(order):
                            if (shape.kind, n, trial, d) in have:
                                continue
                            for r in run_cell(live[d], taps[d], shape, pool(shape, trial, n), spec.max_in_flight):
                                _append(
                                    rows_path,
                                    {
                                        "workload": shape.kind,
                                        "n_active": n,
                                        "trial": trial,
                                        "kv_dtype": d,
                                        "slot": slot,
                                        "t_wall": time.time(),
                                        **r,
                                    },
                                )
            if spec.correctness_prompts:
                shape = spec.workloads[0]
                convs = px.conversation_pool(spec, shape, spec.trials, spec.correctness_prompts)
                for d, llm in live.items():
                    if d in corr_done:
                        continue
                    for r in correctness(llm, shape, convs):
                        _append(corr_path, {"kv_dtype": d, "workload": shape.kind, **r})
        except BaseException as exc:  # noqa: BLE001
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            for d in live:
                engines["engines"][d].update(status="error", error=f"during measurement: {type(exc).__name__}: {exc}")
            save()
        finally:
            for llm in live.values():
                stop_llm(llm)
            live.clear()
    sys.stdout.flush()
    sys.stderr.flush()


def entry(log_path: str, env: dict[str, str], spec_d: dict[str, Any], out_dir: str) -> None:
    """Spawn target: :func:`fp8lab.engine.worker.prepare_worker` (log, environment), then the worker."""
    from fp8lab.engine.worker import prepare_worker

    prepare_worker(log_path, env)
    worker_main(spec_d, out_dir, log_path)
