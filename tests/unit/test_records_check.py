"""capacity.records_check: the KV page-size formula against the block counts of stored engine runs.

The committed H200 stores (reports/h200/records/*.tar.gz) are real vLLM 0.26.0 runs: these tests read them as
they are, and one copy is altered to show that a wrong block count is caught.
"""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest

from fp8lab import capacity
from fp8lab.paths import REPO_ROOT
from fp8lab.specs import SpecError

H200 = REPO_ROOT / "reports" / "h200" / "records"


def test_every_h200_engine_matches_the_formula():
    df = capacity.records_check([str(H200)])
    s = capacity.summarize_records(df, [str(H200)])
    # 10 Study 01 engine runs (5 paired trials x auto/fp8, CUDA graphs), 4 Study 03 (the real model) + 4 Study 02 engines
    # (the real model since 2026-12-04, stored under 03_quality; its 3 re-measurements of Study 03's engines were
    # pruned), 6 Study 04 engines; fp8_e5m2 failed to start in vLLM 0.26.0 and stays a row with its error
    assert s["engines"] == 24 and s["compared"] == 23 and s["exact"] == 23 and s["max_abs_rel_error"] == 0.0
    assert s["devices"] == ["NVIDIA H200"]
    (failed,) = s["not_compared"].values()
    assert "float8_e5m2" in failed
    # Qwen3-8B at 24 GiB: 2 x 36 layers x 8 KV heads x 128 x 2 B x 16 tokens = 2,359,296 B per block (auto)
    q = df[(df.model == "qwen3-8b") & (df.kv_dtype == "auto")]
    assert set(q.bytes_per_block) == {2_359_296} and set(q.engine_blocks) == {24 * 2**30 // 2_359_296}
    # block 256 at 128K (Study 04): 16x the bytes per block, 1/16 the blocks
    b256 = df[(df.model == "qwen3-8b-128k") & (df.block_size == 256) & (df.kv_dtype == "fp8")]
    assert list(b256.engine_blocks) == [24 * 2**30 // (2_359_296 * 16 // 2)] == [1365]


def test_study_02_scale_sets_resolve_inside_the_store():
    """Study 02's engines load model folders it wrote into the host's store (absolute host paths); the check
    finds them inside the unpacked archive, not on this machine."""
    df = capacity.records_check([str(H200 / "02_calibration.tar.gz")])
    assert set(df.model) == {"large-tensor", "large-attn_head", "prompt32-attn_head", "SmolLM2-135M-Instruct"}
    # the 3 scale sets and fp8 with vLLM's dynamic scales (its auto and scale-1.0 engines were Study 03's, pruned)
    assert len(df) == 4 and df.error.isna().all() and (df.rel_error == 0).all()


def test_a_wrong_block_count_is_caught(tmp_path):
    with tarfile.open(H200 / "01_kv_dtype_auto_vs_fp8.tar.gz") as tf:
        tf.extractall(tmp_path, members=[m for m in tf.getmembers() if m.name.endswith(".json")], filter="data")
    study = tmp_path / "01_kv_dtype_auto_vs_fp8"
    run = sorted(study.iterdir())[0]
    meta = json.loads((run / "engine.json").read_text())
    meta["engine"]["num_blocks"] += 1
    (run / "engine.json").write_text(json.dumps(meta))
    s = capacity.summarize_records(capacity.records_check([str(study)]), [str(study)])
    assert s["compared"] == 10 and s["exact"] == 9 and 0 < s["max_abs_rel_error"] < 1e-3
    assert "exactly in 9, largest error" in capacity.records_markdown(s)


def test_a_run_whose_config_is_nowhere_is_a_row(tmp_path):
    with tarfile.open(H200 / "01_kv_dtype_auto_vs_fp8.tar.gz") as tf:
        tf.extractall(tmp_path, members=[m for m in tf.getmembers() if m.name.endswith(".json")], filter="data")
    run = sorted((tmp_path / "01_kv_dtype_auto_vs_fp8").iterdir())[0]
    spec = json.loads((run / "spec.json").read_text())
    spec["engine"]["model"] = "/elsewhere/models/not-here"
    (run / "spec.json").write_text(json.dumps(spec))
    df = capacity.records_check([str(run)])
    assert len(df) == 1 and df.error.iloc[0] == "model config not found here: /elsewhere/models/not-here"
    s = capacity.summarize_records(df, [str(run)])
    assert s["compared"] == 0 and "none with both" in capacity.records_markdown(s)


def test_the_same_run_twice_counts_once(tmp_path):
    shutil.copy(H200 / "03_quality.tar.gz", tmp_path / "a.tar.gz")
    df = capacity.records_check([str(H200 / "03_quality.tar.gz"), str(tmp_path)])
    assert len(df) == df.run.nunique() == 4


@pytest.mark.parametrize(
    "roots, bad",
    [
        ("runs", "= 'runs': not a list"),
        (["/no/such/store"], "= '/no/such/store': no such path"),
        ([3], "= 3: no such path"),
    ],
)
def test_bad_roots_name_the_field(roots, bad):
    with pytest.raises(SpecError, match="ENGINE_RECORDS") as e:
        capacity.check_record_roots(roots)
    assert bad in str(e.value) and "allowed:" in str(e.value)


def test_summary_and_verdict_carry_the_records():
    import pandas as pd

    from fp8lab import kvmath

    lay = kvmath.load_layout(REPO_ROOT / "data" / "configs" / "qwen3-8b")
    formula = pd.DataFrame([kvmath.summary_row(lay, ["auto", "fp8"], 1)])
    plan = pd.DataFrame(kvmath.plan_capacity(lay, 141.0, ["auto", "fp8"], 32768, overhead_gib=4.0))
    memory = pd.DataFrame(kvmath.memory_rows(lay, 32, 8192, ["auto", "fp8"], tp=1))
    check = capacity.capacity_check(str(REPO_ROOT / "data" / "configs" / "qwen3-8b"), measure=False)
    rec = capacity.summarize_records(capacity.records_check([str(H200)]), [str(H200)])
    s = capacity.summarize("qwen3-8b", ["auto", "fp8"], formula, plan, memory, check, rec)
    assert s["records"]["exact"] == 23
    assert "block count of 23 engines exactly" in capacity.verdict_markdown(s)
    assert "Engines on record" not in capacity.verdict_markdown({**s, "records": None})


def test_archives_without_the_tarfile_data_filter(tmp_path, monkeypatch):
    """Python 3.11 before 3.11.4 has no tarfile "data" filter: only plain, relative run files are unpacked."""
    import io

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    assert len(capacity.records_check([str(H200 / "03_quality.tar.gz")])) == 4
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tf:
        for name in ("../outside/r/spec.json", "/abs/r/engine.json", "ok/r/spec.json", "ok/r/records.parquet"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tf.addfile(info, io.BytesIO(b"{}"))
    with tarfile.open(bad) as tf:
        assert [m.name for m in capacity.records.run_members(tf)] == ["ok/r/spec.json"]
