"""A throwaway PostgreSQL cluster for the tests: real server, never a mock.

One cluster per test session (initdb + pg_ctl from the PostgreSQL binaries
on the machine), listening only on a unix socket in a short temp folder
(socket paths are limited to ~107 bytes). Run as root, the server runs as
the ``postgres`` user, since initdb refuses root. Each test gets its own
database. Without the binaries the tests are skipped, unless
``STATEQUEUE_REQUIRE_PG=1`` (set by .ci/run) makes that a failure.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

SUPERUSER = "postgres"


def find_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: $STATEQUEUE_PG_BIN, the newest
    /usr/lib/postgresql/N/bin, other usual places, or PATH."""
    candidates = [os.environ.get("STATEQUEUE_PG_BIN", "")]
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted(versions, key=lambda p: int(Path(p).parent.name), reverse=True)
    candidates += [*glob.glob("/usr/pgsql-*/bin"), "/usr/local/pgsql/bin"]
    on_path = shutil.which("pg_ctl")
    candidates += [str(Path(on_path).parent)] if on_path else []
    for folder in filter(None, candidates):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


@dataclass
class PgCluster:
    bin_dir: Path
    root: Path
    as_user: list[str]
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def socket_dir(self) -> Path:
        return self.root / "s"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.socket_dir}"

    def pg_ctl(self, *args: str) -> None:
        cmd = [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-c listen_addresses='' -c unix_socket_directories={self.socket_dir}"
        self.pg_ctl("-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "-w", "stop")

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)


def _start_cluster(bin_dir: Path) -> PgCluster:
    root = Path(tempfile.mkdtemp(prefix="sqpg", dir="/tmp"))  # short: socket path limit
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, user=SUPERUSER, group=SUPERUSER)
        as_user = ["runuser", "-u", SUPERUSER, "--"]
    cluster = PgCluster(bin_dir, root, as_user)
    cluster.socket_dir.mkdir()
    if as_user:
        shutil.chown(cluster.socket_dir, user=SUPERUSER, group=SUPERUSER)
    initdb = [*as_user, str(bin_dir / "initdb"), "-D", str(cluster.data_dir)]
    initdb += ["-U", SUPERUSER, "-A", "trust", "--no-sync", "-E", "UTF8", "--no-locale"]
    subprocess.run(initdb, check=True, capture_output=True, timeout=120)
    cluster.start()
    return cluster


def unavailable(reason: str) -> NoReturn:
    """Skip the test, or fail it when STATEQUEUE_REQUIRE_PG=1 (CI)."""
    if os.environ.get("STATEQUEUE_REQUIRE_PG") == "1":
        pytest.fail(f"{reason}, and STATEQUEUE_REQUIRE_PG=1", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """The session's PostgreSQL cluster, stopped (by its data folder's pid file) at the end."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        unavailable("PostgreSQL binaries (initdb, pg_ctl) not found")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed")
    cluster = _start_cluster(bin_dir)
    try:
        yield cluster
    finally:
        # Thrown away next: no shutdown checkpoint to wait for.
        with suppress(subprocess.SubprocessError):
            cluster.stop("immediate")
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """The URL of a fresh database of its own for one test."""
    return pg_cluster.new_database()


@contextmanager
def throwaway_cluster() -> Iterator[PgCluster]:
    """A cluster of its own, for tests that stop or crash the server (never
    the session's); skipped (or failed, in CI) like the session's."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        unavailable("PostgreSQL binaries (initdb, pg_ctl) not found")
    cluster = _start_cluster(bin_dir)
    try:
        yield cluster
    finally:
        with suppress(subprocess.SubprocessError):
            cluster.stop("immediate")
        shutil.rmtree(cluster.root, ignore_errors=True)


def sql(url: str, query: str, *params: object) -> list[tuple[object, ...]]:
    """Run one statement on its own autocommit connection; its rows, if any."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params or None)
        return cur.fetchall() if cur.description else []
