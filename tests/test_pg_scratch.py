"""Issue 21, point 4: a PostgreSQL queue's scratch folders on this host (the
home, ``.postgres``, ``.postgres/QUEUE`` and its ``logs`` and ``claims``) are
checked as the local store's folders are: another user's, writable by group
or others, or a link is refused with exit 9 before anything is written.

Otherwise another local user who made them first in a shared home could read
the runner's job output through a log file planted there, or hang it by
holding flocks on its claim files. The folders are made as another uid with
os.chown (the tests run as root); the database is a real server (tests/pg.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE
from tests.pg import sql

pytest.importorskip("psycopg")

OTHER_UID = 65534  # nobody


def _scratch(home: Path) -> Path:
    """home/.postgres/q with logs and claims, all as statequeue makes them."""
    scratch = home / ".postgres" / "q"
    for folder in (home, home / ".postgres", scratch, scratch / "logs", scratch / "claims"):
        folder.mkdir(mode=0o700, exist_ok=True)
        folder.chmod(0o700)
    return scratch


def _spoil(folder: Path, problem: str, elsewhere: Path) -> None:
    if problem == "uid":
        os.chown(folder, OTHER_UID, OTHER_UID)
    elif problem == "mode":
        folder.chmod(0o777)
    else:  # a link to a folder that is itself fine: only the link is wrong
        elsewhere.mkdir(mode=0o700)
        os.rename(folder, elsewhere / "moved")
        folder.symlink_to(elsewhere / "moved")


def _cli(env: dict[str, str], url: str, cmd: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, cmd, "-q", "q", "--store", url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="making folders as another uid needs root")
@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("", "uid"),
        ("", "mode"),
        (".postgres", "uid"),
        (".postgres", "link"),
        (".postgres/q", "mode"),
        (".postgres/q", "link"),
        (".postgres/q/logs", "uid"),
        (".postgres/q/logs", "mode"),
        (".postgres/q/logs", "link"),
        (".postgres/q/claims", "uid"),
        (".postgres/q/claims", "link"),
    ],
)
def test_an_unsafe_scratch_folder_is_refused_with_exit_9(
    pg_url: str, sq_env: dict[str, str], sq_home: Path, tmp_path: Path, where: str, problem: str
) -> None:
    _scratch(sq_home)
    folder = sq_home / where if where else sq_home
    _spoil(folder, problem, tmp_path / "elsewhere")
    done = _cli(sq_env, pg_url, "enqueue", "a")
    assert done.returncode == 9, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("statequeue: ") and str(folder) in line, line
    # Refused before the database was touched: no schema, no item.
    assert sql(pg_url, "SELECT to_regclass('statequeue.items') IS NULL") == [(True,)]


@pytest.mark.skipif(os.geteuid() != 0, reason="making folders as another uid needs root")
def test_a_runner_takes_nothing_when_a_log_folder_is_anothers(
    pg_url: str, sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """The planted-log attack: another user made ``logs`` (open to all), so
    the job's output would land where they can read it."""
    assert _cli(sq_env, pg_url, "enqueue", "secret").returncode == 0
    logs = _scratch(sq_home) / "logs"
    os.chown(logs, OTHER_UID, OTHER_UID)
    logs.chmod(0o777)
    done = _cli(sq_env, pg_url, "run", "--", "echo", "{}")
    assert done.returncode == 9, done.stderr
    assert "owned by uid 65534" in done.stderr
    assert os.listdir(logs) == []
    assert sql(pg_url, "SELECT state FROM statequeue.live") == [("pending",)]


def test_the_scratch_folders_are_made_private(pg_url: str, sq_env: dict[str, str]) -> None:
    assert _cli(sq_env, pg_url, "enqueue", "a").returncode == 0
    home = Path(sq_env["STATEQUEUE_HOME"])
    scratch = home / ".postgres" / "q"
    for folder in (home, home / ".postgres", scratch, scratch / "logs", scratch / "claims"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder


def test_drop_never_removes_through_a_linked_scratch_folder(
    pg_url: str, sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """`drop` removes the queue's scratch folder: a ``.postgres`` that is a
    link must not make it delete a folder of the same name elsewhere."""
    assert _cli(sq_env, pg_url, "enqueue", "a").returncode == 0
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "q").mkdir(mode=0o700, parents=True)
    (elsewhere / "q" / "keep.txt").write_text("precious")
    elsewhere.chmod(0o700)
    postgres = sq_home / ".postgres"
    subprocess.run(["rm", "-r", str(postgres)], check=True)
    postgres.symlink_to(elsewhere)
    done = subprocess.run(
        [STATEQUEUE, "drop", "q", "--yes", "--store", pg_url],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (elsewhere / "q" / "keep.txt").read_text() == "precious"
    assert done.returncode == 9, done.stderr
    [line] = done.stderr.splitlines()
    assert str(postgres) in line and "symbolic link" in line, line
    # Refused before anything was dropped.
    assert sql(pg_url, "SELECT name FROM statequeue.queues") == [("q",)]


def test_a_look_at_a_missing_queue_leaves_no_scratch_folder(
    pg_url: str, sq_env: dict[str, str], sq_home: Path
) -> None:
    """`status` of a queue that does not exist (or was just dropped) exits 7
    and used to leave HOME/.postgres/QUEUE/{claims,logs} behind."""
    scratch = sq_home / ".postgres" / "q"
    missing = _cli(sq_env, pg_url, "status")
    assert missing.returncode == 7, missing.stderr
    assert not scratch.exists()
    assert _cli(sq_env, pg_url, "enqueue", "a").returncode == 0
    assert scratch.is_dir()  # a queue that exists keeps its folder
    assert _cli(sq_env, pg_url, "status").returncode == 0
    assert scratch.is_dir()
    dropped = _cli(sq_env, pg_url, "drop", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert _cli(sq_env, pg_url, "status").returncode == 7
    assert not scratch.exists()
