"""The exported reports as a reader opens them: a real headless Chromium, network off.

``fp8lab run`` executes notebook 00 on the cpu-tiny profile (papermill, predictions only: no engine) and writes its
HTML and the index; Chromium opens both and the tests assert what a reader sees: the verdict first, no code,
nothing loaded from outside the file, every image decoded, the formula rendered (MathML), no console error.
Screenshots are kept in ``$FP8LAB_TEST_ARTIFACTS`` (default ``runs/test-artifacts/browser``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from browser_cdp import chromium_binary, open_page

from fp8lab.paths import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        chromium_binary() is None and not os.environ.get("CI"),
        reason="chromium not installed (scripts/test.sh installs it; CI requires it)",
    ),
]

STEM = "00_kv_memory_estimation"
ARTIFACTS = Path(os.environ.get("FP8LAB_TEST_ARTIFACTS", REPO_ROOT / "runs" / "test-artifacts" / "browser"))

PAGE_PROBES = {
    "title": "document.title",
    "first_h2_id": "document.querySelector('h2') && document.querySelector('h2').id",
    "verdict_top": "document.getElementById('verdict').getBoundingClientRect().top",
    "first_bullet_above_params": "document.querySelector('li').getBoundingClientRect().top < "
    "document.getElementById('parameters').getBoundingClientRect().top",
    "verdict_before_params": "document.body.innerText.indexOf('Verdict') < document.body.innerText.indexOf('Parameters')",
    "code_elements": "document.querySelectorAll('.jp-CodeCell .jp-InputArea, .jp-InputPrompt, .jp-CodeCell .highlight, .cm-editor').length",
    "text": "document.body.innerText",
    "images": "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])",
    "math_width": "(() => { const m = document.querySelector('math'); return m ? m.getBoundingClientRect().width : 0 })()",
    "math_text": "(() => { const m = document.querySelector('math'); return m ? m.textContent : '' })()",
    "param_tables": "document.querySelectorAll('table.fp8lab-params').length",
}
INDEX_PROBES = {
    "title": "document.title",
    "first_h2": "document.querySelector('h2').textContent",
    "headline_top": "document.getElementById('headline').getBoundingClientRect().top",
    "first_after_h1": "(() => { const h = document.querySelector('h1'); let e = h.nextElementSibling; "
    "while (e && !e.textContent.trim()) e = e.nextElementSibling; return e ? e.id : null })()",
    "decision_top": "document.getElementById('decision').getBoundingClientRect().top",
    "decision_text": "document.getElementById('decision').innerText",
    "verdict_links": "Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href')).filter(h => h.endsWith('#verdict'))",
    "all_links": "Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href'))",
    "text": "document.body.innerText",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory, runs_root):
    from fp8lab.report.run import run_profile

    out = tmp_path_factory.mktemp("browser-report")
    summary = run_profile(
        "cpu-tiny", out, notebooks=["00"], overrides={"MEASURE": False, "ENGINE_RECORDS": []}, progress=False
    )
    entry = summary["notebooks"][STEM]
    assert entry["status"] == "ok", entry["error"]
    return out


def _only_local(urls: list[str]) -> list[str]:
    return [u for u in urls if not (u.startswith("file://") or u.startswith("data:"))]


def test_notebook_page_opens_with_its_verdict_and_loads_nothing_from_outside(report):
    visit = open_page(report / f"{STEM}.html", PAGE_PROBES, screenshot=ARTIFACTS / f"{STEM}.png")
    p = visit.probes
    assert _only_local(visit.requests) == [], visit.requests
    assert visit.console_errors == []
    assert p["title"].startswith("00 · KV-cache memory")  # the tab names the study, not "Notebook"
    assert p["first_h2_id"] == "verdict" and 0 <= p["verdict_top"] < 400  # on the first screen, first section
    assert p["first_bullet_above_params"] and p["verdict_before_params"]
    assert "KV per token" in p["text"].split("Parameters")[0]  # the computed bullets, before the evidence
    # code inputs hidden: no editor in the DOM and no source text on the page
    assert p["code_elements"] == 0
    assert "import pandas" not in p["text"] and "record_summary(" not in p["text"]
    assert p["param_tables"] == 1 and "injected-parameters" not in (report / f"{STEM}.html").read_text()
    # no stderr noise or raw file paths of the kernel's outputs
    assert "Warning" not in p["text"] and "PosixPath(" not in p["text"]
    # figures: several, every one decoded
    assert len(p["images"]) >= 3 and all(ok and w > 0 and h > 0 for ok, w, h in p["images"]), p["images"]
    # the formula: MathML laid out by the browser, not raw TeX waiting for MathJax
    assert p["math_width"] > 100 and "bytes/token" in p["math_text"]
    assert "$$" not in p["text"] and "\\text{" not in p["text"]
    assert visit.screenshot.stat().st_size > 10_000


def test_index_opens_with_the_decision_then_the_headline_and_links_each_verdict(report):
    visit = open_page(report / "index.html", INDEX_PROBES, screenshot=ARTIFACTS / "index.png")
    p = visit.probes
    assert _only_local(visit.requests) == [] and visit.console_errors == []
    assert p["title"] == "fp8lab report: cpu-tiny"
    # the decision box first (nothing measured here: it says so), the audit's headline after it
    assert p["first_after_h1"] == "decision" and p["first_h2"] == "Decision: FP8 KV cache or auto?"
    assert 0 <= p["decision_top"] < 300 and p["decision_top"] < p["headline_top"]
    assert "quality: not yet measured through the cache on a real model" in p["decision_text"]
    # the study's block links its verdict; the decision box links the same page for what it read there
    assert set(p["verdict_links"]) == {f"{STEM}.html#verdict"} and len(p["verdict_links"]) == 3
    for href in p["all_links"]:  # every link resolves to a file of the report folder
        assert (report / href.split("#")[0]).is_file(), href
    # key numbers with units; the device and vLLM of the runs (none here: predictions only) are named
    assert re.search(r"3,072 → 1,536 B/token", p["text"]), p["text"]
    assert "no engine run of its own" in p["text"]
    assert not re.search(r"\d\.\d{6,}", p["text"])  # no unrounded floats
    assert visit.screenshot.stat().st_size > 10_000


#: A number with its 95% interval as the decision box writes it: ``+13.2% [+12.7, +13.6]``.
INTERVAL = re.compile(r"[-+]?[\d,.]+\s*(?:%|ms|pp|tokens)?\s*\[[-+]?[\d,.]+, [-+]?[\d,.]+\]")


@pytest.mark.parametrize("folder", ["h200", "h200/shipped", "cpu-tiny"])
def test_committed_index_opens_with_the_decision_box_holding_numbers_with_intervals(folder):
    """Every committed index: the decision box is the first content after the title, on the first screen, and
    its lines hold numbers with their intervals and n, each linked to the page that measured it."""
    index = REPO_ROOT / "reports" / folder / "index.html"
    visit = open_page(index, INDEX_PROBES, screenshot=ARTIFACTS / f"index-{folder.replace('/', '-')}.png")
    p = visit.probes
    assert _only_local(visit.requests) == [] and visit.console_errors == []
    assert p["first_after_h1"] == "decision" and 0 <= p["decision_top"] < 300
    text = p["decision_text"]
    assert text.startswith("Decision: FP8 KV cache or auto?") and "Turn FP8 KV on if" in text and "Keep auto if" in text
    assert len(INTERVAL.findall(text)) >= 2 and "n = " in text, text
    for href in p["all_links"]:
        assert (index.parent / href.split("#")[0]).is_file(), href
