"""Study 07 without an engine: the block arithmetic and the replay of vLLM's block pool (hand-computed cases),
the hit-rate / TTFT analysis on constructed rows, the spec's errors, and the H200 profile's plan built on CPU."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from fp8lab import prefix as px
from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.profiles import load_profile, resolved_parameters
from fp8lab.specs import SpecError

TINY = "data/models/fp8lab-tiny-qwen3"


# ---------------------------------------------------------------------------------------------- arithmetic
def test_shape_lengths():
    s = px.Shape("chat", 0, 0, 4, 2, 3)
    assert [s.prompt_len(t) for t in range(3)] == [4, 10, 16]  # (t+1)*4 + t*2
    assert s.final_len == 17  # 16 + 2 - 1: the last generated token has no KV
    j = px.Shape("json", 8, 5, 4, 2, 2)
    assert j.prompt_len(1) == 8 + 5 + 8 + 2


def test_conversation_blocks_and_formula_knee():
    chat = px.Shape("chat", 0, 0, 4, 2, 3)  # final 17 tokens -> 4 full blocks + a partial one
    assert px.conversation_blocks(chat, 4) == (0, 4, 1)
    system = px.Shape("system", 8, 0, 4, 2, 3)  # final 8 + 12 + 4 + 1 = 25 -> 6 full blocks, 2 shared, + partial
    assert px.conversation_blocks(system, 4) == (2, 4, 1)
    # 16 blocks, one of them vLLM's null block: 15 usable; one request in flight holds one partial block
    assert px.knee_formula(chat, 16, 4) == 3  # 3 x 4 + 1 = 13 <= 15; 4 x 4 + 1 > 15
    assert px.knee_formula(system, 16, 4) == 3  # 2 + 3 x 4 + 1 = 15
    assert px.knee_formula(system, 16, 4, max_in_flight=2) == 2  # 2 + 12 + 2 > 15
    # twice the blocks (fp8 at the same bytes): twice the conversations, or one less for the partial blocks
    assert px.knee_formula(chat, 31, 4) == 7  # 28 + 1 <= 30
    assert px.knee_formula(system, 31, 4) == 6  # 2 + 28 + 1 > 30


def test_simulate_by_hand():
    """Two conversations of two turns (4-token messages, 2-token answers), blocks of 4, one request at a time.

    Unbounded: turn 1 (10 prompt tokens) hits the one full block of turn 0 (its 2nd block is partial) -> 4 hits
    per conversation. With 4 blocks (3 usable): after turn 0 the free queue is [3, 1, 2] (uncached partials go to
    the front, cached blocks to the back); conversation 0's turn 1 revives block 1 and takes two more, 3 (the
    partial) and 2, which held conversation 1's first block: conversation 1 then misses."""
    s = px.Shape("chat", 0, 0, 4, 2, 2)
    assert px.simulate(s, 2, 0, 4, 1) == [{"turn": 0, "queries": 8, "hits": 0}, {"turn": 1, "queries": 20, "hits": 8}]
    assert px.simulate(s, 2, 4, 4, 1) == [{"turn": 0, "queries": 8, "hits": 0}, {"turn": 1, "queries": 20, "hits": 4}]
    assert px.sim_hit_rate(s, 2, None, 4, 1) == pytest.approx(8 / 28)
    assert px.sim_hit_rate(s, 2, 4, 4, 1) == pytest.approx(4 / 28)
    assert px.knee_simulated(s, 4, 4, 1) == 1  # one conversation (3 blocks) fits, two do not
    assert px.knee_formula(s, 4, 4) == 1  # 2 full blocks + 1 partial = 3 usable


