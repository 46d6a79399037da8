"""CURVE for the processes: creating key files, the flags, and the gatekeeper.

- `ensure()` creates the mesh's certificates (logjam/curve.py has the layout) when they
  are missing, `create_pair()` one more client's: `logjam-keys` (tools/keys.py) is the one
  command that calls them, and `make up` runs its `init` before anything starts. No process
  creates keys on its own: a missing file stops a device and a client alike, and says which
  command creates it. Secret files are mode 0600, the directory 0700.
- `add_server_flags` / `add_client_flags`, and `ServerCurve` / `ClientCurve`: those flags,
  typed, in each entry point's config (they read the key files at start and under --check): every process
  finds its key under `--keys` (default `$LOGJAM_DATA_DIR/keys`) with no flag at all;
  `--curve-secret`, `--curve-server-key` and `--curve-allow` point elsewhere.
- `Gatekeeper` is a server process's ZAP handler: it admits a CURVE client when its public
  key is in the allowlist directory (read again by `reload()`, on SIGHUP), and reports every
  refusal: one WARNING per peer and reason (rate-limited) and a count for /metrics. Clients
  that fail before ZAP is asked (no CURVE at all, or another server key) are seen through a
  socket monitor; libzmq's monitor names the listening endpoint there, not the peer.

The gatekeeper is a thread with its own sockets in the server's context (ZAP is per
context), so it is created after any fork, like every other socket.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import zmq
import zmq.auth
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from logjam import curve
from logjam.curve import ClientKey, KeyFileError, ServerKey
from logjam.endpoints import needs_curve
from runtime.check import Checker
from runtime.ratelimit import RateLimitedLog

log = logging.getLogger("logjam")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
# A peer refused for one reason is logged once in this many seconds (it reconnects every 0.1 s).
LOG_PEER_EVERY = 300.0
_MONITORED = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_PROTOCOL_REASONS = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: ("no_curve", "the client does not speak CURVE (plaintext?)"),
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: ("bad_handshake", "CURVE handshake failed: the client uses another server key"),
}


# -- files ---------------------------------------------------------------------


def ensure(keys_dir: str | Path) -> list[str]:
    """Create whatever of the server pair, the client pair and its allowlist entry is missing; returns what was made."""
    keys = Path(keys_dir)
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    (keys / curve.ALLOWED).mkdir(exist_ok=True, mode=0o700)
    made = []
    for name in (curve.SERVER, curve.CLIENT):
        if curve.secret_file(keys, name).exists() or not _create_pair(keys, name):
            continue
        made.append(name)
        if name == curve.CLIENT:
            admit(keys, name, curve.public_file(keys, name))
    return made


# A key's name is a file name in the keys directory and the allowlist (NAME.key, NAME.key_secret).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")


def checked_name(name: str) -> str:
    """`name` if it can name a client's key files (ValueError if not)."""
    if not _NAME.fullmatch(name) or name == curve.SERVER:
        raise ValueError(f"{name!r} cannot name a client key (letters, digits, - and _; not {curve.SERVER!r})")
    return name


def create_pair(keys_dir: str | Path, name: str) -> bool:
    """Create the key pair `name` in the mesh's keys directory (made by `ensure`); False when it exists."""
    keys = Path(keys_dir)
    _initialised(keys)
    return not curve.secret_file(keys, checked_name(name)).exists() and _create_pair(keys, name)


def admit(keys_dir: str | Path, name: str, public: str | Path) -> Path:
    """Put the public certificate `public` into the allowlist as NAME.key (a device reads it on SIGHUP)."""
    _initialised(Path(keys_dir))
    _load_public(public)
    target = Path(keys_dir) / curve.ALLOWED / f"{checked_name(name)}.key"
    shutil.copyfile(public, target)
    return target


def revoke(keys_dir: str | Path, name: str) -> Path | None:
    """Take NAME.key out of the allowlist (its key pair stays); None when it was not there."""
    target = Path(keys_dir) / curve.ALLOWED / f"{checked_name(name)}.key"
    try:
        target.unlink()
    except FileNotFoundError:
        return None
    return target


