"""Bad input, tried as a user would: each gets one clear message (field, value, what is allowed) before any engine
starts, or, where only vLLM can tell, a run recorded as failed without one. No test here starts an engine.

The CLI cases run the real command (``python -m fp8lab.cli``, what the ``fp8lab`` entry point calls) in a subprocess
and read its exit code and stderr, as a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.engine.run import check_model_limits, run_engine
from fp8lab.paths import CONFIGS_DIR, REPO_ROOT
from fp8lab.profiles import load_profiles
from fp8lab.specs import BLOCK_SIZES, EngineSpec, Phase, Request, SpecError
from fp8lab.workloads import parse_mix

pytestmark = pytest.mark.reliability


def cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "fp8lab.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=full_env,
        timeout=timeout,
    )


def assert_clear_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2, no traceback, one error line on stderr holding every needle."""
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


# ------------------------------------------------------------------------------------------- fp8lab estimate
def test_estimate_config_not_utf8(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_bytes(b'\xff\xfe{"model_type": "llama"}')
    assert_clear_error(cli("estimate", str(cfg)), "config.path", str(cfg), "UTF-8", "0xff")


def test_estimate_config_malformed_json(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama",\n "num_hidden_layers": 32')
    assert_clear_error(cli("estimate", str(cfg)), "config.path", "valid JSON", "line 2")


def test_estimate_config_missing_fields(tmp_path):
    cfg = json.loads((CONFIGS_DIR / "qwen3-8b" / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert_clear_error(cli("estimate", str(tmp_path)), "num_hidden_layers", "None", "a positive integer")


def test_estimate_path_that_does_not_exist(tmp_path):
    assert_clear_error(cli("estimate", str(tmp_path / "nope")), "config.path", "nothing found there")


@pytest.mark.parametrize("value", ["0", "-5", "abc"])
def test_estimate_context_len_not_a_length(value):
    assert_clear_error(cli("estimate", "qwen3-8b", "--context-len", value), "context_len", value, "an integer >= 1")


def test_estimate_context_len_past_the_model_limit():
    """The issue's case: it said "max_concurrency 0" and nothing about the model's 40,960 positions."""
    res = cli("estimate", "qwen3-8b", "--context-len", "10000000", "--memory-gib", "40")
    assert_clear_error(res, "context_len = 10000000", "max_position_embeddings = 40,960", "[1, 40,960]")
    assert "max_concurrency" not in res.stdout


def test_estimate_context_len_within_a_rope_scaled_limit():
    """qwen3-8b-128k (YaRN, factor 4, max_position_embeddings 131,072): 131,072 is allowed, 131,073 is not."""
    assert cli("estimate", "qwen3-8b-128k", "--context-len", "131072").returncode == 0
    assert_clear_error(cli("estimate", "qwen3-8b-128k", "--context-len", "131073"), "131,072")


def test_estimate_context_past_the_kv_budget_says_so():
    """40,960 tokens of qwen3-8b need 5.6 GiB of bf16 KV: 1 GiB holds none. The figures stand; a warning says why."""
    res = cli("estimate", "qwen3-8b", "--context-len", "40960", "--memory-gib", "1", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["max_concurrency"] == 0 and "does not fit" in out["warning"]
    assert "warning: one sequence of 40,960 tokens does not fit a KV budget of 1 GiB" in res.stderr


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--memory-gib", "-1", "memory_gib"),
        ("--tp", "3", "tp"),
        ("--kv-dtype", "fp4", "kv_dtype"),
        ("--block-size", "0", "block_size"),
    ],
)
def test_estimate_other_bad_flags(flag, value, needle):
    assert_clear_error(cli("estimate", "qwen3-8b", flag, value), needle, value)


# ------------------------------------------------------------------------------------------- engine specs
def test_model_folder_that_does_not_exist(tmp_path):
    """Refused when the run starts, before any engine (the spec itself is built without the file system, so a
    stored one loads on another machine): nothing is stored, no engine work folder is made."""
    from fp8lab.engine.results import run_cached

    spec = EngineSpec(model=str(tmp_path / "missing" / "model"))
    with pytest.raises(SpecError, match="EngineSpec.model .*missing/model.*a folder holding config.json"):
        run_cached(spec, [Request((1, 2, 3), 4)], study="s", root=tmp_path / "runs")
    assert [p.name for p in (tmp_path / "runs" / "s").iterdir() if not p.name.endswith(".lock")] == []


def test_hub_id_offline_is_refused_at_once(tmp_path, monkeypatch):
    """``HF_HUB_OFFLINE=1`` and an id that is not in the (empty) cache: refused before any engine starts (it took
    40 s of engine start-up before)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    spec = EngineSpec(model="no-such-org/no-such-model")
    with pytest.raises(SpecError, match="HF_HUB_OFFLINE is set.*not cached"):
        run_engine(spec, env={"HF_HUB_OFFLINE": "1"})


def test_hub_id_with_the_hub_unreachable_is_refused_at_once(tmp_path, monkeypatch):
    """No network (a hub endpoint nothing listens on) and an uncached id: refused, naming the id."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HTTPS_PROXY",
        "https_proxy",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(SpecError, match="no-such-org/no-such-model.*cannot be reached"):
        run_engine(EngineSpec(model="no-such-org/no-such-model"))


def test_hub_id_in_the_local_cache_passes_offline(tmp_path, monkeypatch, tiny_model):
    snap = tmp_path / "hub" / "models--some-org--some-model" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    shutil.copy(Path(tiny_model) / "config.json", snap / "config.json")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    from fp8lab.engine.run import check_model_source

    check_model_source(EngineSpec(model="some-org/some-model"), env={"HF_HUB_OFFLINE": "1"})  # no raise


@pytest.mark.parametrize("value", [0, -5, 15, 2.5, "2048"])
def test_max_model_len_not_a_length(tiny_model, value):
    with pytest.raises(SpecError, match="EngineSpec.max_model_len"):
        EngineSpec(model=tiny_model, max_model_len=value)


def test_max_model_len_past_the_model_limit_refused_before_start(tiny_model):
    """The issue's case: 500,000 on a model whose limit is 131,072 was an `invalid` run after a 17 s start."""
    spec = EngineSpec(model=tiny_model, max_model_len=500_000, kv_cache_gib=1.0)
    with pytest.raises(
        SpecError,
        match=r"max_model_len = 500000: at most the model's limit, "
        r"max_position_embeddings = 131,072",
    ):
        run_engine(spec)
    # as vLLM allows, past the limit with VLLM_ALLOW_LONG_MAX_MODEL_LEN (the long-context probe uses it)
    assert check_model_limits(spec, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}) == 500_000


def test_model_config_not_utf8_refused_before_start(tiny_model, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b"\xff" + (Path(tiny_model) / "config.json").read_bytes())
    with pytest.raises(SpecError, match="UTF-8"):
        run_engine(EngineSpec(model=str(model), max_model_len=2048))


def test_request_lengths(tiny_model):
    with pytest.raises(SpecError, match="Request.max_tokens = 0"):
        Request(prompt_token_ids=(1, 2, 3), max_tokens=0)
    with pytest.raises(SpecError, match="Request.prompt_token_ids"):
        Request(prompt_token_ids=(), max_tokens=4)
    spec = EngineSpec(model=tiny_model, max_model_len=64, kv_cache_gib=1.0)
    with pytest.raises(SpecError, match=r"prompt_len \+ max_tokens = 80: at most max_model_len = 64"):
        run_engine(spec, [Phase("main", (Request(prompt_token_ids=tuple(range(10, 70)), max_tokens=20),))])


def test_block_size_the_installed_vllm_rejects_is_recorded_without_a_start(tiny_model):
    """Which block sizes the backend takes is asked of the installed vLLM (``supports_block_size``), not written in
    fp8lab: a size it refuses comes back as an ``unsupported`` run, with no engine started (no worker log)."""
    from fp8lab.engine.capability import detect
    from fp8lab.vllm_options import cached_engine_choices

    info = cached_engine_choices()
    if (
        detect().platform == "cpu"
    ):  # every CPU answers (an AVX2-only one aborted here once: vllm_options.engine_choices)
        assert info and info["default_backend"] == "CPU_ATTN", info
    backend = (info or {}).get("backends", {}).get((info or {}).get("default_backend") or "")
    if not backend:
        pytest.skip("no fixed attention backend on this platform (GPU: vLLM picks one per model)")
    refused = [b for b in BLOCK_SIZES if b not in backend["block_sizes"]]
    accepted = [b for b in BLOCK_SIZES if b in backend["block_sizes"]]
    assert refused and accepted, backend["block_sizes"][:8]
    res = run_engine(EngineSpec(model=tiny_model, block_size=refused[0], kv_cache_gib=1.0, max_model_len=2048))
    assert res.status == "unsupported" and res.engine.get("checked_before_start"), (res.status, res.error)
    assert f"block_size = {refused[0]}" in res.error and info["version"] in res.error
    assert res.provenance.get("vllm")


def test_request_mix_whose_weights_sum_to_zero():
    with pytest.raises(SpecError, match="RequestClass.weight = 0"):
        parse_mix([["short", 128, 16, 0], ["long", 512, 32, 0]])
    with pytest.raises(SpecError, match="RequestClass.weight = -1"):
        parse_mix([["short", 128, 16, -1]])
    with pytest.raises(SpecError, match="Workload.mix"):
        parse_mix([])
    with pytest.raises(SpecError, match="Workload.mix"):
        parse_mix([["short", 128]])


# ------------------------------------------------------------------------------------------- profiles and -p
def test_run_parameter_not_yaml(tmp_path):
    assert_clear_error(
        cli("run", "00", "--out", str(tmp_path), "-p", "CONTEXT_LENS", "[1024, 2048"),
        "RunSpec.CONTEXT_LENS",
        "'[1024, 2048'",
        "a YAML value",
    )


def test_run_parameter_unknown(tmp_path):
    assert_clear_error(
        cli("run", "00", "--out", str(tmp_path), "-p", "KV_CACHE_GB", "2"),
        "RunSpec.KV_CACHE_GB = 2",
        "not a parameter of 00_kv_memory_estimation",
    )


@pytest.mark.parametrize(
    "name,value,needle",
    [
        ("KV_DTYPES", "fp8", "a list like the notebook's default"),
        ("KV_CACHE_GIB", "lots", "a number like the notebook's default 1.0"),
        ("MEASURE", "3", "True or False"),
    ],
)
def test_run_parameter_of_the_wrong_type(tmp_path, name, value, needle):
    """Caught before any notebook starts (``-p KV_DTYPES fp8`` would otherwise run the dtypes f, p, 8)."""
    res = cli("run", "00", "--out", str(tmp_path), "-p", name, value)
    assert_clear_error(res, f"RunSpec.{name}", needle)
    assert not list(tmp_path.glob("*.ipynb"))


def test_run_unknown_profile_and_notebook(tmp_path):
    assert_clear_error(
        cli("run", "00", "--profile", "h100", "--out", str(tmp_path)), "Profile.name = 'h100'", "cpu-tiny"
    )
    assert_clear_error(cli("run", "99_nope", "--out", str(tmp_path)), "RunSpec.notebooks = '99_nope'")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("cpu-tiny:\n  params: {a: [1, 2}\nh200: {}\n", "line 2"),
        ("- just\n- a list\n", "mapping"),
        ("cpu-tiny:\n  params: 3\n", "cpu-tiny.params"),
    ],
)
def test_profiles_file_malformed(tmp_path, text, needle):
    bad = tmp_path / "profiles.yaml"
    bad.write_text(text)
    with pytest.raises(SpecError, match="Profile") as err:
        load_profiles(bad)
    assert needle in str(err.value)


