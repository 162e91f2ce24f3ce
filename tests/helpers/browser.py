"""A real headless Chromium (Debian's package, no browser download) driven over the DevTools protocol:
open a page, wait until a JavaScript condition holds, take a screenshot. Started by PID, on loopback,
with a profile of its own, and killed with its process group."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import websockets

from potluck import lifeline

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def chromium() -> str | None:
    return next((p for p in CANDIDATES if os.path.exists(p)), shutil.which("chromium"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Page:
    def __init__(self, ws: Any) -> None:
        self.ws, self._id = ws, 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    async def wait_until(self, expression: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not await self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied {expression!r} within {timeout_s:.0f} s")
            await asyncio.sleep(0.5)

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def open_page(url: str, width: int = 1400, height: int = 1800) -> AsyncIterator[Page]:
    exe = chromium()
    assert exe is not None, "chromium is not installed (scripts/test.sh installs Debian's package)"
    port = _free_port()
    profile = tempfile.mkdtemp(prefix="potluck-chromium-")
    proc = subprocess.Popen(
        [
            exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            "--remote-debugging-address=127.0.0.1", f"--remote-debugging-port={port}",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lifeline.preexec(signal.SIGKILL),  # dies with the test run, even a killed one
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        targets: list[dict[str, Any]] = []
        while not targets:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                    targets = [t for t in json.loads(r.read()) if t.get("type") == "page"]
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("chromium did not open its DevTools port") from None
                await asyncio.sleep(0.3)
        async with websockets.connect(targets[0]["webSocketDebuggerUrl"], max_size=64 << 20) as ws:
            page = Page(ws)
            await page.call("Page.enable")
            await page.call("Page.navigate", url=url)
            yield page
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)