def test_simulate_shared_prefix_hits_across_conversations():
    """A shared 8-token prefix (2 blocks of 4): the 2nd conversation's first prompt hits both, the first's not."""
    s = px.Shape("system", 8, 0, 4, 2, 2)
    rows = px.simulate(s, 2, 0, 4, 1)
    # turn 0: prompts of 12 tokens; conv 0 misses, conv 1 hits the 2 shared blocks (cap (12-1)//4 = 2 blocks)
    assert rows[0] == {"turn": 0, "queries": 24, "hits": 8}
    # turn 1: 18 tokens; KV of turn 0 covers 12 + 2 - 1 = 13 tokens = 3 full blocks -> 12 hits each
    assert rows[1] == {"turn": 1, "queries": 36, "hits": 24}


def test_fp8_twice_the_blocks_moves_the_replayed_knee_out():
    s = px.Shape("chat", 0, 0, 96, 16, 3)
    k_auto, k_fp8 = px.knee_simulated(s, 64, 32, 4), px.knee_simulated(s, 128, 32, 4)
    assert px.knee_formula(s, 64, 32, 4) == 5  # final 335 tokens -> 10 full blocks + 1 partial; 50 + 4 <= 63
    # the replay holds one more: the last wave's final-turn blocks are never needed again
    assert k_auto == 6 and k_fp8 == 12
    assert k_fp8 >= 2 * k_auto
    # beyond auto's knee and inside fp8's, only auto loses hits
    n = k_auto + 2
    assert px.sim_hit_rate(s, n, 64, 32, 4) < px.sim_hit_rate(s, n, 128, 32, 4) == px.sim_hit_rate(s, n, None, 32, 4)


# ---------------------------------------------------------------------------------------------- analysis
def _rows() -> pd.DataFrame:
    """2 trials x 2 dtypes x n_active {2, 8}, 2 turns each; hit rates and TTFTs chosen for hand computation."""
    rows = []
    hits = {("auto", 0): 50, ("auto", 1): 50, ("fp8", 0): 70, ("fp8", 1): 60}
    ttft = {("auto", 0): 0.100, ("auto", 1): 0.100, ("fp8", 0): 0.080, ("fp8", 1): 0.090}
    for n in (2, 8):
        for t in (0, 1):
            for d in ("auto", "fp8"):
                h = hits[(d, t)] if n == 8 else 50  # at n=2 both hold: equal hit rates
                for turn, (q, hh) in enumerate(((40, 10), (60, h - 10))):
                    rows.append(
                        {
                            "workload": "chat",
                            "n_active": n,
                            "trial": t,
                            "kv_dtype": d,
                            "turn": turn,
                            "queries": q,
                            "hits": hh,
                            "cached_tokens": hh,
                            "requests": n,
                            "ttft_mean_s": ttft[(d, t)] if n == 8 else 0.05,
                            "wall_s": 2.0,
                            "output_tokens": 100 if d == "auto" else 120,
                            "preemptions": 0,
                            "kv_usage_max": 0.5,
                        }
                    )
    return pd.DataFrame(rows)


def test_cell_table_sums_turns():
    c = px.cell_table(_rows())
    r = c[(c.n_active == 8) & (c.trial == 0) & (c.kv_dtype == "fp8")].iloc[0]
    assert (r.queries, r.hits) == (100, 70) and r.hit_rate == pytest.approx(0.7)
    assert r.ttft_mean_ms == pytest.approx(80.0) and r.ttft_followup_ms == pytest.approx(80.0)
    assert r.output_tok_s == pytest.approx(240 / 4.0)  # 2 turns x 120 tokens / 2 x 2 s


