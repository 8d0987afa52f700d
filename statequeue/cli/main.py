"""The console-script entry point, with a fast path for plain `enqueue`.

Shell loops call `statequeue enqueue x` thousands of times, and importing
typer (with click) is most of a cold start. A plain enqueue -- only the
options listed in ``_FAST_OPTIONS`` and items that do not start with '-' --
is parsed here and runs the same library call with the same output; anything
else (help, unknown options, other commands) goes to the typer app.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

_VALUED = {"--home": "home", "-q": "queue", "--queue": "queue", "--file": "file", "-f": "file"}
_FLAGS = {"--json": "json", "-0": "null", "--null": "null"}


@dataclass
class _FastEnqueue:
    items: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)


def _parse_fast(args: Sequence[str]) -> _FastEnqueue | None:
    """The options of a plain enqueue invocation, or None to use the full CLI."""
    opts = _FastEnqueue()
    seen_command = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _VALUED and i + 1 < len(args):
            if _VALUED[arg] in opts.values:
                return None  # given twice: let the full parser decide
            opts.values[_VALUED[arg]] = args[i + 1]
            i += 2
            continue
        if not seen_command:
            if arg != "enqueue":
                return None
            seen_command = True
        elif arg in _FLAGS:
            opts.flags.add(_FLAGS[arg])
        elif arg.startswith("-") or arg == "":
            return None
        else:
            opts.items.append(arg)
        i += 1
    return opts if seen_command else None


def _fast_enqueue(opts: _FastEnqueue) -> int:
    from statequeue.cli.input import read_items
    from statequeue.queue import Queue

    texts = read_items(opts.items, file=opts.values.get("file"), null="null" in opts.flags)
    home, name = opts.values.get("home"), opts.values.get("queue")
    with Queue(name, home=home, create=True) as q:
        for notice in q.notices():
            sys.stderr.write(f"statequeue: {notice}\n")
        result = q.enqueue(texts)
    if "json" in opts.flags:
        sys.stdout.write(f'{{"added":{result.added},"skipped":{result.skipped}}}\n')
    else:
        sys.stdout.write(f"added {result.added}, skipped {result.skipped} already queued\n")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    opts = _parse_fast(args)
    if opts is None:
        from statequeue.cli.app import main as full_main

        full_main(args)
        return
    from statequeue.cli.errors import fail
    from statequeue.errors import StateQueueError

    try:
        code = _fast_enqueue(opts)
    except StateQueueError as exc:
        code = fail(exc.message, int(exc.exit_code))
    except OSError as exc:
        code = fail(f"error: {exc.strerror or exc}", 6)
    # Everything is written, fsynced and closed. Skip the interpreter's
    # teardown, which would free a million item strings one by one (~0.4 s).
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        code = code or 6  # stdout closed under us: the items are queued all the same
    os._exit(code)
