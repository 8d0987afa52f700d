"""The console-script entry point, with a fast path for plain `enqueue`, `status` and `run`.

Shell loops call `statequeue enqueue x` thousands of times, scripts poll
`statequeue status --json`, cron starts `run`, and importing typer (with
click) is most of a cold start. A plain invocation of enqueue or status --
only the options listed in ``_VALUED`` and ``_FLAGS`` for the command, and
(for enqueue) items that do not start with '-' -- is parsed here and runs the
same library call with the same output; a plain `run` is parsed by
cli/run_argv.py into what typer would pass. Anything else (help, unknown
options, other commands) goes to the typer app: the named command's module
and group alone when argv names one plainly (cli/command_table.py), every
command's otherwise (cli/app.py).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import click

    from statequeue.cli.run_start import RunArgs, Where

_GLOBAL = {"--home": "home", "-q": "queue", "--queue": "queue", "--store": "store"}
_VALUED = {
    "enqueue": {**_GLOBAL, "--file": "file", "-f": "file"},
    "status": _GLOBAL,
}
_FLAGS = {
    "enqueue": {"--json": "json", "-0": "null", "--null": "null"},
    "status": {"--json": "json"},
}


class _Fast:
    # A plain class: importing dataclasses (inspect, tokenize...) would come
    # before main() can set how Ctrl-C acts during the imports.
    def __init__(self) -> None:
        self.command = ""
        self.items: list[str] = []
        self.values: dict[str, str] = {}
        self.flags: set[str] = set()


def _parse_fast(args: Sequence[str]) -> _Fast | None:
    """The options of a plain enqueue or status invocation, or None to use the full CLI."""
    opts = _Fast()
    i = 0
    while i < len(args):
        arg = args[i]
        valued = _VALUED.get(opts.command, _GLOBAL)
        if arg in valued and i + 1 < len(args):
            if valued[arg] in opts.values:
                return None  # given twice: let the full parser decide
            opts.values[valued[arg]] = args[i + 1]
            i += 2
            continue
        if not opts.command:
            if arg not in _VALUED:
                return None
            opts.command = arg
        elif arg in _FLAGS[opts.command]:
            opts.flags.add(_FLAGS[opts.command][arg])
        elif arg.startswith("-") or arg == "" or opts.command != "enqueue":
            return None
        else:
            opts.items.append(arg)
        i += 1
    return opts if opts.command else None


def _fast_status(opts: _Fast) -> int:
    # lazy: start-up time (the fast path loads only what its command needs)
    from statequeue.api.queue import Queue
    from statequeue.cli.render import emit_json, print_notices, running_texts, status_text

    home, name = opts.values.get("home"), opts.values.get("queue")
    with Queue(name, home=home, create=False, store=opts.values.get("store")) as q:
        print_notices(q.notices())
        st = q.status()
        texts = {} if "json" in opts.flags else running_texts(q, st)
    if "json" in opts.flags:
        emit_json(st.to_json())
    else:
        sys.stdout.write(status_text(st, texts) + "\n")
    return 0


def _fast_enqueue(opts: _Fast) -> int:
    # lazy: start-up time (the fast path loads only what its command needs)
    from statequeue.api.queue import Queue
    from statequeue.cli.input import open_to_enqueue, read_input
    from statequeue.core.errors import InvalidItem

    texts, where = read_input(opts.items, file=opts.values.get("file"), null="null" in opts.flags)
    home, name, store = opts.values.get("home"), opts.values.get("queue"), opts.values.get("store")

    def opener(create: bool) -> Queue:
        return Queue(name, home=home, create=create, store=store)

    with open_to_enqueue(opener, texts, where) as q:
        for notice in q.notices():
            sys.stderr.write(f"statequeue: {notice}\n")
        try:
            result = q.enqueue(texts)
        except InvalidItem as exc:
            raise where.locate(exc) from None
    if "json" in opts.flags:
        sys.stdout.write(f'{{"schema":1,"added":{result.added},"skipped":{result.skipped}}}\n')
    else:
        sys.stdout.write(f"added {result.added}, skipped {result.skipped} already queued\n")
    return 0


def _standard_fds() -> None:
    """Started with stdin, stdout or stderr closed (`>&-`): put /dev/null
    there, so no file this process opens later (a journal) takes fd 1 and
    gets what a print writes, and the CLI has its streams."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free fd: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 (for the process's life)


