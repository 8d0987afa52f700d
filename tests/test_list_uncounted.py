"""`list` shows an item given back uncounted with the attempts the store counts.

An attempt that never began (the runner was short of resources, its keeper was
gone, or it stopped taking items after claiming one) is given back with its
count restored. `list` used to fall back to the item's last start record when
the count was 0, and showed 1 attempt for an item that never ran.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from statequeue import Queue
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from tests.conftest import STATEQUEUE


def test_an_attempt_given_back_uncounted_is_not_listed(
    sq_home: Path, sq_env: dict[str, str]
) -> None:
    runner = new_runner()
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
        claim = q.claim(runner)
        assert claim is not None and claim.item == "a"
        q.release(claim, "not started: test", uncounted=True)
        views = {v.item: (v.state, v.attempts) for v in q.items()}
        assert views == {"a": (ItemState.PENDING, 0), "b": (ItemState.PENDING, 0)}
        # Its next claim is attempt 1 again, and once done it lists 1.
        claim = q.claim(runner)
        assert claim is not None and (claim.item, claim.attempt) == ("a", 1)
        q.finish(claim, Outcome(ok=True, exit_code=0))
        assert [(v.item, v.attempts) for v in q.items()] == [("a", 1), ("b", 0)]
    listed = subprocess.run(
        [STATEQUEUE, "list"], env=sq_env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert listed == ["1\tdone\t1\ta", "2\tpending\t0\tb"]
