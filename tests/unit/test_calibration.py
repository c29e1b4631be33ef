"""Study 02 arithmetic with hand-computed expectations: amax -> scale for E4M3/E5M2, per-tensor vs
per-head reduction, relative difference, convergence of subsets, clipping rate and SNR on constructed
tensors, and the export's safetensors names, shapes and config."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fp8lab import calibration as c
from fp8lab.kvcapture import KVCapture, kv_cache_scheme, read_kv_scales
from fp8lab.specs import SpecError

AMAX = np.array([[448.0, 224.0], [8.96, 44.8]])  # [layers=2, kv_heads=2]


# ------------------------------------------------------------------------------- amax -> scale
def test_scale_is_amax_over_format_max_per_head():
    s = c.scales_from_amax(AMAX, "e4m3", "attn_head")
    np.testing.assert_allclose(s, [[1.0, 0.5], [0.02, 0.1]])
    s5 = c.scales_from_amax(AMAX, "e5m2", "attn_head")
    np.testing.assert_allclose(s5, AMAX / 57344.0)
    assert s5[0, 0] == pytest.approx(448 / 57344) == pytest.approx(0.0078125)  # 2^-7


def test_per_tensor_takes_the_max_over_heads():
    s = c.scales_from_amax(AMAX, "e4m3", "tensor")
    np.testing.assert_allclose(s, [[1.0, 1.0], [0.1, 0.1]])  # layer 1: max(8.96, 44.8) / 448


def test_zero_amax_gets_the_default_scale_and_custom_divisor():
    s = c.scales_from_amax(np.array([[0.0, 200.0]]), "e4m3", "attn_head", divisor=200.0)
    np.testing.assert_allclose(s, [[1.0, 1.0]])  # vLLM's dynamic K formula: amax / 200


def test_scale_set_reduced_is_the_max_over_heads():
    ss = c.ScaleSet("x", "fp8", "attn_head", [[0.05, 0.5], [0.2, 0.1]], [[1.0, 2.0], [3.0, 3.0]])
    assert ss.format == "e4m3"  # vLLM's "fp8" is E4M3
    r = ss.reduced()
    assert r.strategy == "tensor"
    np.testing.assert_allclose(r.k, [[0.5, 0.5], [0.2, 0.2]])
    np.testing.assert_allclose(r.v, [[2.0, 2.0], [3.0, 3.0]])
    with pytest.raises(SpecError, match="positive finite"):
        c.ScaleSet("bad", "e4m3", "tensor", [[0.0]], [[1.0]])
    with pytest.raises(SpecError, match="strategy"):
        c.ScaleSet("bad", "e4m3", "channel", [[1.0]], [[1.0]])


def _capture(k_amax, v_amax, seq_lens=None):
    k, v = np.asarray(k_amax, np.float32), np.asarray(v_amax, np.float32)
    return c.AmaxCapture("m", k, v, list(seq_lens or [10] * len(k)), 0.0, 1.0)


def test_capture_amax_over_sequences_and_scale_sets():
    cap = _capture([[[1.0, 4.0]], [[2.0, 3.0]]], [[[5.0, 1.0]], [[1.0, 1.0]]])  # 2 seqs, 1 layer, 2 heads
    k, v = cap.amax()
    np.testing.assert_allclose(k, [[2.0, 4.0]])
    np.testing.assert_allclose(v, [[5.0, 1.0]])
    np.testing.assert_allclose(cap.amax([1])[0], [[2.0, 3.0]])
    ss = c.scale_set_from_capture("large", cap, "e4m3", "attn_head")
    np.testing.assert_allclose(ss.k, [[2 / 448, 4 / 448]])
    assert (ss.n_samples, ss.n_tokens) == (2, 20)
    dyn = c.scale_set_from_capture("dyn", cap, "e4m3", "tensor", divisors=c.VLLM_DYNAMIC_DIVISORS)
    np.testing.assert_allclose(dyn.k, [[4 / 200, 4 / 200]])
    np.testing.assert_allclose(dyn.v, [[5 / 100, 5 / 100]])


# ------------------------------------------------------------------------------- differences
def test_relative_difference_table_against_the_large_set():
    large = c.ScaleSet("large", "e4m3", "attn_head", [[0.10, 0.20]], [[1.0, 1.0]])
    small = c.ScaleSet("prompt32", "e4m3", "attn_head", [[0.097, 0.20]], [[0.5, 1.5]])
    d = c.scale_diff_table([large, small])
    p = d[d["name"] == "prompt32"].set_index(["tensor", "head"])
    assert p.loc[("K", 0), "rel_diff"] == pytest.approx(0.03)
    assert p.loc[("K", 1), "rel_diff"] == 0.0
    assert p.loc[("V", 0), "rel_diff"] == pytest.approx(0.5) and p.loc[("V", 1), "rel_diff"] == pytest.approx(0.5)
    assert p.loc[("K", 0), "abs_diff"] == pytest.approx(0.003)
    assert p.loc[("V", 0), "ratio"] == pytest.approx(0.5)
    s = c.scale_diff_summary(d).set_index("name")
    assert s.loc["prompt32", "rel_diff_mean"] == pytest.approx((0.03 + 0 + 0.5 + 0.5) / 4)
    assert s.loc["prompt32", "rel_diff_max"] == pytest.approx(0.5)
    assert s.loc["prompt32", "rel_diff_mean_K"] == pytest.approx(0.015)
    assert s.loc["large", "rel_diff_max"] == 0.0


def test_default_and_per_tensor_sets_compare_with_the_per_tensor_reference():
    cap = _capture([[[448.0, 224.0]]], [[[44.8, 44.8]]])
    sets = c.build_scale_sets({"large": cap}, ["e4m3"], ["attn_head"], dynamic_from="large")
    assert [s.name for s in sets] == ["large", "dynamic_emul", "default"]
    d = c.scale_diff_table(sets).set_index(["name", "tensor", "head"])
    # default 1.0 against large per head: K head 1 scale 0.5 -> |1 - 0.5| / 0.5
    assert d.loc[("default", "K", 1), "rel_diff"] == pytest.approx(1.0)
    assert d.loc[("default", "V", 0), "rel_diff"] == pytest.approx((1 - 0.1) / 0.1)


def test_convergence_of_subsets():
    # 4 sequences; the full amax per head is reached only by sequence 3
    k = [[[1.0, 1.0]], [[1.0, 1.0]], [[1.0, 1.0]], [[2.0, 4.0]]]
    cap = _capture(k, k, [5, 5, 5, 5])
    conv = c.convergence_table(cap, [1, 4], draws=3, seed=0, strategies=["attn_head", "tensor"])
    full = conv[conv.n_samples == 4]
    assert (full.rel_diff_mean == 0).all() and len(full) == 4  # one draw of the full set x 2 strategies x K/V
    one = conv[(conv.n_samples == 1) & (conv.strategy == "attn_head") & (conv.tensor == "K")]
    # a subset without sequence 3: head 0 (1 vs 2) 0.5, head 1 (1 vs 4) 0.75 -> mean 0.625, max 0.75
    for _, r in one.iterrows():
        assert r.rel_diff_mean in (pytest.approx(0.625), 0.0)
        assert r.n_tokens == 5
    t = c.tokens_to_threshold(conv, 0.03)
    assert t["attn_head"] == 20.0  # only the full set is within 0.03 in every draw (unless every draw hit seq 3)


# ------------------------------------------------------------------------------- clipping and SNR
def _kv(x: torch.Tensor) -> KVCapture:
    return KVCapture(model="m", dtype="float32", keys=[x], values=[x.clone()], seq_lens=[x.shape[0]])


def test_clipping_rate_on_a_constructed_tensor():
    # 1 layer, 2 heads, head_dim 4, 1 token: head 0 holds 1..4, head 1 holds 5, 10, 20, 40
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [5.0, 10.0, 20.0, 40.0]]])
    # K head 0: scale 2/448, x/scale = 224 x: 1 -> 224 and 2 -> 448 exact, 3 and 4 clip to 448 (read back 2)
    # head 1: scale 40/448, x/scale = 11.2 x: 56, 112, 224, 448, all exact in E4M3
    # V head 0: scale 1/64: 64, 128, 192, 256, exact, nothing clips
    ss = c.ScaleSet("s", "e4m3", "attn_head", [[2 / 448, 40 / 448]], [[1 / 64, 40 / 448]])
    e = c.quant_error_table(_kv(x), [ss], ["rne"]).set_index(["tensor", "head"])
    assert e.loc[("K", 0), "clipped"] == 2
    assert e.loc[("K", 1), "clipped"] == 0 and e.loc[("V", 0), "clipped"] == 0
    assert e.loc[("K", 0), "n"] == 4
    assert e.loc[("K", 0), "sq_err"] == pytest.approx(1.0 + 4.0, rel=1e-6)  # (3 - 2)^2 + (4 - 2)^2
    assert e.loc[("K", 1), "sq_err"] == 0.0
    s = c.quant_error_summary(c.quant_error_table(_kv(x), [ss], ["rne"])).set_index("tensor")
    assert s.loc["K", "clip_rate"] == pytest.approx(2 / 8) and s.loc["V", "clip_rate"] == 0.0
    sq_norm = 1 + 4 + 9 + 16 + 25 + 100 + 400 + 1600
    assert s.loc["K", "rel_mse"] == pytest.approx(5 / sq_norm, rel=1e-6)
    assert s.loc["K", "snr_db"] == pytest.approx(10 * math.log10(sq_norm / 5), rel=1e-6)
    assert s.loc["V", "snr_db"] == math.inf  # every value of V is exact at these scales


def test_rtz_and_rne_error_on_a_value_between_two_steps():
    # 1.0625 lies between E4M3 steps 1.0 and 1.125: RTZ gives 1.0 (error 0.0625), RNE ties to even 1.0
    # 1.09375 (above the midpoint): RTZ 1.0 (error 0.09375), RNE 1.125 (error 0.03125)
    x = torch.tensor([[[1.09375, 1.0, 1.0, 1.0]]])
    ss = c.ScaleSet("one", "e4m3", "tensor", [[1.0]], [[1.0]])
    e = c.quant_error_table(_kv(x), [ss], ["rtz", "rne"]).set_index(["rounding", "tensor"])
    assert e.loc[("rtz", "K"), "sq_err"] == pytest.approx(0.09375**2)
    assert e.loc[("rne", "K"), "sq_err"] == pytest.approx(0.03125**2)
    assert c.snr_db(100.0, 1.0) == pytest.approx(20.0)


# ------------------------------------------------------------------------------- export
@pytest.fixture
def tiny_ckpt(tmp_path):
    """A fake 2-layer checkpoint: only the names and the config matter to the export."""
    src = tmp_path / "src"
    src.mkdir()
    w = {f"model.layers.{i}.self_attn.{p}.weight": torch.zeros(4, 4) for i in range(2) for p in ("q_proj", "k_proj")}
    save_file(w, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2}))
    (src / "tokenizer.json").write_text("{}")
    return src


def test_export_per_head_writes_names_shapes_and_config(tiny_ckpt, tmp_path):
    ss = c.ScaleSet("large", "e4m3", "attn_head", [[0.1, 0.2], [0.3, 0.4]], [[0.5, 0.6], [0.7, 0.8]])
    out = c.export_scale_set(str(tiny_ckpt), ss, tmp_path / "out")
    with safe_open(str(out / c.SCALES_FILE), framework="pt") as st:
        names = sorted(st.keys())
        assert names == [f"model.layers.{i}.self_attn.{t}_scale" for i in range(2) for t in ("k", "v")]
        k1 = st.get_tensor("model.layers.1.self_attn.k_scale")
    assert k1.shape == (2, 1, 1) and k1.dtype == torch.float32
    assert k1.flatten().tolist() == pytest.approx([0.3, 0.4])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert cfg["quantization_config"]["kv_cache_scheme"] == {
        "num_bits": 8,
        "type": "float",
        "strategy": "attn_head",
        "dynamic": False,
        "symmetric": True,
    }
    assert kv_cache_scheme(str(out))["strategy"] == "attn_head"
    assert (out / "model.safetensors").is_symlink() and (out / "tokenizer.json").is_file()
    assert json.loads((tiny_ckpt / "config.json").read_text()).get("quantization_config") is None  # source untouched
    back = read_kv_scales(str(out))  # Study 03's reader sees the same values, and the CPU reduction
    assert back[0][1].tolist() == pytest.approx([0.5, 0.6])
    assert read_kv_scales(str(out), reduce="max")[1][0].tolist() == pytest.approx([0.4])


def test_export_per_tensor_and_refusals(tiny_ckpt, tmp_path):
    ss = c.ScaleSet("large", "e4m3", "attn_head", [[0.1, 0.2], [0.3, 0.4]], [[0.5, 0.6], [0.7, 0.8]]).reduced()
    out = c.export_scale_set(str(tiny_ckpt), ss, tmp_path / "t", link_weights=False)
    with safe_open(str(out / c.SCALES_FILE), framework="pt") as st:
        assert st.get_tensor("model.layers.0.self_attn.k_scale").shape == (1,)
        assert st.get_tensor("model.layers.1.self_attn.v_scale").tolist() == pytest.approx([0.8])
    assert (
        json.loads((out / "config.json").read_text())["quantization_config"]["kv_cache_scheme"]["strategy"] == "tensor"
    )
    assert not (out / "model.safetensors").is_symlink()
    e5 = c.ScaleSet("x", "e5m2", "tensor", [[1.0, 1.0]] * 2, [[1.0, 1.0]] * 2)
    with pytest.raises(SpecError, match="e4m3"):
        c.export_scale_set(str(tiny_ckpt), e5, tmp_path / "e5")
    wrong_layers = c.ScaleSet("x", "e4m3", "tensor", [[1.0, 1.0]], [[1.0, 1.0]])
    with pytest.raises(SpecError, match="2 layers"):
        c.export_scale_set(str(tiny_ckpt), wrong_layers, tmp_path / "w")


def test_export_dir_is_content_addressed(tiny_ckpt, tmp_path):
    a = c.ScaleSet("large", "e4m3", "attn_head", [[0.1, 0.2], [0.3, 0.4]], [[0.5, 0.6], [0.7, 0.8]])
    b = a.scaled(0.01, name="large")
    pa, pb = c.scale_set_dir(str(tiny_ckpt), a, root=tmp_path), c.scale_set_dir(str(tiny_ckpt), b, root=tmp_path)
    assert pa.name == pb.name == "large-attn_head" and pa != pb
    assert c.scale_set_dir(str(tiny_ckpt), a, root=tmp_path) == pa
    assert c.quality_label(pa) == "fp8+large-attn_head"


# ------------------------------------------------------------------------------- data and spec
def test_batches_group_equal_lengths():
    seqs = [[1] * 3, [1] * 5, [1] * 3, [1] * 3]
    assert c.batches(seqs, 2) == [[0, 2], [3], [1]]


def test_draw_samples_are_exact_windows_and_refuse_too_many():
    pool = c.CalibrationPool(
        segments=(tuple(range(10)), tuple(range(100, 105))),
        docs=("a",),
        excluded_docs=(),
        excluded_spans=0,
        roles=("val",),
    )
    s = c.draw_samples(pool, 3, 3, seed=1)
    assert len(s) == 3 and all(len(x) == 3 for x in s)
    assert len(set(s)) == 3  # distinct, non-overlapping windows; none crosses a segment's end
    assert all(x in {(0, 1, 2), (3, 4, 5), (6, 7, 8), (100, 101, 102)} for x in s)
    with pytest.raises(SpecError, match="at most 4 windows"):
        c.draw_samples(pool, 5, 3)


def test_calibration_spec_checks_fields(tiny_model):
    s = c.CalibrationSpec(model=tiny_model)
    assert s.source_names() == ["prompt32", "prompt71", "large"]  # the reports' prompt: 71 tokens here
    with pytest.raises(SpecError, match="CalibrationSpec.strategies = 'channel'"):
        c.CalibrationSpec(model=tiny_model, strategies=("channel",))
    with pytest.raises(SpecError, match="quality_sets"):
        c.CalibrationSpec(model=tiny_model, quality_sets=("prompt16",))
    with pytest.raises(SpecError, match="subset_sizes"):
        c.CalibrationSpec(model=tiny_model, calib_samples=8, subset_sizes=(16,))
    p = c.CalibrationSpec.from_params({"MODEL": tiny_model, "FORMATS": ["e4m3"], "OTHER": 1})
    assert p.formats == ("e4m3",)


def test_the_reports_prompt_cut_to_32_tokens(tiny_model):
    full = c.prompt_ids(tiny_model)
    assert len(full) == 71 and c.prompt_ids(tiny_model, 32) == full[:32]


def test_a_stored_capture_is_loaded_with_its_amax_and_timings(tiny_model, tmp_path):
    """A re-render on another machine must reuse the capture that was measured (its amax name the scale sets and
    so the engine runs): the second call loads the stored file instead of running the model again."""
    seqs = [list(range(100, 120)), list(range(200, 220))]
    first = c.stored_capture(tiny_model, seqs, batch_size=2, root=tmp_path)
    path = c.capture_path(tiny_model, seqs, 2, "cpu", root=tmp_path)
    assert path.is_file() and path.parent == tmp_path / c.STUDY / "captures"
    # mark the stored file: a load returns these values, a fresh capture could not
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        arrays = {k: z[k] for k in ("k_amax", "v_amax", "seq_lens")}
    meta["capture_s"] = 123.0
    arrays["k_amax"] = arrays["k_amax"] * 2
    np.savez(path, meta=np.asarray(json.dumps(meta)), **arrays)
    again = c.stored_capture(tiny_model, seqs, batch_size=2, root=tmp_path)
    assert again.capture_s == 123.0 and again.seq_lens == [20, 20]
    np.testing.assert_array_equal(again.k_amax, first.k_amax * 2)
    np.testing.assert_array_equal(again.v_amax, first.v_amax)
    assert first.k_amax.shape == (2, first.num_layers, first.num_kv_heads) and (first.k_amax > 0).all()
    # other token ids, batch size or device: another capture
    assert c.capture_path(tiny_model, seqs[:1], 2, "cpu", root=tmp_path) != path
    assert c.capture_path(tiny_model, seqs, 1, "cpu", root=tmp_path) != path
    assert c.capture_path(tiny_model, seqs, 2, "cuda", root=tmp_path) != path


def test_the_end_to_end_paragraph_keeps_vllms_dynamic_scales_apart_from_the_calibrated_sets():
    """On the H200 (SmolLM2-135M-Instruct, 2026-12-04) vLLM's dynamic scales gave Δppl +252% while the calibrated
    sets stayed within 0.3 points of the default scale: 'the calibrated sets move Δppl by at most 250.67 points' read
    the dynamic scales' failure as the sets'. The sets' bound and the dynamic shift are now said apart."""
    import pandas as pd

    from fp8lab.calibration.verdict import end_to_end

    cols = ["status", "delta_ppl_pct", "delta_ppl_pct_ci", "tf_top1", "tf_abs_dlogprob", "top3_match", "task_acc"]
    qs = pd.DataFrame(
        [
            ["ok", 0.0, None, 1.0, 0.0, 0.99, 0.468],
            ["ok", 1.45, (1.12, 1.75), 0.959, 0.0658, 0.92, 0.456],
            ["ok", 1.17, (0.87, 1.49), 0.958, 0.0659, 0.88, 0.464],
            ["ok", 1.31, (1.03, 1.58), 0.951, 0.0701, 0.89, 0.472],
            ["ok", 252.12, (234.12, 269.65), 0.679, 0.9503, 0.42, 0.134],
        ],
        index=["auto", "fp8", "fp8+large-attn_head", "fp8+prompt32-attn_head", "fp8+dynamic"],
        columns=cols,
    )
    txt = end_to_end(qs)
    assert (
        "the calibrated scale sets move Δppl by at most 0.28 points, teacher-forced |Δlogprob| by at most 0.0043 "
        "nats, copy-task accuracy by at most 0.016." in txt
    )
    assert (
        "vLLM's dynamic scales (`fp8+dynamic`) move, against fp8: Δppl +250.67 points, teacher-forced "
        "|Δlogprob| +0.8845 nats, copy-task accuracy -0.322." in txt
    )
    assert "`fp8+dynamic`: Δppl +252.12% (95% CI 234.12 to 269.65)" in txt
