"""CurveZMQ on the mesh's ZeroMQ sockets: reading key files, and each side's socket options.

Every socket a device binds is a CURVE server with the mesh's server key pair; every
socket that connects to one is a CURVE client with a key pair of its own and the server's
public key. Keys are zmq.auth certificate files (`NAME.key` holds the public key,
`NAME.key_secret` both), by default under one directory, `$LOGJAM_DATA_DIR/keys`:

    server.key, server.key_secret   the devices' key pair
    client.key, client.key_secret   the bundled clients' key pair (bridges, importers, tools)
    allowed/*.key                   the public keys a device admits: its allowlist

The options are set before bind or connect, so they hold for the C fast paths as well
(native/ drives these same sockets). Which clients a server admits is decided by its ZAP
handler (runtime/curve.py); creating the files is runtime's job too (`logjam-keys`, tools/keys.py,
and `make up` call it). This module only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import zmq
import zmq.auth

from logjam.defaults import data_root
from logjam.endpoints import needs_curve

SERVER = "server"
CLIENT = "client"
ALLOWED = "allowed"


class KeyFileError(ValueError):
    """A key file is missing or holds no usable key; the message says which and what to do."""


def default_dir() -> Path:
    """`$LOGJAM_DATA_DIR/keys`, else `./data/keys` (where `make up` keeps them)."""
    return data_root() / "keys"


def public_file(keys_dir: str | Path, name: str) -> Path:
    return Path(keys_dir) / f"{name}.key"


def secret_file(keys_dir: str | Path, name: str) -> Path:
    return Path(keys_dir) / f"{name}.key_secret"


def creates(path: str | Path) -> str:
    """The `logjam-keys` command (tools/keys.py) that creates the certificate `path`."""
    keys, name = Path(path).parent, Path(path).name.partition(".")[0]
    where = "" if keys.resolve() == default_dir() else f" --keys {keys}"
    if name in (SERVER, CLIENT):
        return f"`logjam-keys init{where}` creates the mesh's keys (`make up` runs it)"
    return f"`logjam-keys add {name}{where}` creates a key pair {name} and admits it"


def _load(path: str | Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    if not Path(path).exists():  # zmq.auth would say "Invalid certificate file", which hides why
        raise KeyFileError(f"the CURVE certificate {path} is missing: {creates(path)}")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise KeyFileError(f"cannot read the CURVE certificate {path}: {e}") from None
    if len(public) != 40 or (secret and (secret_key is None or len(secret_key) != 40)):
        raise KeyFileError(f"{path} holds no {'secret' if secret else 'public'} CURVE key "
                           f"(a zmq.auth certificate{', the .key_secret file' if secret else ''} is needed)")
    return public, secret_key


@dataclass(frozen=True, slots=True)
class ServerKey:
    """A server's key pair (Z85 text, as in the certificate files)."""

    public: bytes
    secret: bytes = field(repr=False)  # never in a log line or a test failure

    @classmethod
    def load(cls, secret_path: str | Path) -> "ServerKey":
        public, secret = _load(secret_path, secret=True)
        return cls(public, secret)  # type: ignore[arg-type]

    def apply(self, sock: zmq.Socket, domain: str) -> None:
        """Make `sock` a CURVE server; its ZAP requests carry `domain` (the socket's name in refusals)."""
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.zap_domain = domain.encode()


@dataclass(frozen=True, slots=True)
class ClientKey:
    """A client's key pair and the public key of the servers it connects to."""

    public: bytes
    secret: bytes = field(repr=False)
    server_public: bytes

    @classmethod
    def load(cls, secret_path: str | Path, server_path: str | Path) -> "ClientKey":
        public, secret = _load(secret_path, secret=True)
        server_public, _ = _load(server_path, secret=False)
        return cls(public, secret, server_public)  # type: ignore[arg-type]

    @classmethod
    def from_dir(cls, keys_dir: str | Path) -> "ClientKey":
        """The bundled clients' key: `client.key_secret` and `server.key` in `keys_dir`."""
        return cls.load(secret_file(keys_dir, CLIENT), public_file(keys_dir, SERVER))

    def apply(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE client; a server that does not know our key never lets a byte through."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def connect(sock: zmq.Socket, endpoints: str | Sequence[str], curve: ClientKey | None) -> zmq.Socket:
    """Connect a client socket to `endpoints`, as a CURVE client on every hop but a local one.

    `curve` None speaks plaintext everywhere (a device run with --allow-plaintext). An
    `ipc://` endpoint (logjam/endpoints.py) is plaintext either way: the device serves it
    without CURVE, behind file permissions. libzmq copies the options when it connects, so
    the local endpoints are connected first, before the key is set.
    """
    keyed = False
    for endpoint in sorted([endpoints] if isinstance(endpoints, str) else endpoints, key=needs_curve):
        if curve is not None and needs_curve(endpoint) and not keyed:
            curve.apply(sock)
            keyed = True
        sock.connect(endpoint)
    return sock
