"""The reader's HTML (fp8lab.report.htmlexport) and the index's numbers (fp8lab.report.run), on notebooks built here."""

from __future__ import annotations

import json

import nbformat
import pytest

from fp8lab.report import htmlexport
from fp8lab.report.run import fmt_number, key_numbers, runs_provenance, write_index

FORMULA = r"$$\text{bytes/token} = \sum_{\text{layers}} \text{kv\_heads} \times b$$"


def _notebook():
    v4 = nbformat.v4
    params = v4.new_code_cell('MODEL = "a"  # the model folder\nKV_CACHE_GIB = 1.0  # KV budget in GiB\nN = 3')
    params.metadata["tags"] = ["parameters"]
    injected = v4.new_code_cell("# Parameters\nKV_CACHE_GIB = 24\n")
    injected.metadata["tags"] = ["injected-parameters"]
    table = v4.new_code_cell("t")
    table.outputs = [
        v4.new_output(
            "execute_result",
            data={
                "text/html": "<table><thead><tr><th>x</th></tr></thead><tbody><tr><td>1.3607525825500488</td></tr></tbody></table>",
                "text/plain": "x",
            },
            execution_count=1,
        )
    ]
    empty = v4.new_code_cell("e")
    empty.outputs = [
        v4.new_output(
            "execute_result",
            data={"text/html": "<table><thead><tr><th>x</th></tr></thead><tbody>\n</tbody></table>", "text/plain": ""},
            execution_count=2,
        )
    ]
    noisy = v4.new_code_cell("run()")
    noisy.outputs = [
        v4.new_output("stream", name="stderr", text="/x/tqdm/auto.py:21: TqdmWarning: IProgress not found\n"),
        v4.new_output(
            "display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "a"}, "text/plain": "HBox()"}
        ),
        v4.new_output("stream", name="stdout", text="step 1\rstep 2\rdone\n"),
    ]
    verdict = v4.new_code_cell("display(Markdown(v)); record_summary(s)")
    dump = json.dumps({f"k{i}": i for i in range(40)}, indent=2)
    verdict.outputs = [
        v4.new_output("display_data", data={"text/markdown": "- **fp8** halves the KV: x0.50"}),
        v4.new_output("stream", name="stdout", text=dump + "\n"),
        v4.new_output("execute_result", data={"text/plain": "PosixPath('/tmp/x.summary.json')"}, execution_count=3),
    ]
    cells = [
        v4.new_markdown_cell("# 09 · A `study`: does it hold?\n\nWhat this notebook asks."),
        params,
        injected,
        v4.new_markdown_cell("## 1. The formula\n\n" + FORMULA + "\n\nand `$HOME` stays code."),
        table,
        empty,
        noisy,
        v4.new_markdown_cell("## Verdict"),
        verdict,
    ]
    return v4.new_notebook(cells=cells)


def test_prepare_puts_title_verdict_parameters_then_evidence():
    nb = htmlexport.prepare(_notebook())
    src = [c.source.split("\n")[0] for c in nb.cells if c.cell_type == "markdown"]
    assert src[0] == "# 09 · A `study`: does it hold?"
    assert src[1] == '<h2 id="verdict">Verdict</h2>'
    assert nb.cells[2].outputs[0]["data"]["text/markdown"].startswith("- **fp8**")  # the computed bullets, next
    assert any(s.startswith('<h2 id="parameters">') for s in src)
    assert 1 < src.index('<h2 id="parameters">Parameters</h2>') < src.index("## 1. The formula")
    assert nb.metadata["title"] == "09 · A study: does it hold?"
    assert not [c for c in nb.cells if set(c.metadata.get("tags", [])) & {"parameters", "injected-parameters"}]


def test_parameters_table_shows_resolved_values_and_who_set_them():
    page = htmlexport.parameters_html(
        'MODEL = "a"  # the model folder\nKV_CACHE_GIB = 1.0  # KV budget in GiB', "KV_CACHE_GIB = 24\n"
    )
    assert "<td><code>KV_CACHE_GIB</code></td><td><code>24</code></td><td>run</td><td>KV budget in GiB</td>" in page
    assert "<td><code>MODEL</code></td><td><code>&quot;a&quot;</code></td><td>default</td>" in page
    assert "1.0" not in page  # the default that the run replaced is not shown beside it


