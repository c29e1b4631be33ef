"""Spec validation: bad values fail before any engine starts, naming field, value and what is allowed."""

from __future__ import annotations

import pytest

from fp8lab.engine.result import classify_failure, root_cause
from fp8lab.engine.run import validate_phases
from fp8lab.specs import EngineSpec, Phase, Request, SpecError, spec_hash


@pytest.fixture()
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 4096}')
    return str(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("kv_cache_dtype", "fp9", "auto | float16 | bfloat16 | fp8 | fp8_e4m3 | fp8_e5m2"),
        ("block_size", 24, "allowed: 1 | 8 | 16"),
        ("gpu_memory_utilization", 1.5, "(0.0, 1.0]"),
        ("gpu_memory_utilization", 0.0, "(0.0, 1.0]"),
        ("tensor_parallel_size", 0, "[1, 64]"),
        ("tensor_parallel_size", 2.0, "[1, 64]"),
        ("kv_cache_gib", -1, "(0.0, 4096.0]"),
        ("max_num_seqs", 0, "[1, 65536]"),
        ("load_format", "pt", "auto | safetensors | dummy"),
        ("enforce_eager", "yes", "True or False"),
        ("seed", -3, "[0, 2147483647]"),
    ],
)
def test_bad_field_names_field_value_and_allowed(model_dir, field, value, allowed):
    with pytest.raises(SpecError) as err:
        EngineSpec(model=model_dir, **{field: value})
    msg = str(err.value)
    assert msg.startswith(f"EngineSpec.{field} = {value!r}: ")
    assert allowed in msg
    assert err.value.field == field and err.value.value == value


def test_missing_model_folder_is_rejected_when_a_run_starts(tmp_path):
    """Built without a look at the file system (a stored spec.json loads on another machine); refused, naming the
    field, value and what is allowed, by the check every engine start runs first."""
    spec = EngineSpec(model=str(tmp_path / "nope"))
    assert spec.model == str(tmp_path / "nope")
    with pytest.raises(SpecError, match="EngineSpec.model = .*nope.*a folder holding config.json"):
        spec.check_paths()
    with pytest.raises(SpecError, match="EngineSpec.model = .*nope.*a folder holding config.json"):
        validate_phases(spec, [], "llm")


def test_hub_id_passes_through_unchanged():
    assert EngineSpec(model="Qwen/Qwen3-8B").model == "Qwen/Qwen3-8B"


def test_relative_model_path_resolves_against_repo_root():
    spec = EngineSpec(model="data/configs/qwen3-8b")
    assert spec.model.endswith("data/configs/qwen3-8b") and spec.model.startswith("/")


def test_tensor_parallel_size_is_accepted_and_hashed(model_dir):
    a, b = EngineSpec(model=model_dir), EngineSpec(model=model_dir, tensor_parallel_size=2)
    assert b.tensor_parallel_size == 2
    assert spec_hash(a) != spec_hash(b) and spec_hash(a) == spec_hash(EngineSpec(model=model_dir))


def test_spec_roundtrip_and_unknown_field(model_dir):
    s = EngineSpec(model=model_dir, kv_cache_dtype="fp8", block_size=16)
    assert EngineSpec.from_dict(s.to_dict()) == s
    with pytest.raises(SpecError, match="EngineSpec.kv_dtype = 'fp8': allowed fields"):
        EngineSpec.from_dict({**s.to_dict(), "kv_dtype": "fp8"})


def test_request_validation():
    with pytest.raises(SpecError, match="Request.prompt_token_ids"):
        Request(prompt_token_ids=[], max_tokens=1)
    with pytest.raises(SpecError, match="Request.max_tokens = 0"):
        Request(prompt_token_ids=[1], max_tokens=0)
    with pytest.raises(SpecError, match="Request.prompt_logprobs = 21"):
        Request(prompt_token_ids=[1], max_tokens=1, prompt_logprobs=21)


def test_phases_checked_against_max_model_len(model_dir):
    spec = EngineSpec(model=model_dir)  # max_position_embeddings 4096 in the config
    ok = Phase("a", (Request(prompt_token_ids=[1] * 4000, max_tokens=96),))
    validate_phases(spec, [ok], "llm")
    too_long = Phase("b", (Request(prompt_token_ids=[1] * 4000, max_tokens=97),))
    with pytest.raises(SpecError, match="prompt_len \\+ max_tokens = 4097: at most max_model_len = 4096"):
        validate_phases(spec, [too_long], "llm")
    with pytest.raises(SpecError, match="distinct names"):
        validate_phases(spec, [ok, ok], "llm")
    with pytest.raises(SpecError, match="driver = 'sync'"):
        validate_phases(spec, [ok], "sync")
    with pytest.raises(SpecError, match="concurrency = 4: None with the 'llm' driver"):
        validate_phases(spec, [Phase("c", ok.requests, concurrency=4)], "llm")


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
        (
            "ValueError: To serve at least one request with the model's max seq len (32768), (0.05 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (0.02 GiB).",
            "oom",
        ),
        ("ValueError: No valid attention backend found for cuda with head_size 72", "unsupported"),
        ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig", "invalid"),
        ("RuntimeError: something odd", "error"),
    ],
)
def test_failure_classification(text, status):
    assert classify_failure(text) == status


