"""The runner's per-item overhead (issue 14 part 1): what the keeper is sent
per item, the loop's passes, the epoll set, and the figures the bench reads.
Each test names a saving and checks that the behaviour it must keep holds."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.run import keeper_process as kp
from statequeue.run.jobs import Job
from statequeue.run.keeper import Keeper
from statequeue.run.options import RunOptions
from statequeue.run.poller import Poller
from statequeue.run.runner import Runner


def _run(queue: Queue, *command: str, **options: Any) -> Runner:
    runner = Runner(queue, RunOptions(command=command, **options))
    runner.run()
    return runner


def _journal(home: Path, name: str = "q") -> list[dict[str, Any]]:
    import orjson

    path = home / name / "journal.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


# -- the keeper is sent the run's environment once ------------------------------------


def test_the_environment_goes_to_the_keeper_once_and_each_spawn_sends_only_its_item(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    sent: list[tuple[Any, ...]] = []
    real_send = Keeper._send

    def spy(self: Keeper, request: tuple[Any, ...], fds: Any) -> None:
        sent.append(request)
        real_send(self, request, fds)

    monkeypatch.setattr(Keeper, "_send", spy)
    monkeypatch.setenv("OVERHEAD_TEST_VAR", "x" * 1000)
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        _run(q, "true")
        assert q.status().counts["done"] == 3
    environs = [r for r in sent if r[0] == kp.ENVIRON]
    spawns = [r for r in sent if r[0] == kp.SPAWN]
    assert len(environs) == 1, "the run's environment is sent once"
    assert environs[0][1]["OVERHEAD_TEST_VAR"] == "x" * 1000
    assert len(spawns) == 3
    for request in spawns:
        item_env = request[4]
        assert item_env and all(name.startswith("STATEQUEUE_") for name in item_env), item_env


def test_a_child_sees_the_run_environment_and_its_own_item_variables(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OVERHEAD_TEST_VAR", "from the run")
    values = '"$OVERHEAD_TEST_VAR" "$STATEQUEUE_ITEM" "$STATEQUEUE_ID"'
    script = f'printf "%s|%s|%s" {values} > {out}/$1'
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b"])
        _run(q, "sh", "-c", script, "sh", "{}", jobs=2)
    assert (out / "a").read_text() == "from the run|a|1"
    assert (out / "b").read_text() == "from the run|b|2"


def test_the_keeper_writes_its_cpu_time_for_the_bench_when_asked(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path, tmp_path: Path
) -> None:
    report = tmp_path / "keeper-cpu"
    monkeypatch.setenv(kp.CPU_REPORT_ENV, str(report))
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a"])
        _run(q, "true")
    deadline = time.monotonic() + 30  # the keeper exits just after the runner's goodbye
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert float(report.read_text()) > 0


# -- the loop --------------------------------------------------------------------------


def test_output_alone_does_not_make_the_loop_take_a_pass(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    passes = 0
    real_reap = Runner._reap

    def counting(self: Runner) -> None:
        nonlocal passes
        passes += 1
        real_reap(self)

    monkeypatch.setattr(Runner, "_reap", counting)
    chatty = "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo $i; sleep 0.03; done"
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a"])
        _run(q, "sh", "-c", chatty)
        [result] = list(q.results())
    assert result.state.value == "done"
    # Twelve writes, each a wakeup; only the exit (and a 1 s tick, under
    # load) makes the loop look at its slots and items again.
    assert passes < 6, passes


def test_no_claim_is_taken_with_the_last_result_once_max_time_has_run_out(
    sq_home: Path,
) -> None:
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b"])
        runner = Runner(q, RunOptions(command=("true",), max_time=60.0))
        assert runner._prefetch_scope()[0], "a slot is free and the run goes on"
        runner._max_time_at = time.monotonic() - 1.0
        assert runner._prefetch_scope() == (False, None)


def test_a_max_time_run_gives_nothing_back(sq_home: Path) -> None:
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        _run(q, "sh", "-c", "sleep 0.3", max_time=0.05)
        counts = q.status().counts
    assert (counts["done"], counts["pending"]) == (1, 2)
    # The claim is not taken with the result and then handed back (an intr
    # record, counted as an interruption in `events` and `stats`).
    assert not [r for r in _journal(sq_home) if r["t"] == "intr"]


# -- the epoll set ----------------------------------------------------------------------


def test_a_pipe_forgotten_and_closed_leaves_the_epoll_set() -> None:
    poller = Poller()
    try:
        r, w = os.pipe()
        poller.watch(r, "old")
        os.close(w)
        assert poller.ready(0) == [(r, "old")]  # end of file
        poller.forget(r)
        os.close(r)
        assert poller.ready(0) == []
        r2, w2 = os.pipe()  # likely the same numbers again
        poller.watch(r2, "new")  # no EEXIST: the close took the old one out
        assert poller.ready(0) == []
        os.write(w2, b"x")
        assert poller.ready(0) == [(r2, "new")]
        os.close(w2)
        os.close(r2)
    finally:
        poller.close()


def test_the_poller_keeps_the_selectors_interface_for_the_store_wakeup() -> None:
    poller = Poller()
    r, w = os.pipe()
    try:
        key = poller.register(r, 1, "tag")
        assert (key.fd, key.data) == (r, "tag")
        os.write(w, b"x")
        [(found, _)] = poller.select(0)
        assert (found.fd, found.data) == (r, "tag")
        assert set(poller.get_map()) == {r}
        poller.unregister(r)
        assert poller.select(0) == []
    finally:
        os.close(r)
        os.close(w)
        poller.close()


# -- the children's pipes ---------------------------------------------------------------


def test_a_short_items_pipes_are_read_at_its_exit_without_watching_them(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    watched: list[object] = []
    real_watch = Poller.watch

    def spy(self: Poller, fd: int, tag: Any) -> None:
        watched.append(tag)
        real_watch(self, fd, tag)

    monkeypatch.setattr(Poller, "watch", spy)
    # Longer than the delay, never: a watch on a pipe costs a syscall, and its
    # end of file a wakeup of the runner, per item.
    monkeypatch.setattr("statequeue.run.output_watch.OUTPUT_WATCH_DELAY", 3600.0)
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        _run(q, "sh", "-c", 'echo "out $1"; echo "err $1" >&2', "sh")
        results = {r.item: r for r in q.results()}
    assert not [tag for tag in watched if isinstance(tag, Job)]
    assert {item: r.state.value for item, r in results.items()} == dict.fromkeys("abc", "done")
    log = (sq_home / "q" / "logs" / "2.1.log").read_bytes()
    assert b"out b" in log and b"err b" in log  # read at the exit all the same


def test_a_child_that_fills_its_pipe_before_it_is_watched_goes_on(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    monkeypatch.setattr("statequeue.run.output_watch.OUTPUT_WATCH_DELAY", 0.2)
    big = "head -c 300000 /dev/zero | tr '\\0' x; echo; echo tail-of-stderr >&2"
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a"])
        # --timeout: were the pipe never read, the child would block for good.
        _run(q, "sh", "-c", big, timeout=60.0)
        [result] = list(q.results())
    assert result.state.value == "done", result.reason
    log = (sq_home / "q" / "logs" / "1.1.log").read_bytes()
    assert log.count(b"x") == 300000
    assert b"tail-of-stderr" in log


# -- the keeper's reports ---------------------------------------------------------------


class _Sock:
    """A socket that notes each message sent."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def test_exits_found_together_go_to_the_runner_in_one_message() -> None:
    sock = _Sock()
    keeper = kp.KeeperProcess(sock, "q")  # type: ignore[arg-type]  # only sendall is used
    keeper.report([(1, 0), (2, 3), (3, -9)])
    assert len(sock.sent) == 1, "one wakeup of the runner for the three exits"
    found = list(kp.REPLY.iter_unpack(sock.sent[0]))
    assert found == [(kp.EXITED, 1, 0), (kp.EXITED, 2, 3), (kp.EXITED, 3, -9)]
    keeper.report([])
    assert len(sock.sent) == 1, "nothing to say: no message"


def test_unregistering_an_fd_its_owner_closed_already_is_no_error() -> None:
    # A store's wake-up fd (PostgreSQL LISTEN) goes away with a dropped
    # connection before the runner lets go of it, as selectors allows.
    poller = Poller()
    try:
        r, w = os.pipe()
        poller.register(r, 1, "wake")
        os.close(r)
        os.close(w)
        key = poller.unregister(r)
        assert key.data == "wake"
        assert poller.get_map() == {}
    finally:
        poller.close()
