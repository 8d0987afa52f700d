"""An agent-style pipeline on statequeue: a fake LLM with random latency and
random failures, run with ``statequeue.map_async``. Kill it part-way and run it
again: it resumes, and only the prompts with no stored answer run.

Try it:

    python scripts/agent_example.py            # Ctrl-C or `kill -9` it part-way ...
    python scripts/agent_example.py            # ... and again: it picks up where it was
    python scripts/agent_example.py --reset    # drop the queue and start over

The answers live in the queue (`statequeue -q agent-example results --json`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys

import statequeue
from statequeue.api.maintenance import drop_queue
from statequeue.core.errors import QueueNotFound


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--queue", default="agent-example", help="queue name (default: %(default)s)")
    p.add_argument("--tasks", type=int, default=200, help="prompts to answer")
    p.add_argument("--concurrency", type=int, default=16, help="model calls at once")
    p.add_argument("--latency", type=float, default=0.2, help="longest model call, seconds")
    p.add_argument("--fail-rate", type=float, default=0.2, help="share of calls that fail")
    p.add_argument("--retries", type=int, default=8, help="retries per prompt")
    p.add_argument("--log", help="append 'start P'/'end P' lines here (fsynced), for tests")
    p.add_argument("--reset", action="store_true", help="drop the queue and exit")
    return p.parse_args(argv)


class FakeModel:
    """An LLM-like call: waits a random time, sometimes fails, else answers."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.calls = 0

    async def __call__(self, prompt: str) -> dict[str, object]:
        self.calls += 1
        self._note("start", prompt)
        await asyncio.sleep(random.uniform(0, self.args.latency))
        if random.random() < self.args.fail_rate:
            self._note("fail", prompt)
            raise TimeoutError("the model timed out")
        words = prompt.split()
        answer = {"prompt": prompt, "summary": " ".join(reversed(words)), "tokens": len(words)}
        self._note("end", prompt)
        return answer

    def _note(self, what: str, prompt: str) -> None:
        if not self.args.log:
            return
        fd = os.open(self.args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{what} {prompt}\n".encode())
            os.fsync(fd)  # on disk before the call returns: a kill cannot lose the line
        finally:
            os.close(fd)


async def run(args: argparse.Namespace) -> int:
    prompts = [f"summarise document {n:04d}" for n in range(args.tasks)]
    model = FakeModel(args)
    print(
        f"answering {len(prompts)} prompts in queue {args.queue!r}; "
        f"kill me (Ctrl-C or kill -9 {os.getpid()}) and run me again to resume",
        flush=True,
    )
    try:
        answers = await statequeue.map_async(
            model,
            prompts,
            queue=args.queue,
            concurrency=args.concurrency,
            retries=args.retries,
            retry_delay=0.05,
        )
    except statequeue.MapFailed as exc:
        print(f"{len(exc.failures)} prompts failed after {args.retries} retries; run me again")
        return 1
    tokens = sum(int(a["tokens"]) for a in answers)
    print(f"{len(answers)} answers ({tokens} tokens); {model.calls} model calls in this run")
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.reset:
        with contextlib.suppress(QueueNotFound):  # nothing to drop
            drop_queue(args.queue)
        print(f"dropped queue {args.queue!r}")
        return 0
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        print("interrupted: run me again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
