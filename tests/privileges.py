"""Running a command without root's power to ignore file modes, so a test
run as root meets the permission errors a normal user would."""

from __future__ import annotations

import os
import shutil

import pytest


def without_write_access() -> tuple[str, ...]:
    """A prefix that runs a command without the power to ignore file modes:
    nothing for a normal user; for root, setpriv dropping the capabilities
    that bypass them (root stays the owner, so the ownership check passes)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable")