def _initialised(keys: Path) -> None:
    if not (keys / curve.ALLOWED).is_dir():
        raise KeyFileError(f"{keys} holds no mesh keys yet: {curve.creates(curve.secret_file(keys, curve.SERVER))}")


def _load_public(path: str | Path) -> bytes:
    if not Path(path).is_file():
        raise KeyFileError(f"{path}: no such certificate")
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise KeyFileError(f"{path}: not a zmq.auth certificate ({e})") from None
    return public


def _create_pair(keys: Path, name: str) -> bool:
    """Create a pair in a private temporary directory, then link it in: no moment where a secret is
    readable, and of two processes starting at once only one pair wins (False: the other's did)."""
    tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=keys))  # mode 0700
    try:
        public, secret = zmq.auth.create_certificates(tmp, name)
        os.chmod(secret, 0o600)
        os.chmod(public, 0o644)
        try:
            os.link(secret, curve.secret_file(keys, name))  # fails if it exists: the secret file decides
        except FileExistsError:
            return False
        os.replace(public, curve.public_file(keys, name))
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- flags -----------------------------------------------------------------------

SERVER_SOCKETS = ("router", "pull", "pub", "stats", "replay")


def _keys_flag(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--keys", metavar="DIR",
                       help="directory of the mesh's CURVE certificates (default $LOGJAM_DATA_DIR/keys, else ./data/keys)")


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("CURVE (encryption and authentication to the device)")
    _keys_flag(g)
    g.add_argument("--curve-secret", metavar="FILE", help="this client's certificate (zmq.auth .key_secret file; "
                   "default KEYS/client.key_secret)")
    g.add_argument("--curve-server-key", metavar="FILE",
                   help="the devices' public certificate (default KEYS/server.key)")
    g.add_argument("--plaintext", action="store_true",
                   help="connect without CURVE, to a device run with --allow-plaintext")


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("CURVE (encryption and authentication of every client)")
    _keys_flag(g)
    g.add_argument("--curve-secret", metavar="FILE",
                   help="the server's certificate (zmq.auth .key_secret file; default KEYS/server.key_secret, "
                        "which `logjam-keys init` creates)")
    g.add_argument("--curve-allow", metavar="DIR",
                   help="directory of the public certificates (*.key) of admitted clients; SIGHUP reads it again "
                        "(default KEYS/allowed)")
    g.add_argument("--allow-plaintext", nargs="?", const="all", metavar="SOCKETS",
                   help="accept clients without CURVE (and without authentication) on these sockets, a comma list "
                        f"of {', '.join(SERVER_SOCKETS)}; alone: all of them. Default: none")


def keys_dir(args: argparse.Namespace) -> Path:
    return Path(args.keys) if args.keys else curve.default_dir()


@dataclass(frozen=True, slots=True)
class ClientCurve:
    """A client's CURVE flags, typed: its certificate and the devices' public one, or --plaintext.
    Building it reads no file: `load()` reads them when the client starts, `check()` under --check."""

    secret: Path
    server_key: Path
    plaintext: bool = False

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "ClientCurve":
        keys = keys_dir(args)
        return cls(Path(args.curve_secret) if args.curve_secret else curve.secret_file(keys, curve.CLIENT),
                   Path(args.curve_server_key) if args.curve_server_key else curve.public_file(keys, curve.SERVER),
                   bool(args.plaintext))

    def needed(self, endpoints: Sequence[str] = ()) -> bool:
        """Whether connecting to `endpoints` takes a key: not with --plaintext, nor when every one
        of them is a local ipc endpoint, which takes no CURVE."""
        return not self.plaintext and (not endpoints or any(needs_curve(e) for e in endpoints))

    def load(self, endpoints: Sequence[str] = ()) -> ClientKey | None:
        """The client's key for `endpoints` (None where none is needed); KeyFileError says what is missing."""
        if not self.needed(endpoints):
            return None
        try:
            return ClientKey.load(self.secret, self.server_key)
        except KeyFileError as e:
            raise KeyFileError(f"{e}; --keys, --curve-secret and --curve-server-key point elsewhere; --plaintext "
                               "connects without CURVE (to a device run with --allow-plaintext)") from None

    def check(self, c: Checker, endpoints: Sequence[str] = ()) -> None:
        """--check: the key files as a start reads them, unless none of `endpoints` takes CURVE."""
        if self.plaintext:
            c.would_run("CURVE off (--plaintext): the device must run with --allow-plaintext")
        elif not self.needed(endpoints):
            c.would_run("no CURVE: every device endpoint is a local ipc socket (guarded by file permissions)")
        elif c.attempt("CURVE client key", self.load) is not None:
            c.would_run(f"CURVE client key {self.secret}")


