"""``oncebus serve`` as the child of a test process: it stops when its parent goes away.

The parent holds the child's stdin open; when the parent dies (even by SIGKILL,
when no fixture teardown runs) the pipe reaches end of file, the child stops as
on SIGTERM and removes the temporary directory the parent made for it
(``ONCEBUS_TESTING_WORK_DIR``), so nothing is left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading

from oncebus.testing._server import WORK_DIR_ENV

_orphaned = threading.Event()


def _stop_when_the_parent_is_gone() -> None:
    # the raw descriptor, not sys.stdin: a thread blocked inside a buffered read holds its lock and delays
    # the interpreter's exit by a second
    while os.read(0, 4096):
        pass
    _orphaned.set()
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    threading.Thread(target=_stop_when_the_parent_is_gone, name="oncebus-parent-watch", daemon=True).start()
    from oncebus.cli import main as cli_main

    code = cli_main(sys.argv[1:])
    if _orphaned.is_set() and os.environ.get(WORK_DIR_ENV):
        shutil.rmtree(os.environ[WORK_DIR_ENV], ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
