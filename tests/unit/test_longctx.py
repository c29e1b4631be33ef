"""Study 04 arithmetic, by hand: length grids, long documents cut to exact token counts, passkey
insertion, the capacity boundary, growth fits, crossovers, per-position divergence; and the whole
analysis path on a fake engine runner (no vLLM)."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pandas as pd
import pytest

from fp8lab import longctx as lc
from fp8lab import workloads
from fp8lab.engine.result import EngineResult
from fp8lab.paths import TINY_MODEL_DIR
from fp8lab.specs import SpecError

TINY = str(TINY_MODEL_DIR)


# ------------------------------------------------------------------------------------------ grids
def test_geometric_grid_ends_at_the_longest_prompt():
    assert lc.length_grid("geometric", 1024, 8192, 32) == (1024, 2048, 4096, 8160)
    # the H200 ramp: 1K ... 64K, then 128K minus the output
    assert lc.length_grid("geometric", 1024, 131072, 32) == (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131040)
    # the last doubling lands exactly on the longest prompt: no duplicate
    assert lc.length_grid("geometric", 1024, 8192 + 16, 16) == (1024, 2048, 4096, 8192)


def test_geometric_grid_rounds_a_fractional_factor():
    # 100, 150, 225, 337.5 -> 338 (round half to even), then 506 > 340: stop; last = 350 - 10
    assert lc.length_grid("geometric", 100, 350, 10, factor=1.5) == (100, 150, 225, 338, 340)


def test_linear_grid_is_the_reports_ramp():
    assert lc.length_grid("linear", 1024, 8192, 32, step=1024) == (1024, 2048, 3072, 4096, 5120, 6144, 7168, 8160)
    assert lc.length_grid("linear", 1024, 4096 + 32, 32, step=1024) == (1024, 2048, 3072, 4096)
    assert lc.length_grid("linear", 1000, 1010, 10) == (1000,)
    assert len(lc.length_grid("linear", 1024, 131072, 32, step=1024)) == 128  # 1K, 2K, ..., 127K, 131040


@pytest.mark.parametrize(
    "args,kw",
    [
        (("cubic", 1, 100, 1), {}),
        (("geometric", 1024, 1000, 32), {}),
        (("geometric", 16, 100, 4), {"factor": 1.0}),
        (("linear", 16, 100, 4), {"step": 0}),
    ],
)
def test_grid_rejects_bad_values(args, kw):
    with pytest.raises(SpecError):
        lc.length_grid(*args, **kw)


# ------------------------------------------------------------------------------------------ documents
def test_assemble_keeps_paragraphs_and_inserts_blocks():
    doc = lc.assemble_document(["p1\n\np2\n  \np3", "p4"], inserts=("code", "json"), every=2, seed=3)
    parts = doc.split("\n\n")
    assert parts[0] == "p1" and parts[1] == "p2" and parts[3] == "p3" and parts[4] == "p4"
    assert parts[2].startswith("```python\n") and parts[2].endswith("```")  # after paragraph 2: code
    obj = json.loads("\n\n".join(parts[5:]))  # after paragraph 4: json (indented, one block)
    assert set(obj) == {"id", "name", "enabled", "ratio", "tags", "limits"}
    # seeded: the same seed gives the same document, another seed another one
    assert doc == lc.assemble_document(["p1\n\np2\n  \np3", "p4"], inserts=("code", "json"), every=2, seed=3)
    assert doc != lc.assemble_document(["p1\n\np2\n  \np3", "p4"], inserts=("code", "json"), every=2, seed=4)


def test_assemble_without_inserts_is_the_text():
    assert lc.assemble_document(["a\n\nb", "c\n"], inserts=()) == "a\n\nb\n\nc"
    with pytest.raises(SpecError):
        lc.assemble_document(["a"], inserts=("yaml",))


def test_json_object_is_valid_json():
    rng = random.Random(0)
    for _ in range(5):
        assert isinstance(json.loads(lc.json_object(rng)), dict)


def test_document_ids_are_exact_and_nested():
    a = lc.document_ids(TINY, 1000)
    b = lc.document_ids(TINY, 3000)
    assert len(a) == 1000 and len(b) == 3000 and b[:1000] == a
    assert lc.document_ids(TINY, 500, offset=250) == b[250:750]
    assert lc.document_ids(TINY, 777, inserts=()) != lc.document_ids(TINY, 777)  # inserts change the text


def test_document_ids_wrap_around_a_short_corpus(monkeypatch):
    class Stub:
        ids = list(range(10))

        def take(self, n):
            return self.ids

    key = (lc.resolve_model(TINY), ("code", "json"), 6, 12345)
    monkeypatch.setitem(workloads._STREAMS, key, Stub())
    assert lc.document_ids(TINY, 7, offset=8, seed=12345) == (8, 9, 0, 1, 2, 3, 4)
    assert lc.document_ids(TINY, 25, offset=0, seed=12345) == tuple(list(range(10)) * 2 + list(range(5)))


# ------------------------------------------------------------------------------------------ passkey
def test_insert_at_depth():
    assert lc.insert_at_depth([1, 2, 3, 4], [9], 0.5) == ((1, 2, 9, 3, 4), 2)
    assert lc.insert_at_depth([1, 2, 3, 4], [9, 9], 0.0) == ((9, 9, 1, 2, 3, 4), 0)
    assert lc.insert_at_depth([1, 2, 3, 4], [9], 1.0) == ((1, 2, 3, 4, 9), 4)
    assert lc.insert_at_depth(list(range(10)), [99], 0.34)[1] == 3  # round(3.4)
    with pytest.raises(SpecError):
        lc.insert_at_depth([1], [2], 1.5)


def test_passkey_items_exact_length_and_needle_where_asked():
    from fp8lab.workloads import load_tokenizer

    tok = load_tokenizer(lc.resolve_model(TINY))
    items = lc.passkey_items(TINY, [256, 512], [0.0, 0.5, 1.0], trials=2, seed=1)
    assert len(items) == 2 * 3 * 2 and len({it.tag for it in items}) == 12
    for it in items:
        assert len(it.prompt) == it.length
        assert len(it.key) == 5 and it.key.isdigit()
        needle = tok.encode(lc.PASSKEY_NEEDLE.format(key=it.key), add_special_tokens=False)
        assert list(it.prompt[it.needle_pos : it.needle_pos + len(needle)]) == needle
        task = tok.encode(lc.PASSKEY_TASK, add_special_tokens=False)
        question = tok.encode(lc.PASSKEY_QUESTION, add_special_tokens=False)
        hay = it.length - len(task) - len(needle) - len(question)
        assert it.needle_pos == len(task) + round(it.depth * hay)
        assert list(it.prompt[-len(question) :]) == question
    with pytest.raises(SpecError):
        lc.passkey_items(TINY, [40], [0.5])  # shorter than task + needle + question


def test_multi_key_items_hold_every_needle_and_ask_for_the_one_at_depth():
    """The multi-key variant: k needles alike but for a label, each with its own key, the asked one at ``depth``
    (``needle_pos``), the others elsewhere; the question names the asked label; one-key items are unchanged."""
    from fp8lab.workloads import load_tokenizer

    tok = load_tokenizer(lc.resolve_model(TINY))
    one = lc.passkey_items(TINY, [256], [0.5], trials=2, seed=3)
    both = lc.passkey_items(TINY, [256], [0.5], trials=2, seed=3, keys=(1, 4))
    assert [it.prompt for it in both[:2]] == [it.prompt for it in one]  # keys=(1,) first: same prompts as ever
    multi = both[2:]
    assert len(multi) == 2 and all(it.keys == 4 and it.tag.endswith("-k4") for it in multi)
    for it in multi:
        assert len(it.prompt) == 256
        text = tok.decode(list(it.prompt))
        asked = text.rsplit("What is the pass key for the ", 1)[1].split(" door", 1)[0]
        assert asked in lc.PASSKEY_LABELS
        assert text.count("door's pass key.") == 4  # four needles
        needle = tok.encode(lc.PASSKEY_MULTI_NEEDLE.format(label=asked, key=it.key), add_special_tokens=False)
        assert list(it.prompt[it.needle_pos : it.needle_pos + len(needle)]) == needle  # the asked one, where stated
        others = [lab for lab in lc.PASSKEY_LABELS if lab != asked and f"for the {lab} door is" in text]
        assert len(others) == 3
    with pytest.raises(SpecError, match="keys"):
        lc.passkey_items(TINY, [256], [0.5], keys=(9,))


def test_passkey_paired_difference_interval_and_power():
    """Paired over prompts: 100 prompts, auto right on 80, fp8 on 75 (5 lost, 0 gained): diff -0.05 with a t-interval
    over the per-prompt differences; with nothing discordant the interval is the rule of three, +-3/n."""
    import numpy as np
    import pandas as pd

    from fp8lab.longctx.divergence import paired_mde_proportion, passkey_paired

    tags = [f"p{i}" for i in range(100)]
    auto = [1] * 80 + [0] * 20
    fp8 = [1] * 75 + [0] * 25
    pk = pd.DataFrame(
        [
            {"kv_dtype": "auto", "tag": t, "keys": 1, "length": 1024, "correct": bool(a)}
            for t, a in zip(tags, auto, strict=True)
        ]
        + [
            {"kv_dtype": "fp8", "tag": t, "keys": 1, "length": 1024, "correct": bool(b)}
            for t, b in zip(tags, fp8, strict=True)
        ]
    )
    r = passkey_paired(pk).iloc[0]
    d = np.array(fp8, float) - np.array(auto, float)
    h = 1.9842169515086827 * d.std(ddof=1) / 10  # t(0.975, 99) * s / sqrt(100)
    assert (r.n, r.only_base, r.only_cand) == (100, 5, 0)
    assert (
        r["diff"] == pytest.approx(-0.05)
        and r.ci_low == pytest.approx(-0.05 - h)
        and r.ci_high == pytest.approx(-0.05 + h)
    )
    assert r.mde == pytest.approx(paired_mde_proportion(auto, fp8)) and r.mde == pytest.approx(
        2.8015852 * np.sqrt(0.05 / 100), rel=1e-6
    )
    same = passkey_paired(pk.assign(correct=pk.tag.isin(tags[:80]))).iloc[0]
    assert (same["diff"], same.ci_low, same.ci_high) == (0.0, -0.03, 0.03)
    assert same.mde == pytest.approx(2.8015852 * np.sqrt(2 * 0.8 * 0.2 / 100), rel=1e-6)
    # every prompt right on both sides (cpu-tiny's 3 passkey prompts per length): the planned discordance 2p(1-p) is
    # 0, which read as "detects 0.0 points"; the rule of three bounds it at 3/n: 3 prompts detect nothing under 100 points
    assert paired_mde_proportion([1, 1, 1], [1, 1, 1]) == pytest.approx(2.8015852 * np.sqrt(1 / 3), rel=1e-6)
    assert paired_mde_proportion([1] * 300, [1] * 300) == pytest.approx(2.8015852 * np.sqrt(0.01 / 300), rel=1e-6)


def test_passkey_scoring():
    assert lc.passkey_correct(" 71432. Remember it.", "71432")
    assert lc.passkey_correct(" 7 14 32", "71432")
    assert not lc.passkey_correct(" 7143", "71432")
    assert not lc.passkey_correct(" 714321", "71432")
    assert not lc.passkey_correct(" a string", "71432") and not lc.passkey_correct("", "71432")


# ------------------------------------------------------------------------------------------ boundary
def test_block_arithmetic():
    assert lc.blocks_for(8192, 128) == 64 and lc.blocks_for(8193, 128) == 65 and lc.blocks_for(0, 16) == 0
    assert lc.longest_context(81, 128) == 80 * 128 == 10240
    assert lc.longest_context(1, 16) == 0 and lc.longest_context(0, 16) == 0
    assert lc.max_concurrency_at(81, 128, 8192) == 1  # 80 usable blocks // 64
    assert lc.max_concurrency_at(163, 128, 8192) == 2  # 162 // 64
    assert lc.max_concurrency_at(100_000, 16, 1024, max_num_seqs=256) == 256  # 1562, capped


def test_tiny_model_boundary_at_003_gib():
    """The cpu-tiny budget: 0.03 GiB = 32,212,254 bytes. Tiny model: 6 layers x 2 KV heads x (64 + 64) x 2 B =
    3072 B/token (auto), 1536 (fp8); a 128-token block is 393,216 / 196,608 bytes -> 81 / 163 blocks. vLLM 0.32
    (CPU) said exactly this when asked for 10,368 tokens with auto: "the estimated maximum model length is 10240"."""
    plan = lc.LongCtxPlan(model=TINY, lengths=(1024, 8160), kv_cache_gib=0.03, block_size=128)
    assert lc.predicted_num_blocks(plan, "auto", 128) == 81
    assert lc.predicted_num_blocks(plan, "fp8", 128) == 163
    assert lc.longest_context(81, 128) == 10240 and lc.longest_context(163, 128) == 20736
    msg = (
        "ValueError: To serve at least one request with the model's max seq len (10368), (0.03 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.03 GiB). Based on the available memory, "
        "the estimated maximum model length is 10240. Try increasing `gpu_memory_utilization`"
    )
    assert lc.parse_estimated_max_len(msg) == 10240
    assert lc.parse_estimated_max_len("CUDA error: out of memory") is None and lc.parse_estimated_max_len(None) is None


def test_qwen3_8b_boundary_at_24_gib():
    """Qwen3-8B: 2 x 36 layers x 8 heads x 128 x 2 B = 147,456 B/token; 16-token blocks of 2,359,296 B (auto) /
    1,179,648 B (fp8); 24 GiB -> 10,922 / 21,845 blocks -> 174,736 / 349,504 tokens; at 131,072 tokens
    (8,192 blocks per sequence) auto holds 1 sequence, fp8 2."""
    plan = lc.LongCtxPlan(
        model="data/configs/qwen3-8b-128k",
        lengths=(1024, 131040),
        kv_cache_gib=24.0,
        block_size=16,
        load_format="dummy",
    )
    nb = {dt: lc.predicted_num_blocks(plan, dt, 16) for dt in ("auto", "fp8")}
    assert nb == {"auto": 10922, "fp8": 21845}
    assert lc.longest_context(nb["auto"], 16) == 174736 and lc.longest_context(nb["fp8"], 16) == 349504
    assert lc.max_concurrency_at(nb["auto"], 16, 131072) == 1 and lc.max_concurrency_at(nb["fp8"], 16, 131072) == 2
    # one ramp engine per dtype holds the whole ramp at this budget
    assert lc.ramp_max_model_len(plan, "auto", 16) == 131072


def test_ramp_runs_what_fits_when_the_budget_is_short():
    plan = lc.LongCtxPlan(model=TINY, lengths=(1024, 8160), output_tokens=32, kv_cache_gib=0.003, block_size=128)
    # 3,221,225 B // 393,216 = 8 blocks -> 7 x 128 = 896 tokens: less than the shortest request (1056): keep the
    # full max_model_len, so the engine fails at start and records the boundary
    assert lc.ramp_max_model_len(plan, "auto", 128) == 8192
    plan = lc.LongCtxPlan(model=TINY, lengths=(1024, 8160), output_tokens=32, kv_cache_gib=0.01, block_size=128)
    # 10,737,418 // 393,216 = 27 blocks -> 26 x 128 = 3328 tokens (auto); fp8: 54 -> 6784
    assert lc.ramp_max_model_len(plan, "auto", 128) == 3328
    assert lc.ramp_max_model_len(plan, "fp8", 128) == 6784


# ------------------------------------------------------------------------------------------ fits
LS = np.array([1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072], dtype=float)


def test_quadratic_growth_is_recovered():
    y = 0.01 + 2e-6 * LS + 3e-10 * LS**2
    f = lc.fit_growth(LS, y, 2)
    assert f["a"] == pytest.approx(0.01, rel=1e-6) and f["b"] == pytest.approx(2e-6, rel=1e-6)
    assert f["c"] == pytest.approx(3e-10, rel=1e-6) and f["r2"] == pytest.approx(1.0)
    assert lc.fitted(f, 131072) == pytest.approx(0.01 + 2e-6 * 131072 + 3e-10 * 131072**2)


def test_growth_exponents():
    assert lc.fit_growth(LS, 3e-10 * LS**2, 2)["exponent"] == pytest.approx(2.0)
    assert lc.fit_growth(LS, 1e-8 * LS, 1)["exponent"] == pytest.approx(1.0)
    lin = lc.fit_growth(LS, 0.005 + 1e-8 * LS, 1)
    assert lin["a"] == pytest.approx(0.005) and lin["b"] == pytest.approx(1e-8) and lin["c"] == 0.0
    # the exponent over the longer half: 0.005 + 1e-8 L is still dominated by the constant at 16K-128K
    assert 0 < lin["exponent"] < 1


def test_fit_coefficients_are_not_negative():
    f = lc.fit_growth(LS, 1.0 - 1e-6 * LS, 1)  # decreasing data: the slope is clipped at zero
    assert f["b"] == 0.0 and f["a"] > 0


def test_fit_needs_enough_points():
    f = lc.fit_growth([1024, 2048], [1.0, 2.0], 2)
    assert math.isnan(f["a"]) and f["n"] == 2


def test_crossovers():
    assert lc.measured_crossover([1, 2, 4, 8], [1, 1, 1, 1], [2, 0.5, 1.5, 0.9]) == 8
    assert lc.measured_crossover([1, 2, 4, 8], [1, 1, 1, 1], [2, 0.5, 0.5, 0.9]) == 2
    assert lc.measured_crossover([1, 2, 4, 8], [1, 1, 1, 1], [0.5, 0.5, 0.5, 1.1]) is None
    base, cand = {"a": 0.010, "b": 2e-8, "c": 0.0}, {"a": 0.011, "b": 1e-8, "c": 0.0}  # equal at 100,000 tokens
    assert lc.fitted_crossover(base, cand, 1024, 131072) == pytest.approx(1e5, rel=0.005)
    assert lc.fitted_crossover(base, cand, 1024, 65536) is None
    assert lc.fitted_crossover(cand, base, 1024, 65536) == 1024  # below everywhere: from the start


def test_decode_overlap_peak():
    g = pd.DataFrame({"sent_s": [0.0, 0.0], "ttft_s": [1.0, 2.0], "e2e_s": [3.0, 4.0]})
    assert lc.overlap_peak(g) == 2  # [1, 3] and [2, 4] overlap
    g = pd.DataFrame({"sent_s": [0.0, 0.0], "ttft_s": [1.0, 3.5], "e2e_s": [3.0, 4.0]})
    assert lc.overlap_peak(g) == 1  # the second one decodes after the first finished


# ------------------------------------------------------------------------------------------ divergence
def test_position_divergence_by_hand():
    lp = math.log
    base = {
        "prompt_token_logprobs": [float("nan"), lp(0.5), lp(0.6)],
        "prompt_topk_ids": [[], [5, 6], [7, 8]],
        "prompt_topk_logprobs": [[], [lp(0.5), lp(0.3)], [lp(0.6), lp(0.2)]],
    }
    cand = {
        "prompt_token_logprobs": [float("nan"), lp(0.4), lp(0.6)],
        "prompt_topk_ids": [[], [6, 5], [7, 8]],
        "prompt_topk_logprobs": [[], [lp(0.45), lp(0.4)], [lp(0.6), lp(0.2)]],
    }
    df = lc.position_divergence(base, cand, [1, 5, 7], top_k=2)
    assert list(df.pos) == [1, 2]
    assert list(df.top1) == [0.0, 1.0] and list(df.top2) == [1.0, 1.0]
    assert df.abs_dlogprob.iloc[0] == pytest.approx(abs(lp(0.4) - lp(0.5))) and df.abs_dlogprob.iloc[1] == 0.0
    # KL over {5, 6, rest}: p = (0.5, 0.3, 0.2), q = (0.4, 0.45, 0.15)
    kl = 0.5 * lp(0.5 / 0.4) + 0.3 * lp(0.3 / 0.45) + 0.2 * lp(0.2 / 0.15)
    assert df.kl.iloc[0] == pytest.approx(kl) and df.kl.iloc[1] == pytest.approx(0.0, abs=1e-12)
    assert df.nll_base.iloc[0] == pytest.approx(-lp(0.5))


def test_divergence_bins_and_trend():
    div = pd.DataFrame(
        {
            "pos": np.arange(1, 9),
            "top1": [1, 1, 1, 1, 1, 0, 1, 0],
            "top5": 1.0,
            "abs_dlogprob": [0.1, 0.1, 0.1, 0.1, 0.2, 0.2, 0.4, 0.4],
            "kl": 0.0,
            "nll_base": 1.0,
            "nll_cand": 1.0,
        }
    ).assign(kv_dtype="fp8", source="text", doc=0)
    b = lc.divergence_by_position(div, bins=4, length=8)  # width 2: bins 0 (pos 1), 2, 4, 6, 8 (pos 8)
    assert list(b.pos_bin) == [0, 2, 4, 6, 8] and list(b.n) == [1, 2, 2, 2, 1]
    assert list(b.flip_rate) == [0.0, 0.0, 0.0, 0.5, 1.0]  # flips at positions 6 and 8
    t = lc.divergence_trend(b).iloc[0]
    assert t.abs_dlogprob == pytest.approx(div.abs_dlogprob.mean())
    assert t.last_over_first == pytest.approx(4.0) and t.spearman_rho > 0.9


# ------------------------------------------------------------------------------------------ plan and phases
def test_plan_checks_itself():
    with pytest.raises(SpecError, match="kv_dtypes"):
        lc.LongCtxPlan(model=TINY, lengths=(1024,), kv_dtypes=("fp8", "auto"))
    with pytest.raises(SpecError, match="max_position_embeddings"):
        lc.LongCtxPlan(model=TINY, lengths=(131072,))
    with pytest.raises(SpecError, match="concurrency"):
        lc.LongCtxPlan(model=TINY, lengths=(1024,), concurrency=8, max_num_seqs=4)
    with pytest.raises(SpecError, match="sweep_block_sizes"):
        lc.LongCtxPlan(model=TINY, lengths=(1024,), sweep_block_sizes=(48,))
    with pytest.raises(SpecError, match="sweep_lengths"):
        lc.LongCtxPlan(model=TINY, lengths=(1024,), sweep_lengths=(2048,))


def test_divergence_scoring_through_the_cache_or_in_one_pass():
    """``cache`` (the default): the document's first token as the prompt, the rest forced, one decode step each;
    ``one_pass``: the whole document as the prompt, one output token, prompt logprobs (the 2026-11 H200 run's
    requests); both score the same tokens; anything else is a SpecError naming the field."""
    kw = dict(model=TINY, lengths=(1024,), quality_model=TINY, quality_length=256, quality_random_docs=1, top_k=3)
    cache, one = lc.LongCtxPlan(**kw), lc.LongCtxPlan(**kw, divergence_scoring="one_pass")
    assert cache.divergence_scoring == "cache"
    (pc, *_), _ = lc.quality_phases(cache)
    (po, *_), _ = lc.quality_phases(one)
    assert pc.name == po.name == "div-text"
    (rc,), (ro,) = pc.requests, po.requests
    doc = ro.prompt_token_ids
    assert len(doc) == 256 and ro.max_tokens == 1 and ro.prompt_logprobs == 3 and ro.forced_token_ids is None
    assert rc.prompt_token_ids == doc[:1] and rc.forced_token_ids == doc[1:] and rc.max_tokens == 255
    assert rc.logprobs == 3 and not rc.prompt_logprobs
    assert one.quality_context == cache.quality_context == 257
    with pytest.raises(SpecError, match=r"divergence_scoring = 'prefill'.*cache \| one_pass"):
        lc.LongCtxPlan(**kw, divergence_scoring="prefill")


def test_quality_concurrency_and_batch_budget_reach_the_quality_engines_only():
    """``quality_concurrency`` sets the divergence and passkey phases' requests in flight (capped at the phase's size),
    ``quality_max_num_batched_tokens`` the quality engines' prefill budget; the ramp engine keeps its own. Their
    defaults leave the phases as they were (one request at a time), so stored runs keep their keys."""
    kw = dict(model=TINY, lengths=(1024,), quality_model=TINY, quality_length=256, passkey_lengths=(256,), top_k=3)
    base = lc.LongCtxPlan(**kw)
    assert [p.concurrency for p in lc.quality_phases(base)[0]] == [1, 1, 1]
    wide = lc.LongCtxPlan(
        **kw,
        quality_docs=2,
        passkey_trials=4,
        quality_concurrency=8,
        quality_max_num_batched_tokens=4096,
        max_num_batched_tokens=512,
    )
    phases, items = lc.quality_phases(wide)
    assert {p.name: p.concurrency for p in phases} == {"div-text": 2, "div-random": 1, "passkey": 8}
    assert len(items) == 12
    assert wide.engine_spec("fp8", quality=True).max_num_batched_tokens == 4096
    assert wide.engine_spec("fp8").max_num_batched_tokens == 512
    assert base.engine_spec("fp8", quality=True).max_num_batched_tokens is None
    with pytest.raises(SpecError, match="quality_concurrency = 0"):
        lc.LongCtxPlan(**kw, quality_concurrency=0)
    with pytest.raises(SpecError, match="quality_max_num_batched_tokens = 8"):
        lc.LongCtxPlan(**kw, quality_max_num_batched_tokens=8)


def test_phase_names_round_trip():
    assert lc.phase_meta("ramp-c4-L8160") == {"kind": "ramp", "concurrency": 4, "length": 8160}
    assert lc.phase_meta("randtok-L1024") == {"kind": "randtok", "concurrency": 1, "length": 1024}
    assert lc.phase_meta("div-text")["kind"] == "div-text"


def test_ramp_phases_and_fit():
    plan = lc.LongCtxPlan(
        model=TINY,
        lengths=(512, 1008),
        output_tokens=16,
        concurrency=2,
        requests_per_length=2,
        random_token_lengths=(1008,),
    )
    phases = lc.ramp_phases(plan)
    names = [p.name for p in phases]
    assert names == ["warmup", "ramp-c1-L512", "ramp-c1-L1008", "ramp-c2-L512", "ramp-c2-L1008", "randtok-L1008"]
    c2 = phases[4]
    assert c2.concurrency == 2 and [r.prompt_len for r in c2.requests] == [1008, 1008]
    assert len({r.prompt_token_ids for r in c2.requests + phases[2].requests}) == 4  # four different documents
    assert phases[1].requests[0].prompt_token_ids == phases[2].requests[0].prompt_token_ids[:512]  # same doc, deeper
    fit = lc.fit_phases(phases, 600)
    assert [p.name for p in fit] == ["warmup", "ramp-c1-L512", "ramp-c2-L512"]


# ------------------------------------------------------------------------------------------ the analysis path, faked
def _fake_runner(plan: lc.LongCtxPlan, fp8_faster_from: int = 4096, device_kv_gib: float = 0.01):
    """Engines that behave like vLLM on the arithmetic: start only when max_model_len fits the budget (else
    vLLM's error), TTFT quadratic and ITL linear in length (fp8's ITL slope half of auto's), KV usage as the
    formula says, a preemption when concurrent requests do not fit the pool."""
    from fp8lab import kvmath

    calls = []

    def runner(spec, phases, study, driver, sample_interval_s, env=None):
        calls.append(spec)
        bs = spec.block_size or 128
        gib = spec.kv_cache_gib if spec.kv_cache_gib is not None else device_kv_gib  # None: "vLLM sizes it"
        nb = kvmath.predict_num_blocks(spec.model, int(gib * kvmath.GIB), bs, spec.kv_cache_dtype)
        longest = lc.longest_context(nb, bs)
        if spec.block_size == 16:
            return EngineResult(
                "unsupported", "No common block size for 16", {}, pd.DataFrame(), pd.DataFrame(), {}, {}
            )
        if spec.max_model_len > longest:
            err = (
                f"ValueError: To serve at least one request with the model's max seq len ({spec.max_model_len}) ... "
                f"larger than the available KV cache memory. the estimated maximum model length is {longest}. Try"
            )
            return EngineResult("oom", err, {}, pd.DataFrame(), pd.DataFrame(), {}, {})
        rows, ph = [], {}
        slope = 1e-8 if spec.kv_cache_dtype == "auto" else 0.5e-8
        for p in phases:
            for i, r in enumerate(p.requests):
                L = r.prompt_len
                ttft = 0.01 + 1e-6 * L + 1e-10 * L**2
                itl = 0.010 + slope * L + (0.001 if spec.kv_cache_dtype != "auto" and L < fp8_faster_from else 0)
                row = {
                    "phase": p.name,
                    "request": i,
                    "cls": r.cls,
                    "tag": r.tag,
                    "prompt_tokens": L,
                    "output_tokens": r.max_tokens,
                    "sent_s": 0.0,
                    "ttft_s": ttft,
                    "itl_s": [itl] * (r.max_tokens - 1),
                    "tpot_s": itl,
                    "e2e_s": ttft + itl * (r.max_tokens - 1),
                    "num_preemptions": 0,
                    "output_token_ids": [5] * r.max_tokens,
                }
                if r.prompt_logprobs is not None:
                    n = L
                    noise = 0.0 if spec.kv_cache_dtype == "auto" else 0.01
                    row.update(
                        prompt_token_logprobs=[float("nan")] + [-1.0 - noise] * (n - 1),
                        prompt_topk_ids=[[]] + [[r.prompt_token_ids[j], 1] for j in range(1, n)],
                        prompt_topk_logprobs=[[]] + [[-1.0 - noise, -2.0]] * (n - 1),
                    )
                if r.forced_token_ids is not None:  # scored through the cache: the forced tokens, their scores
                    m = len(r.forced_token_ids)
                    noise = 0.0 if spec.kv_cache_dtype == "auto" else 0.01
                    row.update(
                        output_token_ids=list(r.forced_token_ids),
                        forced_token_ids=list(r.forced_token_ids),
                        forced_ok=True,
                        output_token_logprobs=[-1.0 - noise] * m,
                        output_topk_ids=[[t, 1] for t in r.forced_token_ids],
                        output_topk_logprobs=[[-1.0 - noise, -2.0]] * m,
                    )
                rows.append(row)
            conc = len(p.requests) if p.concurrency and p.concurrency > 1 else 1
            L = max(r.prompt_len + r.max_tokens for r in p.requests)
            over = conc * lc.blocks_for(L, bs) > nb - 1  # the pool cannot hold them all: vLLM preempts
            ph[p.name] = {
                "wall_s": 1.0,
                "preemptions": 1.0 if over else 0.0,
                "mem_peak_bytes": 2**30,
                "kv_usage_peak": conc * lc.blocks_for(L, bs) / (nb - 1),
            }
        eng = {
            "num_blocks": nb,
            "block_size": bs,
            "max_model_len": spec.max_model_len,
            "max_num_seqs": 256,
            "kv_budget_bytes": int(gib * kvmath.GIB),
        }
        return EngineResult("ok", None, eng, pd.DataFrame(rows), pd.DataFrame(columns=["phase"]), ph, {})

    return runner, calls


@pytest.fixture(scope="module")
def fake_study():
    plan = lc.LongCtxPlan(
        model=TINY,
        lengths=lc.length_grid("geometric", 512, 8192, 32),
        output_tokens=32,
        concurrency=2,
        kv_cache_gib=0.03,
        block_size=128,
        random_token_lengths=(8160,),
        sweep_block_sizes=(16, 256),
        sweep_dtypes=("auto", "fp8"),
        sweep_lengths=(8160,),
        quality_model=TINY,
        quality_length=600,
        passkey_lengths=(256,),
        passkey_depths=(0.5,),
    )
    runner, calls = _fake_runner(plan)
    res = lc.run_study(plan, runner=runner, progress=False)
    return plan, res, lc.tables(res), calls


def test_fake_study_runs_every_engine(fake_study):
    plan, res, t, calls = fake_study
    roles = [r["role"] for r in res.runs]
    assert roles == ["ramp", "ramp", "sweep", "sweep", "sweep", "sweep", "probe", "probe"]
    probes = [s.max_model_len for s in calls[-2:]]
    assert probes == [10240 + 128, 20736 + 128]  # one block beyond each dtype's predicted longest context
    b = t.boundary.set_index("kv_dtype")
    assert b.loc["auto", "longest_formula"] == b.loc["auto", "longest_measured"] == 10240
    assert b.loc["fp8", "longest_measured"] == 20736 and b.loc["fp8", "over_status"] == "oom"


def test_fake_study_tables(fake_study):
    plan, res, t, _ = fake_study
    r = t.ramp.set_index(["kv_dtype", "concurrency", "length"])
    assert r.loc[("auto", 1, 8160), "outcome"] == "ok" and r.loc[("fp8", 2, 8160), "outcome"] == "held"
    assert r.loc[("auto", 1, 8160), "blocks_used_peak"] == 64
    fr = t.frontier.set_index(["kv_dtype", "length"])
    assert fr.loc[("auto", 8160), "max_conc_formula"] == 1 and fr.loc[("fp8", 8160), "max_conc_formula"] == 2
    assert fr.loc[("auto", 8160), "max_conc_measured"] == 1
    g = t.growth.set_index(["kv_dtype", "metric"])
    assert g.loc[("auto", "itl_p50_s"), "b"] == pytest.approx(1e-8, rel=1e-6)
    cx = t.crossover.set_index("metric")
    assert cx.loc["itl_p50_s", "measured"] == 4096
    bs = t.blocksize.set_index(["kv_dtype", "block_size"])
    assert bs.loc[("auto", 16), "outcome"] == "unsupported" and bs.loc[("fp8", 256), "outcome"] == "ok"
    assert len(t.divergence) == 599 * 2  # one text + one random document of 600 tokens, positions 1..599
    assert t.trend.set_index("source").loc["text", "abs_dlogprob"] == pytest.approx(0.01)
    assert set(t.passkey.kv_dtype) == {"auto", "fp8"} and not t.passkey.correct.any()
    c = lc.claims(res, t)
    # one request per dtype and length: resampling requests (a request's gaps are not independent) gives no interval,
    # so "fp8 faster beyond noise at the longest" is not established: the claim holds only in part
    assert c["gains_grow"]["label"].startswith("partly: the fp8/auto ITL ratio falls with length")
    assert c["block256"]["unsupported"] == [16]
    assert c["silent"]["baseline_can_retrieve"] is False
    md = lc.verdict_markdown(res, t, c)
    assert "10,240" in md and "20,736" in md
    s = lc.summary_values(res, t, c)
    assert s["auto.longest_measured"] == 10240 and s["fp8.crossover.itl_p50_s.measured"] == 4096
    json.dumps(s, default=str)


def test_one_passkey_prompt_per_cell_gives_no_interval_and_no_nan(fake_study):
    """The fake study asks one passkey prompt per (length, depth): its paired difference has n = 1 and no interval.
    The page says so instead of printing "+nan", the rows carry no interval (they validate: a NaN there raised),
    and the flat summary leaves the interval out."""
    plan, res, t, _ = fake_study
    assert t.passkey_paired.n.tolist() == [1]
    md = lc.verdict_markdown(res, t)
    assert "nan" not in md.lower() and "on the same 1 prompts: " in md and "no interval: too few prompts" in md
    diff = [r for r in lc.summary_rows(res, t) if r["metric"] == "passkey_accuracy_diff"]
    assert len(diff) == 1 and diff[0]["ci_low"] is None and diff[0]["ci_high"] is None
    s = lc.summary_values(res, t)
    assert "fp8.passkey_diff.L256" in s and "fp8.passkey_diff.L256.ci" not in s


def test_fake_study_short_budget_runs_what_fits():
    """0.01 GiB: auto holds 3,328 tokens (26 blocks), fp8 6,784: the ramp to 8,192 does not fit either; each
    engine starts at its own boundary (arithmetic) and the longer lengths are recorded, not sent."""
    plan = lc.LongCtxPlan(
        model=TINY,
        lengths=lc.length_grid("geometric", 512, 8192, 32),
        output_tokens=32,
        concurrency=2,
        kv_cache_gib=0.01,
        block_size=128,
    )
    runner, calls = _fake_runner(plan)
    res = lc.run_study(plan, runner=runner, progress=False)
    assert [s.max_model_len for s in calls] == [3328, 6784, 3328 + 128, 6784 + 128]
    t = lc.tables(res)
    r = t.ramp.set_index(["kv_dtype", "concurrency", "length"])
    assert r.loc[("auto", 1, 2048), "outcome"] == "ok" and r.loc[("auto", 1, 4096), "outcome"] == "over_capacity"
    assert r.loc[("fp8", 1, 4096), "outcome"] == "ok" and r.loc[("fp8", 1, 8160), "outcome"] == "over_capacity"
    b = t.boundary.set_index("kv_dtype")
    assert not b.holds_ramp.any() and list(b.longest_measured) == [3328, 6784]
    assert lc.claims(res, t)["oom"]["longest_held_at_concurrency"] == {"auto": 1024, "fp8": 2048}
    # an fp8 engine that never ran (a device without the kernel) is "not measured", never "none of the lengths"
    t.ramp.loc[t.ramp.kv_dtype == "fp8", "outcome"] = "unsupported"
    assert lc.claims(res, t)["oom"]["longest_held_at_concurrency"] == {"auto": 1024, "fp8": "not run"}
    md = lc.verdict_markdown(res, t)
    assert "`fp8` not measured (its engine ran no concurrent request)" in md and "none of the lengths" not in md


def test_fake_study_vllm_sized_cache_finds_the_boundary_by_its_error():
    """No budget (a GPU's own sizing): the ramp asks for the full length, vLLM refuses and states its maximum,
    the ramp runs again at exactly that; no probe is needed."""
    plan = lc.LongCtxPlan(
        model=TINY,
        lengths=lc.length_grid("geometric", 512, 8192, 32),
        output_tokens=32,
        concurrency=1,
        kv_cache_gib=None,
        block_size=128,
    )
    runner, calls = _fake_runner(plan, device_kv_gib=0.01)
    res = lc.run_study(plan, runner=runner, progress=False)
    assert [s.max_model_len for s in calls] == [8192, 3328, 8192, 6784]
    assert [r.status for r in res.results("ramp")] == ["oom", "ok", "oom", "ok"]
    b = lc.boundary_table(res).set_index("kv_dtype")
    assert list(b.longest_measured) == [3328, 6784] and list(b.longest_engine) == [3328, 6784]
    assert b.longest_formula.isna().all()  # no budget given: the formula has nothing to work from
