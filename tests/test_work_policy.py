"""``Queue.work()`` with a policy and ``with item:`` (issue 13 point 2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statequeue import ItemState, Queue
from statequeue.core.errors import UsageError


def test_an_exception_inside_the_block_fails_the_attempt_and_the_loop_goes_on(
    sq_home: Path,
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["bad", "good"])
        seen = []
        for item in q.work():
            seen.append(item.item)
            with item:
                if item.item == "bad":
                    raise ValueError("no such host")
                item.done("ok")
        assert seen == ["bad", "good"]
        failed = q.result("bad")
        assert failed is not None and failed.state is ItemState.FAILED
        assert failed.reason == "ValueError: no such host"
        assert q.result("good").result == "ok"  # type: ignore[union-attr]


def test_retries_run_a_failed_item_again_after_its_delay(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["flaky"])
        attempts = []
        for item in q.work(retries=2, retry_delay=0.01):
            attempts.append(item.attempt)
            with item:
                if item.attempt < 3:
                    raise TimeoutError("slow")
                item.done(item.attempt)
        assert attempts == [1, 2, 3]
        assert q.result("flaky").result == 3  # type: ignore[union-attr]


def test_retries_run_out_and_the_item_fails(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["bad"])
        for item in q.work(retries=1, retry_delay=0):
            item.fail("nope")  # an explicit fail() follows the policy too
        assert q.history("bad").state is ItemState.FAILED
        assert [e["t"] for e in q.history("bad").events].count("end") == 2


def test_a_clean_block_records_done_and_a_bad_result_fails_the_item(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["plain", "odd"])
        for item in q.work():
            with item:
                if item.item == "odd":
                    item.done(object())  # not JSON
        assert q.history("plain").state is ItemState.DONE
        odd = q.result("odd")
        assert odd is not None and odd.state is ItemState.FAILED
        assert odd.reason.startswith("InvalidResult: ")


def test_keyboard_interrupt_gives_the_item_back_uncounted_and_leaves_the_loop(
    sq_home: Path,
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
        with pytest.raises(KeyboardInterrupt):
            for item in q.work(retries=0):
                with item:
                    raise KeyboardInterrupt
        assert [v.state for v in q.items()] == [ItemState.PENDING, ItemState.PENDING]
        work = q.work()
        again = next(work)
        assert again.item == "a"
        assert again.claim.failures == 0  # not counted as a failure
        again.done()
        work.close()


def test_an_exception_outside_the_block_leaves_the_loop_and_gives_the_item_back(
    sq_home: Path,
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
        with pytest.raises(RuntimeError):
            for _item in q.work():
                raise RuntimeError("outside")
        assert q.history("a").state is ItemState.PENDING


def crash_while_working(sq_home: Path, name: str) -> None:
    """A process claims the first item of queue ``name`` and dies with SIGKILL."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from statequeue import Queue
        q = Queue({name!r}, home={str(sq_home)!r})
        for item in q.work():
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == -9


@pytest.mark.parametrize("answer", [True, False])
def test_verify_settles_an_interrupted_item_before_it_runs_again(
    sq_home: Path, answer: bool
) -> None:
    with Queue("v", home=sq_home) as q:
        q.enqueue(["x"])
    crash_while_working(sq_home, "v")
    asked: list[tuple[str, bool]] = []

    def verify(item: object) -> bool:
        asked.append((item.item, item.interrupted))  # type: ignore[attr-defined]
        return answer

    with Queue("v", home=sq_home) as q:
        ran = []
        for item in q.work(verify=verify):
            ran.append(item.item)
            item.done("ran")
        assert asked == [("x", True)]
        assert ran == ([] if answer else ["x"])
        result = q.result("x")
        assert result is not None and result.state is ItemState.DONE
        assert result.reason == ("verified: finished before its runner died" if answer else "")


@pytest.mark.parametrize(
    "kwargs",
    [{"retries": -1}, {"retry_delay": float("nan")}, {"max_crashes": 0}, {"on_interrupted": "x"}],
)
def test_a_bad_policy_is_a_usage_error(sq_home: Path, kwargs: dict[str, float]) -> None:
    with Queue(home=sq_home) as q, pytest.raises(UsageError):
        q.work(**kwargs)  # type: ignore[arg-type]
