"""`stats` and `status --watch` give an ETA only while a runner is active: after
a run was killed (or ended) with items left, nothing is finishing, so they say
that no runner is active instead of an ETA from the rate of the dead run."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.models import RunnerInfo
from tests.conftest import STATEQUEUE

NO_RUNNER = "no ETA: no runner is active (3 items left)"


def _two_done(queue: Queue) -> None:
    queue.enqueue(["a", "b", "c", "d", "e"])
    for n, item in enumerate(queue.work(), 1):
        item.done()
        if n == 2:
            break  # the loop ends: its runner is gone, 3 items left


def test_stats_gives_no_eta_while_no_runner_is_active(sq_env: dict[str, str]) -> None:
    with Queue("e") as queue:
        _two_done(queue)
        figures = queue.stats()
        assert figures.rate and figures.left == 3
        assert figures.eta is None and figures.runner_active is False
        assert figures.to_json()["eta"] == {
            "left": 3,
            "seconds": None,
            "runner_active": False,
            "paused": False,
        }
    text = subprocess.run(
        [STATEQUEUE, "-q", "e", "stats"], env=sq_env, capture_output=True, text=True, check=True
    ).stdout
    rate = [line for line in text.splitlines() if line.startswith("rate:")]
    assert len(rate) == 1 and rate[0].endswith(f"; {NO_RUNNER}"), text


def test_stats_gives_the_eta_while_a_runner_is_active(sq_env: dict[str, str]) -> None:
    with Queue("e") as queue:
        _two_done(queue)
        queue.register_runner(RunnerInfo("alive", os.getpid(), "h", "", time.time()))
        figures = queue.stats()
        assert figures.runner_active is True and figures.eta == pytest.approx(3 / figures.rate)
        text = subprocess.run(
            [STATEQUEUE, "-q", "e", "stats"], env=sq_env, capture_output=True, text=True
        ).stdout
        assert "for 3 items left" in text and "no ETA" not in text, text


def test_the_watch_gives_no_eta_while_no_runner_is_active(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from statequeue.cli import watch

    def stop(seconds: float) -> None:
        raise KeyboardInterrupt  # after the first screen

    monkeypatch.setattr(watch.time, "sleep", stop)
    with Queue("w") as queue:
        _two_done(queue)
        with pytest.raises(KeyboardInterrupt):
            watch.watch_status(queue, interval=1.0, json=False)
    screen = capsys.readouterr().out
    assert NO_RUNNER in screen and "items left" not in screen.replace(NO_RUNNER, ""), screen
