"""Interactive use, as a user would: JupyterLab started from this environment, opened in a real headless Chromium,
notebook 00 run with Run All (the command behind Run > Run All Cells), its verdict read off the page.

The notebook is a copy in a scratch folder (JupyterLab autosaves; the committed notebook stays without outputs)
and runs with its own defaults: the shipped model on CPU vLLM, the measured check included (an engine per dtype,
or a recorded failure where the CPU has no FP8 KV kernel: that is a verdict line, not a kernel error). Engines
land in the session's results store (``runs_root``). The browser reaches only the local server: the network flags of
:mod:`browser_cdp` cut everything else, and the test fails on any request to another host, any error output in the
notebook, any console exception or a missing verdict. A screenshot is kept in ``$FP8LAB_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest
from browser_cdp import Browser, chromium_binary

from fp8lab.engine.capability import kv_support
from fp8lab.paths import NOTEBOOKS_DIR, REPO_ROOT

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

PANEL = "jupyterapp.shell.currentWidget"
READY = (
    f"(() => {{ const w = window.jupyterapp && {PANEL}; return !!(w && w.content && w.context && "
    "w.context.isReady && w.sessionContext.session && w.sessionContext.session.kernel && "
    "w.sessionContext.session.kernel.status === 'idle' && w.content.widgets.length > 0); })()"
)
# every code cell has run (an execution count, none pending) and the kernel is idle again
DONE = (
    f"(() => {{ const w = {PANEL}; const code = w.content.widgets.filter(c => c.model.type === 'code'); "
    "return w.sessionContext.session.kernel.status === 'idle' && code.length > 0 && "
    "code.every(c => c.model.executionCount !== null) && "
    "!Array.from(document.querySelectorAll('.jp-InputPrompt')).some(p => p.textContent.includes('*')); })()"
)
ERRORS = (
    f"{PANEL}.content.widgets.filter(c => c.model.type === 'code')"
    ".flatMap(c => c.model.outputs.toJSON()).filter(o => o.output_type === 'error')"
    ".map(o => o.ename + ': ' + o.evalue)"
)
VERDICT = (
    f"(() => {{ const cells = {PANEL}.content.widgets; "
    "const i = cells.findIndex(c => c.model.type === 'markdown' && "
    "c.model.sharedModel.getSource().startsWith('## Verdict')); "
    "return i < 0 ? null : cells.slice(i + 1).map(c => c.node.innerText).join('\\n'); })()"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, runs_root):
    """A JupyterLab server on 127.0.0.1 serving a scratch copy of notebook 00; yields (url base, token, folder)."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(NOTEBOOKS_DIR / f"{STEM}.ipynb", root / f"{STEM}.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    home = tmp_path_factory.mktemp("lab-home")
    env = {
        **os.environ,
        "FP8LAB_RUNS": str(runs_root),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "PYTHONUNBUFFERED": "1",
    }
    log = (home / "lab.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--expose-app-in-browser",
            "--allow-root",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"JupyterLab did not start:\n{(home / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token, root
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)  # the server and the kernels it started
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
        log.close()


def test_run_all_in_jupyterlab_shows_the_verdict(lab):
    base, token, root = lab
    with Browser(width=1400, height=1000, offline=False, timeout_s=120) as b:
        b.navigate(f"{base}/lab/tree/{STEM}.ipynb?token={token}")
        b.wait_until(READY, timeout_s=180)
        b.evaluate("jupyterapp.commands.execute('notebook:run-all-cells')")
        b.wait_until(DONE, timeout_s=900, every_s=2)
        errors = b.evaluate(ERRORS)
        verdict = b.evaluate(VERDICT)
        (ARTIFACTS / "jupyterlab-00-verdict.txt").parent.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "jupyterlab-00-verdict.txt").write_text(verdict or "")
        b.evaluate(
            f"{PANEL}.content.activeCellIndex = {PANEL}.content.widgets.findIndex(c => "
            "c.model.type === 'markdown' && c.model.sharedModel.getSource().startsWith('## Verdict'))"
        )
        b.evaluate(f"{PANEL}.content.scrollToItem({PANEL}.content.activeCellIndex, 'start')")
        time.sleep(1)
        b.screenshot(ARTIFACTS / "jupyterlab-00-run-all.png")
        b.drain()
        visit = b.visit()
    assert errors == [], errors  # no cell raised
    assert verdict, "no output under '## Verdict'"
    # the verdict's computed lines, with the shipped model's numbers: 1,536 vs 3,072 bytes per token
    assert "KV per token (fp8lab-tiny-qwen3): fp8 stores 1,536 B/token vs 3,072 for auto (x0.50)" in verdict
    if kv_support("fp8").native:  # the measured check: two CPU engines, block counts as the formula predicts
        assert "Measured on vLLM: KV blocks auto 2,730 (predicted 2,730), fp8 5,461 (predicted 5,461)" in verdict
    else:  # no FP8 KV kernel on this CPU: the fp8 engine's refusal is a verdict line, not a kernel error
        assert "Measured: not every engine gave figures (auto: ok, fp8: unsupported (" in verdict
    hosts = {urlparse(u).hostname for u in visit.requests if urlparse(u).scheme in ("http", "https", "ws", "wss")}
    assert hosts <= {"127.0.0.1"}, hosts
    assert not [e for e in visit.console_errors if "Uncaught" in e or "Error:" in e], visit.console_errors
