"""`drop` of a queue the user may not change: exit 2 naming the queue, as
every other write to such a queue (NoAccess), not exit 6 "an I/O error" with
a bare file name relative to a folder the message never named."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from statequeue import Queue
from statequeue.cli.app import _invoke
from statequeue.cli.errors import run_guarded


def test_drop_without_permission_says_which_queue_and_exits_2(
    sq_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    Queue("q", home=sq_home).enqueue(["a"])

    def denied(path: str, *args: Any, **kwargs: Any) -> None:
        # What rmtree meets in a queue folder the user may read but not change
        # (a root test cannot lose its own rights; the tester saw it with them dropped).
        raise PermissionError(13, "Permission denied", "claims.lock")

    monkeypatch.setattr(shutil, "rmtree", denied)
    assert run_guarded(_invoke, ["drop", "q", "--yes"]) == 2
    err = capsys.readouterr().err
    assert err == f"statequeue: cannot write {sq_home / 'q'}: Permission denied (claims.lock)\n"
