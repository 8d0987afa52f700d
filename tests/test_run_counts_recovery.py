"""A run counts what its own recovery settled as failed or held.

Found by an outside tester: a run whose recovery held the items a killed
runner left (--on-interrupted hold, poison after --max-crashes) or marked
them failed (--on-interrupted fail) said so in a notice, then summed up
"0 failed" and exited 0 -- "nothing to do" when no other item was left.
Those items now count in the summary (failed / held, text and --json) and
make the run exit 1, as `help exit-codes` says.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE
from tests.dead_runner import die_holding_two

RUN_TIMEOUT = 120


def _after_a_crash(
    sq_env: dict[str, str], sq_home: Path, store_url: str, items: list[str]
) -> list[str]:
    """Items 1 and 2 claimed by a runner that died; the CLI's --store words."""
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(items)
    die_holding_two(sq_env, sq_home, store_url)
    return ["--store", store_url] if store_url else []


def _run(env: dict[str, str], store: list[str], *options: str) -> subprocess.CompletedProcess[str]:
    argv = [STATEQUEUE, *store, "run", *options, "--", "true"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


@pytest.mark.parametrize(("policy", "word"), [("hold", "held"), ("fail", "failed")])
def test_items_recovery_settles_count_and_fail_the_run(
    sq_env: dict[str, str], sq_home: Path, store_url: str, policy: str, word: str
) -> None:
    store = _after_a_crash(sq_env, sq_home, store_url, ["a", "b", "c"])
    ran = _run(sq_env, store, "--on-interrupted", policy)
    assert "recovered 2 interrupted items (1, 2)" in ran.stderr, ran.stderr
    held = 2 if policy == "hold" else 0
    failed = 2 - held
    expected = f"items: 1 ok, {failed} failed" + (f", {held} held" if held else "")
    assert f"{expected}; 1 attempt started" in ran.stderr, ran.stderr
    assert ran.returncode == ExitCode.FAILED, ran.stderr
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        assert sorted(v.state.value for v in q.items()) == sorted(["done", word, word])


def test_a_run_with_nothing_else_to_do_still_fails(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    store = _after_a_crash(sq_env, sq_home, store_url, ["a", "b"])
    ran = _run(sq_env, store, "--max-crashes", "1", "--json")
    assert "held 2 poison items (1, 2)" in ran.stderr, ran.stderr
    summary = json.loads(ran.stdout)
    assert (summary["succeeded"], summary["failed"], summary["held"]) == (0, 0, 2), ran.stdout
    assert summary["exit_code"] == ran.returncode == ExitCode.FAILED, ran.stderr


def test_quiet_keeps_the_summary_of_a_run_that_only_recovered(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    store = _after_a_crash(sq_env, sq_home, store_url, ["a", "b"])
    ran = _run(sq_env, store, "--quiet", "--on-interrupted", "fail")
    assert "nothing to do" not in ran.stderr, ran.stderr
    assert "statequeue: items: 0 ok, 2 failed; 0 attempts started" in ran.stderr, ran.stderr
    assert ran.returncode == ExitCode.FAILED, ran.stderr