def open_sockets(value: str | None) -> frozenset[str]:
    """The sockets --allow-plaintext names (ValueError for another name)."""
    if not value:
        return frozenset()
    names = {s.strip() for s in value.split(",") if s.strip()}
    if "all" in names:
        return frozenset(SERVER_SOCKETS)
    unknown = names - set(SERVER_SOCKETS)
    if unknown:
        raise ValueError(f"--allow-plaintext: unknown socket {', '.join(sorted(unknown))} "
                         f"(one of {', '.join(SERVER_SOCKETS)}, or all)")
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class ServerCurve:
    """A device's CURVE flags, typed: its key file (None: every socket plaintext), the allowlist
    directory, and which sockets stay open. Building it reads no file: `load()` reads the key
    when the device starts, `check()` the same files under --check."""

    secret: Path | None
    allow_dir: Path
    plaintext: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "ServerCurve":
        plaintext = open_sockets(args.allow_plaintext)
        keys = keys_dir(args)
        allow = Path(args.curve_allow) if args.curve_allow else keys / curve.ALLOWED
        if plaintext == frozenset(SERVER_SOCKETS):
            return cls(None, allow, plaintext)
        return cls(Path(args.curve_secret) if args.curve_secret else curve.secret_file(keys, curve.SERVER),
                   allow, plaintext)

    def secured(self, name: str) -> bool:
        return self.secret is not None and name not in self.plaintext

    def describe(self) -> str:
        closed = [s for s in SERVER_SOCKETS if self.secured(s)]
        text = f"CURVE on {', '.join(closed)} (allowlist {self.allow_dir})" if closed else "CURVE off"
        if self.plaintext:
            text += f"; OPEN, plaintext without authentication: {', '.join(s for s in SERVER_SOCKETS if s in self.plaintext)}"
        return text

    def load(self) -> ServerKey:
        """The server's key pair; KeyFileError says which file is missing and what creates it."""
        if self.secret is None:
            raise KeyFileError("CURVE is off on every socket (--allow-plaintext): there is no key to load")
        key = ServerKey.load(self.secret)
        if not self.allow_dir.is_dir():
            raise KeyFileError(f"--curve-allow {self.allow_dir}: not a directory of client certificates "
                               f"({curve.creates(self.secret)})")
        return key

    def check(self, c: Checker) -> None:
        """--check: the key files as a start reads them."""
        if self.secret is None:
            c.would_run("CURVE off: every socket OPEN (--allow-plaintext)")
        elif c.attempt(f"CURVE server certificate {self.secret}", self.load) is not None:
            c.attempt(f"--curve-allow {self.allow_dir}", lambda: zmq.auth.load_certificates(self.allow_dir))
            c.would_run(self.describe())


# -- the ZAP handler ---------------------------------------------------------------


