"""Library and result edges found by an outside tester (session 6): results
checked at the depth they are stored, NaN and wide integers, string state
filters, durations of library attempts, and bad arguments as StateQueueErrors."""

from __future__ import annotations

import asyncio
import io
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

import statequeue
import statequeue.api.map_run
import statequeue.api.work
from statequeue import Queue
from statequeue.core.errors import (
    InvalidExport,
    InvalidQueueName,
    InvalidResult,
    MapFailed,
    StateQueueError,
    UnknownState,
    UsageError,
)
from statequeue.core.models import ItemState
from statequeue.core.records import RESULT_MAX_DEPTH
from tests.conftest import STATEQUEUE


def nested(levels: int) -> list[Any]:
    """A list ``levels`` deep: ``[[...[]...]]``."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def done_with(result: Any, name: str = "q") -> None:
    """Claim the only item of a fresh queue and mark it done with ``result``."""
    with Queue(name) as q:
        q.enqueue(["x"])
        for it in q.work():
            it.done(result)


def refused_by_done(result: Any) -> InvalidResult:
    """The InvalidResult ``done(result)`` raises; the item stays claimed and is settled after."""
    with Queue("refused") as q:
        q.enqueue(["x"])
        for it in q.work():
            with pytest.raises(InvalidResult) as caught:
                it.done(result)
            assert not it.settled  # still the caller's to settle
            it.done("settled after")
        assert [r.result for r in q.results()] == ["settled after"]
    return caught.value


# -- 1. a result nested as deep as the records can hold --------------------------------


def test_the_deepest_result_accepted_is_stored_shown_and_exported() -> None:
    assert RESULT_MAX_DEPTH == 250
    deepest = nested(RESULT_MAX_DEPTH)
    with Queue("q") as q:
        q.enqueue(["ok", "failed"])
        for it in q.work():
            if it.item == "ok":
                it.done(deepest)
            else:
                it.fail("no", result=deepest)
        # The done item moves to the archive; the failed one stays, its
        # result as the compacted item's `last`: `show --json` nests it 4 deep.
        q.compact()
        assert [r.result for r in q.results()] == [deepest, deepest]
        for item_id in (1, 2):
            orjson.dumps(q.history(item_id).to_json())  # what `show --json` writes
        out = io.BytesIO()
        assert q.export(out) == 2
    with Queue("copy") as copy:
        copy.import_(out.getvalue().splitlines(keepends=True))
        assert [r.result for r in copy.results()] == [deepest, deepest]


@pytest.mark.parametrize("levels", [251, 252, 253, 254, 255])
def test_done_refuses_a_result_too_deep_to_store(levels: int) -> None:
    exc = refused_by_done(nested(levels))
    assert f"nested deeper than {RESULT_MAX_DEPTH} levels" in exc.message


def test_fail_refuses_a_result_too_deep_to_store() -> None:
    with Queue("q") as q:
        q.enqueue(["x"])
        for it in q.work():
            with pytest.raises(InvalidResult):
                it.fail("broke", result=nested(254))
            it.fail("broke")
        assert q.results()[0].state is ItemState.FAILED


def test_map_fails_an_item_whose_result_is_too_deep_and_goes_on() -> None:
    def fn(item: str) -> Any:
        return nested(254) if item == "deep" else item.upper()

    with pytest.raises(MapFailed) as caught:
        statequeue.map(fn, ["deep", "b"], queue="m", jobs=1)
    assert caught.value.results == [None, "B"]
    ((item, reason),) = caught.value.failures
    assert item == "deep" and "nested deeper than" in reason


def test_import_refuses_an_export_whose_result_is_too_deep() -> None:
    done_with("fine")
    with Queue("q") as q:
        out = io.BytesIO()
        q.export(out)
    header, line = out.getvalue().splitlines()
    assert b'"result":"fine"' in line
    # Edited by hand: orjson reads 1024 levels, but no record could hold this.
    edited = line.replace(b'"result":"fine"', b'"result":' + b"[" * 300 + b"]" * 300)
    with Queue("copy") as copy, pytest.raises(InvalidExport, match="nested deeper"):
        copy.import_([header + b"\n", edited + b"\n"])


RESULT_FILES: dict[str, bytes] = {
    "d250": b"[" * 250 + b"]" * 250,
    "d251": b"[" * 251 + b"]" * 251,
    "d252": b"[" * 252 + b"]" * 252,
    "d253": b"[" * 253 + b"]" * 253,
    "d254": b"[" * 254 + b"]" * 254,
    "d255": b"[" * 255 + b"]" * 255,
    "wide": b"123456789012345678901234567890",
    "wide-negative": b'{"n": [-9223372036854775809]}',
    "u64max": b"18446744073709551615",
    "digits-in-text": b'"123456789012345678901234567890"',
    "long-fraction": b"0.12345678901234567890123",
    "empty": b"",
    "blank": b" \n",
    "infinite": b"1e400",
    "last": b'"ran"',
}


@pytest.fixture(scope="module")
def run_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    """One real `run` whose items write the result files above, in order."""
    folder = tmp_path_factory.mktemp("results")
    for name, data in RESULT_FILES.items():
        (folder / f"{name}.json").write_bytes(data)
    env = {"STATEQUEUE_HOME": str(folder / "home"), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"}
    subprocess.run(
        [STATEQUEUE, "-q", "r", "enqueue", *RESULT_FILES], env=env, check=True, capture_output=True
    )
    script = 'cp "$0/$1.json" "$STATEQUEUE_RESULT"'
    out = subprocess.run(
        [STATEQUEUE, "-q", "r", "run", "--", "sh", "-c", script, str(folder), "{}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    with Queue("r", home=folder / "home") as q:
        results = {r.item: r for r in q.results()}
        assert {r.state for r in results.values()} == {ItemState.DONE}  # every item ran
        assert len(results) == len(RESULT_FILES)
        q.export(folder / "export.ndjson")  # every stored result can be exported
    return {k: r.result for k, r in results.items()}, out.stderr, folder


def test_run_stores_the_deepest_result_file_and_refuses_deeper_ones_going_on(
    run_results: tuple[dict[str, Any], str, Path],
) -> None:
    results, stderr, _ = run_results
    assert "Traceback" not in stderr
    assert results["d250"] == nested(250)
    for name in ("d251", "d252", "d253", "d254", "d255"):
        assert "nested deeper than 250 levels" in results[name]["error"], name
    assert stderr.count("nested deeper than 250 levels); recorded an error instead") == 5
    assert results["last"] == "ran"  # the run went on to the next items


def test_run_records_an_error_for_an_integer_json_cannot_keep_exactly(
    run_results: tuple[dict[str, Any], str, Path],
) -> None:
    results, stderr, _ = run_results
    for name in ("wide", "wide-negative"):
        assert "integer exceeds the 64-bit range" in results[name]["error"], name
    assert stderr.count("(an integer exceeds the 64-bit range); recorded an error") == 2
    assert results["u64max"] == 18446744073709551615  # still exact: stored as it is
    assert results["digits-in-text"] == "123456789012345678901234567890"
    assert results["long-fraction"] == pytest.approx(0.12345678901234568)
    assert results["infinite"]["error"] == "result file is not valid JSON"


def test_run_records_no_result_for_a_result_file_left_empty(
    run_results: tuple[dict[str, Any], str, Path],
) -> None:
    results, _, _ = run_results
    assert results["empty"] is None
    assert results["blank"] is None


# -- 2. NaN and infinity ----------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), float("-inf"), {"a": [1, float("nan")]}, (1.0, float("inf"))],
    ids=["nan", "inf", "-inf", "nested", "tuple"],
)
def test_done_refuses_nan_and_infinity(value: Any) -> None:
    exc = refused_by_done(value)
    assert "NaN or infinity" in exc.message


def test_done_still_stores_null_and_finite_floats() -> None:
    done_with({"a": None, "b": [1.5, None]})
    with Queue("q") as q:
        assert q.results()[0].result == {"a": None, "b": [1.5, None]}


def test_map_fails_an_item_whose_result_is_nan() -> None:
    with pytest.raises(MapFailed) as caught:
        statequeue.map(lambda item: float("nan"), ["a"], queue="m", jobs=1)
    assert "NaN or infinity" in caught.value.failures[0][1]


def test_done_refuses_an_integer_past_64_bits() -> None:
    exc = refused_by_done(2**80)
    assert "64-bit" in exc.message


@pytest.mark.parametrize("reason", [5, None, ["a"]], ids=repr)
def test_fail_refuses_a_reason_that_is_not_text(reason: Any) -> None:
    # Stored, it broke `statequeue results` and `status` (they print it as text).
    with Queue("r") as q:
        q.enqueue(["x"])
        for it in q.work():
            with pytest.raises(InvalidResult, match="reason must be a str, not "):
                it.fail(reason)
            it.fail("text")
        assert [r.reason for r in q.results()] == ["text"]


# -- 4. state filters given as strings --------------------------------------------------


def settled_queue() -> Queue:
    q = Queue("s")
    q.enqueue(["a", "b", "c"])
    for it in q.work():
        if it.item == "a":
            it.done(1)
        elif it.item == "b":
            it.fail("no")
        else:
            it.release()
            break
    return q


def test_state_filters_accept_the_states_names() -> None:
    with settled_queue() as q:
        assert [v.item for v in q.items("pending")] == ["c"]
        assert [v.item for v in q.iter_items("done")] == ["a"]
        assert [r.item for r in q.results("done")] == ["a"]
        assert [r.item for r in q.iter_results("failed")] == ["b"]
        assert [v.item for v in q.items(ItemState.FAILED)] == ["b"]
        assert q.retry(states="failed") == [2]
        assert [v.item for v in q.items("pending")] == ["b", "c"]


def test_state_filters_refuse_an_unknown_state() -> None:
    with settled_queue() as q:
        calls = [
            lambda: q.items("bogus"),
            lambda: q.iter_items("Pending"),
            lambda: q.results("bogus"),
            lambda: q.iter_results("bogus"),
            lambda: q.retry(states=["failed", "bogus"]),
            lambda: q.retry(states=5),  # type: ignore[arg-type]
        ]
        for call in calls:
            with pytest.raises(UnknownState, match="unknown state") as caught:
                call()
            assert isinstance(caught.value, UsageError)
        with pytest.raises(UsageError, match="only for done or failed"):
            q.results("pending")


# -- 5. durations of library attempts ---------------------------------------------------


class SteppingClock:
    """A stand-in for a module's ``time``: monotonic() steps 2.5 s a call."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 2.5
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_work_records_each_attempts_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statequeue.api.work, "time", SteppingClock())
    with Queue("d") as q:
        q.enqueue(["a", "b"])
        for it in q.work():
            if it.item == "a":
                it.done(1)
            else:
                it.fail("no")
        durations = {r.item: r.duration for r in q.results()}
    assert durations == {"a": 2.5, "b": 2.5}  # one step: claimed, then settled


