"""Study 01's verdict lines that are computed from tables alone: the fidelity check's summary (with each
tool's own run-to-run spread) and the preemption line, on numbers measured on the H200 (the committed
records of reports/h200/shipped, and the fidelity rows printed by reports/h200's Study 01 HTML)."""

from __future__ import annotations

import tarfile

import pandas as pd
import pytest

from fp8lab import results, serving
from fp8lab.paths import REPO_ROOT

SHIPPED = REPO_ROOT / "reports" / "h200" / "shipped" / "records" / "01_kv_dtype_auto_vs_fp8.tar.gz"


def _rows(values):
    """Fidelity rows in run order (bench, fp8lab, fp8lab, bench, ...), tokens/s as given."""
    out = []
    for r, (first, second) in enumerate(zip(values[::2], values[1::2], strict=True)):
        order = ("bench", "fp8lab") if r % 2 == 0 else ("fp8lab", "bench")
        out += [{"round": r, "who": order[0], "status": "ok", "tokens_per_second": first},
                {"round": r, "who": order[1], "status": "ok", "tokens_per_second": second}]
    return pd.DataFrame(out)


def test_fidelity_summary_on_the_h200_rows():
    # reports/h200, Study 01 (8B-shaped, eager, 1024 in + 256 out, 256 requests): two rounds
    f = serving.fidelity_summary(_rows([21745.61, 20290.77, 21177.84, 20672.20]))
    assert f["round_ratios"] == pytest.approx([20290.77 / 21745.61, 21177.84 / 20672.20])
    assert f["ratio"] == pytest.approx(0.97878, abs=1e-5) and f["within_tolerance"]
    assert f["spread_pct"] == pytest.approx({"bench": 5.1925, "fp8lab": 4.3718}, abs=1e-3)
    assert f["resolvable"] is False  # each tool varied by more than 3% against itself
    line = serving.fidelity_line(f)
    assert "= 0.979 (within 3%; run to run, vLLM bench varied by 5.2%, fp8lab varied by 4.4%)" in line
    assert "within that variation" in line
    # reports/h200/shipped (the tiny model, CUDA graphs, 256 requests): 0.784, but fp8lab varied by 23.7%
    g = serving.fidelity_summary(_rows([195074.93, 127739.80, 158063.45, 172947.14]))
    assert g["ratio"] == pytest.approx(0.78438, abs=1e-5) and not g["within_tolerance"] and g["resolvable"] is False
    assert "outside 3%" in serving.fidelity_line(g) and "no verdict on either tool" in serving.fidelity_line(g)


def test_fidelity_summary_when_it_can_tell():
    steady = serving.fidelity_summary(_rows([100.0, 101.0, 100.5, 100.2]))
    assert steady["resolvable"] is True and steady["within_tolerance"]
    assert "cannot resolve" not in serving.fidelity_line(steady)
    off = serving.fidelity_summary(_rows([100.0, 90.0, 91.0, 101.0]))  # steady tools, 10% apart
    assert off["resolvable"] is True and not off["within_tolerance"] and off["ratio"] == pytest.approx(0.9005, abs=1e-4)
    wide = serving.fidelity_summary(_rows([100.0, 80.0, 84.0, 104.0]))  # 20% apart, tools vary by 4-5%
    assert wide["resolvable"] is False and "the tools disagree" in serving.fidelity_line(wide)
    one = serving.fidelity_summary(_rows([100.0, 97.0]))
    assert one["resolvable"] is None and one["spread_pct"] == {} and one["ratio"] == pytest.approx(0.97)
    failed = _rows([100.0, 97.0, 99.0, 100.0])
    failed.loc[3, ["status", "tokens_per_second"]] = ["failed", None]
    f = serving.fidelity_summary(failed)
    assert f["round_ratios"] == pytest.approx([0.97]) and f["resolvable"] is None  # bench ran once
    assert serving.fidelity_line(None) is None


def test_preemption_line_on_the_shipped_model_records(tmp_path):
    with tarfile.open(SHIPPED) as t:
        t.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    ph = results.phase_table("01_kv_dtype_auto_vs_fp8", tmp_path)
    closed = ph[ph.phase.str.match(r"^closed-c\d+$")].copy()
    tp = pd.DataFrame({"kv_dtype": closed.kv_cache_dtype, "trial": closed.tag.str.removeprefix("trial").astype(int),
                       "concurrency": closed.phase.str.removeprefix("closed-c").astype(int),
                       "preemptions": closed.preemptions})
    assert len(tp) == 24  # 2 dtypes x 3 trials x 4 concurrencies
    line = serving.preemption_line(tp, "auto", "fp8")
    assert line.startswith("- **Preemptions (closed loop).** `auto` preempted at c=128 (15, 15, 15 over 3 trials); "
                           "`fp8` never preempted.")
    assert "Only `auto` ran out of KV cache" in line
    both = tp.assign(preemptions=1)
    assert "Only" not in serving.preemption_line(both, "auto", "fp8")
    assert serving.preemption_line(tp.assign(preemptions=0), "auto", "fp8") is None


def test_throughput_points_name_the_method():
    assert serving._tput_point("output tok/s @c=32") == "c=32"
    assert serving._tput_point("output tok/s (no stream) @c=32") == "c=32 (no stream)"
