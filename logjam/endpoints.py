"""Where a device listens, and which hops need CURVE.

A device listens on TCP (its ports, for clients on any host) and, with a data directory,
also on `ipc://` endpoints in `<data-dir>/ipc/` (for clients on its own host): one Unix
socket per ZeroMQ socket, named after it (`router`, `pull`, `pub`, `stats`, `replay`).
The directory is mode 0700 and the socket files 0600, so only the mesh's user (and root)
can connect there; that is why an ipc hop needs no CURVE, while every TCP hop keeps it
(docs/security.md). A client decides per endpoint: `needs_curve`.

libzmq takes a socket's security options when it binds or connects, so one device socket
serves its ipc endpoint without CURVE and its TCP endpoint with it: bind the ipc endpoint
first, then set the CURVE options, then bind TCP (devices/listen.py).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from logjam import defaults

SOCKETS = ("router", "pull", "pub", "stats", "replay")
IPC_DIR = "ipc"
# sun_path is 108 bytes on Linux, NUL included; a longer path cannot be bound.
MAX_IPC_PATH = 107
_IPC = "ipc://"


def ipc_dir(data_dir: str | Path) -> Path:
    """The directory of a device's ipc endpoints: `<data-dir>/ipc`, made absolute."""
    return Path(os.path.abspath(data_dir)) / IPC_DIR


def ipc_endpoint(directory: str | Path, name: str) -> str:
    """`ipc://<directory>/<name>` for one of SOCKETS."""
    if name not in SOCKETS:
        raise ValueError(f"no device socket is named {name!r} (one of {', '.join(SOCKETS)})")
    return f"{_IPC}{Path(directory) / name}"


def ipc_fits(directory: str | Path) -> bool:
    """Whether every socket's path in `directory` fits a Unix socket address."""
    longest = max(len(os.fsencode(str(Path(directory) / name))) for name in SOCKETS)
    return longest <= MAX_IPC_PATH


def is_local(endpoint: str) -> bool:
    """An `ipc://` endpoint: a Unix socket on this host, guarded by file permissions."""
    return endpoint.startswith(_IPC)


def needs_curve(endpoint: str) -> bool:
    """Every hop but a local one is encrypted and authenticated."""
    return not is_local(endpoint)


def sibling(endpoint: str, name: str) -> str:
    """The device's socket `name` beside the ipc `endpoint` (`.../ipc/pub` -> `.../ipc/replay`)."""
    if not is_local(endpoint):
        raise ValueError(f"{endpoint!r} is not an ipc:// endpoint")
    return ipc_endpoint(Path(endpoint[len(_IPC):]).parent, name)


def path_of(endpoint: str) -> Path:
    """The file of an ipc endpoint."""
    if not is_local(endpoint):
        raise ValueError(f"{endpoint!r} is not an ipc:// endpoint")
    return Path(endpoint[len(_IPC):])


def local_devices(name: str, data_root: str | Path | None = None) -> list[str]:
    """The ipc endpoints `name` of the devices that serve one now from the mesh's data directory
    (`device`, then `device-1`, `device-2`, ... as `make up` runs them): what a tool on the mesh's
    host connects to by default. A socket file left by a stopped device is passed over."""
    root = Path(data_root) if data_root is not None else defaults.data_root()
    dirs = [root / "device"] + sorted(root.glob("device-*"), key=lambda p: (len(p.name), p.name))
    found = []
    for d in dirs:
        directory = ipc_dir(d)
        if ipc_fits(directory) and _listening(directory / name):
            found.append(ipc_endpoint(directory, name))
    return found


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
