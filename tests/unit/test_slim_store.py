"""The slimmed committed stores and reports read the same as fresh ones (scripts/slim_store.py, fp8lab.report.htmlslim).

A store written by the current code (``results.save``: float64, int64, ``itl_s``, Study 04's top-k lists) and the
same store rewritten by ``slim_store.py`` must give the notebooks the same frames; these tests build both from
one set of records and compare.
"""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import pandas as pd
import pytest

from fp8lab import longctx as lc
from fp8lab.engine import results
from fp8lab.paths import REPO_ROOT


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def slim_store():
    return _script("slim_store")


@pytest.fixture(scope="module")
def slim_html():
    from fp8lab.report import htmlslim

    return htmlslim


def _records(rng: np.random.Generator, n: int = 40) -> pd.DataFrame:
    """Records shaped as the engine writes them: vLLM's logprobs are float32 values held as float64, the client's
    inter-token gaps are float64 differences of a nanosecond clock."""
    rows = []
    for i in range(n):
        k = int(rng.integers(3, 30))
        clock = 1e5 + np.cumsum(rng.integers(1_000_000, 30_000_000, size=k + 1)) * 1e-9
        lps = rng.normal(-3, 2, size=k).astype(np.float32).astype(np.float64)
        rows.append(
            {
                "phase": "closed-c8" if i % 2 else "teacher",
                "request": i,
                "tag": f"r{i}",
                "prompt_tokens": k,
                "ttft_s": float(rng.random()),
                "itl_s": list(np.diff(clock)),
                "prompt_token_logprobs": [float("nan")] + list(lps[1:]),
                "prompt_topk_ids": [[]] + [list(rng.integers(0, 8192, size=5)) for _ in range(k - 1)],
                "engine_ttft_s": float(np.float32(rng.random())),
                "num_preemptions": 0,
            }
        )
    return pd.DataFrame(rows)


def test_a_compact_store_reads_back_as_the_fresh_one(tmp_path, slim_store):
    import pyarrow.parquet as pq

    fresh = _records(np.random.default_rng(0))
    fresh.to_parquet(tmp_path / "fresh.parquet", index=False)  # what results.save writes
    slim_store.write_compact(
        slim_store.compact_table(pq.read_table(tmp_path / "fresh.parquet")), tmp_path / "slim.parquet"
    )
    assert (tmp_path / "slim.parquet").stat().st_size < 0.75 * (tmp_path / "fresh.parquet").stat().st_size
    assert "itl_e8" in pq.read_schema(tmp_path / "slim.parquet").names  # stored as 10 ns ticks
    a, b = results.read_records(tmp_path / "fresh.parquet"), results.read_records(tmp_path / "slim.parquet")
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        for x, y in zip(a[col], b[col], strict=True):
            if col == "itl_s":  # within 5 ns of the measured gap, float64
                assert y.dtype == np.float64 and np.abs(np.asarray(x) - y).max() <= 5.0001e-9
            elif col == "prompt_topk_ids":
                assert [list(map(int, t)) for t in x] == [list(map(int, t)) for t in y]
                assert all(np.asarray(t).dtype == np.int64 for t in y if len(t))
            elif isinstance(x, np.ndarray):
                assert y.dtype == x.dtype and np.array_equal(x, y, equal_nan=True)
            else:
                assert x == y or (x != x and y != y), (col, x, y)  # bit-for-bit, NaN as NaN
    assert b.engine_ttft_s.dtype == np.float64


def test_coarser_itl_ticks_read_back_within_half_a_tick(tmp_path, slim_store):
    """``--itl-exp 5`` (a store of millions of gaps): gaps come back as seconds, each within 5 us of the measured one,
    and a store slimmed again keeps its ticks."""
    import pyarrow.parquet as pq

    fresh = _records(np.random.default_rng(1))
    fresh.to_parquet(tmp_path / "fresh.parquet", index=False)
    slim = slim_store.compact_table(pq.read_table(tmp_path / "fresh.parquet"), itl_exp=5)
    assert "itl_e5" in slim.column_names and "itl_s" not in slim.column_names
    assert slim_store.compact_table(slim).column("itl_e5").equals(slim.column("itl_e5"))  # idempotent
    slim_store.write_compact(slim, tmp_path / "slim.parquet")
    a, b = results.read_records(tmp_path / "fresh.parquet"), results.read_records(tmp_path / "slim.parquet")
    err = max(np.abs(np.asarray(x) - y).max() for x, y in zip(a.itl_s, b.itl_s, strict=True))
    assert 1e-7 < err <= 5.0001e-6  # coarser than the 10 ns default, never beyond half a tick


