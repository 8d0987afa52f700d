"""``python -m statequeue``."""

from __future__ import annotations

from statequeue.cli.app import main

main()