def test_cell_table_falls_back_to_per_request_counts_where_the_counters_missed_steps():
    """vLLM 0.26 dropped the scheduler stats of steps without outputs (the H200 run of the shipped model): a turn
    whose counters saw fewer prompt tokens than were sent takes its hits from ``num_cached_tokens``."""
    rows = _rows()
    rows["prompt_tokens"] = rows.queries
    sel = (rows.n_active == 8) & (rows.trial == 0) & (rows.kv_dtype == "fp8") & (rows.turn == 1)
    rows.loc[sel, ["queries", "hits"]] = (0, 0)  # the whole turn's counts lost
    c = px.cell_table(rows)
    r = c[(c.n_active == 8) & (c.trial == 0) & (c.kv_dtype == "fp8")].iloc[0]
    assert (r.queries, r.hits) == (100, 70) and r.hit_rate == pytest.approx(0.7)
    assert (r.counter_turns, r.counter_turns_complete) == (2, 1)
    assert c.counter_turns_complete.sum() == c.counter_turns.sum() - 1
    # a complete turn keeps the counters' own figures, even where num_cached_tokens says otherwise
    rows2 = _rows()
    rows2["prompt_tokens"] = rows2.queries
    rows2["cached_tokens"] = 0
    r2 = px.cell_table(rows2).query("n_active == 8 and trial == 0 and kv_dtype == 'fp8'").iloc[0]
    assert r2.hits == 70 and r2.counter_turns_complete == 2


def test_sweep_table_paired_intervals_by_hand():
    pred = pd.DataFrame(
        [
            {"workload": "chat", "kv_dtype": d, "n_active": n, "hit_rate_pred": 0.5, "hit_rate_unbounded": 0.6}
            for d in ("auto", "fp8")
            for n in (2, 8)
        ]
    )
    sw = px.sweep_table(px.cell_table(_rows()), pred)
    r = sw[sw.n_active == 8].iloc[0]
    t1 = 12.706204736174707  # t_{0.975, 1}
    # hit-rate differences 20 and 10 pp: mean 15, sd 7.0711, half-width t * sd / sqrt(2) = t * 5
    assert r.dhit_pp == pytest.approx(15.0)
    assert (r.dhit_pp_ci_low, r.dhit_pp_ci_high) == pytest.approx((15 - 5 * t1, 15 + 5 * t1))
    # TTFT ratios 0.8 and 0.9: geometric mean sqrt(0.72); log half-width t * |ln(0.8/0.9)| / 2
    h = t1 * abs(math.log(0.8 / 0.9)) / 2
    gm = math.sqrt(0.72)
    assert r.ttft_ratio == pytest.approx(gm)
    assert (r.ttft_ratio_ci_low, r.ttft_ratio_ci_high) == pytest.approx((gm * math.exp(-h), gm * math.exp(h)))
    assert r.tput_ratio == pytest.approx(1.2) and r.n_pairs == 2
    assert r.auto_hit_rate == pytest.approx(0.5) and r.fp8_hit_rate == pytest.approx(0.65)
    r2 = sw[sw.n_active == 2].iloc[0]
    assert r2.dhit_pp == 0.0 and r2.ttft_ratio == pytest.approx(1.0)


def test_measured_knee():
    sw = pd.DataFrame(
        {
            "workload": "chat",
            "n_active": [2, 4, 8, 12],
            "hit_rate_unbounded": [0.5, 0.6, 0.65, 0.7],
            "auto_hit_rate": [0.5, 0.595, 0.40, 0.20],
            "fp8_hit_rate": [0.5, 0.6, 0.64, 0.69],
        }
    )
    assert px.measured_knee(sw, "chat", "auto", 2.0) == {"last_held": 4, "first_fallen": 8}
    assert px.measured_knee(sw, "chat", "fp8", 2.0) == {"last_held": 12, "first_fallen": None}
    assert px.measured_knee(sw, "chat", "fp8", 0.5) == {"last_held": 4, "first_fallen": 8}  # 1 pp below at 8


def test_compare_outputs():
    same = px.compare_outputs([1, 2, 3], [-0.1, -0.2, -0.3], [1, 2, 3], [-0.1, -0.2, -0.3])
    assert same == {"tokens_equal": True, "first_diff": None, "max_abs_dlogprob": 0.0, "mean_abs_dlogprob": 0.0}
    d = px.compare_outputs([1, 2, 3, 9], [-0.1, -0.2, -0.5, -1.0], [1, 2, 4, 9], [-0.1, -0.25, -0.3, -9.0])
    # differences at positions 0..2 (up to the first differing token): 0, 0.05, 0.2; position 3 is not compared
    assert d["tokens_equal"] is False and d["first_diff"] == 2
    assert d["max_abs_dlogprob"] == pytest.approx(0.2) and d["mean_abs_dlogprob"] == pytest.approx(0.25 / 3)


