"""Items that are not UTF-8 or hold control characters: their JSON form, their
escaped form for terminals, and the items the API refuses (issue 11 point 1,
issue 10 points 6 and 9)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import orjson
import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import InvalidItem, UsageError
from statequeue.core.textsafe import escaped, item_json, record_json, shown

RAW = os.fsdecode(b"caf\xe9 \xff.pdf")  # Latin-1 file name: not UTF-8


@pytest.mark.parametrize(
    ("item", "fields"),
    [
        ("plain.pdf", {"item": "plain.pdf"}),
        ("café ☕", {"item": "café ☕"}),
        ("a\nb\x1b[2J", {"item": "a\nb\x1b[2J"}),
        (RAW, {"item": "caf\ufffd \ufffd.pdf", "item_b64": "Y2Fm6SD/LnBkZg=="}),
    ],
)
def test_item_json_is_lossless_and_valid_json(item: str, fields: dict[str, str]) -> None:
    assert item_json(item) == fields
    orjson.dumps(item_json(item))  # never raises
    raw = base64.b64decode(fields["item_b64"]) if "item_b64" in fields else item.encode()
    assert os.fsdecode(raw) == item


@pytest.mark.parametrize(
    ("item", "shown_as"),
    [
        ("plain.pdf", "plain.pdf"),
        ("café ☕", "café ☕"),
        (RAW, "caf\\xe9 \\xff.pdf"),
        ("a\nb", "a\\nb"),
        ("tab\there\r", "tab\\there\\r"),
        ("\x1b[2J\x07\x7f", "\\x1b[2J\\a\\x7f"),
        ("back\\slash", "back\\\\slash"),
        ("csi\x9bx", "csi\\u009bx"),
        ("rtl\u202egpj.exe", "rtl\\u202egpj.exe"),
    ],
)
def test_escaped_shows_every_byte_and_no_control(item: str, shown_as: str) -> None:
    out = escaped(item)
    assert out == shown_as
    out.encode("utf-8")  # never a lone surrogate
    assert all(c.isprintable() for c in out)


def test_shown_cuts_after_escaping() -> None:
    assert shown("\n" * 10, 5) == "\\n\\n…"


def test_record_json_turns_itemx_into_item_and_b64() -> None:
    rec = {"seq": 2, "t": "enq", "id": 1, "itemx": "Y2Fm6SD/LnBkZg=="}
    assert record_json(rec) == {
        "seq": 2,
        "t": "enq",
        "id": 1,
        "item": "caf\ufffd \ufffd.pdf",
        "item_b64": "Y2Fm6SD/LnBkZg==",
    }


def test_non_utf8_items_round_trip_through_the_api(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        assert q.enqueue([RAW, "ok"]).added == 2
        assert q.enqueue([RAW]).skipped == 1
        views = q.items()
        assert [v.item for v in views] == [RAW, "ok"]
        assert item_json(views[0].item)["item_b64"] == "Y2Fm6SD/LnBkZg=="


@pytest.mark.parametrize(
    ("items", "problem"),
    [
        (["ok", "lone \ud800 surrogate"], "lone surrogate \\(U\\+D800\\)"),
        (["ok", "\ude00"], "lone surrogate"),
        (["ok", 42], "must be a str, not int"),
        (["ok", ""], "empty item"),
        (["ok", "a\0b"], "NUL"),
    ],
)
def test_the_api_refuses_bad_items_by_name_and_changes_nothing(
    sq_home: Path, items: list[str], problem: str
) -> None:
    with Queue(home=sq_home) as q:
        with pytest.raises(InvalidItem, match=problem) as caught:
            q.enqueue(items)
        assert caught.value.index == 1
        assert isinstance(caught.value, UsageError)
        assert q.status().total == 0
