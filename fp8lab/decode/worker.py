"""Inside the decode study's spawned worker: start the engine sets of the plan, time decode steps, append rows.

Only :mod:`fp8lab.decode` starts this, in a fresh ``spawn`` process whose stdout/stderr go to the run's
worker log. The plan lists engine sets in start order (:mod:`fp8lab.engine.schedule`: fresh engines per dtype,
ABBA, a co-located arm and a one-engine-at-a-time arm); the engines of a set are alive at once and the dtypes
alternate within each repetition (AB, BA, AB, ...), so drift in the machine hits both alike. Every row names its
engine (``arm``, ``round``, ``engine``, ``engine_uid``: the analysis averages within an engine first).

How a step time is taken from one generation (vllm-notes section 1): a batch of ``B`` prompts of ``L``
tokens is sent at once; the last prompt is prefilled last (first come, first served), and its
``(last_token_ts - first_token_ts) / (n - 1)`` spans ``n - 1`` decode steps in which all ``B`` sequences
decode and no prefill runs, because every other request asks for ``margin`` more tokens than the prefill
took steps. ``full_batch`` records that the others were indeed still decoding when it ended. The
timestamps are the engine core's own, per scheduler step, so no client jitter enters.

Each measurement is appended to ``rows.jsonl`` (flushed and synced) as soon as it is taken: a worker that
dies keeps everything it measured, and a rerun skips what is there.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from fp8lab.engine import devices
from fp8lab.engine.worker import prepare_worker, settle_heap, start_llm, stop_llm

#: Unix time by which the worker's engine sets must end (set by scripts/h200_run.sh from its budget); unset: none.
DEADLINE_ENV = "FP8LAB_DEADLINE"


def _append(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _prompts(vocab: int, batch: int, context: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(10, vocab - 10, size=context).tolist() for _ in range(batch)]


def _measure(llm: Any, prompts: list[list[int]], n: int, margin: int) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def sp(k: int) -> Any:
        return SamplingParams(max_tokens=k, ignore_eos=True, temperature=0.0, detokenize=False)

    params = [sp(n + margin)] * (len(prompts) - 1) + [sp(n)]
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    last = outs[-1]
    m = last.metrics
    k = len(last.outputs[0].token_ids)
    others_end = [o.metrics.last_token_ts for o in outs[:-1]]
    firsts = [o.metrics.first_token_ts for o in outs]
    return {
        "step_s": (m.last_token_ts - m.first_token_ts) / (k - 1),
        "ttft_s": float(m.first_token_latency),
        "wall_s": wall,
        "tokens": k,
        "prefill_spread_s": max(firsts) - min(firsts),
        "full_batch": bool(all(t >= m.last_token_ts for t in others_end)),
    }


def _deadline() -> float | None:
    """``FP8LAB_DEADLINE`` (Unix seconds): no engine set starts that would not end before it (None: no deadline)."""
    try:
        v = float(os.environ.get(DEADLINE_ENV) or 0)
    except ValueError:
        return None
    return v if v > 0 else None


def _wait_released(probe: Any, baseline: int | None, timeout_s: float = 60.0) -> float:
    """After a set's engines stop, wait (GPU only) until device memory is back within 1 GiB of ``baseline`` (what
    was used before the first engine), so the next engine's memory check (a solo engine asks for 0.9 of the device)
    does not meet the last one's leftovers. Returns the seconds waited."""
    t0 = time.time()
    if probe.kind != "gpu" or baseline is None:
        return 0.0
    while time.time() - t0 < timeout_s:
        used = probe.used_bytes()
        if used is None or used <= baseline + 2**30:
            break
        time.sleep(0.5)
    return time.time() - t0


def _set_estimate(took: dict[int, float], n: int) -> float | None:
    """Seconds a set of ``n`` engines will take: the least of the last such set's time and ``n`` x the cheapest
    per-engine time seen (the first set pays the host's one-off compile; a later one does not); None: no set yet."""
    if not took:
        return None
    per_engine = min(t / k for k, t in took.items()) * n
    return min(took.get(n, per_engine), per_engine)


