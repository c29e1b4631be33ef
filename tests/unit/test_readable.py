"""The reader's format (fp8lab.report.readable) and its text check (fp8lab.report.pagecheck), on every committed page."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8lab.paths import REPO_ROOT
from fp8lab.report import pagecheck, readable


def test_frame_html_has_no_index_units_fixed_decimals_and_reasons():
    df = pd.DataFrame(
        {
            "kv_dtype": ["auto", "fp8", "fp8_e5m2"],
            "tpot_ms": [5.1234, -0.0, math.nan],
            "blocks": [1000, 2000, None],
            "error": [None, None, "ValueError: The dtype of q torch.float8_e4m3fn does not match"],
        }
    )
    page = readable.frame_html(df)
    assert "tpot (ms)" in page and "<th>tpot_ms</th>" not in page
    assert "5.12" in page and "5.1234" not in page  # 3 significant digits of the column's median
    assert ">0.00<" in page  # -0.0 shown without its sign
    assert "not measured: failed (error; a value error): The dtype of q" in page
    assert "1,000" in page and "2,000" in page
    assert "<th></th>" not in page and ">0<" not in page.split("<tbody>")[1].split("</td>")[0]  # no index column
    assert pagecheck.problems(page) == []


def test_named_index_becomes_a_column_and_wide_frames_are_whole():
    df = pd.DataFrame({f"c{i}": [i * 1.5] for i in range(40)}, index=pd.Index(["auto"], name="kv_dtype"))
    page = readable.frame_html(df)
    assert "<th>kv_dtype</th>" in page and "<th>c39</th>" in page and "..." not in page


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gap 4.31e-01 s", "gap 0.431 s"),
        ("copy at 4069.9173720405943 GB/s", "copy at 4,070 GB/s"),
        ("B=8 -0.0% vs B=1 -1.2%", "B=8 0.0% vs B=1 -1.2%"),
        ("half-width +-0.0 pp", "half-width ±0.0 pp"),
        ("half-width +-1 request", "half-width +-1 request"),
        ("see /tmp/fp8lab-runs/03_quality/f218a99cb35b", "see OUT/f218a99cb35b"),
        ("model /home/someone/fp8lab/data/models/tiny", "model data/models/tiny"),
        ("[-6.6, +35.5]", "[-6.6, +35.5]"),
    ],
)
def test_tidy_text(text, expected):
    assert readable.tidy_text(text) == expected


def test_tidy_text_turns_an_exception_into_a_classified_sentence():
    out = readable.tidy_text("calculate_kv_scales rejected: TypeError: EngineArgs.__init__() got an unexpected kw")
    assert out.startswith("calculate_kv_scales rejected: failed (")
    assert "TypeError" not in out and "a type error" in out
    assert readable.tidy_text("NaN", cell=True).startswith("not measured: ")


def test_pagecheck_finds_each_kind_and_tidy_page_fixes_them():
    bad = (
        "<html><body><p>the fit is 4.31e-01 and -0.0% here; see /tmp/x/y</p>"
        "<table><tr><td>NaN</td><td>...</td><td>ValueError: boom</td></tr></table>"
        "<p>3 rows × 27 columns</p><pre>Traceback (most recent call last):\n  x\nKeyError: 'a'</pre></body></html>"
    )
    kinds = {p.kind for p in pagecheck.problems(bad)}
    assert kinds == {"missing", "truncated", "scientific", "negative-zero", "exception", "machine-path"}
    fixed = readable.tidy_page(bad)
    assert pagecheck.problems(fixed) == []
    assert "<td>...</td>" not in fixed and "A table of 3 rows and 27 columns, shown in part" in fixed
    assert readable.tidy_page(fixed) == fixed
    # a path in a code span (a parameter's value) is the reader's too; styles are left alone
    page = '<td><code>"/home/someone/fp8lab/data/models/tiny"</code></td><style>a{x:1e-05}</style>'
    assert readable.tidy_page(page) == '<td><code>"data/models/tiny"</code></td><style>a{x:1e-05}</style>'


def test_numbers_never_scientific():
    for x in (1.4e-7, -3e-9, 123456789.123, 0.000123, -0.0):
        text = readable.fmt_number(x, readable.decimals_for([x]))
        assert "e" not in text.lower() and text not in ("-0", "-0.0"), (x, text)


def test_every_committed_page_reads_clean():
    """The text check over every committed page (reports/**/*.html)."""
    bad = pagecheck.check_files(pagecheck.pages_under(REPO_ROOT / "reports"))
    assert not bad, "\n".join(f"{p.relative_to(REPO_ROOT)}: {[str(x) for x in v[:3]]}" for p, v in bad.items())