def test_outputs_lose_noise_and_fold_dumps():
    nb = htmlexport.prepare(_notebook())
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = json.dumps(outs)
    assert "TqdmWarning" not in text and "widget-view" not in text and "PosixPath" not in text
    assert any(o.get("text") == "done\n" for o in outs)  # a progress line shows its last state only
    folded = [o for o in outs if "<details" in json.dumps(o)]
    assert len(folded) == 1 and "All 40 recorded values as JSON" in folded[0]["data"]["text/html"]
    htmls = [o["data"]["text/html"] for o in outs if "text/html" in o.get("data", {})]
    assert any("<td>1.36</td>" in h for h in htmls)  # rounded to 3 significant digits (fp8lab.report.readable)
    assert any("This table has no rows" in h for h in htmls)


def test_math_becomes_mathml_outside_code():
    out = htmlexport.render_math("a $x^2$ b\n\n" + FORMULA + "\n\n`$HOME` and $5 or $6")
    assert out.count("<math") == 2 and 'display="block"' in out and "kv_heads" in out and "\\_" not in out
    assert "`$HOME`" in out and "$5 or $6" in out  # code and prices stay text


def test_exported_page_is_offline_code_free_and_titled(tmp_path):
    ipynb = tmp_path / "09_study.ipynb"
    nbformat.write(_notebook(), str(ipynb))
    page = htmlexport.export_html(ipynb, tmp_path / "09_study.html").read_text()
    assert htmlexport.external_references(page) == []
    assert "require.js" not in page and "MathJax" not in page and "cdnjs" not in page
    assert "<title>09 · A study: does it hold?</title>" in page
    assert (
        'class="jp-InputPrompt' not in page
        and 'class="highlight' not in page
        and "display(Markdown" not in page
        and "record_summary(s)" not in page
    )
    assert page.index('id="verdict"') < page.index('id="parameters"') < page.index("The formula")
    assert "<math" in page


def test_external_references_finds_loads_not_links():
    assert htmlexport.external_references('<script src="https://cdn.x/require.js"></script>')
    assert htmlexport.external_references("<link rel=stylesheet href='//fonts.x/css'>")
    assert htmlexport.external_references("<style>@import url(https://x/y.css);</style>")
    assert htmlexport.external_references('<a href="https://arxiv.org/abs/2405.04434">paper</a>') == []
    assert htmlexport.external_references('<img src="data:image/png;base64,AAAA">') == []


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.3607525825500488, "1.36"),
        (4222.807722799688, "4,223"),
        (0.0002688201624094777, "0.000269"),
        (174752, "174,752"),
        (2.0, "2"),
        (None, "n/a"),
        (float("nan"), "n/a"),
        (True, "yes"),
        (-8.004563534647506, "-8.00"),
    ],
)
def test_fmt_number(value, text):
    assert fmt_number(value) == text


def test_key_numbers_of_00_do_not_say_false_beside_exact_records():
    s = {
        "model": "tiny",
        "bytes_per_token": {"auto": 3072, "fp8": 1536},
        "prediction_exact": None,
        "measured_ok": None,
        "measured": {"auto": {"status": "not run"}},
        "records": {"compared": 25, "exact": 25, "devices": ["NVIDIA H200"]},
    }
    rows = dict(key_numbers("00_kv_memory_estimation", s))
    assert rows["KV per token, auto → fp8 (tiny)"] == "3,072 → 1,536 B/token"
    assert rows["engines on record whose block count the formula predicted exactly"] == "25 of 25 (NVIDIA H200)"
    assert rows["engines started by this run"] == "none (predictions only)"
    assert "no" not in rows.values()