def _div_rows(rng: np.random.Generator, n: int, k: int, vocab: int = 64):
    """Base and candidate teacher-forced rows of one document: top-k lists that sometimes disagree."""
    ids = [int(t) for t in rng.integers(0, vocab, size=n)]

    def side(noise: float) -> dict:
        lp = [float("nan")] + [float(np.float32(-abs(rng.normal(1.0, 0.5)) - noise)) for _ in range(n - 1)]
        topk = [[]] + [[int(t) for t in rng.choice(vocab, size=k, replace=False)] for _ in range(n - 1)]
        tlp = [[]] + [
            sorted((float(np.float32(-abs(rng.normal(1.5, 1.0)))) for _ in range(k)), reverse=True)
            for _ in range(n - 1)
        ]
        return {"prompt_token_logprobs": lp, "prompt_topk_ids": topk, "prompt_topk_logprobs": tlp}

    base = side(0.0)
    cand = side(0.05)
    for pos in range(1, n, 3):  # a third of the positions: same top-k as the baseline
        cand["prompt_topk_ids"][pos] = list(base["prompt_topk_ids"][pos])
    return ids, pd.Series(base), pd.Series(cand)


def test_the_slimmed_divergence_equals_the_fresh_one(slim_store):
    ids, base, cand = _div_rows(np.random.default_rng(1), n=300, k=5)
    fresh = lc.position_divergence(base, cand, ids, 5)
    top1, topk, kl = slim_store.divergence_columns(base, cand, ids, 5)
    kept = pd.Series(
        {
            "prompt_token_logprobs": cand["prompt_token_logprobs"],
            "div_top1": top1,
            "div_topk": topk,
            "div_kl": kl.astype(np.float32).astype(np.float64),
            "div_top_k": 5,
        }
    )  # as read back
    slim = lc.stored_divergence(pd.Series({"prompt_token_logprobs": base["prompt_token_logprobs"]}), kept, ids, 5)
    assert list(slim.columns) == list(fresh.columns) and len(slim) == len(fresh) == 299
    assert 0 < fresh.top1.mean() < 1 and 0 < fresh.top5.mean() < 1 and fresh.kl.max() > 0  # a case that can differ
    for col in ("pos", "top1", "top5", "abs_dlogprob", "nll_base", "nll_cand"):
        assert slim[col].tolist() == fresh[col].tolist(), col  # exactly
    np.testing.assert_allclose(slim.kl, fresh.kl, rtol=1e-7, atol=0)  # KL kept as float32
    with pytest.raises(Exception, match="top_k"):
        lc.stored_divergence(base, kept, ids, 4)


def test_divergence_table_reads_fresh_and_slimmed_records(slim_store):
    """divergence_table takes the top-k path for a fresh store and the stored columns for a slimmed one."""
    plan = lc.LongCtxPlan(
        model=str(REPO_ROOT / "data/models/fp8lab-tiny-qwen3"),
        lengths=(512,),
        output_tokens=32,
        kv_cache_gib=0.03,
        quality_model=str(REPO_ROOT / "data/models/fp8lab-tiny-qwen3"),
        quality_length=200,
        passkey_lengths=(),
        random_token_lengths=(),
    )
    docs = lc.quality_documents(plan)
    rng = np.random.default_rng(2)
    rows = {"auto": [], "fp8": []}
    for src, id_list in docs.items():
        for j, ids in enumerate(id_list):
            _, b, c = _div_rows(rng, len(ids), plan.top_k)
            for dt, r in (("auto", b), ("fp8", c)):
                rows[dt].append(
                    {
                        "role": "ramp" if plan.quality_merged else "quality",
                        "kv_dtype": dt,
                        "phase": f"div-{src}",
                        "tag": f"{src}-{j}",
                        "engine": 0 if dt == "auto" else 1,
                        **r.to_dict(),
                    }
                )
    fresh = pd.DataFrame(rows["auto"] + rows["fp8"])
    res = lc.LongCtxResult(plan=plan, runs=[], block_size=16, passkey=[], records=fresh)
    want = lc.divergence_table(res)
    assert len(want) == sum(len(i) - 1 for i in docs["text"]) + sum(len(i) - 1 for i in docs["random"])

    slim_rows = []
    base = fresh[fresh.kv_dtype == "auto"].set_index("tag")
    for _, r in fresh.iterrows():
        r = r.to_dict()
        if r["kv_dtype"] == "fp8":
            src, _, j = r["tag"].rpartition("-")
            t1, tk, kl = slim_store.divergence_columns(base.loc[r["tag"]], pd.Series(r), docs[src][int(j)], plan.top_k)
            r.update(div_top1=t1, div_topk=tk, div_kl=kl.astype(np.float32).astype(np.float64), div_top_k=plan.top_k)
        del r["prompt_topk_ids"], r["prompt_topk_logprobs"]
        slim_rows.append(r)
    res_slim = lc.LongCtxResult(plan=plan, runs=[], block_size=16, passkey=[], records=pd.DataFrame(slim_rows))
    got = lc.divergence_table(res_slim)
    pd.testing.assert_frame_equal(got.drop(columns="kl"), want.drop(columns="kl"))
    np.testing.assert_allclose(got.kl, want.kl, rtol=1e-7)
    bins = lc.divergence_by_position(want, plan.position_bins, plan.doc_length)
    pd.testing.assert_frame_equal(lc.divergence_by_position(got, plan.position_bins, plan.doc_length), bins, rtol=1e-6)


