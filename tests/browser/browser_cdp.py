"""A real headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, network off.

:func:`open_page` loads a file URL in a fresh profile with the network cut (an unreachable proxy, every host name
unresolvable, and DevTools' offline emulation) and returns what a test asserts on: every request the page made,
console errors and exceptions, the results of JavaScript probes, and a screenshot.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # network off: nothing outside the file system can answer
    "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageVisit:
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    probes: dict[str, Any] = field(default_factory=dict)
    screenshot: Path | None = None


class _CDP:
    def __init__(self, ws_url: str):
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float = 60) -> None:
        end = time.monotonic() + timeout_s
        if any(e.get("method") == method for e in self.events):
            return
        while time.monotonic() < end:
            e = json.loads(self.ws.recv())
            self.events.append(e)
            if e.get("method") == method:
                return
        raise TimeoutError(method)

    def close(self) -> None:
        self.ws.close()


def open_page(
    path: Path,
    probes: dict[str, str],
    screenshot: Path | None = None,
    width: int = 1280,
    height: int = 1600,
    timeout_s: float = 90,
) -> PageVisit:
    """Open ``path`` (a local HTML file), run each JavaScript expression of ``probes`` after load, and save a
    screenshot of the first screen to ``screenshot``."""
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("chromium not found (scripts/test.sh installs Debian's chromium)")
    profile = Path(tempfile.mkdtemp(prefix="fp8lab-chromium-"))
    proc = subprocess.Popen(
        [
            binary,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    visit = PageVisit()
    try:
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port, browser_path = port_file.read_text().split("\n")[:2]
        cdp = _CDP(f"ws://127.0.0.1:{port.strip()}{browser_path.strip()}")
        target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            cdp.call(f"{domain}.enable", session=sid)
        cdp.call(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            session=sid,
        )
        cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=sid,
        )
        cdp.events.clear()
        cdp.call("Page.navigate", {"url": path.resolve().as_uri()}, session=sid)
        cdp.wait_for("Page.loadEventFired", timeout_s)
        for name, expr in probes.items():
            r = cdp.call(
                "Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}, session=sid
            )
            if "exceptionDetails" in r:
                raise RuntimeError(f"probe {name}: {r['exceptionDetails']}")
            visit.probes[name] = r["result"].get("value")
        if screenshot is not None:
            shot = cdp.call("Page.captureScreenshot", {"format": "png"}, session=sid)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            visit.screenshot = screenshot
        for e in cdp.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Network.requestWillBeSent":
                visit.requests.append(p["request"]["url"])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                visit.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif m == "Runtime.exceptionThrown":
                visit.console_errors.append(str(p.get("exceptionDetails", {}).get("text")))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                visit.console_errors.append(f"{p['entry'].get('text')} {p['entry'].get('url', '')}")
        cdp.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
    return visit
