"""A process's lifecycle: stop on SIGTERM or SIGINT, exit without the hooks that would hang.

Every entry point (devices, bridges, importer, tools) runs in the foreground until a signal
and exits cleanly; this is that, apart from the wire library. The ZeroMQ side of a clean
exit (LINGER, ETERM) is logjam/sockets.py.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable, NoReturn


def stop_event(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> threading.Event:
    """An event set by SIGTERM or SIGINT; loops poll with a short timeout and check it."""
    event = threading.Event()

    def handler(signum: int, frame: object) -> None:
        event.set()

    for s in signals:
        signal.signal(s, handler)
    return event


def exit_skipping_atexit(status: int) -> NoReturn:
    """Exit with `status` after flushing logs and stdio, without running atexit hooks.

    pyspark's Spark Connect client registers an atexit hook that calls the server and,
    when the server is already gone (supervisord stopping everything, a crashed
    server), retries for minutes. Our processes have flushed everything they own by
    the time they exit, so they leave without it.
    """
    import logging
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def exit_with(main: Callable[[], int]) -> NoReturn:
    """Run `main` and exit with the status it returns, without atexit hooks (`exit_skipping_atexit`).

    What `main` raises ends the process as Python would end it, a `SystemExit`'s code or
    message, any other exception's traceback and status 1, and without the hooks too: an
    error is no reason to spend minutes retrying a server that is gone.
    """
    import sys
    import traceback

    try:
        status = main()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 (reported as the interpreter would, then the exit below)
        traceback.print_exc()
        status = 1
    exit_skipping_atexit(status)