def test_root_cause_skips_the_generic_wrapper():
    log = (
        "INFO starting\nTraceback (most recent call last):\n  File x\n"
        "ValueError: No valid attention backend found\nTraceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert root_cause(log, None) == "ValueError: No valid attention backend found"
    assert root_cause("nothing here", "fallback") == "fallback"


def test_root_cause_reads_vllm_026_prefixed_engine_core_lines():
    # vLLM 0.26 prefixes every line its EngineCore process writes, tracebacks included (0.32 does not)
    msg = (
        "ValueError: To serve at least one request with the model's max seq len (131104), (9.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (8.00 GiB). Based on the available memory, "
        "the estimated maximum model length is 116480."
    )
    log = (
        "(EngineCore pid=7) ERROR 11-29 09:57:22 [core.py:1330] EngineCore failed to start.\n"
        f"(EngineCore pid=7) ERROR 11-29 09:57:22 [core.py:1330] {msg}\n"
        "(EngineCore pid=7) Process EngineCore:\n(EngineCore pid=7) Traceback (most recent call last):\n"
        f"\x1b[0;36m(EngineCore pid=7)\x1b[0;0m {msg}\nTraceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert root_cause(log, None) == msg
    assert classify_failure(root_cause(log, None)) == "oom"


def test_phase_client_is_checked_and_hashed_only_when_not_default(tiny_model):
    from fp8lab.engine.results import run_descriptor
    from fp8lab.specs import EngineSpec, Phase, Request, SpecError, spec_hash

    reqs = (Request(prompt_token_ids=(1, 2, 3), max_tokens=4),)
    with pytest.raises(SpecError) as err:
        Phase("x", reqs, concurrency=2, client="http")
    assert err.value.field == "client"
    with pytest.raises(SpecError) as err:
        Phase("x", reqs, client="final")  # an open loop always streams
    assert err.value.field == "client"
    spec = EngineSpec(model=tiny_model)
    streamed = run_descriptor(spec, [Phase("x", reqs, concurrency=2)], "async", 0.25)
    assert "client" not in streamed["phases"][0]  # runs stored before the field keep their hashes
    final = run_descriptor(spec, [Phase("x", reqs, concurrency=2, client="final")], "async", 0.25)
    assert final["phases"][0]["client"] == "final" and spec_hash(final) != spec_hash(streamed)


def test_folder_tokenizer_and_file_checks(tiny_model, tmp_path):
    from fp8lab.specs import check_file, check_model_folder, check_tokenizer

    assert check_model_folder("S", "model", "data/models/fp8lab-tiny-qwen3") == tiny_model  # resolved from the repo
    with pytest.raises(SpecError) as err:
        check_model_folder("S", "model", str(tmp_path))
    assert (err.value.spec, err.value.field) == ("S", "model")
    assert check_tokenizer("S", None, tiny_model) == tiny_model
    with pytest.raises(SpecError) as err:
        check_tokenizer("S", str(tmp_path), tiny_model)  # a folder without tokenizer files
    assert err.value.field == "tokenizer" and str(tmp_path) in err.value.allowed
    (tmp_path / "p.txt").write_text("x")
    assert check_file("S", "f", str(tmp_path / "p.txt"), "a file") == str(tmp_path / "p.txt")
    with pytest.raises(SpecError) as err:
        check_file("S", "f", str(tmp_path / "q.txt"), "a file")
    assert err.value.allowed == "a file"


def test_spec_error_lives_in_errors_and_specs_re_exports_it():
    """fp8lab.errors holds SpecError and imports nothing but the standard library; fp8lab.specs re-exports the
    same class; an error pickles with its fields (a worker can send it back whole)."""
    import pickle
    import subprocess
    import sys

    from fp8lab import errors, specs

    assert specs.SpecError is errors.SpecError is SpecError
    loaded = [
        m
        for m in subprocess.run(
            [sys.executable, "-c", "import sys; import fp8lab.errors; print(' '.join(sorted(sys.modules)))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if m.split(".")[0] in ("fp8lab", "numpy", "pandas", "yaml")
    ]
    assert loaded == ["fp8lab", "fp8lab.errors"], loaded
    err = pickle.loads(pickle.dumps(SpecError("EngineSpec", "block_size", 7, "allowed: 16 | 32")))
    assert isinstance(err, errors.SpecError) and isinstance(err, ValueError)
    assert (err.spec, err.field, err.value, err.allowed) == ("EngineSpec", "block_size", 7, "allowed: 16 | 32")
    assert str(err) == "EngineSpec.block_size = 7: allowed: 16 | 32"
