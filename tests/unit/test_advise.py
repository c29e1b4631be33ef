"""fp8lab advise: the formula's capacity, the step predicted from the committed H200 Study 06 fits, its held-out
validation (within 5%) and its bad inputs."""

from __future__ import annotations

import json

import pytest

from fp8lab import advise, kvmath
from fp8lab.cli import main
from fp8lab.errors import SpecError
from fp8lab.paths import REPO_ROOT

REF = REPO_ROOT / "reports" / "h200" / "decode-2026-11"  # Study 06 of 2026-11-30: batches 1, 8, 32 to 128K


def _point(b, c):
    s = json.loads((REF / "06_decode_speed.summary.json").read_text())
    return next(p for p in s["points"] if p["batch"] == b and p["context_len"] == c)


def test_reference_point_predicted_by_its_own_fit():
    ref = advise.load_reference(REF)
    assert ref.model == "qwen3-8b-128k" and ref.batches == [1, 8, 32]
    p = _point(8, 8192)
    for dt in ("auto", "fp8"):
        st = advise.predict_step(ref, dt, 8, 8192)
        assert st.ms == pytest.approx(p[f"{dt}_step_ms"], rel=0.01) and st.lo < st.ms < st.hi and not st.warnings


def test_advice_on_the_reference_shape():
    adv = advise.advise("qwen3-8b-128k", "h200", context=8192, batch=8)
    auto, fp8 = adv.rows
    # the formula: fp8 holds twice the blocks (one byte per element instead of two)
    assert (
        fp8["kv_bytes_per_token"] * 2
        == auto["kv_bytes_per_token"]
        == kvmath.kv_bytes_per_token(REPO_ROOT / "data/configs/qwen3-8b-128k", "auto")
    )
    assert fp8["capacity_tokens"] // 16 in (2 * auto["capacity_tokens"] // 16, 2 * auto["capacity_tokens"] // 16 + 1)
    # the step: batch 8 at 8K is measured faster with fp8 (about -7%)
    assert fp8["step_ms"] < auto["step_ms"] and adv.verdict.startswith("FP8 pays")
    assert adv.warnings == []


def test_another_model_and_extrapolation_warn():
    adv = advise.advise("llama-3-8b", "h100", context=65536, batch=8)
    text = " ".join(adv.warnings)
    assert "outside batch 8's measured contexts" in text and "another model" in text and "another GPU" in text
    adv = advise.advise("llama-3-70b", "h200", context=32768, batch=4)
    assert adv.verdict.startswith("The weights do not leave any KV memory")


def test_mix_uses_the_mean_context():
    a = advise.advise("qwen3-8b-128k", "h200", batch=8, mix=advise.parse_mix("8192:1,1024:1"))
    assert a.context == pytest.approx(4608)


#: Another model shape measured on the H200 (gpu-quick's Study 06 on Qwen3-14B's config, dummy weights, 2026-12-03).
SHAPE = REPO_ROOT / "reports/h200/gpu-quick/qwen3-14b"


def test_held_out_points_within_five_percent_and_another_shape_within_ten():
    rows = advise.validate(REF)
    kinds = {r["held_out"] for r in rows}
    assert kinds == {"context (interior)", "context (longest)", "batch"}
    assert len(rows) >= 40 and max(abs(r["error_pct"]) for r in rows) < 5.0
    shape = advise.validate_shape(REF, SHAPE, "qwen3-14b")
    assert len(shape) == 20 and max(abs(r["error_pct"]) for r in shape) < 10.0
    # the committed table is write_validation's output with that shape, row for row
    committed = (REF / "advise_validation.csv").read_text().splitlines()
    assert len(committed) == len(rows) + len(shape) + 1
    assert [ln.split(",")[:4] for ln in committed[1:]] == [
        [r["held_out"], r["kv_dtype"], str(r["batch"]), str(r["context_len"])] for r in rows + shape
    ]


def test_fixed_cost_splits_into_the_weights_read_and_a_per_layer_rest():
    """Carried to another model, the fixed cost's weight-read part (weight bytes at the measured bandwidth) scales
    with the weight bytes and the rest with the layer count: doubling the weights adds exactly one weight read;
    doubling the layers adds exactly the rest; the reference's own shape is its fit."""
    ref = advise.load_reference(REF)
    fit = ref.fits[("auto", 1)].line
    base = advise.predict_step(ref, "auto", 1, 0.0).ms
    assert base == pytest.approx(fit.a, rel=1e-12)
    read = ref.weight_read_ms
    assert 0 < read < fit.a
    two_w = advise.predict_step(ref, "auto", 1, 0.0, 2 * ref.weight_bytes, layers=ref.layers).ms
    assert two_w - base == pytest.approx(read, rel=1e-9)
    two_l = advise.predict_step(ref, "auto", 1, 0.0, ref.weight_bytes, layers=2 * ref.layers).ms
    assert two_l - base == pytest.approx(fit.a - read, rel=1e-9)
    # another GPU with twice the bandwidth reads the weights in half the time; the rest is not bandwidth
    fast = advise.predict_step(ref, "auto", 1, 0.0, bandwidth_gbs=2 * ref.bandwidth_gbs).ms
    assert base - fast == pytest.approx(read / 2, rel=1e-9)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["advise", "qwen3-8b", "--gpu", "b300"], "gpu"),
        (["advise", "qwen3-8b", "--mix", "8192:-1"], "mix"),
        (["advise", "qwen3-8b", "--batch", "0"], "batch"),
        (["advise", "qwen3-8b", "--memory-gib", "80"], "gpu"),
    ],
)
def test_bad_input_names_the_field(argv, field, capsys):
    assert main(argv) == 2
    assert f"{field}" in capsys.readouterr().err


def test_cli_prints_both_dtypes(capsys):
    assert main(["advise", "qwen3-8b-128k", "--context", "32768", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "auto:" in out and "fp8:" in out and "decode step" in out
    with pytest.raises(SpecError):
        advise.parse_mix("x:1")


def test_another_shape_is_predicted_through_its_weight_and_kv_bytes(tmp_path):
    """validate_shape predicts another model's Study 06 points from the reference's fits alone: the reference's own
    points come back within its fits' residuals; a model with a quarter of the KV bytes per token gets a quarter of
    the per-token slope; a folder without a Study 06 summary is a clear error."""
    own = advise.validate_shape(REF, REF, "qwen3-8b-128k")
    full = [p for p in json.loads((REF / "06_decode_speed.summary.json").read_text())["points"] if p["full_batch"]]
    assert len(own) == 2 * len(full) and max(abs(r["error_pct"]) for r in own) < 2.0
    # the per-token slope: predicted(32K) - predicted(1K) scales with KV bytes per token (Llama-3-8B: 32 layers x 8
    # KV heads x 128 vs Qwen3-8B: 36 layers, same heads): 32/36 of the reference's
    ref = advise.load_reference(REF)
    d_ref = advise.predict_step(ref, "auto", 1, 32768.0).ms - advise.predict_step(ref, "auto", 1, 1024.0).ms
    k = kvmath.kv_bytes_per_token(REPO_ROOT / "data/configs/llama-3-8b", "auto")
    d_l3 = (
        advise.predict_step(ref, "auto", 1, 32768.0, None, k).ms
        - advise.predict_step(ref, "auto", 1, 1024.0, None, k).ms
    )
    assert d_l3 / d_ref == pytest.approx(32 / 36, rel=1e-9)
    with pytest.raises(SpecError, match="shape"):
        advise.validate_shape(REF, tmp_path)
