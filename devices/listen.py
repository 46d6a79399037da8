"""Binding a device's sockets: an ipc endpoint for its own host, without CURVE, and its TCP port, with it.

libzmq copies a socket's security options when it binds, so one socket serves both: the
ipc endpoint is bound first in plaintext, then the CURVE options are set and the TCP port
is bound. The ipc endpoint is guarded by the filesystem instead (logjam/endpoints.py): its
directory is mode 0700 and must belong to the device's user, its socket file is mode 0600.
`Listener` binds every socket of a device that way, the replay endpoint's included.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import zmq

from logjam import endpoints
from logjam.curve import ServerKey
from runtime.curve import Gatekeeper, ServerCurve

log = logging.getLogger("logjam-device")


def open_ipc_dir(data_dir: str) -> Path | None:
    """`<data_dir>/ipc`, mode 0700 and ours; None (ipc off, logged) when its paths are too long for a Unix socket."""
    directory = endpoints.ipc_dir(data_dir)
    if not endpoints.ipc_fits(directory):
        log.warning("no ipc endpoints: %s is too long for a Unix socket path (%d bytes at most); "
                    "clients on this host use TCP with CURVE", directory, endpoints.MAX_IPC_PATH)
        return None
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    owner = directory.stat().st_uid
    if owner != os.geteuid():
        raise PermissionError(f"{directory} belongs to uid {owner}, not to this device's uid {os.geteuid()}: "
                              "its ipc endpoints would be open to that user")
    os.chmod(directory, 0o700)  # mkdir's mode is cut by the umask, and the directory may be older
    return directory


def bind(sock: zmq.Socket, tcp: str, ipc: str | None, secure: Callable[[], None]) -> None:
    """Bind `ipc` (if any) in plaintext, then set CURVE through `secure` and bind `tcp`."""
    if ipc is not None:
        sock.bind(ipc)
        os.chmod(endpoints.path_of(ipc), 0o600)
    secure()
    sock.bind(tcp)


class Listener:
    """Binds a device's sockets: on `ipc_dir` (if any) and on `address`, with CURVE where `curve` secures the socket."""

    def __init__(self, address: str, ipc_dir: Path | None, curve: ServerCurve | None, key: ServerKey | None,
                 gate: Gatekeeper | None) -> None:
        self.address = address
        self.ipc_dir = ipc_dir
        self.curve = curve
        self.key = key
        self.gate = gate

    def listen(self, sock: zmq.Socket, name: str, port: int) -> None:
        """Bind `sock` on its ipc endpoint (plaintext, this host only) and on its TCP port (CURVE)."""
        tcp = f"tcp://{self.address}:{port}"
        ipc = endpoints.ipc_endpoint(self.ipc_dir, name) if self.ipc_dir is not None else None
        bind(sock, tcp, ipc, lambda: self._secure(sock, name, tcp))

    def _secure(self, sock: zmq.Socket, name: str, endpoint: str) -> None:
        """Make `sock` a CURVE server watched by the gatekeeper, unless --allow-plaintext leaves it open."""
        curve = self.curve
        if curve is None or self.gate is None or self.key is None or not curve.secured(name):
            return
        self.key.apply(sock, name)
        self.gate.watch(sock, name, endpoint)
