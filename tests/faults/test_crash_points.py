"""Deterministic crash points: the real CLI SIGKILLs itself at the k-th
write, fsync, rename, folder fsync, child spawn or recorded result
(STATEQUEUE_TEST_CRASH=KIND:K), for k = 1, 2, ... until a run finishes.

After each crash and restart: every acknowledged result is present, every
item ends done, and re-runs are at most one per crash.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

Env = dict[str, str]
POINTS = {"crashes": 0}


def kinds(fast: str, *slow: str) -> list[object]:
    """``fast`` runs in `make test`; the rest only in `make test-crash`."""
    return [fast, *(pytest.param(k, marks=pytest.mark.crash) for k in slow)]


def sq(env: Env, *args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    if crash is not None:
        env = dict(env, STATEQUEUE_TEST_CRASH=crash)
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def counts(env: Env) -> dict[str, int]:
    out = sq(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["counts"])


def sweep(run_once: object, limit: int = 200) -> int:
    """Call run_once(k) for k = 1.. until it reports no crash; returns crashes seen."""
    for k in range(1, limit):
        if not run_once(k):  # type: ignore[operator]
            return k - 1
    raise AssertionError("never finished without crashing")


@pytest.mark.parametrize("kind", kinds("fsync", "write", "rename", "dirfsync"))
def test_enqueue_crash_points(sq_env: Env, tmp_path: Path, kind: str) -> None:
    items = [f"i{n}" for n in range(6)]

    def once(k: int) -> bool:
        env = dict(sq_env, STATEQUEUE_HOME=str(tmp_path / f"{kind}{k}"))
        out = sq(env, "enqueue", "--json", *items, crash=f"{kind}:{k}")
        if out.returncode != -signal.SIGKILL:
            assert out.returncode == 0, out.stderr
            return False
        POINTS["crashes"] += 1
        again = sq(env, "enqueue", "--json", *items)
        assert again.returncode == 0, again.stderr
        summary = json.loads(again.stdout)
        assert summary["added"] + summary["skipped"] == len(items)
        assert counts(env)["pending"] == len(items)
        return True

    sweep(once)


@pytest.mark.parametrize("kind", kinds("recorded", "write", "fsync", "spawn"))
def test_run_crash_points(sq_env: Env, tmp_path: Path, kind: str) -> None:
    n = 4

    def once(k: int) -> bool:
        env = dict(sq_env, STATEQUEUE_HOME=str(tmp_path / f"{kind}{k}"))
        log = tmp_path / f"{kind}{k}.log"
        sq(env, "enqueue", *[str(i) for i in range(n)])
        worker = ["sh", "-c", f'echo "$0" >> {log}', "{}"]
        first = sq(env, "run", "--no-live", "--", *worker, crash=f"{kind}:{k}")
        crashed = first.returncode == -signal.SIGKILL
        acked = {line.split()[2] for line in first.stderr.splitlines() if line.startswith("[ok]")}
        if crashed:
            POINTS["crashes"] += 1
            rest = sq(env, "run", "--no-live", "--", *worker)
            assert rest.returncode in (0, 3), rest.stderr
        else:
            assert first.returncode == 0, first.stderr
        assert counts(env)["done"] == n
        results = json.loads("[" + ",".join(sq(env, "results", "--json").stdout.split()) + "]")
        assert acked <= {r["item"] for r in results if r["state"] == "done"}
        runs = log.read_text().split() if log.exists() else []
        assert sorted(set(runs)) == [str(i) for i in range(n)]
        assert len(runs) - n <= (1 if crashed else 0), runs
        return crashed

    sweep(once)


@pytest.mark.parametrize("kind", kinds("rename", "write", "fsync", "dirfsync"))
def test_compact_crash_points(sq_env: Env, tmp_path: Path, kind: str) -> None:
    items = [f"c{n}" for n in range(5)]

    def once(k: int) -> bool:
        env = dict(sq_env, STATEQUEUE_HOME=str(tmp_path / f"{kind}{k}"))
        sq(env, "enqueue", *items)
        sq(env, "run", "--no-live", "--limit", "3", "--", "true")
        out = sq(env, "compact", crash=f"{kind}:{k}")
        crashed = out.returncode == -signal.SIGKILL
        if crashed:
            POINTS["crashes"] += 1
        else:
            assert out.returncode == 0, out.stderr
        assert counts(env) == {
            "pending": 2,
            "running": 0,
            "done": 3,
            "failed": 0,
            "cancelled": 0,
            "held": 0,
        }
        assert json.loads(sq(env, "enqueue", "--json", *items).stdout)["added"] == 0
        assert sq(env, "compact").returncode == 0
        assert sq(env, "run", "--no-live", "--", "true").returncode == 0
        assert counts(env)["done"] == 5
        assert len(sq(env, "results", "--json").stdout.split()) == 5
        return crashed

    sweep(once)
