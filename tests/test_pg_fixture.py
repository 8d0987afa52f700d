"""The PostgreSQL test layer can be skipped on a laptop, never in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pg import find_bin_dir, unavailable


def test_missing_postgres_skips_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATEQUEUE_REQUIRE_PG", raising=False)
    with pytest.raises(pytest.skip.Exception):
        unavailable("no initdb")


def test_missing_postgres_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEQUEUE_REQUIRE_PG", "1")
    with pytest.raises(pytest.fail.Exception, match="STATEQUEUE_REQUIRE_PG=1"):
        unavailable("no initdb")


def test_bin_dir_from_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("initdb", "pg_ctl"):
        (tmp_path / name).touch()
    monkeypatch.setenv("STATEQUEUE_PG_BIN", str(tmp_path))
    assert find_bin_dir() == tmp_path
