"""ZeroMQ socket hygiene for the wire clients and every process that opens sockets.

Sockets are created after fork (inside `main`), always with a LINGER, and a
ZeroMQ ETERM is treated as the clean exit it is. (A process's own lifecycle, stopping on
SIGTERM and exiting, is runtime/lifecycle.py: not wire protocol.)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import zmq

DEFAULT_LINGER_MS = 2000


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
