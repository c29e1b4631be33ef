"""Notebook 08 (the KV dtype matrix) executed top to bottom by papermill on the test profile (``cpu-ci``); asserts on
the summary it wrote: a row for every dtype the installed vLLM accepts (asked of vLLM here too), each with a status
and, where it did not start, a classified root cause; capacity of what started exactly the formula's, and the
formula's figures for the rest checked against blocks computed by hand from the model's config."""

from __future__ import annotations

import pytest

from fp8lab import kvformats
from fp8lab.engine.capability import kv_support
from fp8lab.paths import NOTEBOOKS_DIR

pytestmark = [pytest.mark.slow]

NB08 = NOTEBOOKS_DIR / "08_kv_dtype_matrix.ipynb"
CLASSES = {"not on this device", "not for this model", "engine bug"}


@pytest.fixture(scope="module")
def nb08(run_nb, tiny_model):
    params, summary = run_nb(NB08, {"MODEL": tiny_model})
    return params, summary


def test_every_dtype_vllm_accepts_has_a_row_with_a_status_and_a_cause(nb08):
    params, s = nb08
    allowed = kvformats.allowed_kv_dtypes()[0]
    variants = [f"{d}+skip{'-'.join(layers)}" for d, layers in params["SKIP_LAYER_VARIANTS"]]
    assert set(s["rows"]) == {*allowed, *variants} and s["n_rows"] == len(allowed) + len(variants)  # JSON sorts keys
    assert s["complete"] is True and s["n_started"] + s["n_refused"] + s["n_crashed"] == s["n_rows"]
    for label, r in s["rows"].items():
        assert r["status"] in {"started", "refused", "crashed"}, label
        assert (r["status"] == "started") == ("cause_class" not in r), label
        if r["status"] != "started":
            assert r["cause_class"] in CLASSES, label
    assert s["rows"]["fp8_ds_mla"]["cause_class"] == "not for this model"  # an MLA format on a Qwen3 model
    if not kv_support("fp8").native:  # this AVX2 host: no FP8 kernel, and CPU_ATTN takes no other quantized cache
        assert s["started"] == ["auto"] and s["rows"]["fp8"]["cause_class"] == "not on this device"


def test_capacity_is_the_formulas_and_the_hand_count(nb08):
    params, s = nb08
    auto = s["rows"]["auto"]
    bs, budget = auto["block_size"], int(params["KV_CACHE_GIB"] * 2**30)
    # fp8lab-tiny-qwen3: 6 layers x 2 KV heads x (64 + 64) values per token
    assert auto["num_blocks"] == auto["formula_blocks"] == budget // (bs * 6 * 2 * 128 * 2) and auto["blocks_exact"]
    assert s["capacity_exact_all"] is True
    r = s["rows"]
    assert r["fp8"]["formula_blocks"] == budget // (bs * 6 * 2 * 128)
    assert r["int8_per_token_head"]["formula_blocks"] == budget // (bs * 6 * 2 * (128 + 8))  # + fp32 K and V scales
    # TurboQuant k8v4: 2 of 6 layers packed (slot 64 + 32 + 4 = 100 B per head), the 4 boundary layers at bf16
    assert r["turboquant_k8v4"]["formula_blocks"] == budget // (bs * (2 * 2 * 100 + 4 * 2 * 256))
    assert r["fp8+skip0"]["formula_blocks"] == budget // (bs * (5 * 2 * 128 + 2 * 256))
    assert r["fp8"]["capacity_x"] == pytest.approx(r["fp8"]["formula_blocks"] / auto["num_blocks"])


def test_what_started_was_read_from_the_engine(nb08):
    _, s = nb08
    auto = s["rows"]["auto"]
    assert auto["attention_backend"] and auto["scales"] == "none (16-bit cache)"
    assert auto["prefix_hit_equals_cold"] is True
    assert auto["top1_agreement"] == 1.0 and auto["dppl_pct"] == 0.0 and auto["greedy_identical"] == 1.0
    assert "through the KV cache" in s["quality_method"]  # forced decode (fp8lab.forcing)
