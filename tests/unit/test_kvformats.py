"""The KV formats: allowed names come from the installed vLLM, and each format's bytes per token follow vLLM's own
page-size rules (hand-computed here; the rules and their vLLM 0.26 / 0.32 sources are in
:mod:`fp8lab.kvformats`' docstring; ``tests/integration/test_kvformats_vllm.py`` checks them against vLLM's code)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab import kvformats as F
from fp8lab import kvmath as K
from fp8lab.errors import SpecError
from fp8lab.paths import REPO_ROOT
from fp8lab.specs import EngineSpec

QWEN3_8B = "data/configs/qwen3-8b"  # 36 layers, 8 KV heads, head_dim 128, bf16
DSV2_LITE = "data/configs/deepseek-v2-lite"  # MLA: 27 layers, latent 512 + rope 64 = 576, bf16
TINY = "data/models/fp8lab-tiny-qwen3"  # 6 layers, 2 KV heads, head_dim 64, bf16


@pytest.mark.parametrize(
    "dtype, expected",
    [
        ("auto", 36 * 8 * 256 * 2),  # 147,456: (hk + hv) * 2 bytes
        ("bfloat16", 147456),
        ("fp8", 36 * 8 * 256),  # 73,728: one byte per element, per-tensor scales add nothing per token
        ("fp8_inc", 73728),  # torch.float8_e4m3fn, one byte (vLLM STR_DTYPE_TO_TORCH_DTYPE)
        # per-token-head: data + one fp32 scale per K and per V (TritonAttentionBackend.customize_spec, 0.32;
        # AttentionSpec.unpadded_page_size_bytes, 0.26): 36 * 8 * (256 + 8)
        ("int8_per_token_head", 36 * 8 * 264),  # 76,032
        ("fp8_per_token_head", 76032),
        ("int4_per_token_head", 36 * 8 * (64 + 64 + 8)),  # 39,168: two int4 per byte
        # TurboQuant: 32 quantized layers of one slot per head + 4 boundary layers at bf16 (4 * 8 * 512 = 16,384).
        # k8v4 slot = fp8 K (128) + 4-bit V (64) + fp16 scale and zero (4) = 196
        ("turboquant_k8v4", 32 * 8 * 196 + 16384),  # 66,560
        ("turboquant_4bit_nc", 32 * 8 * (64 + 2 + 64 + 4) + 16384),  # K: 4-bit + fp16 norm; 50,688
        ("turboquant_k3v4_nc", 32 * 8 * (48 + 2 + 64 + 4) + 16384),  # 46,592
        ("turboquant_3bit_nc", 32 * 8 * (48 + 2 + 48 + 4) + 16384),  # 42,496
        # UltraQuant: fp4 K and V codes (64 + 64) + one E8M0 scale per 32 values (4 + 4), same boundary layers
        ("ultraquant_4bit", 32 * 8 * 136 + 16384),  # 51,200
        # NVFP4: K and V each head/2 fp4 bytes + head/16 fp8 block scales: 2 * (64 + 8) = 144
        ("nvfp4", 36 * 8 * 144),  # 41,472
        ("nvfp4_4over6", 41472),
    ],
)
def test_bytes_per_token_of_every_format_on_qwen3_8b(dtype, expected):
    assert K.kv_bytes_per_token(QWEN3_8B, dtype) == expected


def test_per_token_head_formats_cost_six_percent_of_fp8_blocks_at_head_dim_64():
    """vllm-notes section 10: on the H200 the per-token-head formats held about 6% fewer blocks than fp8 on a
    head_dim-64 model: 128 / 136 = 0.941."""
    budget = 1 << 30
    fp8 = K.predict_num_blocks(TINY, budget, 16, "fp8")
    pth = K.predict_num_blocks(TINY, budget, 16, "int8_per_token_head")
    assert K.kv_bytes_per_token(TINY, "int8_per_token_head") == 6 * 2 * 136
    assert pth == budget // (16 * 6 * 2 * 136) and round(pth / fp8, 3) == round(128 / 136, 3) == 0.941


def test_mla_formats():
    assert K.kv_bytes_per_token(DSV2_LITE, "auto") == 27 * 576 * 2  # 31,104
    assert K.kv_bytes_per_token(DSV2_LITE, "fp8_ds_mla") == 27 * 656  # MLAAttention.get_kv_cache_spec: 656 B
    assert K.kv_bytes_per_token(DSV2_LITE, "nvfp4_ds_mla") == 27 * 352
    assert K.kv_bytes_per_token(DSV2_LITE, "int8_per_token_head") == 27 * (576 + 8)  # MLACommonBackend: a scale pair
    with pytest.raises(SpecError, match="for MLA .DeepSeek. only"):
        K.kv_bytes_per_token(QWEN3_8B, "fp8_ds_mla")
    with pytest.raises(SpecError, match="unknown format for an MLA model"):
        K.kv_bytes_per_token(DSV2_LITE, "turboquant_k8v4")


def test_skip_layers_keep_layers_in_the_model_dtype():
    # two fp8 layers kept at bf16: 34 * 8 * 256 + 2 * 8 * 512
    assert K.kv_bytes_per_token(QWEN3_8B, "fp8", skip_layers=("0", "35")) == 34 * 2048 + 2 * 4096
    # a skip layer TurboQuant keeps anyway changes nothing
    assert K.kv_bytes_per_token(QWEN3_8B, "turboquant_k8v4", skip_layers=("1",)) == 66560
    assert F.skipped_layers("turboquant_k8v4", 36) == {0, 1, 34, 35}
    assert F.skipped_layers("turboquant_k8v4", 3) == {0, 2}  # n = min(2, L // 2) = 1
    with pytest.raises(SpecError, match="skip_layers = '36'"):
        K.kv_bytes_per_token(QWEN3_8B, "fp8", skip_layers=("36",))
    # the page of a block is the sum of its layers' pages (one group); blocks follow
    assert K.bytes_per_block(QWEN3_8B, 32, "turboquant_k8v4") == 32 * 66560


def test_a_hybrid_model_with_unequal_pages_is_not_guessed():
    with pytest.raises(SpecError, match="not modelled"):
        K.bytes_per_block("data/configs/gemma-2-9b-it", 16, "turboquant_k8v4")
    assert K.bytes_per_block("data/configs/gemma-2-9b-it", 16, "int8_per_token_head") == 21 * 16 * 8 * (512 + 8)


def test_an_unknown_format_is_an_error_not_a_guess():
    with pytest.raises(SpecError, match="kv_dtype = 'int3': unknown format: the KV calculator knows auto"):
        K.kv_bytes_per_token(QWEN3_8B, "int3")
    with pytest.raises(SpecError, match="packed format has none"):
        K.dtype_bytes("nvfp4", "bfloat16")


# ----------------------------------------------------------------------------------------- allowed names


def test_the_allowed_names_are_the_installed_vllms():
    info = F.installed_choices()
    assert info is not None, "this test runs where vLLM is installed"
    allowed, where = F.allowed_kv_dtypes()
    assert allowed == tuple(info["kv_cache_dtypes"]) and "int8_per_token_head" in allowed
    assert where.startswith(f"the installed vLLM {info['version']}")
    # the calculator has a byte rule for every name this vLLM offers
    assert set(allowed) <= set(F.FORMATS)


def test_a_spec_takes_a_name_only_vllm_knows_and_refuses_an_unknown_one_listing_the_allowed(tmp_path):
    spec = EngineSpec(model=TINY, kv_cache_dtype="int8_per_token_head")
    assert spec.kv_cache_dtype == "int8_per_token_head"
    with pytest.raises(SpecError) as err:
        EngineSpec(model=TINY, kv_cache_dtype="int9_per_token_head")
    msg = str(err.value)
    allowed = F.installed_choices()["kv_cache_dtypes"]  # type: ignore[index]
    assert msg.startswith("EngineSpec.kv_cache_dtype = 'int9_per_token_head': the installed vLLM")
    assert msg.endswith(" | ".join(allowed))


def test_without_vllm_the_calculators_formats_are_allowed():
    allowed, where = F.allowed_kv_dtypes(None)
    assert allowed == tuple(F.FORMATS) and where.startswith("unknown format: no vLLM installed")
    F.check_kv_dtype("S", "kv", "turboquant_k8v4", None)
    with pytest.raises(SpecError, match="S.kv = 'int9': unknown format: no vLLM installed to ask; the KV calculator"):
        F.check_kv_dtype("S", "kv", "int9", None)
    # an installation that answered: only its names
    with pytest.raises(SpecError, match="'ultraquant_4bit': the installed vLLM 0.26.0 accepts: auto | fp8$"):
        F.check_kv_dtype("S", "kv", "ultraquant_4bit", {"version": "0.26.0", "kv_cache_dtypes": ["auto", "fp8"]})


def _run_estimate(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-m", "fp8lab.cli", "estimate", TINY, "--json", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        timeout=300,
    )


def test_estimate_takes_a_name_only_vllm_knows():
    out = _run_estimate(sys.executable, "--kv-dtype", "int8_per_token_head", "--memory-gib", "1")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["kv_bytes_per_token"] == 6 * 2 * 136 and res["num_blocks"] == (1 << 30) // (16 * 1632)
    bad = _run_estimate(sys.executable, "--kv-dtype", "int9_per_token_head")
    assert bad.returncode == 2 and "the installed vLLM" in bad.stderr and "int8_per_token_head" in bad.stderr


def _python_without_vllm() -> str | None:
    for cand in ("/usr/bin/python3", shutil.which("python3")):
        if cand and Path(cand).exists():
            probe = subprocess.run([cand, "-c", "import vllm"], capture_output=True, timeout=60)
            if probe.returncode != 0:
                return cand
    return None


def test_estimate_without_vllm_knows_the_calculators_formats():
    """A plain interpreter without vLLM (a ``pip install -e .`` of the calculator): known formats work, others are
    an "unknown format"."""
    py = _python_without_vllm()
    if py is None:
        pytest.skip("no Python without vLLM on this machine")
    out = _run_estimate(py, "--kv-dtype", "turboquant_k8v4")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kv_bytes_per_token"] == 2 * 2 * 100 + 4 * 2 * 256  # 2 TQ layers + 4 boundary (bf16)
    bad = _run_estimate(py, "--kv-dtype", "int9")
    assert bad.returncode == 2 and "unknown format: no vLLM installed to ask" in bad.stderr
