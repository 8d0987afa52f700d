"""The console command's own process: whether it may fork, and how it ends.

Both without typer or click, so main.py's fast paths (enqueue, status, run)
share them with the full CLI (root.py).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

OWNS_PROCESS = False
"""True in the console command only (cli/main.py, called with no argv):
`run` may fork (run/guard.py), which a caller's process (a test calling
``main([...])`` or a CliRunner) must never see."""


def end(code: int) -> NoReturn:
    """End a command with ``code``: stdout flushed (quietly if its reader is
    gone), then the process exits (the console command's without teardown)."""
    if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if OWNS_PROCESS:
        exit_without_teardown(code)
    sys.exit(code)


def exit_without_teardown(code: int) -> NoReturn:
    """End the console command's process without the interpreter's teardown,
    which frees every object of every module one by one (~15 ms after `run`,
    a tenth of its start), but with what that teardown does that matters
    here: other non-daemon threads are waited for (a stats refresh writes its
    cache in one), atexit handlers run, the standard streams are flushed.
    Everything statequeue writes is on disk already (written, fsynced and
    closed before a command returns)."""
    threading = sys.modules.get("threading")  # not imported: no thread was started
    if threading is not None:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()  # what the interpreter calls at exit (there is no public name)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                code = code or 120  # as the interpreter exits when it cannot flush
    os._exit(code)
