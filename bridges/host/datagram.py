"""The thin adapter between a datagram protocol (syslog over UDP, RFC 5426) and asyncio.

A datagram has no connection and no answer, so none of the stream host's rules (admission,
acks, the per-connection `Pipeline`) apply: each datagram is handed to `on_datagram` with
the sender's address, and the protocol decides what to keep. The receive buffer is raised
so that a burst waits in the kernel rather than being dropped there.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Callable

RECEIVE_BUFFER = 8 * 2**20  # the kernel caps it at net.core.rmem_max


class _Listener(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes, str], None]) -> None:
        self.on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.on_datagram(data, f"{addr[0]}:{addr[1]}")


async def listen_datagrams(host: str, port: int, on_datagram: Callable[[bytes, str], None]) -> asyncio.DatagramTransport:
    """Bind a UDP socket on host:port and call `on_datagram(data, peer)` for each datagram."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _Listener(on_datagram), sock=sock)
    return transport