def test_key_numbers_of_01_are_rounded_with_units():
    s = {
        "capacity_tokens_auto": 174752,
        "capacity_tokens_fp8": 349520,
        "headline_concurrency": 32,
        "throughput_delta_pct": -8.004563534647506,
        "throughput_delta_lo_pct": -29.340890909511298,
        "throughput_delta_hi_pct": 6.477920337963616,
        "throughput_delta_label": "within noise",
        "mem_peak_gib_auto": 43.9002685546875,
        "mem_peak_gib_fp8": 43.9373779296875,
    }
    rows = dict(key_numbers("01_kv_dtype_auto_vs_fp8", s))
    assert rows["KV capacity, auto → fp8"] == "174,752 → 349,520 tokens"
    assert rows["fp8 vs auto output throughput at concurrency 32"] == "-8.00 % (95% CI -29.3 to 6.48): within noise"
    assert rows["peak device memory, auto → fp8"] == "43.90 → 43.94 GiB"


def test_index_headline_first_then_audit_and_runs_provenance(tmp_path):
    runs = runs_provenance(
        [
            {"run_dir": "a", "device": "NVIDIA H200", "vllm": "0.26.0", "date_utc": "2026-11-29T13:00:00"},
            {"run_dir": "b", "device": "NVIDIA H200", "vllm": "0.26.0", "date_utc": "2026-11-30T01:00:00"},
            {"run_dir": "a", "device": "NVIDIA H200", "vllm": "0.26.0", "date_utc": "2026-11-29T13:00:00"},
        ]
    )
    assert runs == {"n": 2, "devices": ["NVIDIA H200"], "vllm": ["0.26.0"], "dates": ["2026-11-29", "2026-11-30"]}
    summary = {
        "profile": "h200",
        "created_utc": "2026-12-01T00:00:00+00:00",
        "provenance": {"device": "CPU: render machine", "vllm": "0.32.0"},
        "notebooks": {
            "01_x": {
                "status": "ok",
                "html": "01_x.html",
                "runs": runs,
                "summary": {"trials": 3},
                "ran_on": {"device": "NVIDIA H200", "vllm": "0.26.0"},
            },
            "05_claims_audit": {
                "status": "ok",
                "html": "05_claims_audit.html",
                "runs": {"n": 0},
                "ran_on": {"device": "CPU: render machine", "vllm": "0.32.0", "date_utc": "2026-12-01"},
                "summary": {
                    "headline": ["FP8 doubles KV capacity.", "Speed: inconclusive."],
                    "audit_rows": [{"id": 1, "claim": "c", "verdict": "confirmed"}],
                },
            },
        },
    }
    page = write_index(tmp_path, summary).read_text()
    assert page.index("<h2>Headline</h2>") < page.index("<h2>Claims audit</h2>") < page.index("<h2>Studies</h2>")
    assert "<li>FP8 doubles KV capacity.</li><li>Speed: inconclusive.</li>" in page
    assert "Runs shown: 2 engine runs on NVIDIA H200, vLLM 0.26.0, 2026-11-29 to 2026-11-30." in page
    assert "no engine run of its own; computed on CPU: render machine with vLLM 0.32.0" in page
    assert '<a href="01_x.html#verdict">verdict</a>' in page
    assert "Created" not in page  # the renderer's machine is not presented as where the runs ran


def test_note_run_appends_provenance_when_asked(tmp_path, monkeypatch):
    from fp8lab.engine import results

    results.note_run(tmp_path / "r0", {"device": "NVIDIA H200", "vllm": "0.26.0"}, "ok")  # no log set: no-op
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv(results.RUNS_LOG_ENV, str(log))
    results.note_run(tmp_path / "r1", {"device": "NVIDIA H200", "vllm": "0.26.0", "extra": 1}, "ok")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["device"] == "NVIDIA H200" and lines[0]["status"] == "ok"
    assert "extra" not in lines[0] and lines[0]["run_dir"].endswith("r1")


def test_store_only_never_starts_an_engine(tmp_path, monkeypatch, tiny_model):
    from fp8lab.engine import results
    from fp8lab.specs import EngineSpec

    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")
    res = results.run_cached(EngineSpec(model=tiny_model, kv_cache_gib=0.5), [], study="x", root=tmp_path)
    assert res.status == "error" and "FP8LAB_STORE_ONLY" in res.error
    assert not (tmp_path / "x").exists()  # nothing stored: a later run without the flag runs it


