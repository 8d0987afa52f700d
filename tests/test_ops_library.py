"""Issue 26, point 3: the library keeps what went wrong.

``@resumable`` re-raises the function's own exception; ``map`` raises MapFailed
with each failure's exception object (the first chained as ``__cause__``); and
``work()``/``map()`` keep the traceback as the attempt's log, which
`statequeue logs ID` shows (journal and PostgreSQL stores)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import statequeue
from statequeue import Queue
from tests.conftest import STATEQUEUE


class Unparsable(RuntimeError):
    pass


def _parse(item: str) -> str:
    if item.startswith("job-00"):
        raise Unparsable(f"cannot parse {item}")
    return item.upper()


def _logs(env: dict[str, str], queue: str, item_id: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, "-q", queue, "logs", str(item_id)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_resumable_reraises_the_functions_own_exception() -> None:
    calls: list[str] = []

    @statequeue.resumable(queue="ops-resumable")
    def lookup(key: str) -> str:
        calls.append(key)
        return {"a": "A"}[key]

    assert lookup("a") == "A"
    with pytest.raises(KeyError) as raised:
        lookup("missing")
    assert raised.value.args == ("missing",)
    assert raised.value.__context__ is None  # no MapFailed in the way
    assert any(frame.name == "lookup" for frame in raised.traceback)
    with pytest.raises(KeyError):  # a later call gives it new attempts: fn's own again
        lookup("missing")
    assert calls == ["a", "missing", "missing"]


def test_map_failed_carries_each_exception_chained() -> None:
    items = ["ok-1", "job-007", "ok-2", "job-008"]
    with pytest.raises(statequeue.MapFailed) as raised:
        statequeue.map(_parse, items, queue="ops-map", jobs=2)
    failed = raised.value
    assert [item for item, _ in failed.failures] == ["job-007", "job-008"]
    assert set(failed.errors) == {"job-007", "job-008"}
    assert all(isinstance(e, Unparsable) for e in failed.errors.values())
    assert str(failed.errors["job-008"]) == "cannot parse job-008"
    assert failed.__cause__ is failed.errors["job-007"]


def test_work_keeps_the_traceback_as_the_attempts_log(sq_env: dict[str, str]) -> None:
    with Queue("ops-work") as queue:
        queue.enqueue(["job-007"])
        for item in queue.work():
            with item:
                _parse(item.item)
    shown = _logs(sq_env, "ops-work", 1)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback (most recent call last)" in shown.stdout
    assert "in _parse" in shown.stdout
    assert shown.stdout.rstrip().endswith("Unparsable: cannot parse job-007")
    assert "no output was recorded" not in shown.stderr


def test_map_keeps_each_attempts_traceback(sq_env: dict[str, str]) -> None:
    with pytest.raises(statequeue.MapFailed):
        statequeue.map(_parse, ["job-001"], queue="ops-map-logs", retries=1, retry_delay=0)
    for attempt in (1, 2):
        shown = subprocess.run(
            [STATEQUEUE, "-q", "ops-map-logs", "logs", "1", "--attempt", str(attempt)],
            env=sq_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Unparsable: cannot parse job-001" in shown.stdout, (attempt, shown.stderr)


def test_map_traceback_is_stored_on_postgresql(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(statequeue.MapFailed):
        statequeue.map(_parse, ["job-002"], queue="ops-pg", store=pg_url)
    env = dict(sq_env, STATEQUEUE_STORE=pg_url, STATEQUEUE_HOME=str(tmp_path / "other-host"))
    shown = _logs(env, "ops-pg", 1)
    assert "Unparsable: cannot parse job-002" in shown.stdout, shown.stderr
