"""Benchmark: `statequeue logs --all` against one `logs ID` call per item (issue 26 point 4).

A user read 4,547 items' outputs with one `logs ID` each: ~110 ms a call, 8
minutes. This builds a queue of N done items, each with a log of --log-bytes
(written where the runner writes logs: the queue's logs folder), then times,
in the same run:

  baseline   `statequeue logs ID` for --sample items, extrapolated to N calls
  logs --all one `statequeue logs --all > /dev/null`, and its peak RSS beside
             the total bytes of the logs (streamed: the RSS must not grow with them)

  .venv/bin/python scripts/bench_logs_all.py [--items 4547] [--log-bytes 20000] [--sample 20]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statequeue.api.queue import Queue
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome

BIN = Path(sys.executable).parent / "statequeue"


def build(home: Path, items: int, log_bytes: int) -> int:
    """N done items, each with a log of ``log_bytes``; the logs' total bytes."""
    line = b"x" * 79 + b"\n"
    body = line * max(log_bytes // len(line), 1)
    with Queue("bench", home=home) as q:
        q.enqueue([f"file-{i:06d}.pdf" for i in range(items)])
        runner = new_runner(command=("bench",))
        q.register_runner(runner)
        fd = q.store.logs_fd
        while (claim := q.claim(runner)) is not None:
            name = f"{claim.item_id}.{claim.attempt}.log"
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=fd)
            os.write(out, body)
            os.close(out)
            q.finish(claim, Outcome(ok=True, exit_code=0, duration=0.01), sync=False)
        q.sync()
        q.unregister_runner(runner.runner_id)
    return items * len(body)


def run(env: dict[str, str], *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([str(BIN), "-q", "bench", *args], env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=4547)
    parser.add_argument("--log-bytes", type=int, default=20000)
    parser.add_argument("--sample", type=int, default=20)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="sq-bench-logs-", dir="/var/tmp"))
    try:
        total = build(home, args.items, args.log_bytes)
        env = dict(os.environ, STATEQUEUE_HOME=str(home))
        step = max(args.items // args.sample, 1)
        per_call = [run(env, "logs", str(i)) for i in range(1, args.items + 1, step)][: args.sample]
        mean = sum(per_call) / len(per_call)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        every = run(env, "logs", "--all")
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        print(f"items: {args.items}, logs: {total / 1e6:.1f} MB in all")
        print(
            f"baseline: logs ID, {len(per_call)} calls: {mean * 1000:.0f} ms a call, "
            f"{mean * args.items:.1f} s for every item"
        )
        print(f"logs --all: {every:.2f} s for every item ({mean * args.items / every:.0f}x faster)")
        print(
            f"peak RSS of the CLI processes: {peak_kib / 1024:.0f} MiB "
            f"(before logs --all: {before / 1024:.0f} MiB; logs total {total / 2**20:.0f} MiB)"
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
