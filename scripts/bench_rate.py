"""Benchmark `run --rate` against a rate-limited API (issue 24).

A loopback HTTP API, started here on 127.0.0.1, admits 25 requests per second
with a burst of 5 (its own token bucket) and answers 429 above that. The
worker is a shell script around curl that exits 75 (try later) on a 429.
`statequeue run --rate 60/s -j8` works 300 items against it: the queue starts
faster than the API allows, deferrals halve its rate, successes raise it.

Printed, with the goals: every item done and none failed; the rate achieved
(answers 200 per second over the run) against 80% of the API's 25/s; the share
of requests answered 429 against 25%. A baseline from the same run: the same
items without --rate (every 429 deferred, the concurrency halved instead).

    python scripts/bench_rate.py [--items N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
STATEQUEUE = shutil.which("statequeue", path=str(BIN)) or "statequeue"
API_RATE, API_BURST = 25.0, 5.0

WORKER = """#!/bin/sh
code=$(curl -s -o /dev/null -w '%{http_code}' "$1")
[ "$code" = 429 ] && exit 75
[ "$code" = 200 ]
"""


class LimitedApi(ThreadingHTTPServer):
    """Answers 200 within ``API_RATE`` per second (burst ``API_BURST``), else 429."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tokens, self.stamp = API_BURST, time.monotonic()
        self.lock = threading.Lock()
        self.ok = self.refused = 0

    def admit(self) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(API_BURST, self.tokens + (now - self.stamp) * API_RATE)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                self.ok += 1
                return True
            self.refused += 1
            return False


class _Handler(BaseHTTPRequestHandler):
    server: LimitedApi

    def do_GET(self) -> None:
        admitted = self.server.admit()
        self.send_response(200 if admitted else 429)
        if not admitted:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def one_run(items: int, rate: str | None) -> dict[str, Any]:
    api = LimitedApi()
    thread = threading.Thread(target=api.serve_forever, daemon=True)
    thread.start()
    home = Path(tempfile.mkdtemp(prefix="sqbench-rate-", dir="/var/tmp"))
    try:
        env = {**os.environ, "STATEQUEUE_HOME": str(home)}
        env.pop("STATEQUEUE_STORE", None)
        worker = home / "call_api.sh"
        worker.write_text(WORKER)
        worker.chmod(0o755)
        data = "".join(f"item{i}\n" for i in range(items))
        subprocess.run(
            [STATEQUEUE, "enqueue"], input=data, text=True, env=env, check=True, capture_output=True
        )
        url = f"http://127.0.0.1:{api.server_address[1]}/{{}}"
        limit = ["--rate", rate] if rate else []
        args = [STATEQUEUE, "run", "-j8", *limit, "--quiet", "--json", "--", str(worker), url]
        start = time.perf_counter()
        done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - start
        summary = json.loads(done.stdout)
        status = subprocess.run(
            [STATEQUEUE, "status", "--json"], env=env, capture_output=True, text=True, check=True
        )
        counts = json.loads(status.stdout)["counts"]
    finally:
        api.shutdown()
        api.server_close()
        shutil.rmtree(home, ignore_errors=True)
    requests = api.ok + api.refused
    return {
        "rate": rate or "none",
        "seconds": took,
        "done": counts["done"],
        "failed": counts["failed"] + summary["failed"],
        "achieved_per_second": api.ok / took,
        "requests": requests,
        "refused_share": api.refused / requests if requests else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [one_run(args.items, "60/s"), one_run(args.items, None)]
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    goal_rate = 0.8 * API_RATE
    api = f"a loopback API of {API_RATE:g}/s (burst {API_BURST:g})"
    print(f"run -j8 against {api}, {args.items} items")
    for r in runs:
        print(
            f"  --rate {r['rate']:>5}: {r['seconds']:5.1f}s  done {r['done']}/{args.items}, "
            f"failed {r['failed']}; achieved {r['achieved_per_second']:.1f}/s "
            f"(goal >= {goal_rate:g}/s); 429 answers {100 * r['refused_share']:.1f}% "
            f"of {r['requests']} requests (goal <= 25%)"
        )
    first = runs[0]
    met = (
        first["done"] == args.items
        and first["failed"] == 0
        and first["achieved_per_second"] >= goal_rate
        and first["refused_share"] <= 0.25
    )
    print(f"  goals with --rate 60/s: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
