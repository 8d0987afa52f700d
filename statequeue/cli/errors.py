"""Turning exceptions into one line on stderr and a documented exit code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from statequeue.core.errors import StateQueueError
from statequeue.core.exitcodes import ExitCode

PROG = "statequeue"


class ReaderGone(Exception):
    """The reader of our output went away (`statequeue list | head`)."""


def fail(message: str, code: int) -> int:
    """Print ``message`` as one line on stderr; return ``code``."""
    line = " ".join(str(message).split())
    sys.stderr.write(f"{PROG}: {line}\n")
    return code


def run_guarded(call: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """Run the CLI; every expected failure becomes one line and an exit code."""
    import click  # lazy: start-up time (main.py's fast path imports this module)

    _NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", click.UsageError)
    try:
        return call(argv)
    except StateQueueError as exc:
        return fail(exc.message, int(exc.exit_code))
    except _NO_ARGS_IS_HELP as exc:
        ctx = exc.ctx
        if ctx is not None:
            sys.stdout.write(ctx.get_help() + "\n")
        return int(ExitCode.USAGE)
    except click.UsageError as exc:
        hint = ""
        if exc.ctx is not None and exc.ctx.command_path:
            hint = f" (see `{exc.ctx.command_path} --help`)"
        return fail(f"error: {exc.format_message()}{hint}", int(ExitCode.USAGE))
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except SystemExit as exc:
        # click (on EPIPE) and rich (printing --help) turn a broken pipe into
        # exit 1, the code for "an item failed"; both raise while handling it.
        if isinstance(exc.__context__, BrokenPipeError):
            silence_stdout()
            return 0
        raise
    except click.exceptions.Abort:
        return fail("aborted", int(ExitCode.INTERRUPTED_INT))
    except click.ClickException as exc:
        return fail(f"error: {exc.format_message()}", int(ExitCode.USAGE))
    except KeyboardInterrupt:
        return fail("interrupted", int(ExitCode.INTERRUPTED_INT))
    except (BrokenPipeError, ReaderGone):
        # The reader of our output went away (`| head`): not an error of ours,
        # and quiet, as `ls | head` is.
        silence_stdout()
        return 0
    except OSError as exc:
        where = f" {exc.filename}:" if exc.filename else ""  # no "error::" without one
        return fail(f"error:{where} {exc.strerror or exc}", int(ExitCode.IO_ERROR))


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that nothing more fails on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
