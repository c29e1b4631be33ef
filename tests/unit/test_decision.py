"""The decision box (fp8lab.report.decision) on the committed H200 records: every number read by field from the rows, with
its interval and n; missing evidence said as such; a real model's quality rows replace the 'not yet measured'."""

from __future__ import annotations

import json
import shutil

from fp8lab.paths import REPO_ROOT
from fp8lab.report import decision

H200 = REPO_ROOT / "reports" / "h200"


def _items(d):
    return {i.what: i for i in d.buys + d.costs}


def test_h200_decision_from_the_records():
    d = decision.decide(H200)
    it = _items(d)
    # capacity: Study 06's engines at 24 GiB of KV, block counts (fp8 = 2 x auto + 1)
    rows = json.loads((H200 / "06_decode_speed.rows.json").read_text())
    blocks = {r["kv_dtype"]: r["value"] for r in rows if r["metric"] == "num_blocks"}
    assert it["capacity"].text.startswith(f"{blocks['fp8'] / blocks['auto']:.2f}x the KV tokens")
    assert "10,922 → 21,845 blocks" in it["capacity"].text and it["capacity"].link == "06_decode_speed.html#verdict"
    # throughput at saturation: Study 01's paired delta at 64 in flight, its interval and n
    assert (
        "at 64 requests in flight (closed loop): +13.2% [+12.7, +13.6], n = 5 paired trials"
        in it["throughput at saturation"].text
    )
    assert "at 32,768 tokens per request: 5 → 10 requests" in it["concurrency"].text
    # Study 06 replicated at the engine level (2026-12-03): the one-engine-at-a-time arm, intervals over 3 engine pairs
    step = it["decode step"].text
    assert "95% CI over fresh engines; decode step, CUDA graphs, one engine at a time, 3 engines per dtype" in step
    assert "batch 1, 4,096 tokens: +1.5% [+1.0, +2.0], n = 3 engine pairs" in step
    assert "batch 1: 10,187 tokens [8,677, 11,127], n = 3 engine pairs over 9 contexts" in it["crossover"].text
    assert "chat at 64 conversations: +40.0 pp [+40.0, +40.1], n = 3" in it["prefix hits"].text
    assert it["fixed cost"].text.startswith(
        "fixed cost per decode step at batch 1 (the fits' intercepts, fp8 minus auto): +117 µs [+76, +158] on 5.22 ms, "
        "n = 3 engine pairs over 9 contexts (interval over engines)"
    )
    # the crossover's interval is clamped at 0 tokens (the 2026-11 run's batch-32 interval reaches below zero)
    old, _ = decision.crossovers(H200 / "decode-2026-11")
    assert "batch 32: 381 tokens [0, 907]" in old.text and "-457" not in old.text
    # quality: the H200 report's Study 03 ran the real model (2026-12-03), scored through the cache
    assert it["quality"].measured and it["quality"].link == "03_quality_token_match.html#verdict"
    assert "quality through the cache on SmolLM2-135M-Instruct (ppl, fp8): +1.445 % [+1.121, +1.754], n = 64" in (
        it["quality"].text
    )
    assert (
        "batch 1 beyond about 10,187 tokens" in d.turn_on_if and "short of KV memory" in d.keep_auto_if + d.turn_on_if
    )
    assert "the quality cost measured here (+1.445 % [+1.121, +1.754], n = 64)" in d.keep_auto_if
    # long-context retrieval: Study 04's paired passkey rows on the real model (2026-12-04: 720 prompts per cell), the
    # largest resolved loss
    rows = json.loads((H200 / "04_long_context_ramp_128k.rows.json").read_text())
    diffs = [r for r in rows if r["metric"] == "passkey_accuracy_diff"]
    worst = min((r for r in diffs if r["ci_high"] < 0), key=lambda r: r["value"])
    assert (worst["context_len"], round(100 * worst["value"], 1)) == (4096, -10.6)
    assert it["retrieval"].text == (
        "long-context retrieval on SmolLM2-135M-Instruct (passkey, fp8 minus auto, paired prompts): -10.6 points "
        "[-13.4, -7.7] at 4,096 tokens with 1 needle, n = 720; a loss resolved in 8 of 8 length x needle cells"
    )
    assert max(r["detectable"] for r in diffs) < 0.05  # issue 33: every cell resolves 5 points
    assert it["retrieval"].link == "04_long_context_ramp_128k.html#verdict"
    assert "retrieve facts from long contexts (-10.6 points [-13.4, -7.7] at 4,096 tokens)" in d.keep_auto_if


def test_retrieval_is_left_out_without_real_model_rows_and_says_emulated(tmp_path):
    """No passkey rows of a real model (the shipped model cannot retrieve): no retrieval line, nothing added to the
    rule; an emulated run (an AVX2 CPU) is named so, and a loss no interval resolves adds nothing to the rule."""
    assert decision.retrieval(tmp_path) == (None, None)
    row = {
        "study": "long_context", "metric": "passkey_accuracy_diff", "kv_dtype": "fp8", "baseline": "auto",
        "setting": "passkey, 1 needle, SmolLM2-135M-Instruct, fp8 emulated", "subset": None, "concurrency": None,
        "batch": None, "context_len": 1024, "value": -0.05, "ci_low": -0.2, "ci_high": 0.1, "n": 30,
        "unit": "fraction", "beyond_noise": None, "detectable": 0.3, "evidence": "cpu analogue",
        "device": "CPU: AMD EPYC", "model": "SmolLM2-135M-Instruct",
    }  # fmt: skip
    (tmp_path / "04_long_context_ramp_128k.rows.json").write_text(json.dumps([row]))
    it, loss = decision.retrieval(tmp_path)
    assert "(passkey, fp8 (emulated) minus auto" in it.text and "a loss resolved in 0 of 1" in it.text
    assert loss is None  # no interval below zero: nothing for the rule to cite
    assert "long contexts" not in decision.decide(tmp_path).keep_auto_if


