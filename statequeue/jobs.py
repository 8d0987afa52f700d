"""One child process running one item: spawn, capture output, stop, report.

The child runs in its own process group (so a timeout or a stop reaches its
descendants too), with stdin from /dev/null or the item, and its stdout and
stderr read through pipes into a size-bounded log. On Linux it is also asked
to die with its runner (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from statequeue.fileio import CRASH
from statequeue.models import Claim, Outcome

STDERR_TAIL_BYTES = 4096
RESULT_MAX_BYTES = 1 << 20
_READ = 65536

OutputSink = Callable[[int, bytes], None]
"""Receives (1 or 2, bytes) as a child writes to stdout or stderr, for live display."""


@dataclass(frozen=True)
class JobSpec:
    """How to launch the command for one claimed item."""

    template: tuple[str, ...]
    queue: str
    log_dir: Path
    log_limit: int = 1 << 20
    item_on_stdin: bool = False
    live: OutputSink | None = None


def build_argv(template: tuple[str, ...], item: str) -> list[str]:
    """Replace every ``{}`` in each argument by ``item``; append it if there is none."""
    if any("{}" in arg for arg in template):
        return [arg.replace("{}", item) for arg in template]
    return [*template, item]


def child_env(claim: Claim, queue: str, result_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        STATEQUEUE_ITEM=claim.item,
        STATEQUEUE_ID=str(claim.item_id),
        STATEQUEUE_ATTEMPT=str(claim.attempt),
        STATEQUEUE_QUEUE=queue,
        STATEQUEUE_RESULT=str(result_path),
    )
    return env


def _die_with_parent_setup() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def setup() -> None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the runner died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


class Job:
    """A running child for one claim."""

    _setup: Callable[[], None] | None = None
    _setup_ready = False

    def __init__(self, claim: Claim, spec: JobSpec) -> None:
        self.claim = claim
        self.spec = spec
        self.started = time.monotonic()
        self.deadline: float | None = None
        self.kill_at: float | None = None
        self.stop_reason = ""  # "timeout" or "stopped" once the runner signals it
        stem = f"{claim.item_id}.{claim.attempt}"
        self.log_path = spec.log_dir / f"{stem}.log"
        self.result_path = spec.log_dir / f"{stem}.result"
        self._log_fd = -1
        self._logged = 0
        self._tail = bytearray()
        self.proc = self._spawn()
        self.pipes = {self.proc.stdout.fileno(): 1, self.proc.stderr.fileno(): 2}  # type: ignore[union-attr]
        for fd in self.pipes:
            os.set_blocking(fd, False)
        self.pidfd = _pidfd(self.proc.pid)

    @classmethod
    def _preexec(cls) -> Callable[[], None] | None:
        if not cls._setup_ready:
            cls._setup, cls._setup_ready = _die_with_parent_setup(), True
        return cls._setup

    def _spawn(self) -> subprocess.Popen[bytes]:
        stdin: Any = subprocess.DEVNULL
        if self.spec.item_on_stdin:
            stdin = _memfile(os.fsencode(self.claim.item) + b"\n")
        CRASH.hit("spawn")
        try:
            return subprocess.Popen(
                build_argv(self.spec.template, self.claim.item),
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env(self.claim, self.spec.queue, self.result_path),
                pass_fds=self.claim.inherit_fds,
                start_new_session=True,
                preexec_fn=self._preexec(),  # single-threaded runner
            )
        finally:
            if not isinstance(stdin, int):
                stdin.close()

    # -- output ------------------------------------------------------------------

    def read(self, fd: int) -> bool:
        """Read what the child wrote on ``fd``; False at end of file."""
        try:
            data = os.read(fd, _READ)
        except BlockingIOError:
            return True
        if not data:
            return False
        self._consume(self.pipes[fd], data)
        return True

    def drain(self) -> None:
        """Read whatever is buffered, without waiting for descendants to close."""
        for fd, stream in self.pipes.items():
            while True:
                try:
                    data = os.read(fd, _READ)
                except BlockingIOError:
                    break
                if not data:
                    break
                self._consume(stream, data)

    def _consume(self, stream: int, data: bytes) -> None:
        if stream == 2:
            self._tail += data
            del self._tail[:-STDERR_TAIL_BYTES]
        self._log(data)
        if self.spec.live is not None:
            self.spec.live(stream, data)

    def _log(self, data: bytes) -> None:
        room = self.spec.log_limit - self._logged
        if room <= 0:
            return
        if self._log_fd < 0:
            try:
                self._log_fd = os.open(
                    self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
                )
            except OSError:
                self._logged = self.spec.log_limit
                return
        chunk = data[:room]
        if len(chunk) < len(data):
            chunk += b"\n[statequeue: log limit reached; further output discarded]\n"
        try:
            os.write(self._log_fd, chunk)
        except OSError:
            # A full disk must not stop the runner over a log: the result (and
            # its stderr tail) still go to the journal, which reports its own errors.
            self._logged = self.spec.log_limit
            return
        self._logged += len(data)

    # -- stopping ------------------------------------------------------------------

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def exited(self) -> bool:
        return self.proc.poll() is not None

    # -- result ----------------------------------------------------------------------

    def finish(self) -> Outcome:
        """The outcome of the exited child; closes its pipes and files."""
        self.drain()
        self.close()
        code = self.proc.returncode
        duration = time.monotonic() - self.started
        sig = -code if code is not None and code < 0 else None
        exit_code = code if sig is None else None
        result = self._read_result()
        timed_out = self.stop_reason == "timeout"
        ok = code == 0 and not timed_out
        return Outcome(
            ok=ok,
            exit_code=exit_code,
            signal=sig,
            duration=duration,
            stderr_tail=self._tail.decode("utf-8", "replace"),
            reason="" if ok else self._reason(exit_code, sig, duration),
            result=result,
            timed_out=timed_out,
        )

    def _reason(self, exit_code: int | None, sig: int | None, duration: float) -> str:
        if self.stop_reason == "timeout":
            return f"timed out after {duration:.1f}s"
        if sig is not None:
            return f"killed by signal {sig} ({_signame(sig)})"
        return f"exit code {exit_code}"

    def _read_result(self) -> Any:
        try:
            with open(self.result_path, "rb") as f:
                raw = f.read(RESULT_MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.result_path)
        if len(raw) > RESULT_MAX_BYTES:
            return {"error": f"result file larger than {RESULT_MAX_BYTES} bytes; not stored"}
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {
                "error": "result file is not valid JSON",
                "text": raw[:4096].decode(errors="replace"),
            }

    def close(self) -> None:
        self.pipes.clear()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _pidfd(pid: int) -> int:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return -1
    try:
        fd: int = opener(pid)
    except OSError:
        return -1
    return fd


def _memfile(data: bytes) -> Any:
    """A seekable file holding ``data``, to hand to a child as stdin."""
    import tempfile

    f = tempfile.TemporaryFile()  # noqa: SIM115  # closed by _spawn after Popen
    f.write(data)
    f.seek(0)
    return f


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown"
