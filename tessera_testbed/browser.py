"""A headless Chromium driven over the DevTools protocol, for the allocation page's tests,
its benchmark and the screenshots in the docs: Debian's `chromium` (or the binary named
by TESSERA_CHROMIUM), one page, no network needed. `websocket-client` (a dependency of the
Kubernetes client) speaks the protocol."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("TESSERA_CHROMIUM") or shutil.which("chromium") or ""


def wait_for(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


class Browser:
    """Headless Chromium driven over the DevTools protocol (one page)."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1400, 900)) -> None:
        import websocket

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                f"--window-size={size[0]},{size[1]}",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: _stop ends its helpers too
        )
        try:
            # Chromium writes the port file in place (not by a rename), and registers the
            # first page a moment after it listens: under load either can be seen early
            port = wait_for(
                lambda: _port(profile / "DevToolsActivePort"), timeout=30, interval=0.05
            )
            target = wait_for(lambda: _first_page(port), timeout=30, interval=0.05)
            # no Origin header: a DevTools client is not a web page, and Chromium 111 and
            # later refuse a debugging WebSocket whose Origin it was not told to allow
            self.ws = websocket.create_connection(
                target["webSocketDebuggerUrl"], timeout=30, suppress_origin=True
            )
        except BaseException:
            self._stop()  # before the profile folder is removed under it
            raise
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    def text(self) -> str:
        answer = self.call("Runtime.evaluate", expression="document.body.innerText")
        return str(answer["result"].get("value", ""))

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when a promise)."""
        answer = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in answer, answer
        return answer["result"].get("value")

    def screenshot(self, full_page: bool = False) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": size["height"],
                "scale": 1,
            }
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def close(self) -> None:
        self.ws.close()
        self._stop()

    def _stop(self) -> None:
        # the browser's helper processes (renderer, crash handler) outlive its main process
        # for a moment and go on writing the profile: end the whole group, then wait until
        # it is gone, so that the profile folder can be removed
        group = self.proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        wait_for(lambda: not _group_alive(group), timeout=10, interval=0.05)


def _group_alive(group: int) -> bool:
    """Whether a process of `group` still runs (zombies awaiting their reaper do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # the fields after the command name: state, ppid, pgrp, ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


def _port(path: Path) -> int | None:
    """The DevTools port once Chromium has written its file whole (the port, then the
    browser target's path, each on its own line)."""
    with contextlib.suppress(OSError):
        lines = path.read_text().splitlines()
        if len(lines) >= 2 and lines[0].isdigit():
            return int(lines[0])
    return None


def _first_page(port: int) -> dict[str, Any] | None:
    """The page target, once Chromium lists it."""
    with contextlib.suppress(OSError, ValueError):
        pages = json.loads(_get(f"http://127.0.0.1:{port}/json/list"))
        return next((p for p in pages if p.get("type") == "page"), None)
    return None


def _get(url: str) -> str:

    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())
