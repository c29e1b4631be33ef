"""Notebook 00 executed top to bottom by papermill on the test profile (cpu-ci, cpu-tiny with fewer repetitions), checked through its summary."""

from __future__ import annotations

import pytest

from fp8lab.paths import NOTEBOOKS_DIR
from fp8lab.report import TEST_PROFILE, load_profile, parameters_for, run_notebook

pytestmark = [
    pytest.mark.slow,
    pytest.mark.native_fp8,
]  # FP8 engines: skipped without the kernel (test_degraded.py covers that)


@pytest.fixture(scope="module")
def nb00(tmp_path_factory, runs_root):
    nb = NOTEBOOKS_DIR / "00_kv_memory_estimation.ipynb"
    out = tmp_path_factory.mktemp("nb00")
    # section 6 reads this session's results store, which holds (at least) section 5's own engines
    params = {**parameters_for(nb, load_profile(TEST_PROFILE)), "ENGINE_RECORDS": [str(runs_root)]}
    entry = run_notebook(nb, out, params, progress=False)
    return entry, out


def test_runs_and_exports_html(nb00):
    entry, out = nb00
    assert entry["status"] == "ok", entry["error"]
    html = (out / "00_kv_memory_estimation.html").read_text()
    assert "KV-cache memory" in html and "<img" in html  # figures rendered into the report


def test_formula_numbers(nb00):
    s = nb00[0]["summary"]
    # shipped model: 2 (K,V) x 6 layers x 2 KV heads x 64 head_dim x 2 bytes = 3072; fp8 halves it
    assert s["bytes_per_token"] == {"auto": 3072, "fp8": 1536}
    # Qwen3-8B: 2 x 36 x 8 x 128 x 2 = 147456 B/token; Llama-3-70B: 2 x 80 x 8 x 128 x 2 = 327680
    assert s["configs_bytes_per_token"]["qwen3-8b"]["auto"] == 147456
    assert s["configs_bytes_per_token"]["llama-3-70b"]["fp8"] == 163840
    # KV halves, total memory does not: weights stay
    tot = s["total_memory_vs_first"]["qwen3-8b"]["fp8"]
    assert 0.5 < tot < 1.0


def test_engine_matches_formula(nb00):
    s = nb00[0]["summary"]
    assert s["measured_ok"] and s["prediction_exact"] and s["max_abs_rel_error"] == 0.0
    m = s["measured"]
    # 1 GiB at 128-token blocks: 2**30 // (128 x 3072) = 2730 blocks (auto), 2**30 // (128 x 1536) = 5461 (fp8)
    assert m["auto"]["engine_blocks"] == 2730 and m["fp8"]["engine_blocks"] == 5461


def test_engines_on_record(nb00):
    """Section 6 re-derives every stored engine's block count from its own spec: here at least section 5's
    two CPU engines (study 00_kv_memory), and any other engine this test session stored before."""
    r = nb00[0]["summary"]["records"]
    assert "00_kv_memory" in r["studies"] and r["compared"] >= 2
    assert r["exact"] == r["compared"], r
    assert 1536 * 128 in r["page_sizes"]  # the shipped model: 1,536 B/token in fp8, at the CPU block size 128


def test_rows_recorded_beside_the_summary(nb00):
    """The typed rows notebook 00 records (issue 16) carry the summary's numbers: bytes per token by the formula,
    the engines' blocks measured here (evidence: a CPU analogue) and the engines on record."""
    from fp8lab import summary_table as st

    entry, out = nb00
    s = entry["summary"]
    rows = st.read_rows(out / "00_kv_memory_estimation.rows.json")  # validated on read as on write
    assert st.read_parquet(out / "00_kv_memory_estimation.rows.parquet") == rows
    r = st.one(rows, metric="kv_bytes_per_token", kv_dtype="fp8", model="fp8lab-tiny-qwen3", baseline=None)
    assert r["value"] == s["bytes_per_token"]["fp8"] == 1536 and r["evidence"] == "computed"
    for d in ("auto", "fp8"):
        e = st.one(rows, metric="num_blocks", kv_dtype=d, baseline=None)
        assert e["value"] == s["measured"][d]["engine_blocks"] and e["evidence"] == "cpu analogue"
    rec = st.one(rows, metric="formula_exact_share")
    assert rec["n"] == s["records"]["compared"] and rec["value"] == 1.0
