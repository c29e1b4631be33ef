"""Issue 8's CPU part: per-rank KV capacity arithmetic for tensor parallelism, and the spec's TP field."""

from __future__ import annotations

import pytest

from fp8lab import kvmath
from fp8lab.specs import EngineSpec, SpecError


def test_llama3_70b_tp2_capacity_per_gpu():
    lay = kvmath.load_layout("data/configs/llama-3-70b")
    # 8 KV heads split over 2 ranks = 4 per GPU: 2 (K,V) x 80 layers x 4 x 128 x 2 B = 163840 B/token per GPU
    assert kvmath.kv_bytes_per_token(lay, "auto", tp=2) == 163840
    assert kvmath.kv_bytes_per_token(lay, "fp8", tp=2) == 81920
    budget = 40 * 2**30  # 40 GiB of KV on each GPU
    # blocks of 16 tokens: 40 * 2**30 // (16 * 163840) = 16384 (auto), // (16 * 81920) = 32768 (fp8)
    assert kvmath.predict_num_blocks(lay, budget, 16, "auto", tp=2) == 16384
    assert kvmath.predict_num_blocks(lay, budget, 16, "fp8", tp=2) == 32768
    # at 8192 tokens a sequence takes 512 blocks: 16384 // 512 = 32 sequences (auto), 64 (fp8)
    assert kvmath.max_concurrency(lay, budget, 8192, 16, "auto", tp=2) == 32
    assert kvmath.max_concurrency(lay, budget, 8192, 16, "fp8", tp=2) == 64


def test_more_ranks_than_kv_heads_replicates():
    lay = kvmath.load_layout("data/configs/qwen3-8b")  # 8 KV heads
    per_rank_8 = kvmath.kv_bytes_per_token(lay, "auto", tp=8)  # 1 head per rank: 2*36*1*128*2 = 18432
    assert per_rank_8 == 18432
    assert kvmath.kv_bytes_per_token(lay, "auto", tp=16) == per_rank_8  # replicated, not halved again


def test_spec_validates_tensor_parallel_size():
    assert EngineSpec(model="data/configs/llama-3-70b", tensor_parallel_size=2).tensor_parallel_size == 2
    for bad in (0, -2, 1.5, "2"):
        with pytest.raises(SpecError, match="EngineSpec.tensor_parallel_size"):
            EngineSpec(model="data/configs/llama-3-70b", tensor_parallel_size=bad)
