"""A look at a PostgreSQL database that has no statequeue schema writes
nothing, there or on this host, as a look at a missing local home makes
no folder.

`status`, `queues`, `show`, `events`, `stats`, `fsck` and `drop` of a queue
in an empty database created the whole schema (fifteen tables) there, as
whichever role ran them: in a shared database, a mistyped URL or a look by
another role left a schema behind that the next user's statequeue then
refused or had to share. They also left HOME/.postgres behind. Now each
says what is missing with its usual exit code (7: no such queue; `queues`:
none), and the database and the home are as they were. A write
(`enqueue`) still builds the schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.leftovers import sq
from tests.pg import sql

pytest.importorskip("psycopg")

LOOKS = [
    ("status", "-q", "nope"),
    ("show", "1", "-q", "nope"),
    ("logs", "1", "-q", "nope"),
    ("events", "-q", "nope"),
    ("stats", "-q", "nope"),
    ("fsck", "-q", "nope"),
    ("drop", "nope", "--yes"),
]


def _tables(url: str) -> int:
    found = sql(url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'statequeue'")
    return int(str(found[0][0]))


def test_looks_at_an_empty_database_build_no_schema_and_no_folder(
    pg_url: str, sq_env: dict[str, str], sq_home: Path
) -> None:
    env = {**sq_env, "STATEQUEUE_STORE": pg_url}
    for look in LOOKS:
        done = sq(env, *look)
        assert done.returncode == 7, (look, done.stderr)
        assert done.stderr == "statequeue: no queue 'nope' in the PostgreSQL store\n", look
    listed = sq(env, "queues", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["queues"] == []
    assert _tables(pg_url) == 0
    assert not sq_home.exists()
    # A write builds it, as before.
    added = sq(env, "enqueue", "-q", "yes", "a")
    assert added.returncode == 0, added.stderr
    assert _tables(pg_url) > 0
    assert sq(env, "status", "-q", "yes").returncode == 0
