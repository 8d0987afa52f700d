"""A failure's reason on a progress line shows control characters escaped.

An attacker's find: a persistent worker's reply `{"reason": "a\\u0000b"}` put a
raw NUL on the run's stderr (an escape sequence would reach the terminal as
well), and a 500 KB reason was printed whole. Item texts were escaped already;
reasons now are too, and cut to REASON_SHOWN characters (`show ID` has them whole).
"""

from __future__ import annotations

from statequeue.cli import progress
from statequeue.core.models import Claim, ItemState, Outcome
from statequeue.run.events import ItemFinished


def _line(reason: str, state: ItemState = ItemState.FAILED) -> str:
    claim = Claim(item_id=1, item="a", attempt=1, runner_id="r")
    outcome = Outcome(ok=False, exit_code=1, reason=reason)
    return progress._line(ItemFinished(claim, outcome, state, retries=1))


def test_control_characters_in_a_reason_are_escaped() -> None:
    line = _line("a\x00b\x1b[31mred")
    assert line == "[failed] #1 a attempt 1: a\\x00b\\x1b[31mred"
    assert line.isprintable()
    retry = _line("tab\there", ItemState.PENDING)
    assert retry == "[retry] #1 a attempt 1: tab\\there; retry 1 of 1 follows"


def test_a_huge_reason_is_cut_on_the_progress_line() -> None:
    line = _line("x" * 500_000)
    assert len(line) < progress.REASON_SHOWN + 40
    assert line.endswith("…")