def worker_main(specs: dict[str, dict[str, Any]], plan: dict[str, Any], out_dir: str, log_path: str) -> None:
    """Run the plan's engine sets (``plan["sets"]``: ``{arm, round, configs}`` in start order, every config's engine
    alive together; :mod:`fp8lab.engine.schedule`), each engine measuring every point ``reps`` times; ``specs``:
    ``{arm: {kv_dtype: engine spec}}``. Never raises: failures land in ``engines.json``.

    Before a set starts, the time the last set of as many engines took is checked against ``FP8LAB_DEADLINE``: a
    set that would not finish is left for the next call (``deferred`` in ``engines.json``), so a run cut into
    device calls loses no half-measured engine set."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()  # the caller kills the whole tree (engine cores, workers) by process group
    out, log = Path(out_dir), Path(log_path)
    rows_path, eng_path = out / "rows.jsonl", out / "engines.json"
    engines: dict[str, Any] = {"provenance": devices.provenance(seed=plan["seed"]), "engines": {}, "deferred": []}
    if eng_path.exists():  # an earlier call's engines (a resumed run): kept
        try:
            engines["engines"] = json.loads(eng_path.read_text()).get("engines", {})
        except (OSError, ValueError):
            pass

    def save() -> None:
        tmp = eng_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(engines, indent=2, default=str))
        os.replace(tmp, eng_path)

    save()
    deadline = _deadline()
    probe = devices.MemoryProbe(
        tensor_parallel_size=next(iter(next(iter(specs.values())).values()))["tensor_parallel_size"]
    )
    baseline = probe.used_bytes()
    took: dict[int, float] = {}  # engines alive together -> seconds the last such set took
    for i, es in enumerate(plan["sets"]):
        arm, rnd, configs = es["arm"], int(es["round"]), list(es["configs"])
        need = _set_estimate(took, len(configs))
        if deadline is not None and need is not None and time.time() + need > deadline:
            # this set and every later one wait for the next call, in schedule order (ABBA stays ABBA)
            engines["deferred"] = [{**s, "needs_s": need} for s in plan["sets"][i:]]
            save()
            break
        t_set = time.time()
        live: dict[str, Any] = {}
        ids: dict[str, str] = {}
        llm = None  # the last set's engine, left bound by its loop: dropped before the heap settles
        settle_heap()
        for d in configs:
            eid = f"{arm}/r{rnd}/{d}"
            uid = f"{eid}#{time.time_ns()}"
            ids[d] = uid
            base = {"kv_dtype": d, "arm": arm, "round": rnd, "engine_uid": uid}
            try:
                llm, facts = start_llm(specs[arm][d], log, plan.get("engine_args") or {})
                live[d] = llm
                engines["engines"][eid] = {"status": "ok", "error": None, **base, **facts}
            except BaseException as exc:  # noqa: BLE001 - a failed start is a record, the rest goes on
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                engines["engines"][eid] = {"status": "error", "error": f"{type(exc).__name__}: {exc}", **base}
            save()
        if not live:
            continue
        try:
            # warm-up, discarded: the first generations of an engine pay one-off costs
            b0, c0 = plan["points"][0]
            for llm in live.values():
                for _ in range(plan["warmup"]):
                    _measure(
                        llm,
                        _prompts(plan["vocab"], b0, c0, plan["seed"] + 999),
                        plan["decode_tokens"],
                        plan["margins"][0],
                    )
            for (b, c), margin in zip(plan["points"], plan["margins"], strict=True):
                for rep in range(plan["reps"]):
                    order = [d for d in (configs if rep % 2 == 0 else configs[::-1]) if d in live]
                    # the same prompts for every engine of every round at a (point, rep): engines differ, inputs not
                    prompts = _prompts(plan["vocab"], b, c, plan["seed"] + 7919 * rep + 31 * b + c)
                    for slot, d in enumerate(order):
                        r = _measure(live[d], prompts, plan["decode_tokens"], margin)
                        _append(
                            rows_path,
                            {
                                "batch": b,
                                "context_len": c,
                                "rep": rep,
                                "kv_dtype": d,
                                "arm": arm,
                                "round": rnd,
                                "engine": f"{arm}/r{rnd}/{d}",
                                "engine_uid": ids[d],
                                "slot": slot,
                                "margin": margin,
                                "t_wall": time.time(),
                                **r,
                            },
                        )
        except BaseException as exc:  # noqa: BLE001
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            for d in live:
                engines["engines"][f"{arm}/r{rnd}/{d}"].update(
                    status="error", error=f"during measurement: {type(exc).__name__}: {exc}"
                )
            save()
        finally:
            for llm in live.values():
                stop_llm(llm)
            live.clear()
            waited = _wait_released(probe, baseline)
            took[len(configs)] = time.time() - t_set
            for d in configs:
                if f"{arm}/r{rnd}/{d}" in engines["engines"]:
                    engines["engines"][f"{arm}/r{rnd}/{d}"].update(set_s=took[len(configs)], release_wait_s=waited)
            save()
    sys.stdout.flush()
    sys.stderr.flush()


def entry(
    log_path: str, env: dict[str, str], specs: dict[str, dict[str, Any]], plan: dict[str, Any], out_dir: str
) -> None:
    """Spawn target: :func:`fp8lab.engine.worker.prepare_worker` (log, environment), then the worker."""
    prepare_worker(log_path, env)
    worker_main(specs, plan, out_dir, log_path)
