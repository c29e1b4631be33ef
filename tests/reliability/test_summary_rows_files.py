"""The typed rows beside a notebook's summary, as ``fp8lab run`` handles them (report.run_notebook): written under the
hidden ``.running`` names and renamed with the summary only when the notebook succeeded; a failed rerun, or one whose
rows do not fit the schema, keeps the last good rows; a successful run that records no rows leaves none behind.

The notebook is a real one, executed by papermill in a kernel, written here with a few lines: it records one row
whose value, unit and failure are its parameters."""

from __future__ import annotations

import json

import nbformat
import pytest

from fp8lab import summary_table as st
from fp8lab.report.run import run_notebook

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

CELL = """
from fp8lab import summary_table
from fp8lab.report import run as report
row = summary_table.make_row(
    study="serving", metric="output_tok_s", kv_dtype="fp8", baseline="auto", setting="closed loop", concurrency=8,
    value=VALUE, n=3, unit="%", evidence="cpu analogue", device="CPU: test", model="test",
)
row["unit"] = UNIT  # record_summary validates it (a unit the schema does not declare fails the notebook)
if FAIL:
    raise RuntimeError("failed on purpose")
report.record_summary({"value": VALUE}, rows=[row] if ROWS else None)
"""


def _notebook(path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('VALUE = 1.0\nUNIT = "%"\nFAIL = False\nROWS = True')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(CELL)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def test_rows_are_renamed_with_the_summary_and_a_failed_rerun_keeps_the_last_good_ones(tmp_path):
    nb = _notebook(tmp_path / "98_rows_check.ipynb")
    out = tmp_path / "report"
    rows_file, pq = out / "98_rows_check.rows.json", out / "98_rows_check.rows.parquet"

    entry = run_notebook(nb, out, {"VALUE": 1.5}, progress=False)
    assert entry["status"] == "ok", entry["error"]
    assert [r["value"] for r in st.read_rows(rows_file)] == [1.5] and st.read_parquet(pq) == st.read_rows(rows_file)
    assert json.loads((out / "98_rows_check.summary.json").read_text()) == {"value": 1.5}
    assert not list(out.glob(".*"))  # nothing left under the hidden running names

    failed = run_notebook(nb, out, {"VALUE": 2.5, "FAIL": True}, progress=False)
    assert failed["status"] == "failed" and "failed on purpose" in failed["error"]
    assert [r["value"] for r in st.read_rows(rows_file)] == [1.5]  # the last good rows, untouched
    assert not list(out.glob(".*"))

    bad = run_notebook(nb, out, {"VALUE": 3.5, "UNIT": "furlongs"}, progress=False)
    assert bad["status"] == "failed" and "unit = 'furlongs'" in bad["error"] and "one of %" in bad["error"]
    assert [r["value"] for r in st.read_rows(rows_file)] == [1.5]
    assert json.loads((out / "98_rows_check.summary.json").read_text()) == {"value": 1.5}  # nothing half-written

    plain = run_notebook(nb, out, {"VALUE": 4.5, "ROWS": False}, progress=False)
    assert plain["status"] == "ok", plain["error"]
    assert not rows_file.exists() and not pq.exists()  # no stale rows beside a newer summary