def test_an_emulated_candidate_is_slimmed_against_auto(tmp_path, slim_store, monkeypatch):
    """On a CPU without the FP8 KV kernel Study 04's fp8 quality engine runs emulated and is stored beside the study,
    in ``04_long_context.fp8emu-e4m3`` (its spec says ``auto``: a bf16 cache). slim_tree must derive its divergence
    against ``04_long_context``'s auto before dropping the lists; before, it slimmed auto's lists away and left the
    emulated records as they were, and the re-rendered page read a top-1 flip rate of 1.0 (cpu-tiny, 2026-12-03)."""
    import json

    plan = lc.LongCtxPlan(
        model=str(REPO_ROOT / "data/models/fp8lab-tiny-qwen3"),
        lengths=(512,),
        output_tokens=32,
        kv_cache_gib=0.03,
        quality_model=str(REPO_ROOT / "data/models/fp8lab-tiny-qwen3"),
        quality_length=200,
        passkey_lengths=(),
        random_token_lengths=(),
    )
    monkeypatch.setattr(slim_store, "_longctx_plan", lambda profile: plan)
    docs = lc.quality_documents(plan)
    rng = np.random.default_rng(3)
    rows: dict[str, list] = {"auto": [], "emu": []}
    for src, id_list in docs.items():
        for j, ids in enumerate(id_list):
            _, b, c = _div_rows(rng, len(ids), plan.top_k)
            for side, r in (("auto", b), ("emu", c)):
                rows[side].append({"phase": f"div-{src}", "tag": f"{src}-{j}", **r.to_dict()})
    for folder, side in (("04_long_context/a1", "auto"), ("04_long_context.fp8emu-e4m3/b2", "emu")):
        rd = tmp_path / folder
        rd.mkdir(parents=True)
        (rd / "spec.json").write_text(json.dumps({"engine": {"kv_cache_dtype": "auto"}}))
        pd.DataFrame(rows[side]).to_parquet(rd / "records.parquet", index=False)
    slim_store.slim_tree(tmp_path, "cpu-tiny")
    base = results.read_records(tmp_path / "04_long_context/a1/records.parquet").set_index("tag")
    emu = results.read_records(tmp_path / "04_long_context.fp8emu-e4m3/b2/records.parquet").set_index("tag")
    assert "prompt_topk_ids" not in base and "prompt_topk_ids" not in emu and "div_kl" in emu and "div_kl" not in base
    fresh_base, fresh_emu = pd.DataFrame(rows["auto"]).set_index("tag"), pd.DataFrame(rows["emu"]).set_index("tag")
    for tag in ("text-0", "random-0"):
        src = tag.rpartition("-")[0]
        want = lc.position_divergence(fresh_base.loc[tag], fresh_emu.loc[tag], docs[src][0], plan.top_k)
        got = lc.stored_divergence(base.loc[tag], emu.loc[tag], docs[src][0], plan.top_k)
        assert got.top1.tolist() == want.top1.tolist() and 0 < want.top1.mean() < 1
        np.testing.assert_allclose(got.kl, want.kl, rtol=1e-6)


