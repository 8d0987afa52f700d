"""A warning and `stats` show a run's command as its user gave it (outside
tester: `run --shell` showed as `/bin/sh -c ... sh '{}' '{.}' ...`, and
`stats` printed it unquoted), and a run with nothing to do does not warn
that its command differs. Real CLI runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

from statequeue import Queue
from statequeue.core.models import Outcome, RunnerInfo
from statequeue.run.replacements import NAMES
from statequeue.run.shell_command import shell_template
from statequeue.run.verify import ONLY_ITEM, SHELL
from tests.conftest import STATEQUEUE

WARNING = "statequeue: warning: this queue was last run with a different command: "


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, "-q", "a", *args], env=env, capture_output=True, text=True, check=False
    )


def test_the_warning_and_stats_show_the_command_as_given(sq_env: dict[str, str]) -> None:
    assert _sq(sq_env, "enqueue", "x").returncode == 0
    shell = _sq(sq_env, "run", "--shell", "--", 'echo "[$1]"')
    assert shell.returncode == 0, shell.stderr
    idle = _sq(sq_env, "run", "--", "true")  # nothing to do: runs no command, says nothing of it
    assert idle.returncode == 0, idle.stderr
    assert "different command" not in idle.stderr, idle.stderr
    assert _sq(sq_env, "enqueue", "y").returncode == 0
    ran = _sq(sq_env, "run", "--", "printf", "%s\n", "two words")
    assert ran.returncode == 0, ran.stderr
    # One line: the newline in a word as bash's $'\n', as the user would type it.
    assert f"{WARNING}--shell 'echo \"[$1]\"' (now: printf $'%s\\n' 'two words')\n" in ran.stderr
    assert "/bin/sh" not in ran.stderr, ran.stderr
    stats = _sq(sq_env, "stats")
    assert stats.returncode == 0, stats.stderr
    runners = stats.stdout[stats.stdout.index("runners:") :]
    assert ": --shell 'echo \"[$1]\"'" in runners, runners
    assert ": printf $'%s\\n' 'two words'" in runners, runners  # as in the warning
    assert "/bin/sh" not in runners, runners


def test_the_same_shell_command_again_does_not_warn(sq_env: dict[str, str]) -> None:
    for item in ("x", "y"):
        assert _sq(sq_env, "enqueue", item).returncode == 0
        ran = _sq(sq_env, "run", "--shell", "--", "test", "-n", "{}")
        assert ran.returncode == 0, ran.stderr
        assert "different command" not in ran.stderr, ran.stderr


def test_older_records_still_show_something_sensible() -> None:
    """A record of an older version holds the --shell form as run."""
    from statequeue.core.command_text import SHELL_TAIL, command_text

    assert ("sh", *NAMES) == SHELL_TAIL
    old = [SHELL, "-c", 'gzip -c "$1" > "$1".gz', *SHELL_TAIL]
    assert command_text(old) == '--shell \'gzip -c "$1" > "$1".gz\''
    assert (
        command_text(["./convert", "{}", "out dir"]) == "./convert {} 'out dir'"
    )  # as the docs show it
    assert command_text(["--shell", "echo {} > x"]) == "--shell 'echo {} > x'"


def test_a_record_of_an_older_version_counts_as_the_same_command(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    """An older version recorded `--shell` runs as run: the same command
    given now is no change (no warning), and `stats` shows it as `--shell`."""

    template = shell_template(("test", "-n", "{}"))
    # As an older version recorded it: without the `set -- "$1"` that makes
    # the item the script's only parameter.
    template = tuple(word.replace(ONLY_ITEM, "", 1) for word in template)
    older = RunnerInfo("older-run", os.getpid(), "h", "", time.time(), command=template)
    with Queue("a", home=sq_home) as q:
        q.enqueue(["x", "y"])
        q.store.register_runner(older)
        claim = q.store.claim(older)
        assert claim is not None
        q.store.finish(claim, Outcome(ok=True, duration=0.1))
        q.store.unregister_runner(older.runner_id)
    ran = _sq(sq_env, "run", "--shell", "--", "test", "-n", "{}")
    assert ran.returncode == 0, ran.stderr
    assert "different command" not in ran.stderr, ran.stderr
    stats = _sq(sq_env, "stats").stdout
    assert f": --shell {shlex.quote(template[2])}" in stats, stats


def test_stats_and_report_show_backslashes_quotes_and_controls_as_typed(
    sq_env: dict[str, str],
) -> None:
    """Found by an outside review: `stats` showed `sh -c 'echo a\\b'` with its
    backslash doubled (the quoted text escaped again), and the report joined
    the words with spaces, its quoting lost (`sh -c echo a\\b`). Both now show
    what the user typed; a control character in a word is written as bash's
    $'...' and never reaches the terminal or page raw."""
    assert _sq(sq_env, "enqueue", "x").returncode == 0
    typed = ["sh", "-c", "echo a\\b", "sh", "{}"]
    assert _sq(sq_env, "run", "--", *typed).returncode == 0
    assert _sq(sq_env, "enqueue", "y").returncode == 0
    assert _sq(sq_env, "run", "--", "echo", "\x1b[31mred", "{}").returncode == 0
    stats = _sq(sq_env, "stats").stdout
    assert ": sh -c 'echo a\\b' sh {}  1 attempt" in stats, stats
    assert ": echo $'\\x1b[31mred' {}  1 attempt" in stats, stats
    assert "\x1b" not in stats and "a\\\\b" not in stats
    page = _sq(sq_env, "report", "-o", "-").stdout
    assert "<code>sh -c &#x27;echo a\\b&#x27; sh {}</code>" in page
    assert "<code>echo $&#x27;\\x1b[31mred&#x27; {}</code>" in page
    assert "\x1b" not in page