def test_missing_evidence_is_said(tmp_path):
    d = decision.decide(tmp_path)
    assert all(not i.measured and "not" in i.text for i in d.buys + d.costs)
    assert d.turn_on_if.startswith("not decidable from this report")
    box = decision.decision_html(tmp_path)
    assert box.startswith('<section id="decision">') and "(measured here)" not in box


def test_a_real_model_quality_row_is_used(tmp_path):
    shutil.copy(H200 / "06_decode_speed.rows.json", tmp_path)
    row = {
        "study": "quality", "metric": "tf_kl", "kv_dtype": "fp8", "baseline": "auto", "setting": "through the cache",
        "subset": None, "concurrency": None, "batch": None, "context_len": None, "value": 0.0123, "ci_low": 0.01,
        "ci_high": 0.015, "n": 200, "unit": "nats", "beyond_noise": True, "detectable": None, "evidence": "gpu",
        "device": "NVIDIA H200", "model": "Qwen3-8B",
    }  # fmt: skip
    from fp8lab import summary_table as st

    if "nats" not in st.UNITS:  # the schema's units: use one it has
        row["unit"] = "ratio"
    if "tf_kl" not in st.METRICS:
        row["metric"] = next(m for m in st.METRICS if "kl" in m or "ppl" in m)
    (tmp_path / "09_quality_real.rows.json").write_text(json.dumps([row]))
    it = _items(decision.decide(tmp_path))
    assert it["quality"].measured and "on Qwen3-8B" in it["quality"].text and "n = 200" in it["quality"].text
    assert it["quality"].link is None or it["quality"].link.startswith("09_quality_real")


def test_gpu_quick_profile_runs_its_own_notebooks():
    """`fp8lab run --profile gpu-quick -p MODEL x` runs 00, 06 and 03 (the profile's `run:` list) with CUDA graphs,
    both engines alive at 0.45 each, batch 8 capped by its prefill budget, and quality on real weights."""
    from fp8lab.profiles import list_notebooks, load_profile, resolved_parameters

    prof = load_profile("gpu-quick")
    paths = list_notebooks(prof["run"])
    assert [p.stem[:2] for p in paths] == ["00", "06", "03"]
    p06 = resolved_parameters(paths[1], prof, {"MODEL": "data/configs/qwen3-8b"})
    assert p06["MODEL"] == "data/configs/qwen3-8b" and p06["ENFORCE_EAGER"] is False
    assert p06["GPU_MEMORY_UTILIZATION"] * 2 <= 0.9 and p06["BATCHES"] == [1, 8]
    # MAX_MODEL_LEN null: the grid's longest sequence within the model's positions (decode.spec.fit_model_len)
    from fp8lab.decode.spec import DecodeSpec, plan

    assert p06["MAX_MODEL_LEN"] is None and p06["ENGINES"] == 1 and p06["ARMS"] == ["colocated"]
    s8b = DecodeSpec.from_params(p06)
    grid = plan(s8b)
    # 10 points: batch 1 at all 6 contexts to 32K (40,960 positions); batch 8 to 6K (16 GiB of KV for 8 x 16K+ fails)
    assert int(grid["measure"].sum()) == 10 and s8b.max_model_len == 32768 + 32 + 21  # batch 8's margin
    p_l3 = resolved_parameters(paths[1], prof, {"MODEL": "data/configs/llama-3-8b"})  # 8,192 positions
    s_l3 = DecodeSpec.from_params(p_l3)
    kept = plan(s_l3).query("measure")
    assert s_l3.max_model_len == 6144 + 32 + 8 and sorted(set(kept["context_len"])) == [1024, 2048, 4096, 6144]
    p03 = resolved_parameters(paths[2], prof, {})
    assert p03["KV_DTYPES"] == ["auto", "fp8"] and p03["ENGINE_ROUNDING"] == "rne"


def test_a_crossover_without_an_interval_is_shown_but_is_no_rule():
    """cpu-tiny's Study 06 (5 contexts, no interval on its crossovers): the box shows the estimates, says a fit
    crossing below the grid as such (not "0 tokens"), and does not tell the reader to turn FP8 on because of them."""
    cpu = REPO_ROOT / "reports" / "cpu-tiny"
    d = decision.decide(cpu)
    text = _items(d)["crossover"].text
    assert "batch 1: 551 tokens (no interval: too few points), n = 5 contexts" in text
    assert "batch 4: at every context measured (the fits cross below the shortest) (no interval" in text
    assert "batch 4: 0 tokens" not in text and "past the crossover" not in d.turn_on_if
