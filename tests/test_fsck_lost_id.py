"""`fsck --repair` never hands out an id twice, even when the only damaged
record is the enqueue of the highest id while its attempts' records survive:
the id is left out, as the lost ids are. Before, the next `enqueue` reused it,
and the new item showed the lost one's attempts, history and log as its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120)


def test_repair_never_reuses_the_id_of_an_item_whose_enqueue_was_lost(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        for item in q.work():
            with item:
                item.done()
    journal = sq_home / "default" / "journal.jsonl"
    text = journal.read_text()
    assert text.count('"item":"c"') == 1
    journal.write_text(text.replace('"item":"c"', '"item":"C"'))  # a bad checksum
    repair = _sq(sq_env, "fsck", "--repair")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "no surviving record names item id(s) 3: left out, never reused" in repair.stdout
    assert _sq(sq_env, "enqueue", "d").returncode == 0
    with Queue(home=sq_home, create=False) as q:
        views = [(v.item_id, v.item, v.state.value, v.attempts) for v in q.store.items()]
    assert views == [(1, "a", "done", 1), (2, "b", "done", 1), (4, "d", "pending", 0)]