def test_claim_verdict():
    base = {"engines_status": {"auto": "ok", "fp8": "ok"}}
    gain = {"dhit_pp": 15.0, "dhit_pp_ci_low": 3.0, "dhit_pp_ci_high": 27.0}
    flat = {"dhit_pp": 0.0, "dhit_pp_ci_low": -0.5, "dhit_pp_ci_high": 0.5}
    wide = {"dhit_pp": 0.0, "dhit_pp_ci_low": -5.0, "dhit_pp_ci_high": 5.0}
    assert px.claim_verdict({**base, "sweep": [flat, gain]}) == "refuted"
    assert px.claim_verdict({**base, "sweep": [flat, flat]}) == "consistent"
    assert px.claim_verdict({**base, "sweep": [flat, wide]}) == "inconclusive"
    assert px.claim_verdict({"engines_status": {"auto": "ok", "fp8": "unsupported"}, "sweep": [gain]}) == "not measured"


# ---------------------------------------------------------------------------------------------- spec
def test_spec_errors_name_field_value_and_allowed():
    with pytest.raises(SpecError, match=r"PrefixSpec\.kv_cache_gib = 0\.0001: a budget whose .* max_in_flight"):
        px.PrefixSpec(model=TINY, kv_cache_gib=0.0001)
    with pytest.raises(SpecError, match=r"Shape\.kind = 'rag': allowed: chat \| system \| json"):
        px.PrefixSpec(model=TINY, workloads=[["rag", 0, 0, 8, 4, 2]])
    with pytest.raises(SpecError, match=r"PrefixSpec\.active = \[2, 2\]: distinct values"):
        px.PrefixSpec(model=TINY, active=[2, 2])
    with pytest.raises(SpecError, match=r"PrefixSpec\.trials = 1"):
        px.PrefixSpec(model=TINY, trials=1)
    with pytest.raises(SpecError, match=r"PrefixSpec\.workloads = .*max_model_len = 256"):
        px.PrefixSpec(model=TINY, max_model_len=256)
    with pytest.raises(SpecError, match=r"PrefixSpec\.max_model_len = None: at most 2016 tokens: the 63 usable auto"):
        px.PrefixSpec(model=TINY, kv_cache_gib=0.005859375, block_size=32)  # the model's 131,072 positions
    with pytest.raises(SpecError, match=r"PrefixSpec\.kv_dtypes = 'int4'"):
        px.PrefixSpec(model=TINY, kv_dtypes=["auto", "int4"])


@pytest.mark.parametrize("profile", ["cpu-tiny", "h200", "h200-shipped"])
def test_profile_plans_put_the_knees_inside_the_sweep(profile):
    """Both profiles' specs build and plan on this CPU without an engine; auto's replayed knee falls inside the
    sweep and fp8's lies further out (twice the blocks)."""
    params = resolved_parameters(NOTEBOOKS_DIR / "07_prefix_cache.ipynb", load_profile(profile), {})
    spec = px.PrefixSpec.from_params(params)
    p = px.plan(spec)
    assert len(p) == len(spec.workloads) * len(spec.kv_dtypes) * len(spec.active)
    assert spec.num_blocks("fp8") in (2 * spec.num_blocks("auto"), 2 * spec.num_blocks("auto") + 1)
    for w in spec.workloads:
        k = p[(p.workload == w.kind)].groupby("kv_dtype").knee_simulated.first()
        assert min(spec.active) <= k["auto"] < max(spec.active), (w.kind, k["auto"], spec.active)
        assert k["fp8"] >= 2 * k["auto"] - 1


