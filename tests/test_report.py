"""`statequeue report` (issue 25): the report model (counts, grouping,
percentiles, downsampling that keeps outliers) on the journal, memory and
PostgreSQL stores, on a running queue, and the command's output and errors.
The page in a real browser is tests/test_report_browser.py."""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import Outcome, RunnerInfo
from statequeue.stats.attempts import Attempt, batches_of
from statequeue.stats.report_fold import (
    TIMELINE_LIMIT,
    TIMELINE_OUTLIERS,
    TIMELINE_UNSUCCESSFUL,
    ReportFold,
)
from statequeue.stats.report_model import DONE, FAILED, INTERRUPTED, RETRIED, Report
from tests.conftest import STATEQUEUE
from tests.test_stats import ALPHA, Expected, fill
from tests.waiting import until


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


def check_report(r: Report, want: Expected) -> None:
    """What tests/test_stats.py's ``fill`` put in, as the report shows it."""
    f = r.figures
    assert r.counts["done"] == 31 and r.counts["failed"] == 7 and r.counts["held"] == 1
    assert r.success_rate == pytest.approx(31 / 38)
    assert f.attempts == 40
    assert f.kinds[DONE] == 31 and f.kinds[FAILED] == 7
    assert f.kinds[RETRIED] == 1 and f.kinds[INTERRUPTED] == 1
    groups = {g.reason: (g.count, g.examples) for g in f.failures}
    assert groups == {
        "exit code 1": (4, ("item-31", "item-32", "item-33")),
        "timed out": (2, ("item-35", "item-36")),
        "killed by SIGKILL": (1, ("item-37",)),
        "exit code 2": (1, ("item-38",)),
        "interrupted": (1, ("item-39",)),
    }
    for g in f.failures:
        assert g.first_seen is not None and g.last_seen is not None
        assert g.first_seen <= g.last_seen
    h = f.histogram
    assert sum(h.done) == 31 and sum(h.failed) == 8  # the crash has no duration
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        want_q = _nearest_rank(want.durations, q)
        assert h.quantiles[name] == pytest.approx(want_q, rel=ALPHA), name
    assert [(s.item_id, s.attempt, s.value, s.text) for s in f.slowest[:2]] == [
        (38, 2, 10.0, "item-38"),
        (30, 1, 3.0, "item-30"),
    ]
    assert [(m.item_id, m.attempt, m.text, m.state) for m in f.most_retried] == [
        (38, 2, "item-38", "done")
    ]
    assert [(i.item_id, i.text, i.state) for i in f.interrupted] == [(39, "item-39", "held")]
    assert f.interrupted_total == 1
    assert {name: n for name, _, n in f.runners} == {
        name: n for name, (n, _) in want.per_runner.items()
    }
    assert set(r.hosts) == {"host-1", "host-2"}
    assert f.timeline.total == f.timeline.shown == 40
    assert sum(sum(row) for row in f.throughput.counts) == 40  # type: ignore[union-attr]
    assert r.wall_seconds is not None and r.wall_seconds >= 10.0  # item 38 took 10 s


def test_journal_report_counts_groups_and_percentiles_also_once_archived() -> None:
    want = fill(lambda: Queue("known"))
    q = Queue("known")
    check_report(q.report(), want)
    assert q.report().store == "journal"
    assert q.compact().archived == 31
    check_report(Queue("known").report(), want)


