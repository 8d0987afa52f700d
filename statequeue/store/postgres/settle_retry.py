"""Schema version 11: a retried finish that overtakes its first try.

A finish is retried on a new connection when the old one was cut before its
answer came (session.py). The cut may come while the first try still runs on
the server: its statement goes on, and commits, with nobody to answer. The
retry then looks for the first try's result and finds none (not committed
yet), goes on to settle the item, and its DELETE (or UPDATE) of the item's
running row waits for the first try's row lock; once the first try commits,
the row is gone and the retry called the token stale: ``ClaimLost``, "nothing
was recorded", though the result was, and the next item the first try
claimed was left running until its lease ran out, then counted as a crash.

Now a retried finish whose settling finds no running row looks for the
result once more: the statement runs in a new snapshot (READ COMMITTED, a
volatile function), which sees the first try's commit it waited for. The
fused finish-and-claim then adopts the claim that first try made, as it
already did when the first try had committed before the retry began.

Built from version 7's text (lean_writes.py), which is frozen, so that the
two differ in this block only.
"""

from __future__ import annotations

from statequeue.store.postgres.lean_writes import V7_FINISH, V7_FINISH_AND_CLAIM

_STALE = """        IF NOT FOUND THEN
            EXIT settling;  -- stale: taken over, or finished already
        END IF;
"""

_STALE_OR_OVERTAKEN = """        IF NOT FOUND THEN
            IF p_retried THEN
                -- Waited for the first try, still running when this began:
                -- its result is committed now, and this statement sees it.
                SELECT r.st INTO recorded FROM (
                    SELECT x.state AS st FROM statequeue.results x
                    WHERE x.queue = p_queue AND x.id = p_id AND x.token = p_token
                    UNION ALL SELECT a.state FROM statequeue.archived_results a
                    WHERE a.token = p_token
                ) r LIMIT 1;
            END IF;
            EXIT settling;  -- stale: taken over, or finished already
        END IF;
"""


def _overtaken(text: str) -> str:
    if text.count(_STALE) != 1:
        raise AssertionError("version 7's settling block is not where version 11 expects it")
    return text.replace(_STALE, _STALE_OR_OVERTAKEN)


V11_SETTLE_RETRY = _overtaken(V7_FINISH) + _overtaken(V7_FINISH_AND_CLAIM)
