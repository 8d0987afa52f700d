"""``python -m statequeue``."""

from __future__ import annotations

from statequeue.cli.main import main

main()
