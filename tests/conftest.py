"""Shared fixtures: every test gets its own STATEQUEUE_HOME under tmp_path."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

BIN = Path(sys.executable).parent
STATEQUEUE = shutil.which("statequeue", path=str(BIN)) or "statequeue"


@pytest.fixture(autouse=True)
def sq_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private home for the queues of one test (never the user's data dir)."""
    home = tmp_path / "home"
    monkeypatch.setenv("STATEQUEUE_HOME", str(home))
    monkeypatch.delenv("STATEQUEUE_QUEUE", raising=False)
    monkeypatch.delenv("STATEQUEUE_TEST_CRASH", raising=False)
    # A developer's own PostgreSQL store or host name must not leak into tests.
    monkeypatch.delenv("STATEQUEUE_STORE", raising=False)
    monkeypatch.delenv("STATEQUEUE_HOST", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    return home


@pytest.fixture
def sq_env(sq_home: Path) -> dict[str, str]:
    """Environment for running the real `statequeue` in a subprocess."""
    env = dict(os.environ)
    env["STATEQUEUE_HOME"] = str(sq_home)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(params=["journal", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    """ "" for the journal store, else a fresh PostgreSQL database's URL: a
    test taking it runs on both stores."""
    return str(request.getfixturevalue("pg_url")) if request.param == "postgres" else ""


from tests.pg import pg_cluster, pg_url  # noqa: E402, F401  (fixtures for every test)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL this thread sends through psycopg from now on (tests that count
    what a read sends: test_result_lookup, test_resumable_reads)."""
    psycopg = pytest.importorskip("psycopg")
    sent: list[str] = []
    me = threading.get_ident()
    execute = psycopg.Connection.execute

    def spy(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:
            sent.append(query if isinstance(query, str) else repr(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", spy)
    return sent
