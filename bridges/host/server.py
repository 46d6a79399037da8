"""The asyncio TCP/TLS server that runs one `BridgeProtocol` until SIGTERM.

Shutdown order follows the bridge contract: stop accepting, stop reading from
clients, let sessions finish what they already forwarded (acking it), close the
clients, then close the protocol's stores and the device link. SIGHUP reloads the TLS
files (bridges/host/tls.py); `--metrics-port` serves /metrics and /healthz (device link up).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl

from bridges.host.connection import Connection, IdleTimeout
from bridges.host.link import DeviceLink
from bridges.host.mapping import EventMapper
from bridges.host.metrics import BridgeMetrics
from bridges.host.protocol import BridgeProtocol, Host
from bridges.host.tls import ReloadableTLS
from logjam.health import Check
from logjam.errors import ProtocolError
from logjam.meta import Compression

log = logging.getLogger("logjam-bridge")

SHUTDOWN_GRACE_S = 10.0


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


class BridgeServer:
    def __init__(self, protocol_cls: type[BridgeProtocol], args: argparse.Namespace) -> None:
        self.args = args
        self.metrics = BridgeMetrics(protocol_cls.name)
        self.link = DeviceLink(args.device, max_inflight=args.max_inflight)
        mapper = EventMapper(
            app_env=args.app_env,
            topic=args.topic,
            app_env_field=args.app_env_field,
            compression=Compression.parse(args.compress),
            on_fallback=self.metrics.app_env_fallbacks.inc,
        )
        self.host = Host(args, self.link, mapper, self.metrics)
        self.protocol = protocol_cls(args, self.host)
        self.name = protocol_cls.name
        self.stopping = asyncio.Event()
        self.listening = False
        self.connections: dict[asyncio.Task[None], Connection] = {}

    def health(self) -> list[Check]:
        """/healthz (from the metrics thread): listening, and the device link is up."""
        links = self.link.connected
        down = [ep for ep, up in links.items() if not up]
        listening = self.listening and not self.stopping.is_set()
        return [
            Check("listening", listening, self.args.listen if listening else "not accepting connections"),
            Check("device_link", bool(links) and not down,
                  f"not connected to {', '.join(down or self.args.device)}" if down or not links
                  else f"connected to {', '.join(links)}"),
        ]

    def reload_tls(self, tls: ReloadableTLS) -> None:
        self.metrics.tls_reload(tls.reload())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(
            reader, writer, protocol=self.name,
            idle_timeout=self.args.idle_timeout or None, stopping=self.stopping,
        )
        if len(self.connections) >= self.args.max_connections or self.stopping.is_set():
            self.metrics.refused.inc()
            log.warning("refusing %s: %d connections open (--max-connections)", conn.peer, len(self.connections))
            await conn.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self.connections[task] = conn
        self.metrics.connections.inc()
        self.metrics.active.inc()
        try:
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
            await conn.close()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        self.link.start()
        if self.args.metrics_port:
            self.metrics.serve(self.args.metrics_port, health=self.health)
        await self.protocol.start()
        host, port = split_listen(self.args.listen)
        reloadable = ReloadableTLS(self.args)
        tls = reloadable.context
        loop.add_signal_handler(signal.SIGHUP, self.reload_tls, reloadable)
        server = await asyncio.start_server(
            self._handle, host, port, ssl=tls,
            ssl_handshake_timeout=self.args.tls_handshake_timeout if tls else None,
            limit=2**20, reuse_address=True,
        )
        self.listening = True
        log.info(
            "%s bridge listening on %s:%d%s, forwarding to %s",
            self.name, host, port, " (TLS)" if tls else "", ", ".join(self.args.device),
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
