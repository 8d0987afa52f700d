"""Fixtures shared by the acceptance tests: a work folder for the workers,
the environment that names it, and the runners they start (stopped by pid)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_runner import Procs


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "w"
    (folder / "pids").mkdir(parents=True)
    return folder


@pytest.fixture
def env(sq_env: dict[str, str], work: Path) -> dict[str, str]:
    return {**sq_env, "SQT_DIR": str(work)}


@pytest.fixture
def procs(env: dict[str, str], work: Path) -> Iterator[Procs]:
    p = Procs(env, work / "pids")
    try:
        yield p
    finally:
        p.cleanup()
