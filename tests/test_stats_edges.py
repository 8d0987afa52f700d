"""Edges of `stats` found by an outside tester: durations exactly on a
histogram edge, long lists of reasons, the throughput header."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import pytest

from statequeue.api.queue import Queue
from statequeue.cli.stats_view import plain_text, throughput_rows
from statequeue.core.models import Outcome, RunnerInfo
from statequeue.stats.figures import Stats, StatsBuilder
from statequeue.stats.histogram import histogram
from statequeue.stats.sketch import QuantileSketch
from tests.conftest import STATEQUEUE


def _bins(values: list[float]) -> dict[tuple[float, float], int]:
    sketch = QuantileSketch()
    sketch.add_many(values)
    return {(lo, hi): n for lo, hi, n in histogram(sketch) if n}


def test_a_duration_on_an_edge_is_counted_in_the_bin_it_starts() -> None:
    # [from, to): 0.5 s is in 0.5-1 s, 1 s in 1-2 s, 2 s in 2-5 s, 5 s in 5-10 s.
    bins = _bins([0.5] * 3 + [1.0] * 5 + [2.0] * 7 + [5.0] * 11)
    assert bins == {(0.5, 1.0): 3, (1.0, 2.0): 5, (2.0, 5.0): 7, (5.0, 10.0): 11}


def test_durations_inside_bins_stay_there() -> None:
    bins = _bins([0.7] * 2 + [1.5] * 4 + [3.0] * 6 + [7.5] * 8)
    assert bins == {(0.5, 1.0): 2, (1.0, 2.0): 4, (2.0, 5.0): 6, (5.0, 10.0): 8}


def test_zero_durations_have_their_own_first_bin() -> None:
    bins = _bins([0.0] * 4 + [0.002] * 2)
    assert list(bins.values()) == [4, 2] and next(iter(bins))[0] == 0.0


def _queue_with_reasons(n: int) -> Queue:
    q = Queue("reasons")
    store = q.store
    runner = RunnerInfo("r", os.getpid(), "h", "", time.time())
    store.register_runner(runner)
    q.enqueue([f"x{i}" for i in range(n)])
    while (claim := store.claim(runner)) is not None:
        # Told apart by words: reasons that differ only in numbers are one group.
        word = "".join(chr(ord("a") + int(d)) for d in str(claim.item_id))
        store.finish(claim, Outcome(ok=False, reason=f"reason number {word}"))
    return q


def test_the_text_lists_the_20_most_frequent_reasons_and_counts_the_rest() -> None:
    q = _queue_with_reasons(25)
    try:
        text = plain_text(q.stats())
        figures = q.stats().to_json()
    finally:
        q.close()
    assert text.count("reason number") == 20
    assert "... and 5 more reasons (5 failed; all in --json)" in text
    assert len(figures["failures"]["reasons"]) == 25


def test_a_since_before_1970_is_every_attempt(
    sq_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _queue_with_reasons(3).close()
    done = subprocess.run(
        [STATEQUEUE, "-q", "reasons", "stats", "--since", "1e300"],
        env=sq_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    headline = done.stdout.splitlines()[0]
    assert headline.startswith("queue reasons: 3 finished attempts (") and "last" not in headline


def test_the_throughput_header_names_the_width_of_its_rows() -> None:
    from statequeue.stats.rates import ThroughputView

    view = ThroughputView(start=0.0, bucket_seconds=60.0, counts=(1,) * 120)
    stats = dataclasses.replace(_stats_of_nothing(), throughput=view, attempts=120)
    text = plain_text(stats)
    assert "10m00s rows" in text  # 120 one-minute buckets, 10 to a row
    assert len(throughput_rows(stats)) == 12


def _stats_of_nothing() -> Stats:
    return StatsBuilder(now=1000.0).build(queue="q", counts={})
