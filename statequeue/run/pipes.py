"""A child's output pipes: made ahead (``PipeStock``) and read without
blocking (``read_some``), for the per-item job and the persistent worker."""

from __future__ import annotations

import contextlib
import os

READ_SIZE = 65536


def read_some(fd: int) -> bytes | None:
    """Up to ``READ_SIZE`` bytes from the non-blocking ``fd``: b"" at end of
    file, None when nothing is there yet."""
    try:
        return os.read(fd, READ_SIZE)
    except BlockingIOError:
        return None


class PipeStock:
    """A child's two output pipes, made ahead: the runner makes the next
    pair once a child is started, so that making them (four system calls) is
    not on the path from one child's exit to the next child's start."""

    def __init__(self) -> None:
        self._ready: list[Pipes] = []

    def take(self) -> Pipes:
        """A pair: the one made ahead, else a new one (OSError, e.g. EMFILE)."""
        return self._ready.pop() if self._ready else make_pipes()

    def refill(self) -> None:
        """Make the next pair, if none is ready (short of fds: the next take says so)."""
        if not self._ready:
            with contextlib.suppress(OSError):
                self._ready.append(make_pipes())

    def close(self) -> None:
        for pipes in self._ready:
            for fd in pipes:
                os.close(fd)
        self._ready.clear()


Pipes = tuple[int, int, int, int]
"""stdout's read and write ends, then stderr's; the read ends non-blocking."""


def make_pipes() -> Pipes:
    """A child's stdout and stderr pipes (close-on-exec; the runner's ends
    non-blocking). OSError (EMFILE: see runner) leaves nothing open."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
    except BaseException:
        for fd in (out_r, out_w):
            os.close(fd)
        raise
    return out_r, out_w, err_r, err_w
