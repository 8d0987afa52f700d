"""`logs --item TEXT`, as `show --item TEXT` (the README names items by their
text): an outside tester's `logs --item 7` was refused "No such option".
By exact text, exit 7 when no item has it, and one way of naming only."""

from __future__ import annotations

import subprocess

from tests.conftest import STATEQUEUE


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_logs_names_an_item_by_its_text(sq_env: dict[str, str]) -> None:
    assert _sq(sq_env, "enqueue", "alpha", "beta").returncode == 0
    assert _sq(sq_env, "run", "--", "sh", "-c", "echo out-$1", "_", "{}").returncode == 0
    by_text = _sq(sq_env, "logs", "--item", "beta")
    assert (by_text.returncode, by_text.stdout) == (0, "out-beta\n"), by_text.stderr
    assert by_text.stdout == _sq(sq_env, "logs", "2").stdout
    missing = _sq(sq_env, "logs", "--item", "gamma")
    assert missing.returncode == 7 and missing.stderr.count("\n") == 1, missing.stderr
    both = _sq(sq_env, "logs", "1", "--item", "beta")
    assert both.returncode == 2 and "one of them" in both.stderr, both.stderr
    with_all = _sq(sq_env, "logs", "--all", "--item", "beta")
    assert with_all.returncode == 2 and "one of them" in with_all.stderr, with_all.stderr
