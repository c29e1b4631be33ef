"""The emulated-FP8 cache write (fp8lab.engine.fp8emu): what it hands vLLM's cache op, with real torch tensors."""

from __future__ import annotations

import pytest
import torch

from fp8lab.engine import fp8emu
from fp8lab.fp8formats import get_format, roundtrip


class Layer:
    def __init__(self, name: str):
        self.layer_name = name


def stored_by(fmt: str, scales: dict, layer: str, key: torch.Tensor, value: torch.Tensor):
    seen = {}

    def orig(self, layer, key, value, kv_cache, slot_mapping):
        seen.update(key=key, value=value)

    fp8emu.make_update(orig, fmt, scales)(None, Layer(layer), key, value, None, None)
    return seen["key"], seen["value"]


def sample(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(16, 2, 64, generator=g) * 3).to(torch.bfloat16)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_values_are_the_rtz_round_trip_in_the_model_dtype(fmt):
    k, v = sample(0), sample(1)
    sk, sv = stored_by(fmt, {}, "model.layers.0.self_attn.attn", k, v)
    assert sk.dtype == torch.bfloat16 and sk.shape == k.shape
    assert torch.equal(sk.float(), roundtrip(k, fmt, "rtz", 1.0))  # scale 1: exact in bf16
    assert torch.equal(sv.float(), roundtrip(v, fmt, "rtz", 1.0))
    # round toward zero never grows a value, and at least some values changed
    assert (sk.float().abs() <= k.float().abs()).all() and not torch.equal(sk, k)
    # every stored value is an FP8 value
    assert torch.equal(sk.float(), roundtrip(sk, fmt, "rtz", 1.0))
    assert float(sk.float().abs().max()) <= get_format(fmt).max


def test_per_layer_scales_are_applied_by_layer_index():
    k, v = sample(2), sample(3)
    scales = {0: (1.0, 1.0), 3: (0.015625, 0.5)}  # powers of two: exact in bf16
    sk3, sv3 = stored_by("e4m3", scales, "model.layers.3.self_attn.attn", k, v)
    assert torch.equal(sk3.float(), roundtrip(k, "e4m3", "rtz", 0.015625))
    assert torch.equal(sv3.float(), roundtrip(v, "e4m3", "rtz", 0.5))
    sk0, _ = stored_by("e4m3", scales, "model.layers.0.self_attn.attn", k, v)
    assert not torch.equal(sk3, sk0)  # a smaller scale keeps more precision of small values
    sk7, _ = stored_by("e4m3", scales, "model.layers.7.self_attn.attn", k, v)  # absent: 1.0
    assert torch.equal(sk7, sk0)


def test_env_and_log_check(monkeypatch):
    assert fp8emu.env_for("fp8") == {fp8emu.ENV: "e4m3"}
    assert fp8emu.env_for("fp8_e5m2", "/x/set")[fp8emu.SCALES_ENV] == "/x/set"
    assert fp8emu.check_log(f"... {fp8emu.MARKER} e4m3 (rtz, scales 1.0) in pid 1\n") is None
    assert "did not load" in fp8emu.check_log("no marker here")
    assert fp8emu.emulated_label("fp8") == "fp8 (emulated)"
    monkeypatch.delenv(fp8emu.ENV, raising=False)
    fp8emu.register()  # without the variable: a no-op that imports nothing of vLLM's
