"""An outside tester's import findings (promise 6: bad input is refused
before anything is written, exit 2, on every store): a header's ``"paused":
"yes"`` imported as not paused, ``item`` and ``item_b64`` that disagree were
taken (``item_b64`` won), a history ``"attempt": -1`` was taken (``show``
printed "attempt -1"), and one item text under two ids printed "imported 1,
skipped 1" where a repeated id is refused. Real CLI, journal and PostgreSQL."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import STATEQUEUE

Env = dict[str, str]
USAGE = 2


def sq(env: Env, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )


def export_of(*entries: dict[str, object], **header: object) -> bytes:
    head = {"statequeue_export": 1, "queue": "src", "items": len(entries), **header}
    return b"".join(json.dumps(x).encode() + b"\n" for x in (head, *entries))


def pending(item_id: int, item: str, **more: object) -> dict[str, object]:
    return {"id": item_id, "item": item, "state": "pending", **more}


def failed_once(attempt: object) -> dict[str, object]:
    end = {"t": "end", "attempt": attempt, "state": "failed", "ok": False, "exit": 1,
           "dur": 0.5, "at": 1.7e9}  # fmt: skip
    return pending(1, "a", state="failed", attempts=1, failures=1, history=[end])


CRASHED_MINUS_3 = {"t": "intr", "attempt": 1, "state": "pending", "crashes": -3, "at": 1.7e9}


@pytest.fixture(params=["journal", "postgres"])
def store_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    if request.param == "journal":
        return ()
    return ("--store", request.getfixturevalue("pg_url"))


BAD = {
    "paused-string": (export_of(pending(1, "a"), paused="yes"), "line 1: ", "'paused'"),
    "paused-number": (export_of(pending(1, "a"), paused=1), "line 1: ", "'paused'"),
    "interrupted-string": (
        export_of(pending(1, "a", interrupted="yes")),
        "line 2: ",
        "interrupted must be a JSON boolean",
    ),
    "item-and-b64-differ": (
        export_of(pending(1, "a", item_b64="Yg==")),  # "b"
        "line 2: ",
        "item and item_b64 differ",
    ),
    "attempt-negative": (
        export_of(failed_once(-1)),
        "line 2: ",
        "'attempt' must be an integer from 1",
    ),
    "attempt-zero": (export_of(failed_once(0)), "line 2: ", "'attempt' must be an integer from 1"),
    "history-crashes-negative": (
        export_of(pending(1, "a", history=[CRASHED_MINUS_3])),
        "line 2: ",
        "'crashes' must be an integer from 0",
    ),
    "one-text-two-ids": (
        export_of(pending(1, "a"), pending(2, "b"), pending(3, "a")),
        "line 4: ",
        "also on line 2 (id 1)",
    ),
    "one-id-twice": (
        export_of(pending(1, "a"), pending(1, "b")),
        "line 3: ",
        "item id 1 appears twice (also on line 2)",
    ),
}


@pytest.mark.parametrize(("data", "where", "message"), BAD.values(), ids=BAD.keys())
def test_wrong_typed_or_clashing_fields_are_refused_and_change_nothing(
    sq_env: Env, store_args: tuple[str, ...], data: bytes, where: str, message: str
) -> None:
    assert sq(sq_env, *store_args, "enqueue", "-q", "dst", "kept").returncode == 0
    before = sq(sq_env, *store_args, "list", "-q", "dst", "--json").stdout
    for target in (("-q", "dst", "--merge"), ("-q", "fresh")):
        done = sq(sq_env, *store_args, "import", *target, stdin=data)
        err = done.stderr.decode()
        assert done.returncode == USAGE, err
        assert err.startswith(f"statequeue: {where}") and message in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert sq(sq_env, *store_args, "list", "-q", "dst", "--json").stdout == before
    status = sq(sq_env, *store_args, "status", "-q", "dst", "--json")
    assert json.loads(status.stdout)["paused"] is False
    fresh = sq(sq_env, *store_args, "list", "-q", "fresh")
    assert fresh.returncode != 0 or fresh.stdout == b""


def test_matching_item_and_b64_and_boolean_paused_still_import(
    sq_env: Env, store_args: tuple[str, ...]
) -> None:
    raw = pending(1, "caf\ufffd", item_b64="Y2Fm6Q==")  # b"caf\xe9"
    data = export_of(raw, failed_once(1) | {"id": 2, "item": "y"}, paused=True)
    done = sq(sq_env, *store_args, "import", "-q", "dst", stdin=data)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith("imported 2, skipped 0")
    status = json.loads(sq(sq_env, *store_args, "status", "-q", "dst", "--json").stdout)
    assert status["paused"] is True
    listed = [
        json.loads(x)
        for x in sq(sq_env, *store_args, "list", "-q", "dst", "--json").stdout.splitlines()
    ]
    assert listed[0]["item_b64"] == "Y2Fm6Q=="
