"""fp8lab.engine.results.phase_table: a study's stored runs tabulated per phase, with hand-computed values."""

from __future__ import annotations

import pandas as pd
import pytest

from fp8lab.cli import main
from fp8lab.engine.result import EngineResult
from fp8lab.engine.results import phase_table, save


def _store(root, run_id: str, dtype: str, status: str = "ok") -> None:
    records = pd.DataFrame(
        {
            "phase": ["warmup", "main", "main", "main"],
            "tag": ["trial0"] * 4,
            "ttft_s": [9.0, 0.010, 0.020, 0.030],
            "tpot_s": [9.0, 0.001, 0.002, 0.003],
        }
    )
    phases = {
        "warmup": {"wall_s": 1.0, "requests": 1, "prompt_tokens": 10, "output_tokens": 5, "preemptions": 0},
        "main": {"wall_s": 4.0, "requests": 3, "prompt_tokens": 30, "output_tokens": 120, "preemptions": 2},
    }
    res = EngineResult(
        status=status,
        error=None,
        engine={"kv_cache_dtype": dtype},
        records=records,
        samples=pd.DataFrame(),
        phases=phases,
        provenance={},
    )
    save(res, root / "study" / run_id, {"engine": {"model": "m", "kv_cache_dtype": dtype}})


def test_phase_table_per_phase_values(tmp_path):
    _store(tmp_path, "a1", "auto")
    _store(tmp_path, "b2", "fp8")
    t = phase_table("study", tmp_path)
    assert len(t) == 4 and set(t.kv_cache_dtype) == {"auto", "fp8"}
    main_row = t[(t.run_id == "a1") & (t.phase == "main")].iloc[0]
    assert main_row.output_tok_s == pytest.approx(30.0)  # 120 tokens / 4 s
    assert main_row.ttft_p50_ms == pytest.approx(20.0)  # the warm-up request (9 s) is not in this phase
    assert main_row.tpot_p99_ms == pytest.approx(2.98)  # linear interpolation of 1, 2, 3 ms at q = 0.99
    assert main_row.preemptions == 2 and main_row.tag == "trial0"
    warm = t[(t.run_id == "a1") & (t.phase == "warmup")].iloc[0]
    assert warm.ttft_p50_ms == pytest.approx(9000.0) and warm.output_tok_s == pytest.approx(5.0)


def test_runs_cli(tmp_path, capsys):
    _store(tmp_path, "a1", "auto")
    assert main(["runs", "study", "--root", str(tmp_path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| auto" in out and "30" in out
    assert main(["runs", "nothing-here", "--root", str(tmp_path)]) == 1
