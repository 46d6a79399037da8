"""The thin adapter between a datagram protocol (syslog over UDP, RFC 5426) and asyncio.

A datagram has no connection and no answer, so none of the stream host's rules (admission,
acks, the per-connection `Pipeline`) apply: the datagrams are handed to `on_datagrams` with
their senders' addresses, and the protocol decides what to keep. The receive buffer is raised
so that a burst waits in the kernel rather than being dropped there.

Each wakeup of the loop reads every datagram waiting, up to `BURST`, and hands them over in
one call: asyncio's own datagram transport reads one per turn of its loop, and that turn
cost more than the rest of a syslog datagram's way to the device.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Callable

log = logging.getLogger(__name__)

RECEIVE_BUFFER = 8 * 2**20  # the kernel caps it at net.core.rmem_max
BURST = 256  # datagrams read per wakeup at most, so that the loop's other work still runs
MAX_DATAGRAM = 65535  # the largest UDP payload


Reader = Callable[[socket.socket], "tuple[list[bytes], list[str]]"]


class RecvfromReader:
    """`read(sock)`: the datagrams waiting (up to BURST) and their senders, one recvfrom each."""

    def __init__(self) -> None:
        self._names: dict[Any, str] = {}  # address -> "host:port", formatted once per sender

    def __call__(self, sock: socket.socket) -> tuple[list[bytes], list[str]]:
        recvfrom, names = sock.recvfrom, self._names
        datas: list[bytes] = []
        peers: list[str] = []
        for _ in range(BURST):
            try:
                data, addr = recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # an ICMP error the kernel queued on the socket: it is not ours to act on
                log.debug("datagram socket: %s", e)
                break
            peer = names.get(addr)
            if peer is None:
                if len(names) >= 4096:
                    names.clear()
                peer = names[addr] = f"{addr[0]}:{addr[1]}"
            datas.append(data)
            peers.append(peer)
        return datas, peers


class DatagramListener:
    """A bound UDP socket read on the running loop: `on_datagrams(datas, peers)` with what each
    wakeup reads (`read`: a protocol may bring a faster reader of its own)."""

    def __init__(self, sock: socket.socket, on_datagrams: Callable[[list[bytes], list[str]], None],
                 read: Reader | None = None) -> None:
        self.sock = sock
        self.on_datagrams = on_datagrams
        self.read = read or RecvfromReader()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        datas, peers = self.read(self.sock)
        if datas:
            self.on_datagrams(datas, peers)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()


async def listen_datagrams(host: str, port: int, on_datagrams: Callable[[list[bytes], list[str]], None],
                           read: Reader | None = None) -> DatagramListener:
    """Bind a UDP socket on host:port and call `on_datagrams(datas, peers)` with what each wakeup reads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.bind((host, port))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return DatagramListener(sock, on_datagrams, read)
