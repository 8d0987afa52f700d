"""Turning exceptions into one line on stderr and a documented exit code."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from statequeue.core.errors import DiskFull, StateQueueError, os_error_text, shortage_remedy
from statequeue.core.exitcodes import ExitCode

PROG = "statequeue"


class ReaderGone(Exception):
    """The reader of our output went away (`statequeue list | head`)."""


class Interrupted(Exception):
    """Ctrl-C inside a command: typer would turn KeyboardInterrupt into a
    silent exit 130, where every command says `statequeue: interrupted`."""


# A byte that is not UTF-8 in a name (held as a surrogate escape) shows as
# \xff, as `list` shows it, not as \udcff; a control character cannot reach
# the terminal raw (a file name could hold an escape sequence).
_SHOWN = {code: f"\\x{code - 0xDC00:02x}" for code in range(0xDC80, 0xDD00)}
_SHOWN |= {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F)}


# Commands a hint may name that act on one queue: a hint printed for queue
# "logs" must say `statequeue -q logs fsck --repair`, or the line copied from
# it acts on the default queue (or $STATEQUEUE_QUEUE's) instead.
_ON_A_QUEUE = "fsck|retry|show|resume|pause|compact|logs|list|status|stats|cancel|run"
_QUEUE_FLAGS = ("-q", "--queue")

hint_queue: str | None = None
"""The queue this command acts on, named in its hints (the run's fast path sets it)."""
_hint_argv: Sequence[str] = ()  # else found in the command line (``run_guarded``), when needed


DISK_FULL_HINT = (
    "free space; `statequeue compact --keep-logs 0s` removes the logs of finished items"
)


def with_queue(text: str) -> str:
    """``text`` with ``-q QUEUE`` in each `statequeue COMMAND` hint that names no queue."""
    global hint_queue
    if "`statequeue " not in text:
        return text
    if hint_queue is None:
        hint_queue = queue_of(_hint_argv)
    return hint_for(text, hint_queue)


def hint_for(text: str, queue: str) -> str:
    """``text`` with ``-q QUEUE`` in each `statequeue COMMAND` hint (``queue``
    empty: as it is)."""
    if not queue or "`statequeue " not in text:
        return text
    import re  # lazy: start-up time (a hint only; enqueue imports no re)
    import shlex

    hint = re.compile(rf"`statequeue (?=(?:{_ON_A_QUEUE})\b)")
    return hint.sub(f"`statequeue -q {shlex.quote(queue)} ", text)


def queue_of(argv: Sequence[str], named: str | None = None) -> str:
    """The queue a command line acts on: ``named``, else its -q/--queue (before
    the run's ``--``), else $STATEQUEUE_QUEUE or the default."""
    if named is None:
        for i, arg in enumerate(argv):
            if arg == "--":
                break
            if arg in _QUEUE_FLAGS and i + 1 < len(argv):
                named = argv[i + 1]
            elif arg.startswith("--queue="):
                named = arg.removeprefix("--queue=")
            elif arg.startswith("-q") and len(arg) > 2 and not arg.startswith("--"):
                named = arg[2:]
    from statequeue.core.location import resolve_queue_name  # lazy: a failure only

    try:
        return resolve_queue_name(named)
    except StateQueueError:  # an invalid name: the error says so; no hint names it
        return named or ""


def fail(message: str, code: int) -> int:
    """Print ``message`` as one line on stderr; return ``code``."""
    line = with_queue(" ".join(str(message).split()))
    if not line.isascii() or not line.isprintable():
        line = line.translate(_SHOWN)
    sys.stderr.write(f"{PROG}: {line}\n")
    return code


def run_guarded(call: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """Run the CLI; every expected failure becomes one line and an exit code.
    Without click or typer: main.py's fast path for `run` uses it too (click's
    errors are told apart only when click was imported, as nothing else raises
    them)."""
    global _hint_argv
    _hint_argv = argv
    try:
        return call(argv)
    except BaseException as exc:
        code = exit_code_of(exc)
        if code is None:
            raise
        return code


def _logs_beside(path: str) -> bool:
    """Whether the queue folder of ``path`` (a file of it, or of its logs) has
    logs that `compact --keep-logs 0s` could remove; True when that is not
    known. A new queue's first enqueue has none: compaction frees nothing."""
    if not path:
        return True
    folder = os.path.dirname(path)
    if os.path.basename(folder) == "logs":
        return True  # a log was being written: there are logs
    try:
        with os.scandir(os.path.join(folder, "logs")) as entries:
            return next(entries, None) is not None
    except OSError:
        return not os.path.isdir(folder)  # no queue folder there: say it all


def exit_code_of(exc: BaseException) -> int | None:
    """The exit code for ``exc``, its line printed; None to let it go on."""
    if isinstance(exc, DiskFull) and "space" not in exc.message:
        # Not from compaction (which says what frees space): any command that
        # met a full disk (a run's results, an enqueue).
        hint = DISK_FULL_HINT if _logs_beside(exc.path) else "free space"
        return fail(f"{exc.message} ({hint})", int(exc.exit_code))
    if isinstance(exc, StateQueueError):
        return fail(exc.message, int(exc.exit_code))
    click = sys.modules.get("click")
    if click is not None:
        code = _click_exit_code(click, exc)
        if code is not None:
            return code
    if isinstance(exc, SystemExit):
        # click (on EPIPE) and rich (printing --help) turn a broken pipe into
        # exit 1, the code for "an item failed"; both raise while handling it.
        if isinstance(exc.__context__, BrokenPipeError):
            silence_stdout()
            return 0
        return None
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        return fail("interrupted", int(ExitCode.INTERRUPTED_INT))
    if isinstance(exc, (BrokenPipeError, ReaderGone)):
        # The reader of our output went away (`| head`): not an error of ours,
        # and quiet, as `ls | head` is.
        silence_stdout()
        return 0
    if isinstance(exc, OSError):
        if (remedy := shortage_remedy(exc)) is not None:  # as `run` does (run/resources.py)
            said = f"error: {os_error_text(exc)}; stopped ({remedy})"
            return fail(said, int(ExitCode.RESOURCES))
        return fail(f"error: {os_error_text(exc)}", int(ExitCode.IO_ERROR))
    if isinstance(exc, MemoryError):
        # E.g. an enqueue of an endless stream under a memory limit: every
        # write is all-or-nothing (fsynced batches), so what was
        # acknowledged stays and the rest was not written.
        return fail(
            "out of memory; what was acknowledged is kept, the rest was not written "
            "(raise the limit, or give the input in smaller parts)",
            int(ExitCode.RESOURCES),
        )
    return None


def _click_exit_code(click: Any, exc: BaseException) -> int | None:
    no_args_is_help = getattr(click.exceptions, "NoArgsIsHelpError", click.UsageError)
    if isinstance(exc, no_args_is_help):
        # The error made the help as it was raised (click's get_help): the
        # rich help is printed then, and its text is empty; a plain one is
        # the text. Asked for again here, the rich help was printed twice.
        text = exc.format_message()
        if text:
            sys.stdout.write(text + "\n")
        return int(ExitCode.USAGE)
    if isinstance(exc, click.UsageError):
        hint = ""
        if exc.ctx is not None and exc.ctx.command_path:
            hint = f" (see `{exc.ctx.command_path} --help`)"
        return fail(f"error: {_other_tools(exc.format_message())}{hint}", int(ExitCode.USAGE))
    if isinstance(exc, click.exceptions.Exit):
        return int(exc.exit_code)
    if isinstance(exc, click.exceptions.Abort):
        return fail("aborted", int(ExitCode.INTERRUPTED_INT))
    if isinstance(exc, click.ClickException):
        return fail(f"error: {exc.format_message()}", int(ExitCode.USAGE))
    return None


# Commands of other queue tools (pueue, task-spooler, GNU parallel's habits)
# and what statequeue calls them: said in place of click's spelling guess.
_OTHER_TOOLS = {
    "watch": "status --watch",
    "add": "enqueue",
    "push": "enqueue",
    "submit": "enqueue",
    "ls": "list",
    "log": "logs",
    "follow": "logs ID --follow",
    "restart": "retry",
    "remove": "cancel",
    "kill": "cancel",
    "stop": "cancel",
    "start": "run",
    "clean": "compact",
    "wait": "run, or status --watch",
}


def _other_tools(message: str) -> str:
    """Click's "No such command 'X'. Did you mean ...?" for a name another
    queue tool uses: the statequeue command that does it instead."""
    match = re.match(r"No such command '([^']+)'\.", message)
    if match is None or match.group(1) not in _OTHER_TOOLS:
        return message
    name = match.group(1)
    said = f"No such command '{name}'. Did you mean '{_OTHER_TOOLS[name]}'?"
    if name in ("kill", "stop"):
        said += " (an item that is running: stop its run with Ctrl-C or `kill -TERM PID`)"
    return said


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that nothing more fails on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
