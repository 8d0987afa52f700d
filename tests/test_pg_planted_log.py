"""A file or link planted at a log's path in a PostgreSQL queue's scratch
folder (tester's points 1 and 2): the run neither writes the other user's
file (which he tails) nor loses the attempt's output to a link; it removes
what is there and makes its own log, which is stored as usual."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

pytest.importorskip("psycopg")

NOBODY = 65534


def _cli(env: dict[str, str], url: str, cmd: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, cmd, "-q", "q", "--store", url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("planted", ["foreign", "link"])
def test_a_planted_log_in_the_scratch_folder_neither_leaks_nor_loses_the_output(
    pg_url: str, sq_env: dict[str, str], sq_home: Path, tmp_path: Path, planted: str
) -> None:
    assert _cli(sq_env, pg_url, "enqueue", "secret").returncode == 0
    logs = sq_home / ".postgres" / "q" / "logs"
    assert logs.is_dir()
    tailed = tmp_path / "tailed"
    tailed.write_bytes(b"planted\n")
    if planted == "foreign":
        os.chown(tailed, NOBODY, -1)
        os.chmod(tailed, 0o666)
        os.link(tailed, logs / "1.1.log")
    else:
        (logs / "1.1.log").symlink_to(tailed)
    done = _cli(sq_env, pg_url, "run", "--", "sh", "-c", "echo out-{}")
    assert done.returncode == 0, done.stderr
    assert tailed.read_bytes() == b"planted\n"
    shown = _cli(sq_env, pg_url, "logs", "1")
    assert shown.returncode == 0 and "out-secret" in shown.stdout, shown.stderr