# ---------------------------------------------------------------------------------------------- degradation
def test_fp8_that_cannot_start_leaves_auto_alone_in_summary_and_verdict(tmp_path):
    """A stored run whose fp8 engine failed at start (as on AVX2-only CPUs): the summary and the verdict come out
    with auto alone, say what was not measured, and do not judge the claim."""
    import json

    spec = px.PrefixSpec(
        model=TINY,
        workloads=[["chat", 0, 0, 96, 16, 3]],
        active=[2, 8],
        trials=2,
        kv_cache_gib=0.005859375,
        block_size=32,
        max_model_len=1024,
        correctness_prompts=0,
    )
    (tmp_path / "spec.json").write_text(json.dumps(spec.descriptor(), default=str))
    err = "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    (tmp_path / "engines.json").write_text(
        json.dumps(
            {
                "provenance": {"device": "cpu"},
                "engines": {
                    "auto": {"status": "ok", "num_blocks": 64, "block_size": 32},
                    "fp8": {"status": "unsupported", "error": err},
                },
            }
        )
    )
    rows = []
    for n in (2, 8):
        for t in range(2):
            for turn, r in enumerate(px.simulate(spec.workloads[0], n, 64, 32, 4)):
                rows.append(
                    {
                        "workload": "chat",
                        "n_active": n,
                        "trial": t,
                        "kv_dtype": "auto",
                        **r,
                        "prompt_tokens": r["queries"],
                        "cached_tokens": r["hits"],
                        "requests": n,
                        "ttft_mean_s": 0.01 * (turn + 1),
                        "wall_s": 1.0,
                        "output_tokens": 16 * n,
                        "preemptions": 0,
                        "kv_usage_max": 0.9,
                    }
                )
    lost = next(r for r in rows if (r["n_active"], r["trial"], r["turn"]) == (8, 1, 2))
    lost.update(queries=0, hits=0)  # the engine's counters missed this turn; num_cached_tokens did not
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = px.load(tmp_path)
    assert run.ok_dtypes() == ["auto"] and run.missing_cells() == []
    s = px.summary(run)
    assert s["engines_status"] == {"auto": "ok", "fp8": "unsupported"} and s["engine_errors"]["fp8"] == err
    assert s["claim_verdict"] == "not measured"
    k = {(r["workload"], r["kv_dtype"]): r for r in s["knees"]}
    assert (k[("chat", "auto")]["measured_last_held"], k[("chat", "auto")]["measured_first_fallen"]) == (2, 8)
    assert k[("chat", "fp8")]["measured_last_held"] is None
    lines = px.verdict(s)
    assert lines[0].startswith("Not measured: `fp8` (NotImplementedError: FP8 KV cache on CPU requires")
    assert (
        "chat / auto: predicted knee N=" in lines[2]
        and "measured: holds to N=2, falls from N=8 (prediction inside" in lines[2]
    )
    assert (s["counter_turns"], s["counter_turns_complete"]) == (12, 11)
    assert any(ln.startswith("vLLM's prefix-cache counters missed steps in 1 of 12 turns") for ln in lines)
    assert any("**not measured**" in ln for ln in lines)


