"""Benchmark `statequeue stats --json` on a 1M-item queue (issue 15).

The queue: 1M items run once each, 2% failed with exit code 1, 0.5% timed
out, log-normal durations; written with statequeue's own record encoder, as
scripts/bench.py writes its 1M-done queue, with the runner and host an `end`
record names today: first the records up to the run's last periodic
checkpoint, then `status` (which replays them and writes the checkpoints, of
the state and of the stats summary, as the run's own would), then the records
of the last 6% of the items, which no checkpoint covers (a run killed now
leaves this), then the run's own end (`unregister_runner`: its stop record
and the checkpoints a run leaves as it ends). "compacted" is a copy of it
after `statequeue compact`.

Cases, on each queue:

  after the run        (uncompacted) the first stats --json after the run:
                       the checkpoints its end left cover everything.
  after a kill         (uncompacted) the first stats --json after a run killed
                       just before its end: the checkpoints of its last
                       periodic save, then the 6% of the records after them
                       (replayed by the open, folded by stats).
  after compact        (compacted) the first stats --json after `compact`,
                       whose hook staged the summary of the queue it put in
                       place.
  cold                 stats --json with no stats cache (stats.ckpt removed
                       first): every record the scan needs is decoded. What a
                       queue whose cache was lost costs once.
  warm                 (compacted) stats --json when the previous `stats`
                       saved the cache and nothing was appended since.
  baseline             results --json | python -c '<same>': export, then
                       compute the same percentiles, reason groups, slowest 5
                       and state counts in Python (exact: it sorts every
                       duration).

Each runs as a whole process, interleaved over --rounds rounds (medians and
spread printed); the peak RSS of each is measured in one more run under a
fresh small wrapper (`/usr/bin/time -f %M`, as scripts/bench.py does; for the
pipeline, the larger of its two processes). Also printed: `compact` on a
copy without a stats cache (past stats_cache.STAGE_BUDGET its hook folds
nothing; within it, the whole queue) and on one with a current cache (the
hook folds nothing new): the hook's cost. Goal: stats <= 2 s and <= 100 MB.

Examples:

  .venv/bin/python scripts/bench_stats.py
  .venv/bin/python scripts/bench_stats.py --items 100000 --rounds 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import MB, find_statequeue, read_rss, rss_wrapper

try:
    from statequeue.core import records
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from statequeue.core import records

GOAL_S = 2.0
GOAL_RSS_MB = 100.0

BASELINE = r"""
import json, math, sys
from collections import Counter
durations, reasons, examples, states = [], Counter(), {}, Counter()
for line in sys.stdin:
    r = json.loads(line)
    states[r["state"]] += 1
    if r["state"] == "done" and r["duration"] is not None:
        durations.append((r["duration"], r["id"]))
    elif r["state"] == "failed":
        reason = r["reason"]
        reason = "timed out" if reason.startswith("timed out") else reason
        reasons[reason] += 1
        examples.setdefault(reason, r["id"])
durations.sort()
n = len(durations)
q = {f"p{p}": durations[max(1, math.ceil(p / 100 * n)) - 1][0] for p in (50, 90, 99)}
print(json.dumps({"count": n, **q, "max": durations[-1][0], "slowest": durations[-5:][::-1],
                  "reasons": reasons.most_common(), "examples": examples, "states": states}))
"""


def write_run_queue(
    folder: Path, n: int, seed: int = 15, *, tail: Path | None = None, stop: bool = True
) -> None:
    """Items 1..n enqueued, then run once each by one runner: start and end
    records as `statequeue run` writes them (end names runner and host).
    With ``tail``, the records of the last ``TAIL_SHARE`` of the items go to
    that file instead, to be appended after the run's last checkpoint."""
    folder.mkdir(mode=0o700)
    for sub in ("claims", "runners", "logs"):
        (folder / sub).mkdir(mode=0o700)
    os.close(os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600))
    rng = random.Random(seed)
    runner, host = RUNNER, socket.gethostname()
    base = round(time.time() - n * 0.05, 3)
    encode = records.encode
    seq = 1
    fd = os.open(folder / "journal.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb", buffering=8 * MB) as out:
        header = {"seq": 1, "t": "snap", "v": 1, "next_id": 1}
        out.write(encode({**header, "archived": 0, "archive_size": 0, "watermark": 0}))

        def line(rec: dict[str, Any]) -> bytes:
            nonlocal seq
            seq += 1
            return encode({**rec, "seq": seq})

        for i in range(1, n + 1):
            out.write(line({"t": "enq", "id": i, "item": f"https://example.org/page/{i}"}))
        run = {"t": "run", "runner": runner, "pid": os.getpid(), "host": host, "boot": ""}
        out.write(line({**run, "since": base, "cmd": ["crawl", "{}"]}))
        for i in range(1, n + 1):
            if tail is not None and i == n - int(n * TAIL_SHARE) + 1:
                out.flush()
                os.fsync(out.fileno())
                out = open(tail, "wb", buffering=8 * MB)  # noqa: SIM115 (closed below)
            at = round(base + i * 0.05, 3)
            dur = round(rng.lognormvariate(-3, 1), 6)
            out.write(line({"t": "start", "id": i, "attempt": 1, "runner": runner, "at": at}))
            end: dict[str, Any] = {"t": "end", "id": i, "attempt": 1}
            roll = rng.random()
            if roll < 0.02:
                end.update(state="failed", ok=False, at=at, dur=dur, exit=1, reason="exit code 1")
            elif roll < 0.025:
                end.update(state="failed", ok=False, at=at, dur=5.0, sig=15, timeout=True)
                end["reason"] = "timed out after 5s; ended by SIGTERM"
            else:
                end.update(state="done", ok=True, at=at, dur=dur, exit=0)
            out.write(line({**end, "runner": runner, "host": host}))
        if stop:  # else the run is still registered: ``RUNNER``'s unregister ends it
            out.write(line({"t": "stop", "runner": runner, "at": round(base + n * 0.05, 3)}))
        out.flush()
        os.fsync(out.fileno())
        if tail is not None:
            out.close()


