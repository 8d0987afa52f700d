"""Issue 23: `statequeue run --persistent` on the journal store, with real processes.

Results and logs per item, a worker killed -9 mid-item, a worker that dies
at start, a timeout, each kind of bad reply, recycling, a non-UTF-8 item, and
the usage errors. The worker is tests/persistent_worker.py, run by the real
CLI in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE
from tests.persistent_worker import write_worker
from tests.waiting import until

RUN_TIMEOUT = 120


def _enqueue(sq_home: Path, items: list[str]) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(items)


def _run(
    env: dict[str, str], worker: str, marks: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    argv = [STATEQUEUE, "run", "--persistent", *options, "--", sys.executable, worker, str(marks)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


def _items(sq_home: Path) -> dict[str, tuple[ItemState, int, str]]:
    with Queue(home=sq_home) as q:
        return {v.item: (v.state, v.attempts, v.reason) for v in q.items()}


def _result(sq_home: Path, item: str) -> dict[str, object]:
    with Queue(home=sq_home) as q:
        found = q.result(item)
    assert found is not None
    assert isinstance(found.result, dict)
    return found.result


def _log(sq_home: Path, item: str, attempt: int = 1) -> str:
    with Queue(home=sq_home) as q:
        found = q.result(item)
        assert found is not None
        data = q.read_log(found.item_id, attempt)
    return (data or b"").decode()


@pytest.fixture
def worker(tmp_path: Path) -> tuple[str, Path]:
    return write_worker(tmp_path)


def test_one_worker_per_slot_runs_every_item_and_each_log_holds_its_own_output(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    items = [f"ok-{i}" for i in range(12)] + ["fail-1"]
    _enqueue(sq_home, items)
    done = _run(sq_env, *worker, "-j2")
    assert done.returncode == ExitCode.FAILED, done.stderr  # fail-1
    states = _items(sq_home)
    assert all(states[i][:2] == (ItemState.DONE, 1) for i in items[:-1])
    assert states["fail-1"] == (ItemState.FAILED, 1, "asked to fail")
    pids = {_result(sq_home, i)["pid"] for i in items[:-1]}
    assert 1 <= len(pids) <= 2  # one worker per slot, started once
    for item in items:
        log = _log(sq_home, item)
        # The item's own prints, and no other item's.
        assert f"out {item}\n" in log and f"err {item}\n" in log, log
        others = [i for i in items if i != item and f"out {i}\n" in log]
        assert not others, log


def test_a_worker_killed_mid_item_interrupts_only_that_item_which_runs_again(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    program, marks = worker
    _enqueue(sq_home, ["ok-1", "slow-1", "ok-2"])
    argv = [STATEQUEUE, "run", "--persistent", "--", sys.executable, program, str(marks)]
    with subprocess.Popen(argv, env=sq_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        pid_file = marks / "slow-1.pid"
        pid = until(lambda: pid_file.exists() and pid_file.read_text().split(), "slow-1 to start")
        os.kill(int(pid[0]), signal.SIGKILL)  # type: ignore[index]
        _, err = run.communicate(timeout=RUN_TIMEOUT)
    assert run.returncode == 0, err
    states = _items(sq_home)
    # ok-1 ran once, before; ok-2 once, after; slow-1 was interrupted (a
    # crash), then ran again on a new worker, told it was interrupted.
    assert states["ok-1"][:2] == (ItemState.DONE, 1)
    assert states["ok-2"][:2] == (ItemState.DONE, 1)
    assert states["slow-1"][:2] == (ItemState.DONE, 2), err
    retried = _result(sq_home, "slow-1")
    assert retried["interrupted"] is True and retried["attempt"] == 2
    assert retried["pid"] != int(pid[0])  # type: ignore[index]
    with Queue(home=sq_home) as q:
        history = q.history("slow-1")
    assert "persistent worker was killed by signal 9" in str(history)
    assert not (marks / "overlap").exists()


def test_a_worker_that_dies_mid_item_is_replaced_and_the_item_retried(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    """The retry goes to a new worker with "interrupted": true; after
    --max-crashes the item is held as poison, and the run goes on."""
    _enqueue(sq_home, ["ok-1", "die-1", "ok-2"])
    done = _run(sq_env, *worker, "--max-crashes", "2")
    states = _items(sq_home)
    assert states["ok-1"][:2] == (ItemState.DONE, 1)
    assert states["ok-2"][:2] == (ItemState.DONE, 1)
    assert states["die-1"][:2] == (ItemState.HELD, 2), done.stderr
    assert "poison" in states["die-1"][2]
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert _result(sq_home, "ok-1")["pid"] != _result(sq_home, "ok-2")["pid"]


def test_a_worker_that_dies_at_start_twice_stops_the_run_with_its_exit_code(
    sq_home: Path, sq_env: dict[str, str]
) -> None:
    _enqueue(sq_home, ["a", "b", "c", "d"])
    argv = [STATEQUEUE, "run", "--persistent", "--", "sh", "-c", "exit 5"]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == ExitCode.WORKER_BROKEN, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("statequeue: the persistent worker exited before replying"), last
    states = _items(sq_home)
    # The item in flight (given to both workers in turn) counts nothing:
    # neither worker read its request (nothing of it ran); nor does any other.
    assert [states[i][:2] for i in "abcd"] == [
        (ItemState.PENDING, 0),
        (ItemState.PENDING, 0),
        (ItemState.PENDING, 0),
        (ItemState.PENDING, 0),
    ]


def test_a_timeout_stops_the_worker_records_timed_out_and_a_new_worker_goes_on(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    _enqueue(sq_home, ["ok-1", "hang-1", "ok-2"])
    done = _run(sq_env, *worker, "--timeout", "1s", "--grace", "1s")
    assert done.returncode == ExitCode.FAILED, done.stderr
    states = _items(sq_home)
    assert states["hang-1"][0] is ItemState.FAILED
    assert states["hang-1"][2].startswith("timed out after 1s"), states["hang-1"]
    assert states["ok-2"][:2] == (ItemState.DONE, 1)
    assert _result(sq_home, "ok-1")["pid"] != _result(sq_home, "ok-2")["pid"]
    hung = int((worker[1] / "hang-1.pid").read_text())
    assert not Path(f"/proc/{hung}").exists() or "Z" in Path(f"/proc/{hung}/stat").read_text()


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("notjson-1", "reply is not JSON: 'this is not json'"),
        ("otherid-1", "reply names id 1002, not 2"),
    ],
)
def test_a_bad_reply_fails_the_attempt_saying_what_was_wrong_and_replaces_the_worker(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path], item: str, says: str
) -> None:
    _enqueue(sq_home, ["ok-1", item, "ok-2"])
    done = _run(sq_env, *worker)
    assert done.returncode == ExitCode.FAILED, done.stderr
    states = _items(sq_home)
    assert states[item][0] is ItemState.FAILED
    assert states[item][2] == f"bad reply from the persistent worker: {says}", states[item]
    assert states["ok-2"][:2] == (ItemState.DONE, 1)
    assert _result(sq_home, "ok-1")["pid"] != _result(sq_home, "ok-2")["pid"]


def test_recycle_after_n_items_starts_a_new_worker_every_n(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    items = [f"ok-{i}" for i in range(7)]
    _enqueue(sq_home, items)
    done = _run(sq_env, *worker, "--recycle-after", "3")
    assert done.returncode == 0, done.stderr
    pids = [_result(sq_home, i)["pid"] for i in items]
    assert pids[0] == pids[1] == pids[2] != pids[3]
    assert pids[3] == pids[4] == pids[5] != pids[6]


def test_recycle_rss_replaces_a_worker_that_grew_past_the_size(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    _enqueue(sq_home, ["ok-1", "ok-2", "grow-1", "ok-3", "ok-4"])
    done = _run(sq_env, *worker, "--recycle-rss", "48M")
    assert done.returncode == 0, done.stderr
    pid = {i: _result(sq_home, i)["pid"] for i in ["ok-1", "ok-2", "grow-1", "ok-3", "ok-4"]}
    assert pid["ok-1"] == pid["ok-2"] == pid["grow-1"] != pid["ok-3"] == pid["ok-4"]


def test_a_non_utf8_item_comes_as_item_b64_only(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    raw = b"caf\xe9-\xff.txt"
    _enqueue(sq_home, [os.fsdecode(raw)])
    done = _run(sq_env, *worker)
    assert done.returncode == 0, done.stderr
    with Queue(home=sq_home) as q:
        found = q.result(1)
    assert found is not None
    assert found.result == {"hex": raw.hex(), "has_item": False}


@pytest.mark.parametrize("arg", ["{}", "{.}", "{#}", "x{/}y"])
def test_a_replacement_string_in_a_persistent_command_is_a_usage_error(
    sq_home: Path, sq_env: dict[str, str], arg: str
) -> None:
    _enqueue(sq_home, ["a"])
    argv = [STATEQUEUE, "run", "--persistent", "--", "echo", arg]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == ExitCode.USAGE
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--persistent: the command may not hold" in lines[0], lines
    assert _items(sq_home)["a"][:2] == (ItemState.PENDING, 0)


def test_the_slot_is_the_one_replacement_a_persistent_command_may_hold(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "w.sh"
    script.write_text(
        'while read -r line; do id=${line#*\\"id\\":}; id=${id%%,*}\n'
        'printf \'{"id":%s,"ok":true,"result":"%s"}\\n\' "$id" "$1" >&"$STATEQUEUE_REPLY_FD"\n'
        "done\n"
    )
    _enqueue(sq_home, ["a", "b"])
    argv = [STATEQUEUE, "run", "--persistent", "--", "sh", str(script), "slot{%}"]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    with Queue(home=sq_home) as q:
        assert [r.result for r in q.store.results()] == ["slot1", "slot1"]


def test_a_failed_item_is_retried_on_the_same_worker_once_it_answered(
    sq_home: Path, sq_env: dict[str, str], worker: tuple[str, Path]
) -> None:
    """The worker that answered is no process of the item any more: its
    claim is let go, so the retry is not held back by the worker that lives on."""
    _enqueue(sq_home, ["fail-1"])
    done = _run(sq_env, *worker, "--retries", "2", "--retry-delay", "0")
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert _items(sq_home)["fail-1"] == (ItemState.FAILED, 3, "asked to fail")
    pids = (worker[1] / "fail-1.pid").read_text().split()
    assert len(pids) == 3 and len(set(pids)) == 1


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--recycle-after", "5"], "--recycle-after and --recycle-rss need --persistent"),
        (["--persistent", "--stdin"], "--persistent and --stdin do not go together"),
        (["--persistent", "--recycle-after", "0"], "--recycle-after must be at least 1"),
        (["--persistent", "--recycle-rss", "lots"], "--recycle-rss must be a size such as"),
        (["--persistent", "--recycle-rss", "0M"], "--recycle-rss must be a size such as"),
    ],
)
def test_persistent_option_misuse_is_a_one_line_usage_error(
    sq_home: Path, sq_env: dict[str, str], options: list[str], says: str
) -> None:
    _enqueue(sq_home, ["a"])
    argv = [STATEQUEUE, "run", *options, "--", "cat"]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == ExitCode.USAGE
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert _items(sq_home)["a"][:2] == (ItemState.PENDING, 0)


def test_recycle_rss_sizes() -> None:
    from statequeue.run.options import parse_size

    assert parse_size("512", "-x") == 512
    assert parse_size("1.5k", "-x") == 1536
    assert parse_size("2G", "-x") == 2 << 30
    assert parse_size("300MiB", "-x") == 300 << 20
    assert parse_size("300MB", "-x") == 300 << 20


def test_a_request_larger_than_a_default_pipe_reaches_a_slow_reader_whole(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    """An item near the 64 KiB limit, JSON-escaped to several times that, to a
    worker that has not started reading yet: not taken for one that never reads."""
    slow = tmp_path / "slow.py"
    slow.write_text(
        "import json, os, sys, time\n"
        "time.sleep(0.5)\n"
        "reply = os.fdopen(int(os.environ['STATEQUEUE_REPLY_FD']), 'w')\n"
        "for line in sys.stdin:\n"
        "    req = json.loads(line)\n"
        "    reply.write(json.dumps({'id': req['id'], 'ok': True, 'result': len(req['item'])}))\n"
        "    reply.write('\\n'); reply.flush()\n"
    )
    item = "\x01" * 60000  # 6 bytes each in JSON: 360 kB
    _enqueue(sq_home, [item])
    argv = [STATEQUEUE, "run", "--persistent", "--", sys.executable, str(slow)]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    with Queue(home=sq_home) as q:
        found = q.result(1)
    assert found is not None and found.result == 60000
