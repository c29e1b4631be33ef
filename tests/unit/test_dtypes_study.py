"""Study 08's spec, root-cause classes and pre-checks, and ``fp8lab doctor``'s matrix, without an engine (the
installed vLLM's answer is read from its cache; the notebook test runs the engines)."""

from __future__ import annotations

import pytest

from fp8lab.dtypes import doctor
from fp8lab.dtypes import study as s08
from fp8lab.dtypes.run import ENGINE_BUG, NOT_FOR_MODEL, NOT_ON_DEVICE, classify, precheck
from fp8lab.dtypes.spec import MatrixSpec
from fp8lab.engine.capability import kv_support
from fp8lab.errors import SpecError
from fp8lab.kvformats import allowed_kv_dtypes, installed_choices

TINY = "data/models/fp8lab-tiny-qwen3"


def test_the_rows_are_every_dtype_vllm_accepts_then_the_variants():
    spec = s08.Spec.from_params({"MODEL": TINY, "KV_DTYPES": None, "SKIP_LAYER_VARIANTS": [["fp8", [0, "5"]]]})
    allowed = allowed_kv_dtypes()[0]
    assert spec.kv_dtypes == allowed and len(allowed) == len(installed_choices()["kv_cache_dtypes"])  # type: ignore[index]
    rows = spec.rows()
    assert [r["label"] for r in rows] == [*allowed, "fp8+skip0-5"] and rows[-1]["skip_layers"] == ["0", "5"]
    assert spec.engine_spec("int8_per_token_head").enable_prefix_caching is True


@pytest.mark.parametrize(
    "params, field, allowed",
    [
        ({"KV_DTYPES": ["auto", "int9"]}, "kv_dtypes", "the installed vLLM"),
        ({"KV_DTYPES": ["fp8"]}, "kv_dtypes", "a list holding 'auto'"),
        ({"SKIP_LAYER_VARIANTS": [["fp8", "0"]]}, "skip_layer_variants", "pairs [dtype, [layer, ...]]"),
        ({"SKIP_LAYER_VARIANTS": [["fp8", ["first"]]]}, "skip_layer_variants", "layer indices"),
        ({"START_ANYWAY": ["nvfp5"]}, "start_anyway", "the installed vLLM"),
        ({"DECODE_CONTEXTS": [4096]}, "decode_contexts", "an integer in [1, "),
    ],
)
def test_bad_parameters_are_named_before_any_engine(params, field, allowed):
    with pytest.raises(SpecError) as err:
        s08.Spec.from_params({"MODEL": TINY, **params})
    assert err.value.field == field and allowed in str(err.value)


def test_root_cause_classes():
    assert classify("started", "", "auto", False) is None
    assert classify("crashed", "Segmentation fault", "int8_per_token_head", False) == ENGINE_BUG
    assert classify("refused", "anything", "fp8_ds_mla", False) == NOT_FOR_MODEL  # an MLA format, a non-MLA model
    assert classify("refused", "head size 80 is not supported", "nvfp4", False) == NOT_FOR_MODEL
    assert classify("refused", "FP8 KV cache on CPU requires x86 with AVX-512", "fp8", False) == NOT_ON_DEVICE


def test_precheck_refuses_from_vllms_backend_answer_without_an_engine():
    info = installed_choices()
    spec = MatrixSpec(model=TINY, kv_dtypes=("auto",), start_anyway=("turboquant_k8v4",))
    tq = precheck(spec, {"kv_cache_dtype": "turboquant_k8v4", "skip_layers": []}, info)
    assert tq is None  # started anyway: the engine gives its own answer
    if info and info.get("default_backend") == "CPU_ATTN":
        r = precheck(spec, {"kv_cache_dtype": "int8_per_token_head", "skip_layers": []}, info)
        assert r is not None and r["status"] == "refused" and "CPU_ATTN" in r["cause"]
        assert "supports_kv_cache_dtype" in r["cause"] and "no engine started" in r["checked"]
    assert precheck(spec, {"kv_cache_dtype": "auto", "skip_layers": []}, info) is None


def test_doctor_answers_every_format_from_vllms_answer_without_a_stored_run(tmp_path):
    m = doctor.machine_matrix(TINY, root=tmp_path)
    assert [r["kv_cache_dtype"] for r in m["rows"]] == list(allowed_kv_dtypes()[0])
    by = {r["kv_cache_dtype"]: r for r in m["rows"]}
    assert by["auto"]["here"] == "undecided" and m["source_run"] is None
    if not kv_support("fp8").native:
        assert by["fp8"]["here"] == "refused" and by["fp8"]["cause_class"] == NOT_ON_DEVICE
    text = doctor.format_matrix(m)
    assert text.splitlines()[0].startswith("KV formats of vLLM ") and len(text.splitlines()) == 1 + len(m["rows"])
