"""The calculator's packed-format byte rules (:func:`fp8lab.kvformats.slot_bytes`) against the installed vLLM's own
code: TurboQuant's ``slot_size_aligned``, UltraQuant's ``slot_size``, and the page vLLM's Triton backend gives a
per-token-head spec (``customize_spec``). Asked in one subprocess (importing vLLM takes ~30 s on 2 shared cores)."""

from __future__ import annotations

import json
import subprocess
import sys

from fp8lab.kvformats import slot_bytes
from fp8lab.paths import REPO_ROOT

PROBE = r"""
import json, torch
from vllm.model_executor.layers.quantization.turboquant.config import TQ_PRESETS, TurboQuantConfig
from vllm.v1.attention.ops.ultraquant.format import slot_size
from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
out = {"tq": {}, "uq": {}, "pth": {}}
for h in (64, 128, 256):
    for d in TQ_PRESETS:
        out["tq"][f"{d}/{h}"] = TurboQuantConfig.from_cache_dtype(d, h).slot_size_aligned
    out["uq"][str(h)] = slot_size(h)
    for d in ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"):
        spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=h, dtype=STR_DTYPE_TO_TORCH_DTYPE[d],
                                 kv_quant_mode=get_kv_quant_mode(d))
        out["pth"][f"{d}/{h}"] = TritonAttentionBackend.customize_spec(spec).page_size_bytes // 16
print(json.dumps(out))
"""


def test_packed_slot_bytes_match_vllms_code():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600, check=True
    )
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got["tq"]) == 12 and len(got["pth"]) == 9
    for key, n in got["tq"].items():
        d, h = key.split("/")
        assert slot_bytes(d, int(h), int(h), 2) == n, key
    for h, n in got["uq"].items():
        assert slot_bytes("ultraquant_4bit", int(h), int(h), 2) == n, h
    for key, n in got["pth"].items():
        d, h = key.split("/")
        assert slot_bytes(d, int(h), int(h), 2) == n, key
