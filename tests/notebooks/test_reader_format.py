"""The reader's format in a real kernel: a notebook executed by papermill on fp8lab's kernel shows frames whole
(no '...' column, units in the headers, 'not measured' for a missing value), a figure with alt text that says what
it shows, and a sentence instead of a chart with no data; its exported page passes the text check."""

from __future__ import annotations

import nbformat
import papermill as pm

from fp8lab.report import pagecheck
from fp8lab.report import run as report

CELLS = [
    "import numpy as np\nimport pandas as pd\nimport matplotlib.pyplot as plt\n"
    "pd.DataFrame({f'c{i}_ms': [i * 1.5, np.nan] for i in range(30)})",
    "fig, ax = plt.subplots()\nax.plot([1, 2], [3, 4], label='fp8')\nax.set_xlabel('context (tokens)')\n"
    "ax.set_ylabel('step (ms)')\nax.set_title('Decode step')\nax.legend()\nplt.show()",
    "fig, ax = plt.subplots()\nax.set_xlabel('context (tokens)')\nax.set_ylabel('step (ms)')\n"
    "ax.set_title('fp8 ramp')\nplt.show()",
]


def test_frames_and_figures_in_the_readers_format(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nbformat.write(nb, str(tmp_path / "t.ipynb"))
    pm.execute_notebook(
        str(tmp_path / "t.ipynb"), str(tmp_path / "o.ipynb"), kernel_name=report.ensure_kernel(), progress_bar=False
    )
    page = report.export_html(tmp_path / "o.ipynb", tmp_path / "o.html").read_text(encoding="utf-8")
    assert "<th>c29 (ms)</th>" in page and "columns</p>" not in page
    assert page.count("not measured: not recorded") == 30
    assert 'alt="Decode step: step (ms) against context (tokens) for fp8"' in page
    assert "No chart: nothing was measured for it (fp8 ramp: step (ms) against context (tokens))." in page
    assert "No description has been provided" not in page
    assert pagecheck.problems(page) == []
