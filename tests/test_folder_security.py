"""Shared homes and planted links (issue 10, point 5), and read-only queues
(issue 10, point 11): statequeue touches nothing outside its home, refuses
folders another user could write, and reads a queue it may not write.

Links are planted in the test's own folders (as an attacker could have while
the folder was open to them); what matters is that no outside file changes
and none is created.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.fileio import FileOps, FolderEntry
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal.store import JournalStore
from tests.conftest import STATEQUEUE
from tests.privileges import without_write_access

Env = dict[str, str]
OTHER_UID = 54321
UNSAFE = 9  # ExitCode.UNSAFE_FOLDER
SECRET = b'{"secret": "the victim\'s file"}\n'


def sq(env: Env, *args: str, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*wrap, STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the home, holding a victim file."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "victim").write_bytes(SECRET)
    return folder


def untouched(outside: Path) -> None:
    """The victim is byte-identical and nothing else appeared outside."""
    assert (outside / "victim").read_bytes() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


@pytest.fixture
def queue(sq_home: Path) -> Path:
    """The queue `default` with one pending item, "a" (made through the library:
    quicker than a process)."""
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    return sq_home / "default"


# -- ownership and modes (sshd's StrictModes) ----------------------------------------


@pytest.mark.parametrize(
    ("mode", "args"),
    [(0o770, ["status"]), (0o707, ["enqueue", "b"]), (0o777, ["run", "--", "true"])],
    ids=["group-status", "others-enqueue", "both-run"],
)
def test_a_home_writable_by_group_or_others_is_refused(
    queue: Path, sq_env: Env, sq_home: Path, mode: int, args: list[str]
) -> None:
    os.chmod(sq_home, mode)
    one_line_error(sq(sq_env, *args), UNSAFE, str(sq_home), f"chmod 700 {sq_home}")


def test_a_home_owned_by_another_user_is_refused(queue: Path, sq_env: Env, sq_home: Path) -> None:
    os.chown(sq_home, OTHER_UID, -1)
    one_line_error(sq(sq_env, "status"), UNSAFE, str(sq_home), f"uid {OTHER_UID}")
    one_line_error(sq(sq_env, "enqueue", "-q", "new", "x"), UNSAFE, str(sq_home))
    assert not (sq_home / "new").exists()


def test_a_new_home_is_made_private(sq_env: Env, sq_home: Path) -> None:
    assert sq(sq_env, "enqueue", "a").returncode == 0
    assert os.stat(sq_home).st_mode & 0o777 == 0o700
    assert os.stat(sq_home / "default").st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o720, 0o702], ids=["group", "others"])
def test_a_queue_folder_writable_by_group_or_others_is_refused(
    queue: Path, sq_env: Env, mode: int
) -> None:
    os.chmod(queue, mode)
    before = (queue / "journal.jsonl").read_bytes()
    one_line_error(sq(sq_env, "enqueue", "b"), UNSAFE, str(queue), f"chmod 700 {queue}")
    one_line_error(sq(sq_env, "list"), UNSAFE, str(queue))
    assert (queue / "journal.jsonl").read_bytes() == before


def test_a_queue_folder_owned_by_another_user_is_refused(queue: Path, sq_env: Env) -> None:
    os.chown(queue, OTHER_UID, -1)
    one_line_error(sq(sq_env, "run", "--", "true"), UNSAFE, str(queue), f"uid {OTHER_UID}")


@pytest.mark.parametrize("sub", ["logs", "claims", "runners"])
def test_a_subfolder_writable_by_others_is_refused(queue: Path, sq_env: Env, sub: str) -> None:
    os.chmod(queue / sub, 0o777)
    one_line_error(sq(sq_env, "run", "--", "true"), UNSAFE, str(queue / sub))


# -- planted links -------------------------------------------------------------------


def test_a_linked_queue_folder_is_refused(sq_env: Env, sq_home: Path, outside: Path) -> None:
    sq_home.mkdir(mode=0o700)
    (sq_home / "default").symlink_to(outside)
    for args in (["enqueue", "a"], ["fsck"]):
        one_line_error(sq(sq_env, *args), UNSAFE, str(sq_home / "default"), "symbolic link")
    untouched(outside)


def test_drop_of_a_linked_queue_says_why(sq_env: Env, sq_home: Path, outside: Path) -> None:
    sq_home.mkdir(mode=0o700)
    (sq_home / "q").symlink_to(outside)
    one_line_error(sq(sq_env, "drop", "q", "--yes"), UNSAFE, "symbolic link", f"rm {sq_home}/q")
    assert (sq_home / "q").is_symlink()
    untouched(outside)


def test_drop_still_removes_a_queue(queue: Path, sq_env: Env) -> None:
    assert sq(sq_env, "drop", "default", "--yes").returncode == 0
    assert not queue.exists()


def test_a_linked_log_is_not_overwritten(queue: Path, sq_env: Env, outside: Path) -> None:
    (queue / "logs" / "1.1.log").symlink_to(outside / "victim")
    done = sq(sq_env, "run", "--", "sh", "-c", "echo job output")
    assert done.returncode == 0, done.stderr
    untouched(outside)


def test_a_linked_claim_creates_nothing(queue: Path, sq_env: Env, outside: Path) -> None:
    (queue / "claims.lock").symlink_to(outside / "created-by-claim")
    one_line_error(sq(sq_env, "run", "--", "true"), UNSAFE, "claims.lock", "symbolic link")
    untouched(outside)
    assert sq(sq_env, "status", "--json").returncode == 0  # the queue is still fine


def test_a_linked_per_item_claim_of_an_older_version_creates_nothing(
    queue: Path, sq_env: Env, outside: Path
) -> None:
    (queue / "claims" / "1.lock").symlink_to(outside / "created-by-claim")
    sq(sq_env, "run", "--", "true")
    untouched(outside)


def test_a_linked_archive_is_not_overwritten(queue: Path, sq_env: Env, outside: Path) -> None:
    assert sq(sq_env, "run", "--", "true").returncode == 0
    (queue / "archive.jsonl").symlink_to(outside / "victim")
    one_line_error(sq(sq_env, "compact"), UNSAFE, "archive.jsonl", "symbolic link")
    untouched(outside)


def test_a_linked_result_is_neither_read_nor_written(
    queue: Path, sq_env: Env, outside: Path
) -> None:
    with Queue(home=queue.parent) as q:
        q.enqueue(["b"])
    (queue / "logs" / "1.1.result").symlink_to(outside / "victim")  # read back?
    (queue / "logs" / "2.1.result").symlink_to(outside / "victim")  # written through?
    script = 'test "$0" = a || echo \'{"mine": 1}\' > "$STATEQUEUE_RESULT"'
    done = sq(sq_env, "run", "--", "sh", "-c", script, "{}")
    assert done.returncode == 0, done.stderr
    untouched(outside)
    results = sq(sq_env, "results", "--json").stdout
    assert "victim" not in results and "secret" not in results
    assert "mine" in results
    assert "secret" not in (queue / "journal.jsonl").read_text()


def test_a_linked_verify_result_is_not_written_through(
    queue: Path, sq_env: Env, outside: Path
) -> None:
    (queue / "logs" / "1.verify").symlink_to(outside / "victim")
    hook = 'echo written > "$STATEQUEUE_RESULT"'
    done = sq(sq_env, "run", "--verify-first", "--verify", hook, "--", "true")
    assert done.returncode == 0, done.stderr
    untouched(outside)
    assert not (queue / "logs" / "1.verify").exists()


def test_a_linked_journal_is_refused(queue: Path, sq_env: Env, outside: Path) -> None:
    (queue / "journal.jsonl").replace(outside / "journal.jsonl")
    (queue / "journal.jsonl").symlink_to(outside / "journal.jsonl")
    kept = (outside / "journal.jsonl").read_bytes()
    for args in (["status"], ["fsck", "--repair"]):
        one_line_error(sq(sq_env, *args), UNSAFE, "journal.jsonl", "symbolic link")
    assert (outside / "journal.jsonl").read_bytes() == kept


def test_a_linked_checkpoint_is_not_followed(
    queue: Path, sq_env: Env, outside: Path, tmp_path: Path
) -> None:
    env = {**sq_env, "STATEQUEUE_CHECKPOINT_EVERY": "1"}
    (queue / "state.ckpt").symlink_to(outside / "victim")  # read as a checkpoint?
    (queue / "keys.ckpt").symlink_to(outside / "new-keys")  # written through?
    assert sq(env, "enqueue", *[f"i{n}" for n in range(20)]).returncode == 0
    untouched(outside)
    assert not (queue / "state.ckpt").is_symlink()


def test_a_linked_lock_creates_nothing(queue: Path, sq_env: Env, outside: Path) -> None:
    (queue / "lock").unlink()
    (queue / "lock").symlink_to(outside / "created-by-lock")
    for args in (["enqueue", "b"], ["fsck"]):
        one_line_error(sq(sq_env, *args), UNSAFE, "lock", "symbolic link")
    untouched(outside)


@pytest.mark.parametrize("sub", ["logs", "claims", "runners"])
def test_a_linked_subfolder_is_refused(queue: Path, sq_env: Env, outside: Path, sub: str) -> None:
    shutil.rmtree(queue / sub)
    (queue / sub).symlink_to(outside)
    one_line_error(sq(sq_env, "run", "--", "sh", "-c", "echo out"), UNSAFE, sub, "symbolic link")
    untouched(outside)


# -- read-only queues (issue 10, point 11) ------------------------------------------

READ_ONLY_COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["list"],
    ["show", "1"],
    ["results"],
    ["events"],
    ["queues"],
    ["fsck"],
    ["logs", "1"],
]


@pytest.fixture
def read_only_queue(queue: Path, sq_env: Env) -> Iterator[Path]:
    """A queue with a finished item (and its log) and a pending one, then made
    read-only: folders 0500, files 0400."""
    with Queue(home=queue.parent) as q:
        q.enqueue(["b"])
    assert sq(sq_env, "run", "--limit", "1", "--", "sh", "-c", "echo hello {}").returncode == 0
    folder = queue
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o500 if path.is_dir() else 0o400)
    yield folder
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_read_only_commands_work_on_a_read_only_queue(read_only_queue: Path, sq_env: Env) -> None:
    before = _snapshot(read_only_queue)
    wrap = without_write_access()
    for args in READ_ONLY_COMMANDS:
        done = sq(sq_env, *args, wrap=wrap)
        assert done.returncode == 0, (args, done.stderr)
        assert "Permission denied" not in done.stderr
        if args == ["logs", "1"]:
            assert "hello a" in done.stdout
    assert _snapshot(read_only_queue) == before


def test_a_write_to_a_read_only_queue_names_the_file(read_only_queue: Path, sq_env: Env) -> None:
    before = _snapshot(read_only_queue)
    done = sq(sq_env, "enqueue", "c", wrap=without_write_access())
    one_line_error(done, 2, f"cannot write {read_only_queue}/", "Permission denied")
    done = sq(sq_env, "run", "--", "true", wrap=without_write_access())
    one_line_error(done, 2, f"cannot write {read_only_queue}/", "Permission denied")
    assert _snapshot(read_only_queue) == before


def test_logs_does_not_print_a_linked_log(queue: Path, sq_env: Env, outside: Path) -> None:
    assert sq(sq_env, "run", "--", "true").returncode == 0  # attempt 1, which logs nothing
    (queue / "logs" / "1.1.log").symlink_to(outside / "victim")
    done = sq(sq_env, "logs", "1")
    assert "secret" not in done.stdout
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    untouched(outside)


def test_a_queue_folder_swapped_for_a_link_while_open_is_not_followed(
    sq_home: Path, outside: Path
) -> None:
    # Everything is opened relative to the folder fd taken at open: replacing
    # the folder's path by a link afterwards redirects nothing.
    store = JournalStore(sq_home / "q", create=True)
    try:
        store.enqueue(["a", "b"])
        (sq_home / "q").rename(sq_home / "moved")
        (sq_home / "q").symlink_to(outside)
        claim = store.claim(new_runner())
        assert claim is not None
        store.finish(claim, Outcome(ok=True))
        store.compact()
        assert store.status().counts["done"] == 1
    finally:
        store.close()
    untouched(outside)
    assert (sq_home / "moved" / "archive.jsonl").stat().st_size > 0


def test_creating_a_queue_makes_its_folder_durable_through_file_ops(sq_home: Path) -> None:
    # The crash-point and power-loss layers see the home's fsync (the new
    # folder's name) before the journal's rename, and renames relative to the fd.
    seen: list[tuple[str, str]] = []

    class Recording(FileOps):
        def fsync_dir(self, path: str) -> None:
            seen.append(("dirfsync", str(path)))
            super().fsync_dir(path)

        def replace(self, src: str, dst: str) -> None:
            seen.append(("rename", str(dst)))
            assert isinstance(dst, FolderEntry)
            super().replace(src, dst)

    sq_home.mkdir(mode=0o700)
    JournalStore(sq_home / "q", create=True, ops=Recording()).close()
    journal = str(sq_home / "q" / "journal.jsonl")
    assert seen[:3] == [
        ("dirfsync", str(sq_home)),
        ("rename", journal),
        ("dirfsync", str(sq_home / "q")),
    ]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("journal.jsonl", ["status"]),
        ("lock", ["status"]),
        ("claims.lock", ["run", "--no-live", "--", "true"]),
        ("reserve", ["run", "--no-live", "--", "true"]),
        ("state.ckpt", ["compact"]),
        ("stats.ckpt", ["compact"]),
        ("compact.lock", ["compact"]),
    ],
)
def test_a_folder_at_a_queue_files_name_is_refused_with_exit_9(
    sq_env: Env, sq_home: Path, name: str, args: list[str]
) -> None:
    """As a FIFO there is (`help internals`): one line naming it, exit 9. It
    was exit 6, "Is a directory", as if a write had failed (an outside
    tester's finding)."""
    assert sq(sq_env, "enqueue", "a", "b").returncode == 0
    assert sq(sq_env, "run", "--no-live", "--limit", "1", "--", "true").returncode == 0
    target = sq_home / "default" / name
    aside = target.with_name(f"{name}.aside")
    if target.exists():
        target.rename(aside)
    target.mkdir(mode=0o700)
    one_line_error(sq(sq_env, *args), UNSAFE, str(target), "is a folder")
    target.rmdir()
    if aside.exists():
        aside.rename(target)
    assert sq(sq_env, "status").returncode == 0  # nothing else was changed
