"""Issue 23, the line protocol of persistent workers (run/protocol.py): the
request for each kind of claim, and every way a reply can break the protocol."""

from __future__ import annotations

import base64
import json
import os

import pytest

from statequeue.core.models import Claim
from statequeue.run.protocol import (
    BadReply,
    ExtraReply,
    Reply,
    ReplyReader,
    parse_reply,
    request_line,
)


def test_a_request_is_one_json_line_with_what_the_claim_says() -> None:
    plain = json.loads(request_line(Claim(17, "a.pdf", 1, "r")))
    assert plain == {"id": 17, "item": "a.pdf", "attempt": 1}
    line = request_line(Claim(3, "x\ny", 2, "r", interrupted=True, token=99))
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert json.loads(line) == {
        "id": 3,
        "item": "x\ny",
        "attempt": 2,
        "interrupted": True,
        "token": 99,
    }


def test_an_item_that_is_not_utf8_comes_as_base64_only() -> None:
    raw = b"caf\xe9.txt"
    request = json.loads(request_line(Claim(1, os.fsdecode(raw), 1, "r")))
    assert "item" not in request
    assert base64.b64decode(request["item_b64"]) == raw


def test_good_replies() -> None:
    assert parse_reply(b'{"id": 4, "ok": true, "result": [1]}', 4) == Reply(True, "", [1])
    assert parse_reply(b'{"id": 4, "ok": false, "reason": "no"}', 4) == Reply(False, "no")
    assert parse_reply(b'{"id": 4, "ok": false}', 4).reason == "the worker replied ok: false"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"nope", "reply is not JSON: 'nope'"),
        (b"[4, true]", "reply is not a JSON object: '[4, true]'"),
        (b'{"ok": true}', "reply names id null, not 4"),
        (b'{"id": "4", "ok": true}', 'reply names id "4", not 4'),
        (b'{"id": true, "ok": true}', "reply names id true, not 4"),
        (b'{"id": 4}', 'reply has no "ok": true or false: \'{"id": 4}\''),
        (b'{"id": 4, "ok": 1}', 'reply has no "ok": true or false'),
        (b'{"id": 4, "ok": false, "reason": 3}', 'reply\'s "reason" is not a string'),
        (b'{"id": 4, "ok": true, "result": 123456789012345678901}', "an integer exceeds"),
    ],
)
def test_bad_replies_say_what_is_wrong(line: bytes, says: str) -> None:
    with pytest.raises(BadReply) as caught:
        parse_reply(line, 4)
    assert says in str(caught.value)


def test_the_reader_splits_lines_and_refuses_a_reply_with_no_request() -> None:
    reader = ReplyReader()
    reader.feed(b'{"id": 1, "ok": tr')
    assert reader.next_reply(1) is None and reader.pending()
    reader.feed(b'ue}\n{"id": 1, "ok": true}\n')
    assert reader.next_reply(1) == Reply(True)
    with pytest.raises(BadReply, match="reply sent without a request"):
        reader.next_reply(None)
    assert not reader.pending()


def test_take_gives_the_reply_and_leaves_a_second_line_read_with_it_pending() -> None:
    reader = ReplyReader()
    assert reader.take(b'{"id": 1, "ok": true, "result": 5}\n', 1) == Reply(True, "", 5)
    assert not reader.pending()
    assert reader.take(b'{"id": 2, "ok": tr', 2) is None and reader.pending()
    assert reader.take(b'ue}\n{"id": 2, "o', 2) == Reply(True)
    assert reader.pending()  # part of a line sent without a request: the next send says so
    with pytest.raises(BadReply, match="reply names id 2, not 3"):
        ReplyReader().take(b'{"id": 2, "ok": true}\n', 3)
    # A second reply read with the first: the first stands, the second is
    # left for the caller (the worker is stopped: persistent.py).
    both = ReplyReader()
    assert both.take(b'{"id": 4, "ok": true, "result": 1}\n{"id": 4, "ok": true}\n', 4) == Reply(
        True, "", 1
    )
    assert both.pending()


def test_a_reply_naming_a_request_answered_before_is_a_second_reply() -> None:
    with pytest.raises(ExtraReply, match="a second reply to item 2: "):
        ReplyReader().take(b'{"id": 2, "ok": true}\n', 3, (1, 2))
    with pytest.raises(BadReply, match="reply names id 5, not 3") as caught:
        ReplyReader().take(b'{"id": 5, "ok": true}\n', 3, (1, 2))
    assert not isinstance(caught.value, ExtraReply)
