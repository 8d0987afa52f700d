"""A run that started no attempt does not become the queue's last command:
the next real run compares its command with the last one that ran something
(outside tester: `run -- true` on a queue with nothing due made the next run
warn "last run with a different command: true"). On both stores."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from statequeue import Queue
from statequeue.core.models import Outcome, RunnerInfo
from tests.conftest import STATEQUEUE

WARNING = "last run with a different command"


def _sq(env: dict[str, str], store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", store_url] if store_url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=env, capture_output=True, text=True, check=False
    )


def test_an_idle_run_does_not_replace_the_last_command(
    sq_env: dict[str, str], store_url: str
) -> None:
    real = ("sh", "-c", "exit 0")
    assert _sq(sq_env, store_url, "enqueue", "a").returncode == 0
    first = _sq(sq_env, store_url, "run", "--", *real)
    assert first.returncode == 0, first.stderr
    idle = _sq(sq_env, store_url, "run", "--", "true")  # nothing pending: no attempt
    assert idle.returncode == 0, idle.stderr
    assert WARNING not in idle.stderr  # it runs no command: no warning about it
    assert _sq(sq_env, store_url, "enqueue", "b").returncode == 0
    again = _sq(sq_env, store_url, "run", "--", *real)
    assert again.returncode == 0, again.stderr
    assert WARNING not in again.stderr, again.stderr
    # A real change of command still warns, naming the one that last ran.
    assert _sq(sq_env, store_url, "enqueue", "c").returncode == 0
    changed = _sq(sq_env, store_url, "run", "--", "true")
    assert WARNING in changed.stderr and "sh -c 'exit 0'" in changed.stderr, changed.stderr
    assert _sq(sq_env, store_url, "enqueue", "d").returncode == 0
    after = _sq(sq_env, store_url, "run", "--", *real)
    assert WARNING in after.stderr and ": true (now:" in after.stderr, after.stderr


def test_two_runners_taking_turns_record_each_command_once(sq_home: Path, store_url: str) -> None:
    """Each runner's command is noted at its first start only: two runners of
    different commands whose starts interleave leave [A, B], not A, B, A, B."""
    a = RunnerInfo("runner-a", os.getpid(), "h", "", time.time(), command=("cmd-a",))
    b = RunnerInfo("runner-b", os.getpid(), "h", "", time.time() + 1, command=("cmd-b",))
    with Queue("turns", home=sq_home, store=store_url or None) as q:
        q.enqueue([f"item-{n}" for n in range(6)])
        for runner in (a, b):
            q.store.register_runner(runner)
        assert q.store.commands() == []  # registered, nothing started yet
        for runner in (a, b, a, b, a, b):
            claim = q.store.claim(runner)
            assert claim is not None
            q.store.finish(claim, Outcome(ok=True, duration=0.1))
        assert q.store.commands() == [["cmd-a"], ["cmd-b"]]


def test_a_checkpoint_keeps_whose_commands_are_noted(sq_home: Path) -> None:
    """The journal's state restored from a checkpoint (state_export.py) still
    knows which live runners' commands are noted: their next starts add none."""
    from statequeue.store.records.state import QueueState

    a = RunnerInfo("runner-a", os.getpid(), "h", "", time.time(), command=("cmd-a",))
    b = RunnerInfo("runner-b", os.getpid(), "h", "", time.time() + 1, command=("cmd-b",))
    with Queue("turns", home=sq_home) as q:
        q.enqueue([f"item-{n}" for n in range(2)])
        for runner in (a, b):
            q.store.register_runner(runner)
            claim = q.store.claim(runner)
            assert claim is not None
        state = q.store.state  # type: ignore[attr-defined]
        copy = QueueState()
        copy.restore(*state.export())
        assert copy.commanded == {"runner-a", "runner-b"}
        assert copy.commands == [["cmd-a"], ["cmd-b"]]
