"""A process's lifecycle: stop on SIGTERM or SIGINT, exit without the hooks that would hang.

Every entry point (devices, bridges, importer, tools) runs in the foreground until a signal
and exits cleanly; this is that, apart from the wire library. The ZeroMQ side of a clean
exit (LINGER, ETERM) is logjam/sockets.py.
"""

from __future__ import annotations

import signal
import threading
from typing import NoReturn


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