# ------------------------------------------------------------------------------------------- scales, prompts, text
@pytest.fixture(scope="module")
def good_scale_set(tiny_model, tmp_path_factory) -> Path:
    from fp8lab.calibration import default_scale_set, export_scale_set
    from fp8lab.kvmath import load_layout

    lay = load_layout(tiny_model)
    return export_scale_set(
        tiny_model,
        default_scale_set(lay.num_layers, lay.num_kv_heads).scaled(0.5, "half"),
        tmp_path_factory.mktemp("scales") / "half",
    )


@pytest.mark.parametrize(
    "bad,needle",
    [
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (0.0, "0.0"),
        (-1.0, "-1.0"),
        ("shape", "(3,)"),
        ("layer", "layers"),
    ],
)
def test_scale_set_with_bad_scales(good_scale_set, tmp_path, tiny_model, bad, needle):
    import torch
    from safetensors.torch import load_file, save_file

    from fp8lab.quality import QualitySpec

    folder = tmp_path / "bad"
    shutil.copytree(good_scale_set, folder, symlinks=True)
    tensors = load_file(str(folder / "kv_scales.safetensors"))
    name = sorted(n for n in tensors if n.endswith("v_scale"))[-1]
    if bad == "shape":
        tensors[name] = torch.ones(3)
    elif bad == "layer":
        tensors = {n: t for n, t in tensors.items() if ".layers.0." not in n}
    else:
        tensors[name] = torch.full_like(tensors[name], bad)
    save_file(tensors, str(folder / "kv_scales.safetensors"))
    QualitySpec(model=tiny_model, scale_sets=(str(good_scale_set),))  # the good one passes
    with pytest.raises(SpecError, match="check_kv_scales") as err:
        QualitySpec(model=tiny_model, scale_sets=(str(folder),))
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"", "empty"),
        (b"\n  \n", "empty"),
        (b'{"id": 1, "cat\xff', "UTF-8"),
        (b'{"id": 1}\nnot json\n', "line 2"),
        (b'{"id": 1, "category": "x"}\n', "text"),
    ],
)
def test_prompt_file_empty_not_utf8_or_malformed(tmp_path, tiny_model, content, needle):
    from fp8lab.quality import load_prompt_set

    f = tmp_path / "prompts.jsonl"
    f.write_bytes(content)
    with pytest.raises(SpecError, match="PromptSet") as err:
        load_prompt_set(f, tiny_model)
    assert needle in str(err.value)


@pytest.mark.parametrize("content,needle", [(b"", "empty"), (b"caf\xe9 latin-1", "UTF-8")])
def test_corpus_document_empty_or_not_utf8(tmp_path, content, needle):
    from fp8lab.workloads import heldout_documents

    (tmp_path / "a.txt").write_text("a fine document")
    (tmp_path / "b.txt").write_bytes(content)
    with pytest.raises(SpecError, match=r"Workload.text = '.*b\.txt'") as err:
        heldout_documents(tmp_path)
    assert needle in str(err.value)
