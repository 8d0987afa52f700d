"""The stats summary cache (stats.ckpt, issue 15's speed goal): a cached
summary plus the records after it gives the one-pass answer, and a cache that
does not match the files is never believed."""

from __future__ import annotations

import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.models import Outcome, RunnerInfo
from statequeue.stats.attempts import Attempt, AttemptBatch, batches_of
from statequeue.stats.figures import StatsBuilder, compute_stats
from statequeue.store.journal import stats_cache
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.store import JournalStore
from tests.test_stats import check_figures, fill

NOW = 2_000_000_000.0


# -- merging: the parts of a summary ----------------------------------------------------


def _attempts(n: int, seed: int) -> list[Attempt]:
    """Known attempts over ~3 days (so throughput buckets coarsen), with
    failures of several reasons, retries, runners on two hosts, and ties."""
    rng = random.Random(seed)
    found = []
    for i in range(1, n + 1):
        attempt = 2 if i % 7 == 0 else 1
        ok = rng.random() > 0.2
        runner = f"r{i % 3}"
        found.append(
            Attempt(
                i,
                attempt,
                "done" if ok else rng.choice(["failed", "pending"]),
                ok,
                round(rng.lognormvariate(0, 2), 3) if i % 11 else 1.5,
                "" if ok else rng.choice(["exit code 1", "timed out after 3s", "boom\nmore"]),
                None if ok else rng.choice([1, 2, None]),
                None,
                False,
                runner,
                f"h{i % 3 % 2}" if i % 5 else "",  # a runner runs on one host
                1_000_000.0 + rng.random() * 3 * 86_400,
            )
        )
    return found


def _folded(attempts: list[Attempt], size: int = 50) -> StatsBuilder:
    b = StatsBuilder(now=NOW)
    b.add_all(batches_of(attempts, size))
    return b


@pytest.mark.parametrize("cut", [0, 1, 137, 500, 999, 1000])
def test_merge_of_two_parts_is_the_one_pass_summary(cut: int) -> None:
    every = _attempts(1000, seed=cut)
    whole = _folded(every)
    first, second = _folded(every[:cut]), _folded(every[cut:], size=33)
    first.merge(second)
    assert _summary(first) == _summary(whole)
    got = first.build(queue="q", counts={"pending": 3}).to_json()
    assert _rounded(got) == _rounded(whole.build(queue="q", counts={"pending": 3}).to_json())


def _rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """``figures`` with the mean duration to 12 digits: a float sum added in
    another order may differ in its last bit."""
    mean = figures["durations"]["mean"]
    if mean is not None:
        figures["durations"]["mean"] = float(f"{mean:.12g}")
    figures.pop("generated_at", None)
    return figures


def test_merge_in_any_order_keeps_the_lowest_example() -> None:
    every = _attempts(600, seed=7)
    late, early = _folded(every[300:]), _folded(every[:300])
    late.merge(early)  # the later attempts folded first
    assert _summary(late) == _summary(_folded(every))


def test_throughput_of_a_short_part_merges_into_a_long_one() -> None:
    short = [a._replace(ended_at=1_000_000.0 + i) for i, a in enumerate(_attempts(100, 1))]
    long = _attempts(400, 2)
    merged = _folded(short)
    merged.merge(_folded(long))
    assert merged.throughput.width > 60.0  # the long part's span widened the buckets
    assert _summary(merged) == _summary(_folded(short + long))


def test_export_and_restore_keep_every_figure() -> None:
    b = _folded(_attempts(700, seed=3))
    meta, retried = stats_cache.export(b)
    again = stats_cache.restore(meta, retried)
    assert _summary(again) == _summary(b)
    empty = stats_cache.restore(*stats_cache.export(StatsBuilder(now=0.0)))
    assert empty.build(queue="", counts={}).attempts == 0


def _summary(b: StatsBuilder) -> Any:
    meta, retried = stats_cache.export(b)
    meta["buckets"] = sorted(meta["buckets"])
    meta["slowest"] = sorted(meta["slowest"])
    for key in ("throughput", "recent"):
        meta[key][-1] = sorted(meta[key][-1])
    meta["reasons"] = sorted(meta["reasons"])
    meta["runners"] = sorted(meta["runners"])
    meta["sketch"][2] = round(meta["sketch"][2], 6)  # a float sum, added in another order
    return meta, retried.rstrip(b"\0")


# -- the cache on a journal store --------------------------------------------------------


