"""Where queues live: the home folder, queue names and folder permissions."""

from __future__ import annotations

import os
import re
from pathlib import Path

from statequeue.core.errors import InvalidQueueName, UsageError
from statequeue.core.textsafe import escaped

HOME_ENV = "STATEQUEUE_HOME"
QUEUE_ENV = "STATEQUEUE_QUEUE"
DEFAULT_QUEUE = "default"
DIR_MODE = 0o700
FILE_MODE = 0o600

# Letters, digits, dot, dash and underscore; not starting with a dot, so that
# "..", hidden names and path separators can never name a queue.
_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")


def validate_queue_name(name: str) -> str:
    """Return ``name`` if it is a valid queue name, else raise InvalidQueueName."""
    if not _NAME_RE.fullmatch(name):
        # Readable as typed ('név'); only control and undecodable characters escaped.
        raise InvalidQueueName(
            f"invalid queue name '{escaped(name)}': use 1-128 letters, digits, '.', '-' or '_', "
            "not starting with '.'"
        )
    return name


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The statequeue home: ``home``, else $STATEQUEUE_HOME, else the user data dir."""
    # Set but empty is refused as `--home ""` is, not taken for unset.
    chosen = home if home is not None else os.environ.get(HOME_ENV)
    if chosen is None:
        # lazy: start-up time (platformdirs is only needed when no home is given)
        from platformdirs import user_data_dir

        return Path(user_data_dir("statequeue", appauthor=False))
    text = os.fspath(chosen)
    if not text or "\0" in text:
        raise UsageError(f"invalid home folder {text!r}")
    return Path(text).expanduser()


def resolve_queue_name(name: str | None = None) -> str:
    """The queue name: ``name``, else $STATEQUEUE_QUEUE, else ``default``."""
    chosen = name if name is not None else os.environ.get(QUEUE_ENV) or DEFAULT_QUEUE
    return validate_queue_name(chosen)


def ensure_dir(path: Path) -> bool:
    """Create ``path`` (and parents) with mode 0700. Returns True when it was created."""
    if path.is_dir():
        return False
    try:
        path.mkdir(mode=DIR_MODE, parents=True)
    except FileExistsError:
        if not path.is_dir():
            raise UsageError(f"{path} exists and is not a folder") from None
        return False
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc.strerror}") from None
    os.chmod(path, DIR_MODE)  # mkdir's mode is filtered by the umask
    return True
