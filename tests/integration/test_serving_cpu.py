"""Real vLLM (CPU build) through the async driver: closed loop, open loop, preemption at the KV limit,
and the fidelity check against vLLM's own throughput benchmark. One streaming engine serves every
serving phase (engine starts dominate the cost on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fp8lab import metrics, serving
from fp8lab.engine import devices
from fp8lab.engine.results import run_cached
from fp8lab.specs import EngineSpec, Phase
from fp8lab.workloads import RequestClass, build_requests, with_arrivals

pytestmark = pytest.mark.slow

KV_GIB = 0.0234375  # 24 MiB: 64 blocks of 128 tokens with the auto (bf16) cache of the tiny model
SHORT = RequestClass("short", 64, 8)
CAP = RequestClass("capacity", 96, 64)  # 160 tokens: 2 blocks, the second taken during decode
RATE = 4.0


def _has_tokenizer(model: str) -> bool:
    return (Path(model) / "tokenizer.json").is_file() or (Path(model) / "tokenizer_config.json").is_file()


@pytest.fixture(scope="module")
def source(tiny_model):
    return "text" if _has_tokenizer(tiny_model) else "random"


@pytest.fixture(scope="module")
def served(tiny_model, runs_root, source):
    spec = EngineSpec(model=tiny_model, kv_cache_gib=KV_GIB, max_model_len=1024, skip_tokenizer_init=source == "random")
    reqs = build_requests(tiny_model, [SHORT], 8, source=source, seed=1)
    cap = build_requests(tiny_model, [CAP], 33, source=source, seed=2)
    phases = [
        Phase("warmup", reqs[:2], concurrency=2),
        Phase("closed-c2", reqs[:6], concurrency=2),
        Phase("naive-c2", reqs[:6], concurrency=2, client="final"),  # the same requests, stream not read
        Phase(f"open-constant-{RATE:g}", with_arrivals(reqs, RATE, "constant")),
        Phase("cap-c31", cap[:31], concurrency=31),
        Phase("cap-c33", cap, concurrency=33),
    ]
    res = run_cached(spec, phases, study="test_serving", driver="async")
    assert res.status == "ok", (res.error, res.log_tail[-3000:])
    return res


def _phase(res, name):
    return res.records[res.records.phase == name]


def test_every_token_is_timestamped(served):
    assert served.engine["engine_core"] == "process"  # an AsyncLLM's engine core is a process, whatever the layout
    # on a CPU it is forked from fp8lab's forkserver (vLLM imported once), in seconds; vLLM's own start elsewhere
    assert served.engine["engine_core_start"] == ("forkserver" if devices.cpu_layout() else "vllm")
    for name in ("closed-c2", f"open-constant-{RATE:g}"):
        rec = _phase(served, name)
        assert (rec.output_tokens == SHORT.output_len).all()
        assert (rec.prompt_tokens == SHORT.input_len).all()
        # one inter-token gap per output token after the first, unless the stream merged deltas
        n_gaps = rec.itl_s.map(len)
        assert ((n_gaps == rec.output_tokens - 1) | (rec.merged_deltas > 0)).all()
        assert (n_gaps == rec.output_tokens - 1).mean() >= 0.75
        assert all(np.all(np.asarray(v) >= 0) for v in rec.itl_s)
        # the client's TPOT excludes the first token and agrees with the gaps
        tpot = rec.itl_s.map(np.mean)
        assert np.allclose(tpot[rec.merged_deltas == 0], rec.tpot_s[rec.merged_deltas == 0], rtol=1e-6)
        assert (rec.ttft_s > 0).all() and (rec.e2e_s > rec.ttft_s).all()


def test_closed_loop_respects_concurrency(served):
    rec = _phase(served, "closed-c2")
    start, end = rec.sent_s.to_numpy(), (rec.sent_s + rec.e2e_s).to_numpy()
    events = sorted([(t, 1) for t in start] + [(t, -1) for t in end], key=lambda e: (e[0], e[1]))
    in_flight, peak = 0, 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 2


def test_non_streaming_client_sees_only_the_end(served):
    rec, closed = _phase(served, "naive-c2"), _phase(served, "closed-c2")
    assert len(rec) == 6 and (rec.output_tokens == SHORT.output_len).all()
    assert rec.ttft_s.isna().all() and rec.tpot_s.isna().all()  # no token times without reading the stream
    assert (rec.e2e_s > rec.engine_ttft_s).all() and (rec.engine_ttft_s > 0).all()
    # greedy on the same engine: the same tokens by either client
    assert (
        rec.sort_values("request").output_token_ids.map(list).tolist()
        == closed.sort_values("request").output_token_ids.map(list).tolist()
    )
    start, end = rec.sent_s.to_numpy(), (rec.sent_s + rec.e2e_s).to_numpy()
    assert max(((start <= t) & (t < end)).sum() for t in start) == 2  # still two in flight


def test_open_loop_achieves_a_low_rate(served):
    rec = _phase(served, f"open-constant-{RATE:g}")
    assert metrics.achieved_rate(rec.sent_s) == pytest.approx(RATE, rel=0.05)
    sched = np.arange(len(rec)) / RATE
    lag = rec.sort_values("request").sent_s.to_numpy() - sched
    assert lag.max() < 0.1  # sent on schedule, not when earlier requests finished


def test_preemption_appears_past_the_kv_limit(served):
    # 64 blocks, one of them vLLM's null block: 31 requests of 2 blocks fit, 33 do not
    assert served.engine["num_blocks"] == 64
    ok, over = served.phases["cap-c31"], served.phases["cap-c33"]
    assert ok["preemptions"] == 0 and _phase(served, "cap-c31").num_preemptions.sum() == 0
    assert over["preemptions"] > 0 or _phase(served, "cap-c33").num_preemptions.sum() > 0
    assert (_phase(served, "cap-c33").output_tokens == CAP.output_len).all()  # preempted requests still finish


def test_fidelity_against_vllm_bench(tiny_model, tmp_path):
    if not _has_tokenizer(tiny_model):
        pytest.skip("vLLM's throughput benchmark needs a tokenizer")
    from fp8lab.engine.capability import detect

    spec = EngineSpec(model=tiny_model, kv_cache_gib=0.25, max_model_len=512)
    store = tmp_path / "store"
    # Runs of 6-10 s each on 2 cores: with runs of 1-2 s vLLM bench's own time varied by 70% from run to run, and the
    # one-round ratio with it (1.43 and 1.79 seen on an idle machine). 160 requests take about 6 s where the CPU has
    # AVX-512 or AMX; without them (AVX2: no bf16 arithmetic) each takes about 9x longer, and 160 took 50-58 s a run,
    # so 32 requests there (reports/bench/fidelity_avx2_160_requests; suite_durations_2026-12-02d.txt: 159 s with 160).
    dev = detect()
    n = 160 if dev.avx512 or dev.amx else 32
    res = serving.fidelity_check(spec, 256, 64, n, rounds=1, num_warmups=2, store=store, progress=False)
    rows = res["rows"]
    assert (rows.status == "ok").all(), rows.error.tolist()
    assert rows.set_index("who").num_requests.to_dict() == {"bench": n, "fp8lab": n}
    assert not rows.cached.any()
    # One round on a shared 2-core CI machine: a smoke check of the plumbing and of gross disagreement.
    # The 3% criterion is scripts/bench_fidelity.py with several rounds on an otherwise idle machine.
    assert 0.8 < res["ratio"] < 1.25, rows
    # every finished run is kept with its provenance; the same check again loads them and runs no engine
    (folder,) = store.iterdir()
    kept = json.loads((folder / "round0-fp8lab.json").read_text())
    assert kept["tokens_per_second"] == rows.set_index("who").tokens_per_second["fp8lab"] and kept["provenance"]
    assert not (folder / "round0-fp8lab" / "result.pkl").exists() and (folder / "round0-bench" / "bench.log").exists()
    again = serving.fidelity_check(spec, 256, 64, n, rounds=1, num_warmups=2, store=store, progress=False)
    assert again["rows"].cached.all() and again["ratio"] == res["ratio"]
    assert sorted(p.name for p in folder.glob("round0-*")) == [
        "round0-bench",
        "round0-bench.json",
        "round0-fp8lab",
        "round0-fp8lab.json",
    ]  # nothing ran a second time
