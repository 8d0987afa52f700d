"""A real headless Chromium for the tests of pages people look at (the HTML report).

Debian's ``chromium`` package is installed when absent (the tests run as
root; ``apt-get`` may take minutes, once). The browser is driven over the
DevTools protocol on a pipe (``--remote-debugging-pipe``: fd 3 to the
browser, fd 4 from it, NUL-separated JSON messages): no port, no network, no
new dependency. It is stopped by its pid.

``STATEQUEUE_REQUIRE_BROWSER=1`` (set by .ci/run) turns "no Chromium and it
cannot be installed" from a skip into a failure, as STATEQUEUE_REQUIRE_PG
does for PostgreSQL.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
)


def required() -> bool:
    return os.environ.get("STATEQUEUE_REQUIRE_BROWSER") == "1"


def chromium_path() -> str | None:
    """/usr/bin/chromium, installed from Debian's package when absent; None
    when it cannot be (then the caller skips, or fails when required)."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # One install at a time: test processes running side by side (make test's
    # workers) would otherwise meet on dpkg's lock, and one would fail.
    with open("/tmp/statequeue-tests-chromium.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(CHROMIUM):  # installed by the process we waited for
            return CHROMIUM
        for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                return None
    return CHROMIUM if os.path.exists(CHROMIUM) else None


def need_chromium() -> str:
    """The browser's path, or a skip (a failure under STATEQUEUE_REQUIRE_BROWSER=1)."""
    found = chromium_path()
    if found is None:
        message = "no Chromium: apt-get install chromium failed or is not available"
        if required():
            pytest.fail(message + " (STATEQUEUE_REQUIRE_BROWSER=1)")
        pytest.skip(message)
    return found


class Browser:
    """One headless Chromium, one page, spoken to over the DevTools pipe."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The browser reads commands on fd 3 and writes replies on fd 4.
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # The ends land on 3 and 4 in the child (preexec); nothing else of
            # ours is inheritable (Python opens fds close-on-exec).
            close_fds=False,
            preexec_fn=lambda: _dup_to(to_browser_r, 3, from_browser_w, 4),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = self._attach()

    def _attach(self) -> str:
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        found = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        session: str = found["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        return session

    def call(self, method: str, *, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply; events met meanwhile are kept."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, session=self.session, **params)

    def wait_event(self, method: str) -> dict[str, Any]:
        """The first event named ``method`` (already seen or still to come)."""
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(self._read())

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed its pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        found: dict[str, Any] = json.loads(message)
        return found

    def errors(self) -> list[str]:
        """JavaScript exceptions and console errors seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", "")[:500])
        return found

    def close(self) -> None:
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


def _dup_to(a: int, fd_a: int, b: int, fd_b: int) -> None:
    # In the child: put the pipe ends where --remote-debugging-pipe looks.
    # ``a`` or ``b`` may already sit on 3 or 4: move both out of the way first.
    a, b = os.dup(a), os.dup(b)
    os.dup2(a, fd_a)
    os.dup2(b, fd_b)
    os.set_inheritable(fd_a, True)
    os.set_inheritable(fd_b, True)


def png_colours(png: bytes, limit: int = 1000) -> int:
    """How many distinct colours an 8-bit RGB(A) PNG's pixels take (up to
    ``limit``): a blank page has one. Decodes the PNG filters itself."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, data, header = 8, b"", b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind = png[pos + 4 : pos + 8]
        body = png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            data += body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), f"unexpected PNG format {depth}/{colour}"
    step = 3 if colour == 2 else 4
    stride = width * step
    raw = zlib.decompress(data)
    previous = bytearray(stride)
    seen: set[bytes] = set()
    for y in range(height):
        start = y * (stride + 1)
        row = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, step)
        for x in range(0, stride, step * 7):  # every 7th pixel is plenty
            seen.add(bytes(row[x : x + 3]))
        if len(seen) >= limit:
            break
        previous = row
    return len(seen)


def _unfilter(kind: int, row: bytearray, prev: bytearray, step: int) -> bytearray:
    for i in range(len(row)):
        left = row[i - step] if i >= step else 0
        up = prev[i]
        corner = prev[i - step] if i >= step else 0
        if kind == 1:
            row[i] = (row[i] + left) & 0xFF
        elif kind == 2:
            row[i] = (row[i] + up) & 0xFF
        elif kind == 3:
            row[i] = (row[i] + (left + up) // 2) & 0xFF
        elif kind == 4:
            p = left + up - corner
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
            predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
            row[i] = (row[i] + predictor) & 0xFF
    return row