class Scans:
    """Records which byte ranges the cache had to decode."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ranges: list[tuple[str, int, int]] = []
        real = stats_cache.scan_range_batches

        def scan(fd: int, start: int, end: int, **kw: Any) -> Iterator[AttemptBatch]:
            self.ranges.append((Path(kw["path"]).name, start, end))
            return real(fd, start, end, **kw)

        monkeypatch.setattr(stats_cache, "scan_range_batches", scan)

    def take(self) -> list[tuple[str, int, int]]:
        found, self.ranges = self.ranges, []
        return found


def _figures(q: Queue) -> dict[str, Any]:
    return _rounded(q.stats(now=NOW).to_json())


def _uncached(name: str, monkeypatch: pytest.MonkeyPatch, since: float | None = None) -> Any:
    """The figures computed from the files alone (caches off)."""
    with monkeypatch.context() as m:
        m.setenv("STATEQUEUE_CHECKPOINT_EVERY", "0")
        q = Queue(name)
        try:
            figures = q.stats(since, now=NOW).to_json()
        finally:
            q.close()
    return _rounded(figures)


def _run(q: Queue, n: int, *, seed: int = 1) -> None:
    """Enqueue ``n`` items and finish each once: some fail, durations known."""
    rng = random.Random(seed)
    store = q.store
    runner = RunnerInfo(f"runner-{seed}", os.getpid(), f"host-{seed}", "", time.time())
    store.register_runner(runner)
    q.enqueue([f"s{seed}-{i}" for i in range(n)])
    while (claim := store.claim(runner)) is not None:
        if rng.random() < 0.2:
            outcome = Outcome(ok=False, exit_code=rng.choice([1, 3]), duration=0.5)
        else:
            outcome = Outcome(ok=True, exit_code=0, duration=round(rng.uniform(0.01, 9), 3))
        store.finish(claim, outcome)
    store.unregister_runner(runner.runner_id)


def _poison(folder: Path, extra: int = 1000) -> None:
    """Rewrite the cache, still valid, with ``extra`` attempts that no file
    holds: a result that shows them came from the cache."""
    d = QueueFolder.open(folder, create=False)
    try:
        found = stats_cache.load(d)
        for part in found.values():
            part.builder.attempts += extra
        assert stats_cache.write(d, stats_cache.NAME, found.get("archive"), found.get("total"))
    finally:
        d.close()


def test_cached_figures_are_the_known_ones(monkeypatch: pytest.MonkeyPatch, sq_home: Path) -> None:
    scans = Scans(monkeypatch)
    want = fill(lambda: Queue("known"))
    q = Queue("known")
    check_figures(q, want)  # computed from the files; saves the cache
    assert (sq_home / "known" / stats_cache.NAME).exists()
    assert scans.take()
    check_figures(q, want)  # from the cache alone
    assert scans.take() == []


def test_records_after_the_cache_are_folded(monkeypatch: pytest.MonkeyPatch) -> None:
    scans = Scans(monkeypatch)
    q = Queue("tail")
    _run(q, 30, seed=1)
    q.stats()
    end = os.path.getsize(Path(os.environ["STATEQUEUE_HOME"]) / "tail" / "journal.jsonl")
    scans.take()
    _run(q, 20, seed=2)
    assert _figures(q) == _uncached("tail", monkeypatch)
    assert [start for _, start, _ in scans.take()] == [end]  # only the new records
    assert _figures(q)["attempts"] == 50


def test_a_valid_cache_is_believed(monkeypatch: pytest.MonkeyPatch, sq_home: Path) -> None:
    """The premise of the tests below: a poisoned cache that matches shows."""
    q = Queue("believed")
    _run(q, 10)
    q.stats()
    _poison(sq_home / "believed")
    assert _figures(q)["attempts"] == 1010


def _damage_torn(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _damage_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


def _damage_version(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(stats_cache.MAGIC, b"SQSTATS9\n", 1))


def _damage_empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [_damage_torn, _damage_byte, _damage_version, _damage_empty])
def test_a_damaged_cache_is_ignored(
    damage: Any, monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    q = Queue("damaged")
    _run(q, 25)
    q.stats()
    _poison(sq_home / "damaged")
    damage(sq_home / "damaged" / stats_cache.NAME)
    assert _figures(q) == _uncached("damaged", monkeypatch)


def test_another_journals_cache_is_ignored(monkeypatch: pytest.MonkeyPatch, sq_home: Path) -> None:
    """A copy of a queue folder has the same bytes in another file (inode)."""
    q = Queue("mine")
    _run(q, 12)
    q.stats()
    q.close()
    shutil.copytree(sq_home / "mine", sq_home / "copy")
    _poison(sq_home / "copy")
    assert _figures(Queue("copy")) == _uncached("copy", monkeypatch)


def test_a_cache_whose_bytes_before_its_position_differ_is_ignored(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    q = Queue("moved")
    _run(q, 12)
    q.stats()
    _poison(sq_home / "moved")
    d = QueueFolder.open(sq_home / "moved", create=False)
    try:
        found = stats_cache.load(d)
        total = found["total"]
        assert total.journal is not None
        total.journal["tail"] = "00" + total.journal["tail"][2:]
        stats_cache.write(d, stats_cache.NAME, found.get("archive"), total)
    finally:
        d.close()
    assert _figures(q) == _uncached("moved", monkeypatch)


def test_since_is_computed_from_the_files(monkeypatch: pytest.MonkeyPatch, sq_home: Path) -> None:
    q = Queue("since")
    _run(q, 15)
    q.stats()
    _poison(sq_home / "since")
    got = _rounded(q.stats(3600, now=NOW).to_json())
    assert got == _uncached("since", monkeypatch, 3600)


def test_compaction_carries_the_summary_over(monkeypatch: pytest.MonkeyPatch) -> None:
    scans = Scans(monkeypatch)
    q = Queue("compacted")
    _run(q, 40, seed=1)
    before = _figures(q)
    q.compact()
    scans.take()
    assert _figures(q) == before == _uncached("compacted", monkeypatch)
    assert [name for name, _, _ in scans.take()] == []  # nothing decoded again
    _run(q, 10, seed=2)
    q.compact()  # the archive grows; the staged summary carries it
    scans.take()
    assert _figures(q) == _uncached("compacted", monkeypatch)
    assert scans.take() == []


def test_archive_growth_is_folded_from_its_cached_size(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    scans = Scans(monkeypatch)
    q = Queue("grown")
    _run(q, 30, seed=1)
    q.compact()
    folder = sq_home / "grown"
    (folder / stats_cache.NAME).unlink()
    q.stats()  # from the files: caches the archive's summary at its size
    size = (folder / "archive.jsonl").stat().st_size
    _run(q, 20, seed=2)
    q.compact()
    _drop_total(folder)  # as if the compaction left no summary (an older statequeue)
    scans.take()
    assert _figures(q) == _uncached("grown", monkeypatch)
    archive = [(start, end) for name, start, end in scans.take() if name == "archive.jsonl"]
    assert archive == [(size, (folder / "archive.jsonl").stat().st_size)]


def _drop_total(folder: Path) -> None:
    d = QueueFolder.open(folder, create=False)
    try:
        found = stats_cache.load(d)
        assert stats_cache.write(d, stats_cache.NAME, found["archive"], None)
    finally:
        d.close()


def test_a_read_only_queue_uses_but_never_writes_the_cache(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    q = Queue("ro")
    _run(q, 10)
    q.close()
    store = JournalStore(sq_home / "ro", create=False)
    store.read_only = True  # as for a queue the user may only read
    try:
        builder = store.stats_summary()
    finally:
        store.close()
    assert builder.attempts == 10
    assert not (sq_home / "ro" / stats_cache.NAME).exists()


def test_compute_stats_still_matches_one_fold() -> None:
    every = _attempts(300, seed=5)
    direct = _rounded(compute_stats(every, now=NOW).to_json())
    assert direct == _rounded(_folded(every).build(queue="", counts={}).to_json())
    assert math.isclose(direct["durations"]["count"], sum(a.ok for a in every))


def test_a_compaction_summarises_a_big_uncached_queue_only_within_its_budget(
    monkeypatch: pytest.MonkeyPatch, sq_home: Path
) -> None:
    """Summarising a big queue nobody asked `stats` of would double the
    compaction's time: past the budget it stages nothing; a cached queue's
    compaction only extends its cache, whatever the queue's size."""
    q = Queue("budget")
    _run(q, 40, seed=1)
    folder = sq_home / "budget"
    monkeypatch.setattr(stats_cache, "STAGE_BUDGET", 5000)  # bytes: 40 items need ~15k, 5 ~2k
    q.compact()
    assert not (folder / stats_cache.NAME).exists()
    assert _figures(q) == _uncached("budget", monkeypatch)  # the first `stats` builds it
    assert (folder / stats_cache.NAME).exists()
    scans = Scans(monkeypatch)
    _run(q, 5, seed=2)  # fewer bytes than the budget since the cache
    q.compact()
    scans.take()
    assert _figures(q) == _uncached("budget", monkeypatch)
    assert scans.take() == []  # the staged summary carried it: nothing decoded again