def test_key_numbers_of_06_count_points_beyond_noise():
    s = {
        "points": [
            {"beyond_noise": True, "ratio": 0.9},
            {"beyond_noise": True, "ratio": 1.1},
            {"beyond_noise": False, "ratio": 0.8},
        ],
        "min_detectable_pct": 1.2345,
        "capacity_exact": True,
    }
    rows = dict(key_numbers("06_decode_speed", s))
    assert rows["fp8 decode step faster / slower beyond noise"] == "1 / 1 of 3 points"
    assert rows["smallest fp8/auto change these runs resolve (median 95% CI half-width)"] == "1.2 %"


def test_store_only_shows_a_stored_failure_as_it_was(tmp_path, monkeypatch, tiny_model):
    from fp8lab.engine import results
    from fp8lab.specs import EngineSpec

    spec = EngineSpec(model=tiny_model, kv_cache_gib=0.5)
    rd = results.run_dir_for("x", results.run_descriptor(spec, [], "llm", 0.25), tmp_path)
    rd.mkdir(parents=True)
    (rd / "engine.json").write_text(json.dumps({"status": "error", "error": "ValueError: q dtype e5m2"}))
    monkeypatch.setenv(results.STORE_ONLY_ENV, "1")
    res = results.run_cached(spec, [], study="x", root=tmp_path)
    assert res.status == "error" and res.error == "ValueError: q dtype e5m2"  # the engine's own reason


def test_slim_png_takes_the_smallest_palette_within_max_rms():
    """A figure is re-encoded as the smallest palette whose RMS difference from the original is at most MAX_RMS:
    a plot with a 100-shade band needs only 16 colours, and the result is smaller, within the bound, and left as it is when slimmed
    again."""
    import io

    import numpy as np
    from PIL import Image

    from fp8lab.report.htmlslim import MAX_RMS, slim_png

    rng = np.random.default_rng(0)
    img = np.full((120, 200, 3), 255, dtype=np.uint8)
    img[40:80, 20:180] = (76, 114, 176)  # a bar in the baseline blue
    img[::7, :] = (221, 132, 82)  # grid lines
    img[90:110, :, 0] = np.linspace(100, 200, 200).astype(np.uint8)  # 100 shades: more than 16 colours in all
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 64
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    raw = buf.getvalue()
    out = slim_png(raw)
    q = Image.open(io.BytesIO(out))
    assert q.mode == "P" and len(q.getcolors()) <= 16 and len(out) < len(raw)
    rms = np.sqrt(((np.asarray(q.convert("RGB"), dtype=float) - img) ** 2).mean())
    assert rms <= MAX_RMS
    assert slim_png(out) == out
    noisy = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)  # no palette stays within the bound: kept as it is
    buf = io.BytesIO()
    Image.fromarray(noisy).save(buf, "PNG")
    assert slim_png(buf.getvalue()) == buf.getvalue()


def test_the_summary_dump_becomes_a_link_only_to_the_same_values(tmp_path):
    """A page's folded summary dump is replaced by a link to the summary file beside it when that file holds the same
    values; a file with other values, or none, leaves the page as it is."""
    from fp8lab.report.htmlslim import link_summary_dump

    values = {"a.x": 1.5, "b": [1, 2], "note": "<&>"}
    dump = json.dumps(values, indent=2, sort_keys=True)
    page = "<p>before</p>" + htmlexport._fold_text(dump, "Printed output")["data"]["text/html"] + "<p>after</p>"
    assert "All 3 recorded values as JSON" in page
    summary = tmp_path / "09_study.summary.json"
    assert link_summary_dump(page, summary) == page  # no file
    summary.write_text(json.dumps({**values, "a.x": 1.6}))
    assert link_summary_dump(page, summary) == page  # other values
    summary.write_text(json.dumps(values))  # the same values, another layout
    linked = link_summary_dump(page, summary)
    assert linked == (
        '<p>before</p><p class="fp8lab-summary-link">All 3 recorded values as JSON: '
        '<a href="09_study.summary.json">09_study.summary.json</a> (beside this page).</p><p>after</p>'
    )
    assert link_summary_dump(linked, summary) == linked
