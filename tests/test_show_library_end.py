"""`show` of an attempt the library finished (work(), map()) says nothing of an
exit code: it has none, and `show` used to print `done (exit ?)`."""

from __future__ import annotations

import subprocess

from statequeue.api.queue import Queue
from tests.conftest import STATEQUEUE


def test_show_says_no_exit_for_a_library_attempt(sq_env: dict[str, str], store_url: str) -> None:
    with Queue("lib", store=store_url or None) as queue:
        queue.enqueue(["a", "b"])
        for item in queue.work():
            if item.item == "a":
                item.done()
            else:
                item.fail("no luck")
    store = ["--store", store_url] if store_url else []
    run = [STATEQUEUE, *store, "-q", "lib"]
    subprocess.run([*run, "enqueue", "c"], env=sq_env, check=True, capture_output=True)
    ran = subprocess.run([*run, "run", "--", "true"], env=sq_env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr

    def ends(item_id: int) -> list[str]:
        out = subprocess.run(
            [*run, "show", str(item_id)], env=sq_env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return [line.strip() for line in out.stdout.splitlines() if " end #" in f" {line.strip()}"]

    assert "?" not in "".join(ends(1) + ends(2)), ends(1) + ends(2)
    assert any(line.endswith("end #1 attempt 1: done") for line in ends(1)), ends(1)
    assert any(line.endswith("end #2 attempt 1: failed (no luck)") for line in ends(2)), ends(2)
    # A command's attempt still names its exit code.
    assert any(line.endswith("end #3 attempt 1: done (exit 0)") for line in ends(3)), ends(3)
