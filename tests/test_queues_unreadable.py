"""`queues` with one queue folder this user cannot read: it printed
"cannot read HOME/u: Permission denied", exit 2, and listed no queue at all.
The others are listed; the unreadable one is skipped with a warning naming
it, and the exit code is still its error's (2), for scripts.

Run as the tester did: as root with the capabilities that bypass file modes
dropped (setpriv), else as the user itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from tests.conftest import STATEQUEUE

_NO_BYPASS = "-dac_override,-dac_read_search,-fowner"


def _queues(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [STATEQUEUE, "queues", *args]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.fail("setpriv is needed to test file modes as root")
        argv = ["setpriv", f"--bounding-set={_NO_BYPASS}", "--", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_an_unreadable_queue_does_not_hide_the_others(
    sq_home: Path, sq_env: dict[str, str]
) -> None:
    for name in ("u", "v"):
        with Queue(name, home=sq_home) as q:
            q.enqueue(["a"])
    (sq_home / "u").chmod(0)
    try:
        shown = _queues(sq_env)
        listed = _queues(sq_env, "--json")
    finally:
        (sq_home / "u").chmod(0o700)
    assert shown.returncode == 2, shown.stderr
    assert "v" in shown.stdout.split(), shown.stdout
    assert "skipped" in shown.stderr and str(sq_home / "u") in shown.stderr, shown.stderr
    assert "Traceback" not in shown.stderr
    assert listed.returncode == 2, listed.stderr
    names = [q["queue"] for q in json.loads(listed.stdout)["queues"]]
    assert names == ["v"], names


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [STATEQUEUE, *args]
    if os.geteuid() == 0:
        argv = ["setpriv", f"--bounding-set={_NO_BYPASS}", "--", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_a_read_only_journal_is_read_and_a_write_refused_in_one_line(
    sq_home: Path, sq_env: dict[str, str]
) -> None:
    """`status` and `list` of a queue whose journal file is read-only (its
    folder writable) said "cannot write .../journal.jsonl", exit 2."""
    with Queue("u", home=sq_home) as q:
        q.enqueue(["a", "b"])
    journal = sq_home / "u" / "journal.jsonl"
    journal.chmod(0o400)
    try:
        status = _sq(sq_env, "-q", "u", "status", "--json")
        listed = _sq(sq_env, "-q", "u", "list")
        run = _sq(sq_env, "-q", "u", "run", "--", "true")
    finally:
        journal.chmod(0o600)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["pending"] == 2
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 2, listed.stderr
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"statequeue: cannot write {journal}: Permission denied\n"
    with Queue("u", home=sq_home) as q:
        assert q.status().counts["pending"] == 2  # nothing was claimed