def run(argv: list[str], env: dict[str, str], *, shell: bool = False) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, check=False, shell=shell, timeout=3600
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench_stats: {argv} exited {done.returncode}: {done.stderr[-500:]}")
    return wall, done.stdout


def peak_rss_mb(argv: list[str], env: dict[str, str], workdir: Path) -> float:
    out = workdir / "rss"
    out.unlink(missing_ok=True)
    subprocess.run(rss_wrapper(out, argv), env=env, capture_output=True, check=True)
    return read_rss(out) / 1024


CACHE = "stats.ckpt"
STATE = "state.ckpt"
RUNNER = "benchrunner00001"
TAIL_SHARE = 0.06
"""Of the items, those whose records come after the run's last checkpoint:
their 2 records each stay just under the eighth of the item count that makes
a run's end write one more checkpoint."""


def measure(
    exe: str, queue: Path, env: dict[str, str], workdir: Path, rounds: int, *, compacted: bool
) -> dict[str, Any]:
    """Each case's wall times (interleaved rounds), peak RSS and figures."""
    stats_argv = [exe, "-q", queue.name, "stats", "--json"]
    script = workdir / "baseline.py"
    script.write_text(BASELINE)
    pipeline = f"{exe} -q {queue.name} results --json | {sys.executable} {script}"
    staged = queue / CACHE
    kept = workdir / f"{queue.name}.after-compact"
    if compacted and not staged.exists():
        # Past stats_cache.STAGE_BUDGET with no cache before it, compaction
        # stages no summary: the first `stats` after it is the cold case.
        print(f"{queue.name}: compaction staged no stats summary (beyond the hook's budget)")
        compacted = False
    if compacted:
        shutil.copy(staged, kept)  # the summary compaction's hook left

    def cold() -> None:
        if compacted:
            (queue / CACHE).unlink(missing_ok=True)
        else:  # the state as the run's end left it; no stats summary
            restore(queue, workdir, "ended", stats=False)

    def after_compact() -> None:
        shutil.copy(kept, staged)

    cases: dict[str, tuple[list[str], Any]] = {"cold": (stats_argv, cold)}
    if compacted:
        cases["after compact"] = (stats_argv, after_compact)
        cases["warm"] = (stats_argv, lambda: None)  # the run before saved it
    else:
        # Right after the run the cache covers everything: warm by construction.
        cases["after the run"] = (stats_argv, lambda: restore(queue, workdir, "ended"))
        cases["after a kill"] = (stats_argv, lambda: restore(queue, workdir, "killed"))
    cases["baseline"] = (["/bin/sh", "-c", pipeline], lambda: None)
    walls: dict[str, list[float]] = {name: [] for name in cases}
    outputs: dict[str, str] = {}
    for _ in range(rounds):  # interleaved: every case sees the same machine load
        for name, (argv, prepare) in cases.items():
            prepare()
            wall, outputs[name] = run(argv, env)
            walls[name].append(wall)
    figures: dict[str, Any] = {}
    for name, (argv, prepare) in cases.items():
        prepare()
        figures[name] = {
            "median_s": statistics.median(walls[name]),
            "min_s": min(walls[name]),
            "max_s": max(walls[name]),
            "rss_mb": peak_rss_mb(argv, env, workdir),
        }
    exact = json.loads(outputs["baseline"])
    for name in cases:
        if name != "baseline":
            ours = json.loads(outputs[name])["durations"]
            figures[name]["p99_off"] = abs(ours["p99"] - exact["p99"]) / exact["p99"]
            figures[name]["done_counted"] = (ours["count"], exact["count"])
    return figures