def _escaping_streams() -> None:
    """stdout and stderr in an encoding that cannot hold every character
    (``PYTHONIOENCODING=ascii``, a latin-1 locale): what it cannot hold is
    written escaped (``\\xe9``), never a UnicodeEncodeError traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> None:
    _standard_fds()
    if argv is None:  # the console's own streams (a caller's are left as they are)
        _escaping_streams()
    args = list(sys.argv[1:] if argv is None else argv)
    # While the CLI imports its modules, SIGINT ends the process by the
    # kernel's default action: no Python code runs, so no KeyboardInterrupt
    # traceback from half an import and no crash inside a C extension's
    # initialisation (orjson's has been seen to segfault). Commands get
    # KeyboardInterrupt back afterwards. Only this entry does it: importing
    # the library never touches a signal handler. A SIGINT that was ignored
    # (a job a script started with `&`) stays ignored.
    previous = signal.getsignal(signal.SIGINT)
    quick_exit = previous is signal.default_int_handler
    if quick_exit:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    run = None
    try:
        opts = _parse_fast(args)
        if opts is None and argv is None:  # `run` may fork: the console's own process only
            run = _parse_run(args)
        if opts is None and run is None:
            build = _import_typer_path(args)
        else:
            _import_fast_path()
    finally:
        if quick_exit:
            signal.signal(signal.SIGINT, previous)
    # lazy: start-up time (loaded just above: typer's or the fast path's)
    from statequeue.cli import process

    if argv is None:  # the console command's own process: `run` may fork
        process.OWNS_PROCESS = True
    if run is not None:
        _start_run_fast(*run)
    if opts is None:
        # lazy: start-up time (loaded just above, off the fast path)
        from statequeue.cli import root

        root.run_and_exit(build, args)
    os._exit(_run_fast(opts))


def _parse_run(args: Sequence[str]) -> tuple[RunArgs, Where] | None:
    if "run" not in args:
        return None
    # lazy: start-up time (only a command line that may be `run`)
    from statequeue.cli.run_argv import parse_run

    return parse_run(args)


def _start_run_fast(args: RunArgs, where: Where) -> NoReturn:
    """A plain `run` (cli/run_argv.py): as typer's path would, without typer."""
    # lazy: start-up time (the fast path loads only what its command needs)
    from statequeue.cli import errors, process
    from statequeue.cli.run_start import start_run

    errors.hint_queue = where.queue
    process.end(errors.run_guarded(lambda _: start_run(args, where, owns_process=True), []))


def _import_typer_path(args: Sequence[str]) -> Callable[[], click.Command]:
    """Import the typer CLI (with SIGINT at its default: see main); the
    builder of the click group to run: one command's alone when argv names
    one plainly (cli/command_table.py), else every command's."""
    # lazy: start-up time (typer, only off the fast path)
    from statequeue.cli.command_table import (
        COMMANDS,
        command_in,
        full_group,
        import_command_module,
        one_command_group,
    )

    name = command_in(args)
    if name is None:
        from statequeue.cli import app  # lazy: start-up time (every command module)

        _ = app  # imported for its registrations
        return full_group
    import_command_module(COMMANDS[name])  # its module alone, before SIGINT is back
    return lambda: one_command_group(name)


def _import_fast_path() -> None:
    # lazy: start-up time (imported here, with SIGINT at its default: see main)
    import orjson  # noqa: F401


def _run_fast(opts: _Fast) -> int:
    """Run a fast-path command; its exit code."""
    # lazy: start-up time (the fast path loads only what its command needs)
    from statequeue.cli import errors

    errors.hint_queue = opts.values.get("queue")  # None: $STATEQUEUE_QUEUE's or the default
    try:
        code = _fast_enqueue(opts) if opts.command == "enqueue" else _fast_status(opts)
        sys.stdout.flush()
    except BaseException as exc:
        # One line and an exit code, as the full CLI says it (errors.py): an
        # enqueue stopped while reading its input queued nothing; one stopped
        # while writing keeps what it fsynced; a reader gone (`| head`) is quiet.
        handled = errors.exit_code_of(exc)
        if handled is None:
            raise
        code = handled
    # Everything is written, fsynced and closed. Skip the interpreter's
    # teardown, which would free a million item strings one by one (~0.4 s).
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        code = code or 6  # stdout failed under us: the items are queued all the same
    return code