class Gatekeeper(threading.Thread):
    """A context's ZAP handler and handshake-failure monitor; `refused` counts by (socket, reason)."""

    def __init__(self, ctx: zmq.Context, allow_dir: str | Path) -> None:
        super().__init__(name="curve-zap", daemon=True)
        self.ctx = ctx
        self.allow_dir = Path(allow_dir)
        self.allowed: frozenset[bytes] = self._read()
        self.refused: Counter[tuple[str, str]] = Counter()
        self.admitted = 0
        self.reloads = 0
        self.reload_failures = 0
        self._halt = threading.Event()
        self._monitors: queue.SimpleQueue[tuple[str, str, zmq.Socket]] = queue.SimpleQueue()
        self._log = RateLimitedLog()
        self._last_logged: dict[tuple[str, str, str], float] = {}
        # Bound here, before any server socket binds: a CURVE socket without a ZAP handler admits everyone.
        self._zap = ctx.socket(zmq.REP)
        self._zap.linger = 0
        self._zap.bind(ZAP_ENDPOINT)

    def _read(self) -> frozenset[bytes]:
        try:
            return frozenset(zmq.auth.load_certificates(self.allow_dir))
        except (OSError, ValueError) as e:
            raise KeyFileError(f"cannot read the allowlist {self.allow_dir}: {e}") from None

    def reload(self) -> bool:
        """Read the allowlist again (SIGHUP); new handshakes use it, connected clients stay connected."""
        try:
            fresh = self._read()
        except KeyFileError as e:
            self.reload_failures += 1
            log.error("SIGHUP: %s; keeping the previous allowlist of %d keys", e, len(self.allowed))
            return False
        self.allowed = fresh
        self.reloads += 1
        log.info("SIGHUP: reloaded the CURVE allowlist %s: %d keys; new connections use it", self.allow_dir, len(fresh))
        return True

    def watch(self, sock: zmq.Socket, name: str, endpoint: str) -> None:
        """Report `sock`'s handshake failures; call from the thread that owns `sock`, before it binds."""
        monitor = sock.get_monitor_socket(_MONITORED)
        self._monitors.put((name, endpoint, monitor))

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        monitors: dict[zmq.Socket, tuple[str, str]] = {}
        try:
            while not self._halt.is_set():
                while not self._monitors.empty():
                    name, endpoint, m = self._monitors.get()
                    monitors[m] = (name, endpoint)
                    poller.register(m, zmq.POLLIN)
                for sock, _ in poller.poll(200):
                    if sock is self._zap:
                        self._serve(self._zap.recv_multipart())
                    else:
                        self._handshake_failed(*monitors[sock], sock.recv_multipart())
        except zmq.ContextTerminated:
            pass
        finally:
            for m in monitors:
                m.close(0)
            self._zap.close(0)

    def close(self, timeout: float = 5.0) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
        else:
            self._zap.close(0)

    def _serve(self, frames: list[bytes]) -> None:
        try:
            self._answer(frames)
        except Exception:  # a bug here must refuse this one client, not stop the handler (which refuses all)
            log.exception("CURVE: ZAP request failed; refusing that client")
            self._zap.send_multipart([*frames[:2], b"500", b"internal error", b"", b""])

    def _answer(self, frames: list[bytes]) -> None:
        """ZAP: [version, request id, domain, address, identity, mechanism, credentials...]."""
        version, request_id = frames[0], frames[1]
        domain, address, mechanism = frames[2].decode(errors="replace"), frames[3].decode(errors="replace"), frames[5]
        ok, user = False, b""
        if mechanism == b"NULL":
            ok = True  # only sockets run with --allow-plaintext take NULL (no key to check)
        elif mechanism == b"CURVE" and len(frames) > 6:
            key = z85.encode(frames[6])
            ok = key in self.allowed
            user = key
            if not ok:
                self._refuse(domain, "not_allowed", address,
                             f"key {key.decode()} is not in the allowlist {self.allow_dir}")
        else:
            self._refuse(domain, "mechanism", address, f"mechanism {mechanism.decode(errors='replace')} is not accepted")
        if ok:
            self.admitted += 1
        self._zap.send_multipart([version, request_id, b"200" if ok else b"400",
                                  b"OK" if ok else b"not allowed", user, b""])

    def _handshake_failed(self, name: str, endpoint: str, message: list[bytes]) -> None:
        event = parse_monitor_message(message)
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return  # a ZAP refusal: logged and counted in _answer, with the peer's address
        reason, detail = _PROTOCOL_REASONS.get(int(event["value"]), ("protocol_error", f"handshake error {event['value']}"))
        self._refuse(name, reason, f"a client of {endpoint}", detail)

    def _refuse(self, socket_name: str, reason: str, peer: str, detail: str) -> None:
        self.refused[(socket_name, reason)] += 1
        now = time.monotonic()
        key = (socket_name, reason, peer)
        last = self._last_logged.get(key)
        if last is not None and now - last < LOG_PEER_EVERY:
            return
        if len(self._last_logged) > 10_000:
            self._last_logged.clear()
        self._last_logged[key] = now
        self._log("CURVE: refused %s on %s (%s): %s", peer, socket_name, reason, detail)
