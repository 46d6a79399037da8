"""The asyncio TCP/TLS server that runs one `BridgeProtocol` until SIGTERM.

Shutdown order is the same for every bridge: stop accepting, stop reading from
clients, let sessions finish what they already forwarded (acking it), close the
clients, then close the protocol's stores and the device link. SIGHUP reloads the TLS
files (bridges/host/tls.py); `--metrics-port` serves /metrics and /healthz (device link up).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from typing import Any

from bridges.host.admission import Admission, RateLimitedLog, raise_open_file_limit, tls_refusal_reason
from bridges.host.budget import Budget
from bridges.host.config import HostConfig
from bridges.host.connection import Connection, IdleTimeout
from bridges.host.homes import BatchHomes
from bridges.host.link import DeviceLink
from bridges.host.mapping import EventMapper
from bridges.host.metrics import BridgeMetrics
from bridges.host.protocol import BridgeProtocol, Host
from bridges.host.tls import ReloadableTLS
from runtime.health import Check
from logjam.curve import ClientKey
from logjam.errors import ProtocolError
from logjam.meta import Compression

log = logging.getLogger("logjam-bridge")

SHUTDOWN_GRACE_S = 10.0


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class BridgeServer:
    def __init__(self, protocol_cls: type[BridgeProtocol], config: HostConfig, protocol_config: Any,
                 curve: ClientKey | None = None) -> None:
        self.config = config
        self.metrics = BridgeMetrics(protocol_cls.name)
        self.link = DeviceLink(config.device, max_inflight=config.max_inflight, curve=curve,
                               deadline=config.device_deadline, on_reroute=self.metrics.rerouted,
                               batch_homes=BatchHomes(config.homes_file) if config.homes_file else None)
        mapper = EventMapper(
            app_env=config.app_env,
            topic=config.topic,
            app_env_field=config.app_env_field,
            compression=Compression.parse(config.compress),
            on_fallback=self.metrics.app_env_fallbacks.inc,
        )
        inflate = Budget(config.max_inflated_bytes, gauge=self.metrics.inflated_bytes.set,
                         on_wait=self.metrics.inflate_waits.inc)
        self.host = Host(config, self.link, mapper, self.metrics, inflate)
        self.protocol = protocol_cls(protocol_config, self.host)
        self.name = protocol_cls.name
        self.stopping = asyncio.Event()
        self.listening = False
        self.connections: dict[asyncio.Task[None], Connection] = {}
        self.admission = Admission(config.max_connections, config.max_connections_per_peer, config.shed_idle_after)
        self.refusals = RateLimitedLog()
        self.tls_refusals = RateLimitedLog()
        self.sheds = RateLimitedLog(level=logging.INFO)
        self.handshake_lost = RateLimitedLog(level=logging.INFO)
        self.tls: ssl.SSLContext | None = None

    def _admit(self, conn: Connection) -> bool:
        if self.stopping.is_set():
            return False
        refused, shed = self.admission.admit(conn, self.connections.values())
        if shed is not None:
            self.metrics.shed.inc()
            self.sheds("%s %s: closing idle connection to make room for %s", self.name, shed.peer, conn.peer)
        if refused is None:
            return True
        self.metrics.refused.inc()
        if refused == "per_peer":
            self.metrics.refused_per_peer.inc()
        self.refusals(
            "refusing %s: %s (%d open, %d from this address, none idle for --shed-idle-after %gs)",
            conn.peer, "--max-connections-per-peer" if refused == "per_peer" else "--max-connections",
            self.admission.live, self.admission.per_peer[conn.peer_host], self.config.shed_idle_after,
        )
        return False

    async def _handshake(self, conn: Connection, writer: asyncio.StreamWriter) -> bool:
        """TLS on an accepted connection; a refusal is logged (rate-limited) and counted."""
        assert self.tls is not None
        try:
            await writer.start_tls(self.tls, ssl_handshake_timeout=self.config.tls.handshake_timeout)
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            reason, detail = tls_refusal_reason(e)
            self.metrics.tls_refused(reason)
            if reason == "connection_lost":  # a port probe or a client that gave up: not a refusal
                self.handshake_lost("%s %s: connection closed during the TLS handshake: %s", self.name, conn.peer, detail)
            else:
                self.tls_refusals("%s %s: TLS handshake refused (%s): %s", self.name, conn.peer, reason, detail)
            return False
        conn.update_tls()
        return True

    def health(self) -> list[Check]:
        """/healthz (from the metrics thread): listening, the device link is up, and every device answers."""
        links = self.link.connected
        hung = self.link.hung
        down = [ep for ep, up in links.items() if not up]
        listening = self.listening and not self.stopping.is_set()
        return [
            Check("listening", listening, self.config.listen if listening else "not accepting connections"),
            Check("device_link", bool(links) and not down,
                  f"not connected to {', '.join(down or self.config.device)}" if down or not links
                  else f"connected to {', '.join(links)}"),
            Check("device_answers", not hung,
                  "; ".join(f"{ep} hung: no reply for {s:.0f} s, gets no new batches" for ep, s in hung.items())
                  if hung else f"every device answered within --device-deadline {self.config.device_deadline:g} s"),
            *self.protocol.health_checks(),
        ]

    def reload_tls(self, tls: ReloadableTLS) -> None:
        self.metrics.tls_reload(tls.reload())
        self.protocol.reload_tls()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(
            reader, writer, protocol=self.name,
            idle_timeout=self.config.idle_timeout or None, stopping=self.stopping,
            frame_timeout=self.config.frame_timeout or None,
        )
        if not self._admit(conn):
            await conn.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self.connections[task] = conn
        self.metrics.connections.inc()
        self.metrics.active.inc()
        try:
            if self.tls is not None and not await self._handshake(conn, writer):
                return
            await self.protocol.serve(conn)
        except ProtocolError as e:
            self.metrics.protocol_error(e.reason)
            log.warning("%s %s: protocol error (%s): %s", self.name, conn.peer, e.reason, e)
        except IdleTimeout as e:
            self.metrics.protocol_error("idle_timeout")
            log.info("%s %s: closing idle connection: %s", self.name, conn.peer, e)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError) as e:
            log.info("%s %s: connection lost: %s", self.name, conn.peer, e)
        except asyncio.CancelledError:
            log.info("%s %s: closed at shutdown", self.name, conn.peer)
        except Exception:
            self.metrics.protocol_error("internal")
            log.exception("%s %s: internal error; closing this connection only", self.name, conn.peer)
        finally:
            self.metrics.active.dec()
            del self.connections[task]
            self.admission.release(conn)
            await conn.close()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.link.start()
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, health=self.health)
        await self.protocol.start()
        host, port = split_listen(self.config.listen)
        raise_open_file_limit(self.config.max_connections + 256)
        reloadable = ReloadableTLS(self.config.tls)
        tls = self.tls = reloadable.context
        loop.add_signal_handler(signal.SIGHUP, self.reload_tls, reloadable)
        # TLS is started per connection in _handle (not by the server) so that a refused
        # handshake is seen, logged and counted, and a handshaking client holds a slot; the
        # reloadable context moves each new handshake onto the newest certificate (SIGHUP).
        # A deep accept queue: during a flood of connections the real clients' SYNs must not
        # be dropped (a dropped SYN costs the client a 1 s retransmit, then 3 s, ...).
        server = await asyncio.start_server(self._handle, host, port, limit=2**20, reuse_address=True, backlog=4096)
        self.listening = True
        log.info(
            "%s bridge listening on %s:%d%s, forwarding to %s",
            self.name, host, port, " (TLS)" if tls else "", ", ".join(self.config.device),
        )
        await self.stopping.wait()
        log.info("stopping: no new connections; finishing in-flight work")
        server.close()
        for conn in list(self.connections.values()):
            conn.stop_reading()
        if self.connections:
            _, slow = await asyncio.wait(list(self.connections), timeout=SHUTDOWN_GRACE_S)
            for task in slow:
                task.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
        await self.protocol.aclose()
        await self.link.close()
        log.info("stopped")