def report(label: str, figures: dict[str, Any]) -> list[str]:
    base = figures["baseline"]
    lines = [
        f"{label}: baseline results --json | python {base['median_s']:6.2f} s "
        f"({base['min_s']:.2f}-{base['max_s']:.2f}) {base['rss_mb']:6.1f} MB"
    ]
    for name, m in figures.items():
        if name == "baseline":
            continue
        met = m["median_s"] <= GOAL_S and m["rss_mb"] <= GOAL_RSS_MB
        lines.append(
            f"  stats --json {name:<14} {m['median_s']:6.2f} s ({m['min_s']:.2f}-{m['max_s']:.2f})"
            f" {m['rss_mb']:6.1f} MB | x{base['median_s'] / m['median_s']:.1f} vs baseline"
            f" | p99 off {m['p99_off']:.2%} | goal <= {GOAL_S:.0f} s, <= {GOAL_RSS_MB:.0f} MB:"
            f" {'met' if met else 'MISSED'}"
        )
    return lines


def build_queues(exe: str, home: Path, workdir: Path, n: int, env: dict[str, str]) -> None:
    """ "uncompacted": the run's records up to its last periodic checkpoint, a
    `status` (which replays them and writes the checkpoints, the state's and
    the stats summary's, as the run's own would), then the records of the last
    ``TAIL_SHARE`` of the items, which no checkpoint covers: the queue as a
    run killed now leaves it (its checkpoints kept under ``saved(workdir,
    "killed")``). Then the runner's own end (`unregister_runner`: the stop
    record and the end-of-run checkpoints), kept as ``saved(workdir,
    "ended")``. "compacted" and "compactnocache": copies, each with its
    checkpoints rewritten (a copy has new inodes), the first with the stats
    summary as the run kept it, the second without one, both to be compacted."""
    from statequeue.store.journal.store import JournalStore

    tail = workdir / "tail.jsonl"
    queue = home / "uncompacted"
    write_run_queue(queue, n, tail=tail, stop=False)
    run([exe, "-q", "uncompacted", "status", "--json"], env)  # the run's last checkpoint
    # The summary a run keeps up to its checkpoints (from its first one, when
    # the queue was small). A checkpoint does not build one for a queue this
    # big from nothing (past stats_cache.STAGE_BUDGET): the first stats does.
    run([exe, "-q", "uncompacted", "stats", "--json"], env)
    with open(queue / "journal.jsonl", "ab") as journal:
        journal.write(tail.read_bytes())
        journal.flush()
        os.fsync(journal.fileno())
    tail.unlink()
    keep(queue, workdir, "killed")
    store = JournalStore(queue, create=False, auto_compact=0)
    try:
        store.unregister_runner(RUNNER)  # what `statequeue run` does as it ends
    finally:
        store.close()
    keep(queue, workdir, "ended")
    for copy in ("compacted", "compactnocache"):
        shutil.copytree(queue, home / copy)
        (home / copy / CACHE).unlink()
        run([exe, "-q", copy, "status", "--json"], env)  # new inodes: checkpoints rewritten
    run([exe, "-q", "compacted", "stats", "--json"], env)  # the summary, as the run kept it


def saved(workdir: Path, label: str) -> Path:
    return workdir / f"checkpoints.{label}"


def keep(queue: Path, workdir: Path, label: str) -> None:
    """Copy the queue's two checkpoints aside, to be put back by ``restore``."""
    to = saved(workdir, label)
    to.mkdir()
    for name in (STATE, CACHE):
        shutil.copy(queue / name, to / name)


def restore(queue: Path, workdir: Path, label: str, *, stats: bool = True) -> None:
    for name in (STATE, CACHE):
        if name == CACHE and not stats:
            (queue / CACHE).unlink(missing_ok=True)
        else:
            shutil.copy(saved(workdir, label) / name, queue / name)


def timed_compact(exe: str, home: Path, name: str, env: dict[str, str]) -> float:
    """Wall seconds of `compact` on a copy of the uncompacted queue named ``name``."""
    wall, _ = run([exe, "-q", name, "compact"], env)
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    exe = find_statequeue()
    if exe is None:
        print("bench_stats: no statequeue executable beside the interpreter", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="statequeue-bench-stats-", dir="/var/tmp"))
    home = workdir / "home"
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEQUEUE_")}
    env.update(STATEQUEUE_HOME=str(home), NO_COLOR="1")
    figures: dict[str, Any] = {"items": args.items, "rounds": args.rounds}
    try:
        started = time.perf_counter()
        build_queues(exe, home, workdir, args.items, env)
        nocache = timed_compact(exe, home, "compactnocache", env)  # the hook folds nothing
        shutil.rmtree(home / "compactnocache")
        cached = timed_compact(exe, home, "compacted", env)  # the hook stages the summary
        figures["compact_s"] = {"no stats cache": nocache, "stats cache": cached}
        print(f"(queues built in {time.perf_counter() - started:.0f} s)", file=sys.stderr)
        print(
            f"compact: {nocache:.1f} s without a stats cache "
            "(its hook folds the whole queue within stats_cache.STAGE_BUDGET, nothing past it), "
            f"{cached:.1f} s with one (it folds what came after it); one run each",
            flush=True,
        )
        for name in ("uncompacted", "compacted"):
            figures[name] = measure(
                exe, home / name, env, workdir, args.rounds, compacted=name == "compacted"
            )
            print("\n".join(report(name, figures[name])), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
