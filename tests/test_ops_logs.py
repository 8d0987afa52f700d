"""Issue 26, point 4: reading every item's output at once (`logs --all`,
streamed), and `compact --keep-logs` removing the logs of archived items."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from statequeue import Queue
from statequeue.cli.logs_all import write_all_logs
from tests.conftest import STATEQUEUE

# Item 3 fails; every item writes two lines, one to stderr.
JOB = 'echo "out $1"; echo "err $1" >&2; [ "$1" != c ]'


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120)


def _ran(env: dict[str, str], *items: str) -> None:
    subprocess.run(
        [STATEQUEUE, "enqueue"], env=env, input="\n".join(items) + "\n", text=True, check=True
    )
    _sq(env, "run", "--", "sh", "-c", JOB, "sh", "{}")


def test_logs_all_in_item_order_tagged_and_by_state(sq_env: dict[str, str]) -> None:
    _ran(sq_env, "a", "b", "c", "d e")
    every = _sq(sq_env, "logs", "--all")
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines() == [
        f"{x} {i}" for i in ("a", "b", "c", "d e") for x in ("out", "err")
    ]
    tagged = _sq(sq_env, "logs", "--all", "--tag", "--state", "done")
    assert tagged.stdout.splitlines() == [
        f"{i}\t{x} {i}" for i in ("a", "b", "d e") for x in ("out", "err")
    ]
    failed = _sq(sq_env, "logs", "--all", "--json", "--state", "failed")
    rows = [json.loads(line) for line in failed.stdout.splitlines()]
    assert rows == [
        {
            "schema": 1,  # as every read command's --json objects (help commands)
            "id": 3,
            "item": "c",
            "state": "failed",
            "attempt": 1,
            "output": "out c\nerr c\n",
        }
    ]


def test_logs_of_one_item_as_json(sq_env: dict[str, str]) -> None:
    """`logs ID --json` was refused ("--json goes with --all") while the help
    says every read command takes --json: one object, as --all writes each."""
    _ran(sq_env, "a", "c")
    out = _sq(sq_env, "logs", "2", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "schema": 1,
        "id": 2,
        "item": "c",
        "state": "failed",
        "attempt": 1,
        "output": "out c\nerr c\n",
    }
    by_text = _sq(sq_env, "logs", "--item", "a", "--json", "--attempt", "1")
    assert json.loads(by_text.stdout)["output"] == "out a\nerr a\n"
    missing = _sq(sq_env, "logs", "1", "--json", "--attempt", "2")
    assert (missing.returncode, missing.stdout) == (7, "")
    followed = _sq(sq_env, "logs", "1", "--json", "--follow")
    assert followed.returncode == 2 and "--follow" in followed.stderr


def test_logs_all_refuses_an_id_and_logs_needs_one(sq_env: dict[str, str]) -> None:
    _ran(sq_env, "a")
    for args in (
        ["logs", "--all", "1"],
        ["logs"],
        ["logs", "1", "--tag"],
        ["logs", "--all", "--follow"],
    ):
        out = _sq(sq_env, *args)
        assert out.returncode == 2 and out.stdout == "", (args, out)
        assert len(out.stderr.splitlines()) == 1, (args, out.stderr)


class _Watched:
    """A Queue seen by write_all_logs, counting the logs read before each write."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.read = 0
        self.read_at_first_write: int | None = None

    def iter_items(self, state: Any = None) -> Iterator[Any]:
        return self.queue.iter_items(state)

    def read_log(self, item_id: int, attempt: int) -> bytes | None:
        self.read += 1
        return self.queue.read_log(item_id, attempt)

    def write(self, data: bytes) -> int:
        if self.read_at_first_write is None:
            self.read_at_first_write = self.read
        return len(data)


def test_logs_all_streams_each_log_as_it_is_read(sq_env: dict[str, str]) -> None:
    _ran(sq_env, *[f"i{n}" for n in range(30)])
    with Queue() as queue:
        watched = _Watched(queue)
        written = write_all_logs(
            cast(Queue, watched), cast(Any, watched), state=None, tag=False, as_json=False
        )
    assert written == 30 and watched.read == 30
    assert watched.read_at_first_write == 1  # the first log is out before the second is read


def _logs(home: Path) -> list[str]:
    return sorted(os.listdir(home / "default" / "logs"))


def test_compact_removes_archived_logs_once_old(sq_env: dict[str, str], sq_home: Path) -> None:
    _ran(sq_env, "a", "b", "c")  # c fails: not archived, its log always stays
    assert _logs(sq_home) == ["1.1.log", "2.1.log", "3.1.log"]
    kept = _sq(sq_env, "compact")  # the default keeps them 7 days
    assert kept.returncode == 0 and "removed" not in kept.stdout, kept
    assert _logs(sq_home) == ["1.1.log", "2.1.log", "3.1.log"]
    week_ago = time.time() - 8 * 86400
    for name in ("1.1.log", "3.1.log"):
        os.utime(sq_home / "default" / "logs" / name, (week_ago, week_ago))
    old = _sq(sq_env, "compact", "--json")
    assert json.loads(old.stdout)["logs_removed"] == 1
    assert _logs(sq_home) == ["2.1.log", "3.1.log"]
    now = _sq(sq_env, "compact", "--keep-logs", "0")
    assert "removed 1 log of archived items" in now.stdout, now.stdout
    assert _logs(sq_home) == ["3.1.log"]
    assert _sq(sq_env, "logs", "3").stdout == "out c\nerr c\n"


def test_compact_removes_archived_logs_on_postgresql(pg_url: str, sq_env: dict[str, str]) -> None:
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    _ran(env, "a", "b", "c")  # c fails: not archived, its log stays
    kept = _sq(env, "compact", "--json")
    assert json.loads(kept.stdout)["logs_removed"] == 0, kept
    now = _sq(env, "compact", "--keep-logs", "0", "--json")
    assert json.loads(now.stdout)["logs_removed"] == 2, now
    assert _sq(env, "logs", "1").stdout == ""
    assert _sq(env, "logs", "3").stdout == "out c\nerr c\n"