def test_the_report_counts_deferrals_apart_from_failures(sq_env: dict[str, str]) -> None:
    """Issue 24 in the report: an item that asked to be tried later is a
    deferral, named on the page, not a failure."""
    import statequeue

    with Queue("later") as q:
        q.enqueue(["a", "b"])
        asked: set[str] = set()
        for item in q.work(max_deferrals=5):
            with item:
                if item.item == "a" and "a" not in asked:
                    asked.add("a")
                    raise statequeue.TryLater(0)
        report = q.report()
    assert report.deferred == 1 and report.counts["done"] == 2, report
    assert report.figures.kinds[FAILED] == 0
    page = subprocess.run(
        [STATEQUEUE, "-q", "later", "report", "-o", "-"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "1 deferrals (exit 75: try later)" in page


def test_memory_store_report() -> None:
    from statequeue.store.memory import MemoryStore
    from tests.test_stats import _CrashOnClose

    store = MemoryStore("mem")
    shared = Queue(store=store)
    want = fill(lambda: _CrashOnClose(store, shared))
    r = shared.report()
    assert r.store == "memory"
    check_report(r, want)


def test_postgres_report(pg_url: str, sq_env: dict[str, str]) -> None:
    pytest.importorskip("psycopg")
    queues: list[Queue] = []

    def open_pg() -> Queue:
        queues.append(Queue("pgreport", store=pg_url))
        return queues[-1]

    want = fill(open_pg)
    r = queues[0].report()
    assert r.store == "postgres"
    check_report(r, want)
    done = _sq(sq_env, "--store", pg_url, "-q", "pgreport", "report", "-o", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("<svg") == 3 and "item-38" in done.stdout


def _attempt(
    item_id: int, ended_at: float, duration: float, *, ok: bool = True, runner: str = "r"
) -> Attempt:
    state = "done" if ok else "failed"
    reason = "" if ok else "exit code 3"
    exit_code = 0 if ok else 3
    return Attempt(
        item_id, 1, state, ok, duration, reason, exit_code, None, False, runner, "h", ended_at
    )


def _fold(attempts: list[Attempt], cutoff: float | None = None) -> Any:
    fold = ReportFold(cutoff=cutoff)
    fold.add_all(batches_of(attempts, size=997))  # batch edges fall anywhere
    return fold.build()


def test_percentiles_are_nearest_rank_within_the_sketch_error() -> None:
    attempts = [_attempt(i, 1000.0 + i, float(i)) for i in range(1, 101)]
    failed = [_attempt(i, 2000.0 + i, 1000.0, ok=False) for i in range(101, 111)]
    h = _fold(attempts + failed).histogram
    assert h.quantiles == {
        "p50": pytest.approx(50.0, rel=ALPHA),
        "p90": pytest.approx(90.0, rel=ALPHA),
        "p99": pytest.approx(99.0, rel=ALPHA),
    }
    assert sum(h.done) == 100 and sum(h.failed) == 10
    # Each duration lands in the bin that holds it (within the sketch's error).
    assert h.edges[0] <= 1.0 and h.edges[-1] >= 1000.0
    last = max(j for j, n in enumerate(h.failed) if n)
    assert h.edges[last] <= 1000.0 * (1 + ALPHA) and h.edges[last + 1] >= 1000.0 * (1 - ALPHA)


def test_downsampled_timeline_keeps_the_slowest_and_the_failed_attempts() -> None:
    n = 20_000
    slow = {4321: 500.0, 9000: 450.0, 17_777: 400.0}
    failed = set(range(100, 20_000, 400))  # 50 failures
    attempts = [
        _attempt(i, 1000.0 + i, slow.get(i, 0.5), ok=i not in failed, runner=f"r{i % 3}")
        for i in range(1, n + 1)
    ]
    f = _fold(attempts)
    t = f.timeline
    assert t.total == n and t.shown < n
    assert t.shown <= TIMELINE_LIMIT
    shown = {b.item_id for b in t.bars}
    assert set(slow) <= shown
    assert failed <= shown
    # Past the outliers kept, the rest is sampled through the whole run.
    assert len(shown) > TIMELINE_OUTLIERS + TIMELINE_UNSUCCESSFUL
    assert min(shown) < n / 10 and max(shown) > n * 0.9
    # Lanes belong to runners, a runner's lanes together; no two bars in one lane overlap.
    slots = [(name.split(" #")[0], int(name.split(" #")[1])) for name in t.lanes]
    assert slots == sorted(slots)
    lanes: dict[int, list[tuple[float, float]]] = {}
    for b in t.bars:
        assert t.lanes[b.lane].startswith(f"r{b.item_id % 3} ")
        lanes.setdefault(b.lane, []).append((b.start, b.end))
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in pairwise(spans))
    assert [s.item_id for s in f.slowest[:3]] == [4321, 9000, 17_777]
    assert sum(sum(row) for row in f.throughput.counts) == n


def test_a_small_run_is_not_downsampled() -> None:
    attempts = [_attempt(i, 1000.0 + i, 1.0) for i in range(1, TIMELINE_LIMIT + 1)]
    t = _fold(attempts).timeline
    assert t.shown == t.total == TIMELINE_LIMIT


def test_since_keeps_only_attempts_that_ended_in_the_window() -> None:
    attempts = [_attempt(i, float(i), 1.0) for i in range(1, 101)]
    f = _fold(attempts, cutoff=90.0)
    assert f.attempts == 11 and f.timeline.total == 11
    fill(lambda: Queue("window"))
    q = Queue("window")
    assert q.report(since=3600).figures.attempts == 40
    assert q.report(since=60, now=time.time() + 3600).figures.attempts == 0


def _sq(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def test_report_of_a_running_queue(sq_env: dict[str, str], tmp_path: Path) -> None:
    """A real `statequeue run` holds item 2 (its command waits for a file)
    while `report` reads the queue: the page shows it running and the
    finished attempt; the run then goes on unharmed."""
    gate = tmp_path / "gate"
    assert _sq(sq_env, "-q", "live", "enqueue", "one", "two").returncode == 0
    script = f'[ "$1" = one ] || while [ ! -e {gate} ]; do sleep 0.05; done'
    runner = subprocess.Popen(
        [STATEQUEUE, "-q", "live", "run", "--", "sh", "-c", script, "sh", "{}"],
        env=sq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        q = Queue("live")
        until(
            lambda: q.status().counts.get("running") == 1 and q.status().counts["done"] == 1,
            "item one done and item two running",
        )
        out = tmp_path / "live.html"
        done = _sq(sq_env, "-q", "live", "report", "-o", str(out))
        assert done.returncode == 0, done.stderr
        page = out.read_text()
        assert re.search(r"<b>1</b>running", page) and re.search(r"<b>1</b>done", page)
        r = q.report()
        assert r.active_runners == 1 and r.figures.attempts == 1
        assert r.commands and "sh -c" in r.commands[-1]
        gate.touch()
        assert runner.wait(timeout=60) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert Queue("live").status().counts["done"] == 2


def test_default_path_stdout_and_a_self_contained_page(
    sq_env: dict[str, str], tmp_path: Path
) -> None:
    fill(lambda: Queue("cli"))
    done = _sq(sq_env, "-q", "cli", "report", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cli-report.html"
    page = (tmp_path / "cli-report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 3
    # Nothing is fetched: no external script, style, font, image or link.
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", page)
    urls = set(re.findall(r"https?://[^\"' )]+", page))
    assert urls == {"http://www.w3.org/2000/svg"}  # a namespace name, never fetched
    assert "@media (prefers-color-scheme:dark)" in page and "@media print" in page
    # Attempts by outcome, beside the item-state cards: a held item's last
    # attempt ended "interrupted", so a bare "attempts: 0 held" read as a contradiction.
    assert "<dt>attempts, by how each ended</dt>" in page
    streamed = _sq(sq_env, "-q", "cli", "report", "-o", "-", "--since", "1d")
    assert streamed.returncode == 0 and streamed.stdout.startswith("<!DOCTYPE html>")


def test_item_texts_are_escaped(sq_env: dict[str, str], tmp_path: Path) -> None:
    q = Queue("esc")
    q.enqueue(['<img src=x onerror="alert(1)">'])
    runner = RunnerInfo("runner-x", os.getpid(), "host", "", time.time())
    q.store.register_runner(runner)
    claim = q.store.claim(runner)
    assert claim is not None
    q.store.finish(claim, Outcome(ok=False, duration=0.5, reason="<b>bad</b> & worse"))
    q.close()
    out = tmp_path / "esc.html"
    assert _sq(sq_env, "-q", "esc", "report", "-o", str(out)).returncode == 0
    page = out.read_text()
    assert "<img" not in page and "<b>bad" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "&lt;b&gt;bad&lt;/b&gt; &amp; worse" in page


def _journal_bytes(home: Path, name: str) -> dict[str, bytes]:
    folder = home / name
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_bad_input_one_line_documented_code_no_change(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    fill(lambda: Queue("bad"))
    before = _journal_bytes(sq_home, "bad")
    cases = [
        (["-q", "nosuch", "report", "-o", str(tmp_path / "a.html")], ExitCode.NOT_FOUND),
        (["-q", "bad", "report", "--since", "soon"], ExitCode.USAGE),
        (["-q", "bad", "report", "--since", "-5m"], ExitCode.USAGE),
        (["-q", "bad", "report", "-o", str(tmp_path / "no" / "dir.html")], ExitCode.NOT_FOUND),
        (["-q", "bad", "report", "-o", str(tmp_path)], ExitCode.USAGE),
    ]
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere: the missing folder stands for it
        cases.append((["-q", "bad", "report", "-o", str(locked / "x.html")], ExitCode.IO_ERROR))
    for argv, code in cases:
        done = _sq(sq_env, *argv, cwd=tmp_path)
        assert done.returncode == code, (argv, done.stderr)
        assert done.stdout == "", argv
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, (argv, done.stderr)
    assert not (tmp_path / "a.html").exists() and not (tmp_path / "nosuch-report.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "locked"]
    assert _journal_bytes(sq_home, "bad") == before


def test_items_retried_after_failing_keep_their_text_in_the_report(store_url: str) -> None:
    """After `retry --failed` the items are pending again, with no result: the
    report read the text of five of them from their history and showed the
    rest as `#6`, `#7`, which reads as another item where texts are numbers
    (an outside tester's 30-item queue). Every row has its text now."""
    from statequeue.api.report_data import gather_report

    q = Queue("rep", store=store_url or None)
    try:
        q.enqueue([f"https://example.org/page/{n}" for n in range(1, 9)])
        for item in q.work():
            item.fail("exit code 1")
        assert len(q.retry(states=["failed"])) == 8
        report = gather_report(q._shared, None)
    finally:
        q.close()
    rows = [*report.figures.slowest, *report.figures.most_retried]
    assert len(report.figures.slowest) == 8, report.figures.slowest
    assert {r.text for r in rows} == {f"https://example.org/page/{n}" for n in range(1, 9)}
