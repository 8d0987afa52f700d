"""`fsck --repair` names every item id it cannot vouch for (promise 2: ids it
reports as lost are "reported, never silently dropped").

Before, a damaged enqueue record among those appended since the last
compaction (or since the queue was made) was dropped with ``lost_ids: []``:
only ids below the header's ``next_id`` were looked at. And a dropped record
naming an item (an ``end``) turned a done item back into a running one,
which runs again, without a word. Now the lost ids are found from the id
sequence, and the ids whose state may have gone back are listed as
``state_unsure_ids``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import STATEQUEUE


def _sq(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )


def _ok(env: dict[str, str], *args: str, stdin: str = "") -> str:
    done = _sq(env, *args, stdin=stdin)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _listed(env: dict[str, str]) -> dict[int, str]:
    lines = _ok(env, "list", "--json").splitlines()
    return {(v := json.loads(line))["id"]: v["state"] for line in lines}


def _damage_line(journal: Path, needle: bytes, old: bytes, new: bytes) -> None:
    """Change ``old`` to ``new`` in the one line holding ``needle`` (its
    checksum no longer matches)."""
    lines = journal.read_bytes().split(b"\n")
    (index,) = [i for i, line in enumerate(lines) if needle in line]
    assert old in lines[index]
    lines[index] = lines[index].replace(old, new, 1)
    journal.write_bytes(b"\n".join(lines))


def _compacted_then_run(env: dict[str, str]) -> None:
    """Ids 1-3 done and archived by a compaction; ids 4-6 enqueued and done after it."""
    _ok(env, "enqueue", stdin="a\nb\nc\n")
    _ok(env, "run", "--", "true")
    assert "archived 3" in _ok(env, "compact")
    _ok(env, "enqueue", stdin="d\ne\nf\n")
    _ok(env, "run", "--", "true")
    assert _listed(env) == {i: "done" for i in range(1, 7)}


def test_a_lost_enqueue_after_the_header_is_reported_as_lost(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    _ok(sq_env, "enqueue", stdin="a\nb\nc\nd\ne\n")
    _damage_line(sq_home / "default" / "journal.jsonl", b'"id":3,', b'"item":"c"', b'"item":"x"')
    report = json.loads(_ok(sq_env, "fsck", "--repair", "--json"))
    assert report["repaired"] and report["journal"]["bad_lines"] == [4]
    assert report["lost_ids"] == [[3, 3]]
    assert report["state_unsure_ids"] == []  # the dropped record named only the lost id
    assert _listed(sq_env) == {1: "pending", 2: "pending", 4: "pending", 5: "pending"}
    assert json.loads(_ok(sq_env, "fsck", "--json"))["damaged"] is False
    _ok(sq_env, "enqueue", "f")
    assert max(_listed(sq_env)) == 6  # id 3 is never handed out again


def test_a_dropped_end_after_the_last_compaction_names_the_item_whose_state_went_back(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    _compacted_then_run(sq_env)
    journal = sq_home / "default" / "journal.jsonl"
    _damage_line(journal, b'"t":"end","id":5,', b'"state":"done"', b'"state":"dome"')
    repair = _ok(sq_env, "fsck", "--repair")
    assert "bad records at lines" in repair
    assert "repaired: the valid records now form the queue" in repair
    assert (
        "item id(s) 5 were named by dropped records (or may have been): "
        "their state may have gone back, and a done one may run again"
    ) in repair
    assert "no surviving record names" not in repair  # nothing is lost
    states = _listed(sq_env)
    assert states[5] != "done" and {i: s for i, s in states.items() if i != 5} == {
        i: "done" for i in (1, 2, 3, 4, 6)
    }


def test_the_json_report_names_the_item_and_an_unreadable_drop_names_every_id_it_may_have(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    _compacted_then_run(sq_env)
    _ok(sq_env, "enqueue", stdin="g\nh\ni\nj\n")  # ids 7-10, pending
    journal = sq_home / "default" / "journal.jsonl"
    _damage_line(journal, b'"t":"end","id":6,', b'"state":"done"', b'"state":"dome"')
    # Zero the enqueue records of ids 8 and 9 (their newline too): one
    # unreadable line where two records were.
    data = bytearray(journal.read_bytes())
    first = data.rindex(b"\n", 0, data.index(b'"t":"enq","id":8,')) + 1
    last = data.index(b"\n", data.index(b'"t":"enq","id":9,'))
    data[first:last] = bytes(last - first)
    journal.write_bytes(bytes(data))
    report = json.loads(_ok(sq_env, "fsck", "--repair", "--json"))
    assert report["lost_ids"] == [[8, 9]]
    # Id 6's end was read. The unreadable records may have named any id that
    # existed before them and that no later record speaks for: 4-7 (1-3 are
    # archived; 10 was enqueued after them).
    assert report["state_unsure_ids"] == [[4, 7]]
    assert sorted(_listed(sq_env)) == [1, 2, 3, 4, 5, 6, 7, 10]
