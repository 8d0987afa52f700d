"""The fast path's parser for a plain `statequeue run ... -- COMMAND`.

A run's start is paid once per run: by every cron job, and by every batch of a
script that calls `run` in a loop. Typer and click are about 30 ms of it. A
command line that only uses the options below, each once, in their plain
forms (``--jobs 4``, ``-j 4``, ``-j4``; flags alone), with ``--`` before a
command, is parsed here into the same ``RunArgs`` typer would pass
(run_start.py); anything else (help, a value typer would convert or refuse
differently, an option twice, ``--name=value``, no ``--``) returns None and
goes to typer. A test parses the same lines both ways and compares.
"""

from __future__ import annotations

from collections.abc import Sequence

from statequeue.cli.run_start import RUN_DEFAULTS, RunArgs, Where

_WHERE = {"--home": "home", "-q": "queue", "--queue": "queue", "--store": "store"}
_FLAGS = {
    "--quiet": ("quiet", True),
    "--json": ("json", True),
    "--live": ("live", True),
    "--no-live": ("live", False),
    "--follow": ("follow", True),
    "--single": ("single", True),
    "--shell": ("shell", True),
    "--stdin": ("stdin", True),
    "--halt-on-failure": ("halt_on_failure", True),
    "--verify-first": ("verify_first", True),
    "--persistent": ("persistent", True),
    "--auto-compact": ("auto_compact", True),
    "--no-auto-compact": ("auto_compact", False),
}
_INTS = {
    "-j": "jobs",
    "--jobs": "jobs",
    "--retries": "retries",
    "--max-crashes": "max_crashes",
    "--limit": "limit",
    "--exit-empty": "exit_empty",
    "--burst": "burst",
    "--max-deferrals": "max_deferrals",
    "--recycle-after": "recycle_after",
}
_RANGES = {"limit": (1, None), "exit_empty": (0, 255)}  # typer's min/max for these
_TEXTS = {
    "--timeout": "timeout",
    "--grace": "grace",
    "--retry-delay": "retry_delay",
    "--on-interrupted": "on_interrupted",
    "--verify": "verify",
    "--max-time": "max_time",
    "--lease": "lease",
    "--give-up-after": "give_up_after",
    "--rate": "rate",
    "--recycle-rss": "recycle_rss",
    "--log-limit": "log_limit",
}


def parse_run(argv: Sequence[str]) -> tuple[RunArgs, Where] | None:
    """``argv`` (after the program's name) as a plain `run`, or None."""
    glob: dict[str, str] = {}
    i = _where(argv, 0, glob)
    if i is None or i >= len(argv) or argv[i] != "run":
        return None
    mine: dict[str, str] = {}
    given: RunArgs = {}
    i += 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            command = list(argv[i + 1 :])
            if not command:
                return None  # typer's path says what is missing
            args = {**RUN_DEFAULTS, **given, "command": command}
            where = {**glob, **mine}  # the command's options win, as in typer
            return args, Where(where.get("home"), where.get("queue"), where.get("store"))
        step = _where(argv, i, mine, once=True)
        if step is None:
            return None
        if step > i:
            i = step
            continue
        taken = _option(argv, i, given)
        if taken == 0:
            return None
        i += taken
    return None  # no `--`: typer's path


def _where(argv: Sequence[str], i: int, into: dict[str, str], *, once: bool = False) -> int | None:
    """Past the --home, --queue and --store options at ``i`` (values kept in
    ``into``); None for one given twice here or without a plain value."""
    while i < len(argv) and argv[i] in _WHERE:
        name = _WHERE[argv[i]]
        if name in into or i + 1 >= len(argv) or not _plain(argv[i + 1]):
            return None
        into[name] = argv[i + 1]
        i += 2
        if once:
            break
    return i


def _option(argv: Sequence[str], i: int, given: RunArgs) -> int:
    """How many words of ``argv`` at ``i`` one option of ours took (its value
    kept in ``given``); 0 if it is not one (or not plainly)."""
    arg = argv[i]
    if arg in _FLAGS:
        name, value = _FLAGS[arg]
        if name in given:
            return 0
        given[name] = value
        return 1
    if arg.startswith("-j") and len(arg) > 2:  # -j4
        return 1 if _int("jobs", arg[2:], given) else 0
    if i + 1 >= len(argv) or not _plain(argv[i + 1]):
        return 0
    if arg in _INTS:
        return 2 if _int(_INTS[arg], argv[i + 1], given) else 0
    if arg in _TEXTS and _TEXTS[arg] not in given:
        given[_TEXTS[arg]] = argv[i + 1]
        return 2
    return 0


def _int(name: str, text: str, given: RunArgs) -> bool:
    """Keep ``text`` as the int option ``name``: only plain digits in typer's range."""
    if name in given or not (text.isascii() and text.isdigit()):
        return False
    value = int(text)
    low, high = _RANGES.get(name, (None, None))
    if (low is not None and value < low) or (high is not None and value > high):
        return False
    given[name] = value
    return True


def _plain(value: str) -> bool:
    """A value click takes as it is (one that starts with '-' may be read as an option)."""
    return not value.startswith("-")
