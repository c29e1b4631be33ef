"""``fp8lab run`` as the main job runs it, into a fresh folder: the claims audit, run after the studies in the same
call, must know where those studies ran. ``summary.json`` (each notebook's ``ran_on`` and engine runs) is written
after every notebook, not only at the end, so notebook 05 reads it; before, a fresh folder's audit saw its own
studies as "device unknown" and could not weigh them."""

from __future__ import annotations

import json

import pytest

from fp8lab.engine.devices import provenance
from fp8lab.report.run import run_profile

pytestmark = pytest.mark.slow


def test_the_audit_knows_where_this_runs_studies_ran(tmp_path, runs_root):
    out = tmp_path / "fresh"
    summary = run_profile(
        "cpu-tiny",
        out,
        notebooks=["00", "05"],
        progress=False,
        overrides={"MEASURE": False, "ENGINE_RECORDS": [], "OTHER_REPORTS": []},
    )
    assert {k: v["status"] for k, v in summary["ran_now"].items()} == {
        "00_kv_memory_estimation": "ok",
        "05_claims_audit": "ok",
    }
    audit = json.loads((out / "05_claims_audit.summary.json").read_text())
    device = provenance(with_torch=False)["device"]  # this machine: "CPU: <model name>"
    setting = audit["settings"]["fresh"]["00_kv_memory_estimation"]
    assert setting.startswith(f"{device}, fp8lab-tiny-qwen3, vLLM ") and "device unknown" not in setting
    # the index and summary.json list both notebooks, each with where it ran
    written = json.loads((out / "summary.json").read_text())
    assert all(e["ran_on"]["device"] == device for e in written["notebooks"].values())