def test_map_records_each_calls_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statequeue.api.map_run, "time", SteppingClock())

    def fn(item: str) -> str:
        if item == "bad":
            raise ValueError("bad")
        return item

    with pytest.raises(MapFailed):
        statequeue.map(fn, ["a", "bad"], queue="m", jobs=1)
    with Queue("m") as q:
        assert {r.item: r.duration for r in q.results()} == {"a": 2.5, "bad": 2.5}


def test_the_asyncio_loops_record_durations_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statequeue.api.work, "time", SteppingClock())
    monkeypatch.setattr(statequeue.api.map_run, "time", SteppingClock())

    async def upper(item: str) -> str:
        return item.upper()

    async def main() -> None:
        with Queue("w") as q:
            q.enqueue(["a"])
            async for it in q.work_async(concurrency=1):
                await it.done(1)
        await statequeue.map_async(upper, ["b"], queue="m", concurrency=1)

    asyncio.run(main())
    for name in ("w", "m"):
        with Queue(name) as q:
            assert [r.duration for r in q.results()] == [2.5], name


def spend_a_millisecond(item: str) -> str:
    started = time.monotonic()
    while time.monotonic() - started < 0.001:  # time passes (durations keep 6 digits)
        pass
    return item


def test_durations_are_real_time_not_zero() -> None:
    with Queue("d") as q:
        q.enqueue(["a"])
        for it in q.work():
            it.done(spend_a_millisecond(it.item))
        (work_result,) = q.results()
    statequeue.map(spend_a_millisecond, ["b"], queue="m", jobs=1)
    with Queue("m") as q:
        (map_result,) = q.results()
    for result in (work_result, map_result):
        assert result.duration is not None and result.duration >= 0.001


