"""Reading syslog datagrams (RFC 5426) many per system call: native/syslog.c's recvmmsg.

Why: read one `recvfrom` at a time (bridges/host/datagram.py's `RecvfromReader`, the Python
twin, used under LOGJAM_NATIVE=off or without a build), each datagram cost a system call, a
64 KiB bytes object cut down to size, and an address tuple to format: more than a third of the
UDP bridge's CPU per event. Here one call reads up to `BURST` datagrams into one buffer, and
a sender's address is formatted once, from its bytes.
"""

from __future__ import annotations

import socket
import sys
from array import array
from typing import Any

from bridges.host.datagram import BURST, RecvfromReader, Reader
from logjam import native as _native

MODULE = "bridges.syslog._native_syslog"
SLOT = 65536  # room for the largest UDP payload (65,507 bytes over IPv4)
ADDR_ROOM = 32  # a sockaddr_in6 is 28 bytes


def _peer(addr: bytes) -> str:
    """A sockaddr's bytes as recvfrom's address prints it: `host:port`."""
    family = int.from_bytes(addr[:2], sys.byteorder)  # sa_family: the machine's byte order
    port = int.from_bytes(addr[2:4], "big")
    if family == socket.AF_INET6:
        return f"{socket.inet_ntop(socket.AF_INET6, addr[8:24])}:{port}"
    return f"{socket.inet_ntop(socket.AF_INET, addr[4:8])}:{port}"


class NativeReader:
    """`read(sock)` as `RecvfromReader` gives it, through lj_syslog_recv."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.lib = lib
        self._buf = bytearray(BURST * SLOT)
        self._addrs = bytearray(BURST * ADDR_ROOM)
        self._lens = array("I", bytes(4 * BURST))
        self._addr_lens = array("I", bytes(4 * BURST))
        self._c = (ffi.from_buffer("uint8_t[]", self._buf), ffi.from_buffer("uint32_t[]", self._lens),
                   ffi.from_buffer("uint8_t[]", self._addrs), ffi.from_buffer("uint32_t[]", self._addr_lens))
        self._names: dict[bytes, str] = {}

    def __call__(self, sock: socket.socket) -> tuple[list[bytes], list[str]]:
        buf, lens, addrs, addr_lens = self._c
        n = self.lib.lj_syslog_recv(sock.fileno(), buf, SLOT, BURST, lens, addrs, ADDR_ROOM, addr_lens)
        if n <= 0:  # nothing waits, or an error the kernel queued (an ICMP one): nothing to read
            return [], []
        view, sizes = memoryview(self._buf), self._lens
        datas = [view[i * SLOT:i * SLOT + sizes[i]].tobytes() for i in range(n)]
        alens = self._addr_lens
        peer = self._peer(0)
        if alens[1:n].count(0) == n - 1:  # one sender's burst
            return datas, [peer] * n
        peers = [peer]
        for i in range(1, n):
            if alens[i]:
                peer = self._peer(i)
            peers.append(peer)
        return datas, peers

    def _peer(self, i: int) -> str:
        """The sender of datagram i, `host:port`, formatted once per address."""
        key = bytes(self._addrs[i * ADDR_ROOM:i * ADDR_ROOM + self._addr_lens[i]])
        names = self._names
        peer = names.get(key)
        if peer is None:
            if len(names) >= 4096:
                names.clear()
            peer = names[key] = _peer(key)
        return peer


def reader() -> Reader:
    """The C reader when LOGJAM_NATIVE allows it and it was built, else one recvfrom per datagram."""
    built = _native.load(MODULE)
    return NativeReader(*built) if built is not None else RecvfromReader()
