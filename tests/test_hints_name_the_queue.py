"""A hint names the queue it is about: copied as printed, it acts on that queue.

A new user's `statequeue -q dmg2 fsck` said "run `statequeue fsck --repair`",
and that line, copied, checked the default queue and called it ok. Every
`statequeue COMMAND` hint about a queue (fsck, pause/resume, retry, show...)
now carries `-q NAME`, from whichever path printed it: the typer commands,
the fast paths of `status` and `run`, a run's notices.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120)


def _damaged(env: dict[str, str], home: Path, name: str) -> None:
    assert _sq(env, "-q", name, "enqueue", "1", "2", "3").returncode == 0
    journal = home / name / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"item":"1"', b'"item":"Y"')  # its checksum no longer matches
    journal.write_bytes(b"".join(lines))


def test_the_repair_hint_names_the_damaged_queue_on_every_path(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    _damaged(sq_env, sq_home, "dmg2")
    hint = "`statequeue -q dmg2 fsck --repair`"
    for args in (
        ("-q", "dmg2", "status"),  # the fast path
        ("status", "--queue=dmg2"),  # the typer path (an option it does not parse fast)
        ("list", "-q", "dmg2"),  # after the command's name
        ("-q", "dmg2", "run", "--", "true"),  # run's fast path
    ):
        refused = _sq(sq_env, *args)
        assert refused.returncode == ExitCode.DAMAGED, (args, refused.stderr)
        assert hint in refused.stderr, (args, refused.stderr)
    checked = _sq(sq_env, "-q", "dmg2", "fsck")
    assert checked.returncode == ExitCode.DAMAGED
    assert f"damage found: run {hint} to salvage" in checked.stderr


def test_the_queue_named_by_the_environment_is_the_one_in_the_hint(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    _damaged(sq_env, sq_home, "envq")
    refused = _sq({**sq_env, "STATEQUEUE_QUEUE": "envq"}, "status")
    assert "`statequeue -q envq fsck --repair`" in refused.stderr, refused.stderr


def test_pause_says_how_to_resume_that_queue(sq_env: dict[str, str]) -> None:
    assert _sq(sq_env, "-q", "night", "enqueue", "a").returncode == 0
    paused = _sq(sq_env, "pause", "-q", "night")
    assert paused.returncode == 0
    assert "`statequeue -q night resume`" in paused.stdout
    shown = _sq(sq_env, "-q", "night", "status")
    assert "(`statequeue -q night resume`)" in shown.stdout
