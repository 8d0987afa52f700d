"""A user program that touches every public name; tests/test_typing.py runs
``mypy --strict`` on it (it is not run, and it is not a test module)."""

from __future__ import annotations

import asyncio

import statequeue
from statequeue import (
    AsyncWorkItem,
    Claim,
    EnqueueResult,
    InvalidResult,
    ItemHistory,
    ItemNotFound,
    ItemResult,
    ItemState,
    ItemView,
    MapFailed,
    NotSupported,
    OnInterrupted,
    Outcome,
    PoolBroken,
    Queue,
    QueueClosed,
    StateQueueError,
    Status,
    TryLater,
    UnknownState,
    UsageError,
    WorkItem,
    WorkPolicy,
)
from statequeue.api.maintenance import drop_queue, fsck_queue, list_queues
from statequeue.core.identity import new_runner


def fetch(url: str) -> int:
    return len(url)


async def afetch(url: str) -> int:
    await asyncio.sleep(0)
    return len(url)


@statequeue.resumable(queue="crawl", retries=1)
def once(url: str) -> str:
    return url.upper()


def check(item: WorkItem) -> bool:
    return item.interrupted


def sync_api(q: Queue) -> None:
    added: EnqueueResult = q.enqueue(["a", "b"])
    print(added.added, added.skipped)
    policy = OnInterrupted.RETRY
    for item in q.work(retries=2, retry_delay=0.5, on_interrupted=policy, verify=check):
        with item:
            item.heartbeat()
            state: ItemState = item.done({"n": item.attempt})
            print(state)
    for item in q.work(rate="20/s", max_deferrals=5):
        with item:
            if item.attempt == 1:
                raise TryLater(0.5)
            later: ItemState = item.later(1.0)
            print(later)
    views: list[ItemView] = q.items(ItemState.DONE)
    results: list[ItemResult] = q.results()
    one: ItemResult | None = q.result("a")
    history: ItemHistory = q.history("a")
    status: Status = q.status()
    changed: list[int] = q.retry() + q.cancel([1])
    q.pause()
    q.resume()
    for record in q.events():
        print(record["t"])
    print(views, results, one, history, status, changed, q.fsck().damaged, q.find("a"))
    claim: Claim | None = q.claim(new_runner())
    if claim is not None:
        q.finish(claim, Outcome(ok=True, result=1))
    print(WorkPolicy(retries=1).retries, list_queues(), fsck_queue("crawl").damaged)
    drop_queue("old")
    print(q.fsck(repair=True).report_lines(), q.export("crawl.ndjson"))
    with open("crawl.ndjson", "rb") as lines:
        print(q.import_(lines, merge=True).added)
    q.drop()


async def async_api(q: Queue) -> list[int]:
    async for item in q.work_async(concurrency=16):
        one: AsyncWorkItem = item
        async with one:
            await one.done(await afetch(one.item))
    return await statequeue.map_async(afetch, ["a", "bb"], queue="crawl", concurrency=4)


def worker() -> None:  # `run --persistent -- python this.py`: serve() ends the program
    statequeue.serve(fetch)


def main() -> None:
    try:
        lengths: list[int] = statequeue.map(fetch, ["a", "bb"], queue="crawl", jobs=8)
        print(lengths, once("x"))
        with Queue("crawl") as q:
            sync_api(q)
            print(asyncio.run(async_api(q)))
    except MapFailed as exc:
        for item, reason in exc.failures:
            print(item, reason)
        print(exc.results)
    except PoolBroken as exc:  # a map's pool worker died, and no item was to blame
        print(exc.worker, exc.worker_exit, exc.crashed, exc.how())
    except UnknownState as exc:  # a state filter naming no state
        print(exc.message)
    except (InvalidResult, ItemNotFound, NotSupported, QueueClosed, UsageError) as exc:
        print(exc.message)
    except StateQueueError as exc:
        print(exc.exit_code)


if __name__ == "__main__":
    main()
