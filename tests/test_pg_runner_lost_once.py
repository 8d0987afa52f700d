"""A dead runner of this host is recorded lost once on PostgreSQL, however
many processes find it dead at the same moment.

Each process that opens the queue (a runner's reaper, a ``status``, a
library loop) looks for this host's runners whose pid is gone, and marks
them stopped. Two that looked at once both found the row still live; the
second's update then matched nothing, but both wrote a ``stop`` ("runner
lost") event, and ``events`` showed the runner lost twice. The second look
is made here as such a process made it: with the row as it was before the
first marked it (a read that does not ask whether it is stopped yet).
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.pg import sql as _sql
from tests.test_pg_work_loop_end import _DIE_REGISTERED

psycopg = pytest.importorskip("psycopg")
from statequeue.core.identity import boot_id, host_name  # noqa: E402
from statequeue.store.postgres import PostgresStore, reaping, sql  # noqa: E402  (needs psycopg)

# What a second process read when it looked at the same moment as the first:
# the row not yet marked stopped.
_LOOKED_BEFORE_THE_FIRST_MARKED = """
SELECT runner_id, pid FROM statequeue.runners
WHERE queue = %(q)s AND host = %(host)s AND boot = %(boot)s
"""


def test_a_runner_found_dead_by_two_processes_at_once_is_lost_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    died = subprocess.run(
        [sys.executable, "-c", _DIE_REGISTERED, pg_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    dead = died.stdout.strip()
    store = PostgresStore(pg_url, "q", create=False)
    try:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            first = reaping.stop_dead_runners_here(conn, "q", host=host_name(), boot=boot_id())
            monkeypatch.setattr(sql, "SAME_HOST_RUNNERS", _LOOKED_BEFORE_THE_FIRST_MARKED)
            second = reaping.stop_dead_runners_here(conn, "q", host=host_name(), boot=boot_id())
    finally:
        store.close()
    assert first == [dead] and second == [dead]  # both found it dead
    lost = _sql(
        pg_url,
        "SELECT body->>'how' FROM statequeue.events"
        " WHERE body->>'t' = 'stop' AND body->>'runner' = %s",
        dead,
    )
    assert lost == [("pid",)]