# -- 6. bad arguments raise StateQueueErrors --------------------------------------------


@pytest.mark.parametrize("items", [None, 5, 1.5, SimpleNamespace()], ids=repr)
def test_enqueue_refuses_what_is_not_an_iterable(items: Any) -> None:
    with Queue("e") as q:
        with pytest.raises(UsageError, match="enqueue takes an iterable of items, not "):
            q.enqueue(items)
        assert q.items() == []


def test_enqueue_refuses_a_single_str_naming_the_fix() -> None:
    with Queue("e") as q:
        with pytest.raises(UsageError, match=r"write enqueue\(\[text\]\)"):
            q.enqueue("abc")
        assert q.items() == []


def test_map_refuses_what_is_not_an_iterable() -> None:
    with pytest.raises(UsageError, match="map takes an iterable"):
        statequeue.map(str, None, queue="m")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [5, b"q", ["q"]], ids=repr)
def test_a_queue_name_of_the_wrong_type_is_an_invalid_queue_name(name: Any) -> None:
    with pytest.raises(InvalidQueueName, match="queue name must be a str, not "):
        Queue(name)


def test_a_home_of_the_wrong_type_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="home must be a path"):
        Queue("q", home=5)  # type: ignore[arg-type]


def test_the_messages_are_one_line() -> None:
    with pytest.raises(StateQueueError) as bad_name:
        Queue(5)  # type: ignore[arg-type]
    with Queue("q") as q, pytest.raises(StateQueueError) as bad_items:
        q.enqueue(None)  # type: ignore[arg-type]
    assert "\n" not in bad_name.value.message + bad_items.value.message