HTML = """<html><head><script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js"></script>
<style type="text/css">
:root { --jp-icon-x: url(data:image/svg+xml;base64,AAAA); --jp-used: 1px; --jp-unused: 2px; --jp-chain: var(--jp-used); }
.jp-Cell { margin: var(--jp-chain); }
.jp-Nowhere { color: red; }
@media print { .jp-Cell { color: black; } .jp-Nowhere { color: blue; } }
</style></head><body>
<div class="jp-Cell jp-MarkdownCell jp-Notebook-cell"><div class="jp-Cell-inputWrapper"><div class="jp-RenderedMarkdown">
<h1>Study</h1></div></div></div>
<div class="jp-Cell jp-CodeCell jp-Notebook-cell"><div class="jp-Cell-inputWrapper"><div class="jp-InputArea">
<pre>secret_code = 1</pre></div></div><div class="jp-Cell-outputWrapper"><div class="jp-OutputArea">
<table>
  <tr>
    <td>42</td>
  </tr>
</table><img src="data:image/png;base64,{png}"/></div></div></div>
<div class="jp-Cell jp-CodeCell jp-Notebook-cell jp-mod-noOutputs"><div class="jp-Cell-inputWrapper"><pre>x = 2</pre></div></div>
<script type="module">import("https://cdnjs.cloudflare.com/x.mjs")</script>
</body></html>"""


def test_slim_html_keeps_outputs_and_drops_code_and_cdn(slim_html):
    import base64

    from PIL import Image

    im = Image.new("RGBA", (120, 60), (255, 255, 255, 255))
    for x in range(120):
        im.putpixel((x, 30), (31, 119, 180, 255))
        im.putpixel((x, 31), (120, 170, 210, 255))  # an anti-aliasing shade
    buf = io.BytesIO()
    im.save(buf, "PNG")
    page = HTML.replace("{png}", base64.b64encode(buf.getvalue()).decode())
    out = slim_html.slim(page)
    assert "secret_code" not in out and "x = 2" not in out and "<script" not in out and "cdnjs" not in out
    assert "<h1>Study</h1>" in out and "<td>42</td>" in out and "<tr><td>42</td></tr>" in out
    assert ".jp-Cell {" in out and "jp-Nowhere" not in out and "--jp-icon-x" not in out
    assert "--jp-used" in out and "--jp-chain" in out and "--jp-unused" not in out
    png = base64.b64decode(out.split("data:image/png;base64,")[1].split('"')[0])
    again = Image.open(io.BytesIO(png))
    assert again.mode == "P" and np.array_equal(np.asarray(again.convert("RGB")), np.asarray(im.convert("RGB")))
    assert slim_html.slim(out) == out  # idempotent


def test_slim_quality_keeps_the_lists_through_the_cache_scoring_reads(slim_store):
    """Forced (through the KV cache) Study 03 records keep ``teacher``'s top-k lists and ``task_tf``'s top-1 ids;
    the perplexity windows' and the greedy outputs' lists go, and every actual token's score stays."""
    import pyarrow as pa

    phases = ["greedy", "teacher", "teacher_one_pass", "ppl", "ppl_one_pass", "task_tf"]
    ids, lps = [[[1, 2]] for _ in phases], [[[-0.1, -2.0]] for _ in phases]
    t = pa.table(
        {
            "phase": phases,
            "output_topk_ids": ids,
            "output_topk_logprobs": lps,
            "output_token_logprobs": [[-0.1]] * len(phases),
            "prompt_topk_ids": ids,
            "prompt_topk_logprobs": lps,
        }
    )
    out = slim_store.slim_quality(t).to_pydict()
    kept = {c: [p for p, v in zip(phases, out[c], strict=True) if v is not None] for c in out if c != "phase"}
    assert kept["output_topk_ids"] == ["teacher", "teacher_one_pass", "ppl_one_pass", "task_tf"]
    assert kept["output_topk_logprobs"] == ["teacher", "teacher_one_pass", "ppl_one_pass"]
    assert kept["prompt_topk_ids"] == ["greedy", "teacher", "teacher_one_pass", "task_tf"]
    assert kept["prompt_topk_logprobs"] == ["greedy", "teacher", "teacher_one_pass"]
    assert kept["output_token_logprobs"] == phases
