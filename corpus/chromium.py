"""A headless chromium driven over its DevTools pipe, for screenshots of one element of a page
built from a stylesheet and a body."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import select
import shutil
import signal
import tempfile
import time

from PIL import Image


CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--no-default-browser-check", "--hide-scrollbars",
    "--mute-audio", "--disable-dev-shm-usage", "--force-color-profile=srgb", "--remote-debugging-pipe",
)


class ChromiumError(RuntimeError):
    """Chromium exited, timed out, or answered a DevTools command with an error."""


class Chromium:
    """One headless chromium process, driven over the DevTools pipe (fds 3 and 4; no port, no
    network, no extra dependency), with one page that every screenshot reuses.

    Use it as a context manager: leaving the block closes the browser, kills its process group
    if it does not exit, and removes its fresh profile directory.
    """

    def __init__(self, executable: str = "/usr/bin/chromium", viewport: tuple[int, int] = (1600, 1200),
                 timeout_s: float = 60.0) -> None:
        self.executable = executable
        self.viewport = viewport
        self.timeout_s = timeout_s
        self.pid: int | None = None
        self._profile: str | None = None
        self._fds: tuple[int, ...] = ()
        self._next_id = 0
        self._buffer = b""

    def __enter__(self) -> "Chromium":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="gravityocr-chromium-")
        to_child, self._write_fd = os.pipe()
        self._read_fd, from_child = os.pipe()
        self._fds = (self._write_fd, self._read_fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            argv = [self.executable, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile}", "about:blank"]
            self.pid = os.posix_spawn(self.executable, argv, os.environ, setsid=True, file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, devnull, 2), (os.POSIX_SPAWN_DUP2, to_child, 3),
                (os.POSIX_SPAWN_DUP2, from_child, 4)])
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (to_child, from_child, devnull):
                os.close(fd)
        try:
            target = self._call("Target.createTarget", url="about:blank")["targetId"]
            self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            width, height = self.viewport
            self._call("Emulation.setDeviceMetricsOverride", session=self._session, width=width, height=height,
                       deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            if self.pid is not None:
                try:
                    self._send("Browser.close")
                except OSError:
                    pass
                if not self._exited_within(10.0):
                    os.killpg(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                self._reap_group()
        finally:
            self.pid = None
            for fd in self._fds:
                os.close(fd)
            self._fds = ()
            if self._profile is not None:
                shutil.rmtree(self._profile, ignore_errors=True)
                self._profile = None

    def _exited_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _reap_group(self) -> None:
        """Kill what is left of the browser's own process group (renderer, utility processes) and
        wait, briefly, until none is left."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.02)

    def _send(self, method: str, session: str | None = None, **params) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._write_fd, data):]
        return self._next_id

    def _call(self, method: str, session: str | None = None, **params) -> dict:
        """Send one command and wait for its answer; events that arrive meanwhile are dropped."""
        if self.pid is None:
            raise ChromiumError("chromium is not running")
        wanted = self._send(method, session, **params)
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if message.get("id") == wanted:
                    if "error" in message:
                        raise ChromiumError(f"{method}: {message['error']}")
                    return message["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read_fd], [], [], left)[0]:
                raise ChromiumError(f"{method}: no answer in {self.timeout_s} s")
            chunk = os.read(self._read_fd, 1 << 20)
            if not chunk:
                raise ChromiumError(f"{method}: chromium closed the DevTools pipe")
            self._buffer += chunk

    def screenshot(self, css: str, body: str, element_id: str, margin: int = 8) -> Image.Image:
        """An RGB screenshot of the element `element_id` of a page with stylesheet `css` and `body`,
        `margin` px of page around it. The page's head and body are replaced in place: no
        navigation, no network, nothing left from the previous screenshot."""
        script = (
            f"document.head.innerHTML = {json.dumps('<style>' + css + '</style>')};"
            f"document.body.innerHTML = {json.dumps(body)};"
            f"(() => {{ const r = document.getElementById({json.dumps(element_id)}).getBoundingClientRect();"
            f" return [r.left + window.scrollX, r.top + window.scrollY, r.right + window.scrollX,"
            f" r.bottom + window.scrollY]; }})()"
        )
        answer = self._call("Runtime.evaluate", session=self._session, expression=script, returnByValue=True)
        if "exceptionDetails" in answer:
            raise ChromiumError(f"page script failed: {answer['exceptionDetails'].get('text')}")
        left, top, right, bottom = answer["result"]["value"]
        x0, y0 = max(0, math.floor(left) - margin), max(0, math.floor(top) - margin)
        x1, y1 = math.ceil(right) + margin, math.ceil(bottom) + margin
        shot = self._call("Page.captureScreenshot", session=self._session, format="png",
                          captureBeyondViewport=True,
                          clip={"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0, "scale": 1})
        return Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
