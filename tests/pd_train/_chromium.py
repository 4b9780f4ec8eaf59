"""A headless Chromium driven over the DevTools protocol on a pipe (no websocket, no downloads).

``--remote-debugging-pipe`` makes Chromium read protocol messages from fd 3 and write replies
and events to fd 4, each a JSON object ended by a NUL byte. Enough of the protocol to load a
page, collect console errors and uncaught exceptions, evaluate JavaScript and take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _above_9(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Browser:
    """``with Browser() as b: b.open(url); b.evaluate("1 + 1"); b.screenshot(path)``."""

    def __init__(
        self, executable: str | None = None, *, width: int = 1280, height: int = 900
    ) -> None:
        executable = executable or find_chromium()
        if executable is None:
            msg = "no chromium on PATH (apt-get install chromium)"
            raise RuntimeError(msg)
        self._profile = tempfile.mkdtemp(prefix="pd-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # The child's ends go above fd 9, so moving them onto 3 and 4 cannot clobber either.
        to_child_r, from_child_w = (_above_9(fd) for fd in (to_child_r, from_child_w))
        self._log = open(Path(self._profile) / "chromium.log", "wb")  # noqa: SIM115

        # The shell moves the pipe ends to the fds Chromium expects: 3 reads commands, 4 writes
        # replies.
        script = f'exec "$0" "$@" 3<&{to_child_r} 4>&{from_child_w}'
        self._proc = subprocess.Popen(
            [
                "bash",  # dash refuses fds above 9 in redirections
                "-c",
                script,
                executable,
                *FLAGS,
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(to_child_r, from_child_w),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    # ------------------------------------------------------------------ protocol
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                msg = "chromium did not answer in time"
                raise TimeoutError(msg)
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                log = (Path(self._profile) / "chromium.log").read_text(errors="replace")[-2000:]
                msg = f"chromium closed the pipe (exit {self._proc.poll()}): {log}"
                raise RuntimeError(msg)
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)  # type: ignore[no-any-return]

    def send(
        self, method: str, params: dict[str, Any] | None = None, *, timeout: float = 60
    ) -> Any:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        try:
            os.write(self._to_child, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            log = (Path(self._profile) / "chromium.log").read_text(errors="replace")[-2000:]
            msg = f"chromium is gone (exit {self._proc.poll()}): {log}"
            raise RuntimeError(msg) from None
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    msg = f"{method}: {reply['error']}"
                    raise RuntimeError(msg)
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, *, timeout: float = 60) -> dict[str, Any]:
        for event in self.events:
            if event["method"] == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            event = self._read_message(deadline)
            if "method" in event:
                self.events.append(event)
                if event["method"] == method:
                    return event

    # ------------------------------------------------------------------ page
    def open(self, url: str) -> None:
        """A new tab on ``url`` with console and log collection on; returns after ``load``."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and error-level log entries so far."""
        out = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                out.append(
                    f"exception: {details.get('exception', {}).get('description') or details.get('text')}"
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(
                    f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}"
                )
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                out.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url')})")
        return out

    def evaluate(self, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            msg = f"{expression!r} threw: {result['exceptionDetails']}"
            raise RuntimeError(msg)
        return result["result"].get("value")

    def screenshot(self, path: str | Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": size["height"],
                "scale": 1,
            }
        data = self.send("Page.captureScreenshot", params)["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        try:
            self.session = None
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
