"""Test worker: record what `statequeue run` handed this process.

Writes ``$SQT_DIR/dump/<id>.<attempt>.json`` with the arguments, the
STATEQUEUE_* environment and what stdin is. Deliberately not via
$STATEQUEUE_RESULT, so these checks do not depend on result capture.
"""

import json
import os
import stat
import sys

st = os.fstat(0)
devnull = os.stat(os.devnull)
info = {
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k.startswith("STATEQUEUE_")},
    "stdin_is_devnull": stat.S_ISCHR(st.st_mode) and st.st_rdev == devnull.st_rdev,
    "stdin": sys.stdin.read(),
}
folder = os.path.join(os.environ["SQT_DIR"], "dump")
os.makedirs(folder, exist_ok=True)
name = f"{os.environ['STATEQUEUE_ID']}.{os.environ['STATEQUEUE_ATTEMPT']}.json"
with open(os.path.join(folder, name + ".tmp"), "w") as f:
    json.dump(info, f)
os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
