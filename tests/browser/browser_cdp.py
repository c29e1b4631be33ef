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


class Browser:
    """A headless Chromium with a fresh profile and one page (``sid``), network cut by the flags above; used as a
    context manager. ``offline`` also switches DevTools' offline emulation on (a file page). A page served from
    127.0.0.1 needs ``offline=False``: then 127.0.0.1 alone resolves (the proxy flag never applies to loopback
    addresses), every other host stays unresolvable."""

    def __init__(self, width: int = 1280, height: int = 1600, offline: bool = True, timeout_s: float = 90):
        self.width, self.height, self.offline, self.timeout_s = width, height, offline, timeout_s

    def __enter__(self) -> Browser:
        binary = chromium_binary()
        if binary is None:
            raise RuntimeError("chromium not found (scripts/test.sh installs Debian's chromium)")
        self.profile = Path(tempfile.mkdtemp(prefix="fp8lab-chromium-"))
        self.proc = subprocess.Popen(
            [
                binary,
                *[
                    f
                    if self.offline or not f.startswith("--host-resolver-rules=")
                    else "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
                    for f in FLAGS
                ],
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port_file = self.profile / "DevToolsActivePort"
            end = time.monotonic() + self.timeout_s
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if time.monotonic() > end or self.proc.poll() is not None:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.1)
            port, browser_path = port_file.read_text().split("\n")[:2]
            self.cdp = _CDP(f"ws://127.0.0.1:{port.strip()}{browser_path.strip()}")
            target = self.cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.sid = self.cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Network", "Runtime", "Log"):
                self.call(f"{domain}.enable")
            if self.offline:
                self.call(
                    "Network.emulateNetworkConditions",
                    {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
                )
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
            )
            self.cdp.events.clear()
        except BaseException:
            self._stop()
            raise
        return self

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.cdp.call(method, params, session=self.sid)

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})
        self.cdp.wait_for("Page.loadEventFired", self.timeout_s)

    def evaluate(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_until(self, expr: str, timeout_s: float, every_s: float = 0.5) -> Any:
        """Evaluate ``expr`` until it is truthy (returned), or raise TimeoutError after ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while True:
            v = self.evaluate(expr)
            if v:
                return v
            if time.monotonic() > end:
                raise TimeoutError(f"not true after {timeout_s:.0f} s: {expr[:120]}")
            time.sleep(every_s)

    def screenshot(self, path: Path) -> Path:
        shot = self.call("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def drain(self) -> None:
        """Read the events that arrived since the last call (console messages, requests)."""
        self.cdp.ws.settimeout(0.2)
        try:
            while True:
                self.cdp.events.append(json.loads(self.cdp.ws.recv()))
        except Exception:  # noqa: BLE001 - the socket's timeout ends the drain
            pass
        finally:
            self.cdp.ws.settimeout(60)

    def visit(self) -> PageVisit:
        """What the page did so far: requests, console errors and exceptions."""
        visit = PageVisit()
        for e in self.cdp.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Network.requestWillBeSent":
                visit.requests.append(p["request"]["url"])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                visit.console_errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif m == "Runtime.exceptionThrown":
                visit.console_errors.append(str(p.get("exceptionDetails", {}).get("text")))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                visit.console_errors.append(f"{p['entry'].get('text')} {p['entry'].get('url', '')}")
        return visit

    def _stop(self) -> None:
        if getattr(self, "cdp", None) is not None:
            self.cdp.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __exit__(self, *exc: Any) -> None:
        self._stop()


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
    with Browser(width, height, offline=True, timeout_s=timeout_s) as b:
        b.navigate(path.resolve().as_uri())
        probed = {name: b.evaluate(expr) for name, expr in probes.items()}
        shot = b.screenshot(screenshot) if screenshot is not None else None
        visit = b.visit()
    visit.probes, visit.screenshot = probed, shot
    return visit