def test_a_store_only_rerender_loads_a_run_measured_under_another_vllm_and_starts_nothing(tmp_path, monkeypatch):
    """The H200's runs (vLLM 0.26.0) re-rendered on the CPU (0.32.0): the descriptor's version differs, so the
    hash does; with $FP8LAB_STORE_ONLY the run of the same spec is found and loaded, its provenance noted for the
    report, and a spec the store lacks comes back as an error with nothing started or written."""
    import json

    spec = px.PrefixSpec(
        model=TINY,
        workloads=[["chat", 0, 0, 96, 16, 3]],
        active=[2],
        trials=2,
        kv_cache_gib=0.005859375,
        block_size=32,
        max_model_len=1024,
        correctness_prompts=0,
    )
    desc = spec.descriptor()
    other = {**desc, "vllm": "0.26.0" if desc["vllm"] != "0.26.0" else "0.25.0"}
    kept = tmp_path / px.STUDY / "measuredelsewhere"
    kept.mkdir(parents=True)
    (kept / "spec.json").write_text(json.dumps(other))
    prov = {"device": "NVIDIA H200", "vllm": other["vllm"]}
    (kept / "engines.json").write_text(
        json.dumps(
            {
                "provenance": prov,
                "engines": {d: {"status": "ok", "num_blocks": 64, "block_size": 32} for d in ("auto", "fp8")},
            }
        )
    )
    (kept / "complete.json").write_text("{}")
    monkeypatch.setenv("FP8LAB_STORE_ONLY", "1")
    log = tmp_path / "runs.log"
    monkeypatch.setenv("FP8LAB_RUNS_LOG", str(log))
    run = px.run_prefix(spec, root=tmp_path)
    assert run.run_dir == kept and run.complete and run.ok_dtypes() == ["auto", "fp8"]
    assert json.loads(log.read_text().splitlines()[0])["device"] == "NVIDIA H200"
    assert sorted(p.name for p in (tmp_path / px.STUDY).iterdir()) == ["measuredelsewhere"]
    missing = px.run_prefix(dataclasses.replace(spec, trials=3), root=tmp_path)
    assert not missing.complete and missing.ok_dtypes() == []
    assert "FP8LAB_STORE_ONLY is set, so no engine was started" in missing.engines["fp8"]["error"]
    assert sorted(p.name for p in (tmp_path / px.STUDY).iterdir()) == ["measuredelsewhere"]


def test_turn_prompt_is_the_conversation_so_far_plus_the_last_answer_and_a_new_message():
    from fp8lab.prefix.worker import _prompt

    conv = {"shared": [1, 2], "private": [3], "users": [[10, 11], [20, 21], [30, 31]]}
    answers = [[100, 101], [200, 201]]
    assert _prompt(conv, answers, 0) == [1, 2, 3, 10, 11]
    assert _prompt(conv, answers, 2) == [1, 2, 3, 10, 11, 100, 101, 20, 21, 200, 201, 30, 31]
    s = px.Shape("json", 2, 1, 2, 2, 3)
    assert len(_prompt(conv, answers, 2)) == s.prompt_len(2)


def test_verdict_states_a_hit_vs_cold_divergence_with_its_size():
    """The H200's bf16 engine on the shipped model: 15 of 16 repeated prompts identical, one diverging at output
    token 6; the line gives the share, the token as an integer and the largest logprob difference before it."""
    s = {
        "model": "fp8lab-tiny-qwen3",
        "device": "NVIDIA H200",
        "vllm_version": "0.26.0",
        "kv_cache_gib": 0.005,
        "block_size": 16,
        "max_in_flight": 4,
        "trials": 3,
        "prompt_source": "text",
        "engine_errors": {},
        "num_blocks": {"auto": 112},
        "num_blocks_formula": {"auto": 112},
        "knees": [],
        "claim_verdict": "refuted",
        "correctness": [
            {
                "kv_dtype": "auto",
                "kind": "hit_repeat",
                "prompts": 16,
                "tokens_equal": 0.9375,
                "first_divergence": 6.0,
                "max_abs_dlogprob": 0.0967,
                "cached_tokens_min": 304,
            },
            {
                "kv_dtype": "fp8",
                "kind": "hit_repeat",
                "prompts": 16,
                "tokens_equal": 1.0,
                "first_divergence": None,
                "max_abs_dlogprob": 0.0,
                "cached_tokens_min": 304,
            },
        ],
    }
    lines = px.verdict(s)
    assert "(vLLM 0.26.0, 5.12 MiB of KV per engine, blocks of 16 tokens" in lines[0]
    assert (
        "Correctness auto (hit_repeat, 16 prompts, >= 304 cached tokens): 94% identical greedy sequences; the "
        "earliest divergence at output token 6 (0-based); the chosen tokens' logprobs up to it differ by at most "
        "0.097 nats."
    ) in lines
    assert (
        "Correctness fp8 (hit_repeat, 16 prompts, >= 304 cached tokens): hit and cold outputs identical "
        "(tokens and logprobs)."
    ) in lines
