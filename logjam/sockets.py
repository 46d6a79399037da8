"""Process hygiene shared by the ZeroMQ entry points: signals, sockets, clean exits.

Sockets are created after fork (inside `main`), always with a LINGER, and a
ZeroMQ ETERM is treated as the clean exit it is.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, NoReturn

import zmq

DEFAULT_LINGER_MS = 2000


def stop_event(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> threading.Event:
    """An event set by SIGTERM or SIGINT; loops poll with a short timeout and check it."""
    event = threading.Event()

    def handler(signum: int, frame: object) -> None:
        event.set()

    for s in signals:
        signal.signal(s, handler)
    return event


def socket(ctx: zmq.Context, kind: int, *, linger_ms: int = DEFAULT_LINGER_MS, **options: int) -> zmq.Socket:
    """A socket with LINGER always set; `options` are ZeroMQ option names such as rcvhwm=1000."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name.upper()), value)
    return sock


@contextmanager
def eterm_is_clean() -> Iterator[None]:
    """Swallow the ETERM that a terminated context raises in blocked calls."""
    try:
        yield
    except zmq.ContextTerminated:
        pass
    except zmq.ZMQError as e:
        if e.errno != zmq.ETERM:
            raise


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
