"""`status --watch` shows the rate and ETA `stats` gives, also after a
compaction moved finished items to the archive (a finding of the outside
tester: the watch counted only what the live journal still held)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.models import RunnerInfo
from statequeue.stats.rates import LiveRate
from tests.test_stats_cache import _run


def test_the_watch_rate_is_stats_rate_after_a_compaction(sq_home: Path) -> None:
    q = Queue("w")
    try:
        _run(q, 30, seed=1)
        q.compact()  # the 30 finished items go to the archive
        _run(q, 10, seed=2)
        live = LiveRate(q.store)
        live.update()
        now = time.time()
        stats = q.stats(now=now)
        assert stats.recent_finishes == 40
        assert live.recent.count(now) == stats.recent_finishes
        assert live.rate(now) == stats.rate
    finally:
        q.close()


def test_the_watch_screen_shows_one_rate_line(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """status's own one-minute rate is left out of the watch screen: one rate, one ETA."""
    from statequeue.cli import render, watch

    q = Queue("w1")
    try:
        _run(q, 20, seed=3)
        q.enqueue(["left-1", "left-2"])
        runner = RunnerInfo("watched", os.getpid(), "h", "", time.time())
        q.store.register_runner(runner)  # a runner at work: status shows its own rate
        assert q.status().rate
        assert "rate:" in render.status_text(q.status())

        def stop(seconds: float) -> None:
            raise KeyboardInterrupt  # after the first screen

        monkeypatch.setattr(watch.time, "sleep", stop)
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C goes on up: exit 130
            watch.watch_status(q, interval=1.0, json=False)
    finally:
        q.close()
    screen = capsys.readouterr().out
    rates = [line for line in screen.splitlines() if line.startswith("rate:")]
    assert len(rates) == 1 and "over the last" in rates[0], screen


def test_the_watch_says_the_eta_is_paused_while_the_queue_is(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from statequeue.cli import watch

    q = Queue("w2")
    try:
        _run(q, 10, seed=4)
        q.enqueue(["left-1"])
        q.pause()

        def stop(seconds: float) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(watch.time, "sleep", stop)
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C goes on up: exit 130
            watch.watch_status(q, interval=1.0, json=False)
    finally:
        q.close()
    screen = capsys.readouterr().out
    assert "ETA paused (1 item left)" in screen and "ETA 0" not in screen
