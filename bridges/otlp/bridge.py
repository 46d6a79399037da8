"""`logjam-bridge otlp`: OTLP logs over gRPC (:4317) and HTTP (:4318, protobuf and JSON) to the device.

The host's TCP/TLS server (--listen, 4318) serves OTLP/HTTP (http.py); a `grpc.aio` server
in the same event loop (--grpc-listen, 4317) serves `LogsService/Export`. Both hand the
request's bytes to `Bridge.export`, so the two transports share one decoding step
(records.py), one mapping and one path to the device: `bridges.host.forward`, the
pipeline's rule for a batch outside a stream connection (an OTLP request is a whole
unit of work; there is no window to ack). The answer goes out only after the device's
202 for every record:

- every record accepted: success;
- some refused by the device (400, one by one): success with `partial_success`
  (`rejected_log_records`, `error_message`);
- the mesh holds input (the device slow, paused or holding for importers, the device
  link or --max-inflated-bytes full, or no 202 within --answer-timeout): `UNAVAILABLE`
  with a `google.rpc.RetryInfo` trailer, HTTP 503 with `Retry-After`. A request that
  timed out stays at the device link and is accepted later; the exporter's retry of the
  same bytes waits for that same publish instead of sending a second copy, and a retry
  that comes after it was accepted is answered success (a short memory of request
  digests). Every record's `@metadata._id` is the request's digest and the record's
  index, so any copy the device still gets twice carries the same key (the importer
  drops it);
- malformed: `INVALID_ARGUMENT` / 400; over --max-frame-size: `RESOURCE_EXHAUSTED` / 413.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo

from bridges.host import BridgeProtocol, Connection, Host, forward
from bridges.host.config import HostConfig, TLSConfig
from bridges.host.server import split_listen
from bridges.otlp import engine, records
from bridges.otlp.engine import Outcome
from bridges.otlp.http import HttpSession
from logjam import defaults
from logjam.meta import now_ms
from runtime.check import Checker
from runtime.config import from_flags
from runtime.health import Check

log = logging.getLogger("logjam-bridge.otlp")

SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
PROTOCOL_VERSION = "1"  # opentelemetry.proto ... v1
RECENT = 4096  # request digests remembered after their publish finished


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    """The flags `Bridge.add_arguments` adds (their help text is there)."""

    grpc_listen: str
    answer_timeout: float
    retry_after: float
    max_pending_requests: int

    @classmethod
    def from_flags(cls, args: argparse.Namespace, host: HostConfig) -> "OtlpConfig":
        return from_flags(cls, args)


class Bridge(BridgeProtocol):
    name = "otlp"
    default_port = defaults.BRIDGE_PORTS["otlp"]
    default_max_frame = 4 * 1024 * 1024  # the Collector's default max_recv_msg_size_mib
    default_idle_timeout = 120.0
    Config = OtlpConfig

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--grpc-listen", default=f"0.0.0.0:{defaults.BRIDGE_PORTS['otlp-grpc']}", metavar="HOST:PORT",
                            help="OTLP/gRPC (LogsService/Export); --listen is OTLP/HTTP (default %(default)s)")
        parser.add_argument("--answer-timeout", type=float, default=5.0, metavar="SECONDS",
                            help="answer UNAVAILABLE / 503 (retry) when the device has not accepted a request's "
                                 "records within this long; gRPC also keeps inside the client's deadline "
                                 "(default %(default)s)")
        parser.add_argument("--retry-after", type=float, default=1.0, metavar="SECONDS",
                            help="the delay sent with a retryable answer: RetryInfo, Retry-After (default %(default)s)")
        parser.add_argument("--max-pending-requests", type=int, default=64, metavar="N",
                            help="requests awaiting the device, both transports together; past it clients are "
                                 "told to retry (default %(default)s)")

    @classmethod
    def check(cls, config: OtlpConfig, host: HostConfig, checker: Checker) -> None:
        grpc_listen = checker.attempt(f"--grpc-listen {config.grpc_listen}", lambda: split_listen(config.grpc_listen))
        if grpc_listen is None:
            return
        checker.port("--grpc-listen", grpc_listen[1], zero_ok=True)
        listen = split_listen(host.listen)[1] if host.listen.rpartition(":")[2].isdigit() else None
        checker.distinct_ports({"--listen": listen, "--grpc-listen": grpc_listen[1]})
        checker.distinct_ports({"--grpc-listen": grpc_listen[1], "--metrics-port": host.metrics_port})
        if host.tls.cert and host.tls.key_password:
            checker.error("--tls-key-password: the gRPC side takes only an unencrypted key")
        checker.would_run(f"OTLP/gRPC (LogsService/Export) on {config.grpc_listen}"
                          f"{' (TLS, client certificates: ' + host.tls.auth + ')' if host.tls.cert else ''}; "
                          f"OTLP/HTTP (POST /v1/logs) on --listen {host.listen}")

    def __init__(self, config: OtlpConfig, host: Host) -> None:
        super().__init__(config, host)
        self.pending: dict[str, asyncio.Task[int]] = {}  # request digest -> its publish
        self.recent: OrderedDict[str, int] = OrderedDict()  # digest -> records the device refused
        self.grpc: grpc.aio.Server | None = None
        self.grpc_tls = GrpcTLS(host.config.tls)
        self.grpc_port = 0

    # -- the one path of a request, both transports

    async def export(self, body: bytes, *, json: bool, metadata: dict[str, Any], deadline: float | None = None) -> Outcome:
        """Decode, map and forward one request's (inflated) body; the answer it earned."""
        key = engine.request_key(body)
        if key in self.recent:  # a retry of a request the device accepted after we said "retry"
            return self._accepted(self.recent[key])
        task = self.pending.get(key)
        if task is None:
            link, inflate = self.host.link, self.host.inflate
            if (len(self.pending) >= self.config.max_pending_requests or inflate.spent
                    or link.inflight >= link.max_inflight):
                return Outcome("retry", message="the mesh is holding input; retry later")
            try:
                resources = records.encode(body, json=json, key=key, metadata=metadata,
                                           default_environment=self.environment)
            except engine.BadRequest as e:
                self.host.metrics.protocol_error(e.reason)
                return Outcome("bad", message=str(e))
            out = self._map(resources)
            if not len(out):
                return Outcome("ok")
            self.host.metrics.events_received.inc(len(out))
            task = asyncio.ensure_future(self._publish(out, key, len(body), metadata.get("peer", "?")))
            self.pending[key] = task
            # Its answer may have gone out already ("retry"): an error it ends with is still read here.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        timeout = self.config.answer_timeout
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - 0.5))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            return Outcome("retry", message=f"the device has not accepted these records within {timeout:g}s; retry later")
        if task.cancelled() or task.exception() is not None:
            return Outcome("retry", message="the bridge is stopping; retry later")
        return self._accepted(task.result())

    @staticmethod
    def _accepted(rejected: int) -> Outcome:
        if rejected:
            return Outcome("ok", rejected, f"the device refused {rejected} log records (check the bridge's --app-env "
                                          "and --topic, and the records' service.name)")
        return Outcome("ok")

    @property
    def environment(self) -> str:
        """The environment part of --app-env: the app-env of a service that names none."""
        return self.host.config.app_env.rpartition("-")[2] or "default"

    def _map(self, resources: list[records.Packed]) -> Any:
        """The request's finished bodies (records.encode: `@metadata` and `_id` in them) as batches."""
        mapper = self.host.mapper
        out = mapper.batches()
        for res in resources:
            mapper.add_encoded(out, res.blob, res.lens, res.created_ms, app_env=res.app_env)
        return out

    async def _publish(self, out: Any, key: str, size: int, peer: str) -> int:
        inflate = self.host.inflate
        inflate.take(size)
        try:
            rejected = await forward(self.host, out, f"otlp {peer}")
        finally:
            inflate.give(size)
            self.pending.pop(key, None)
        self.host.metrics.events_acked.inc(len(out) - rejected)
        self.recent[key] = rejected
        while len(self.recent) > RECENT:
            self.recent.popitem(last=False)
        return rejected

    # -- HTTP on the host's server

    async def serve(self, conn: Connection) -> None:
        await HttpSession(self.host, conn, self.export, limit=self.host.config.max_frame_size,
                          retry_after=self.config.retry_after).run()

    # -- gRPC beside it

    async def start(self) -> None:
        cfg = self.host.config
        options = [
            ("grpc.max_receive_message_length", cfg.max_frame_size),
            ("grpc.max_send_message_length", 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ]
        if cfg.idle_timeout:
            options.append(("grpc.max_connection_idle_ms", int(cfg.idle_timeout * 1000)))
        server = grpc.aio.server(options=options, maximum_concurrent_rpcs=max(1, cfg.max_connections))
        handler = grpc.unary_unary_rpc_method_handler(self._grpc_export)  # bytes in, bytes out: engine.py decodes
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
        host, port = split_listen(self.config.grpc_listen)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        creds = self.grpc_tls.credentials()
        self.grpc_port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        if not self.grpc_port:
            raise OSError(f"cannot listen on --grpc-listen {self.config.grpc_listen}")
        await server.start()
        self.grpc = server
        log.info("otlp gRPC (LogsService/Export) listening on %s:%d%s; OTLP/HTTP (POST /v1/logs) on --listen %s",
                 host, self.grpc_port, " (TLS)" if creds else "", cfg.listen)

    async def _grpc_export(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        metadata = self._grpc_metadata(context)
        remaining = context.time_remaining()
        outcome = await self.export(request, json=False, metadata=metadata, deadline=remaining)
        if outcome.kind == "ok":
            return engine.response(outcome.rejected, outcome.message).SerializeToString()
        if outcome.kind == "retry":
            delay = self.config.retry_after
            info = RetryInfo(retry_delay=Duration(seconds=int(delay), nanos=int((delay % 1) * 1e9)))
            await context.abort(grpc.StatusCode.UNAVAILABLE, outcome.message,
                                trailing_metadata=(("google.rpc.retryinfo-bin", info.SerializeToString()),))
        log.warning("otlp %s: refused an Export request: %s", metadata["peer"], outcome.message)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, outcome.message)
        raise AssertionError("unreachable")  # abort raises

    def _grpc_metadata(self, context: grpc.aio.ServicerContext) -> dict[str, Any]:
        peer = context.peer() or "?"
        kind, _, address = peer.partition(":")
        if kind in ("ipv4", "ipv6"):
            peer = address.removeprefix("[").replace("]:", ":") if kind == "ipv6" else address
        meta: dict[str, Any] = {
            "protocol": self.name, "protocol_version": PROTOCOL_VERSION, "transport": "grpc",
            "peer": peer, "received_at": now_ms(),
        }
        auth = context.auth_context()
        if auth.get("transport_security_type") == [b"ssl"]:
            first = lambda k: (auth.get(k) or [b""])[0].decode("utf-8", "replace") or None  # noqa: E731
            meta["tls"] = {"subject": first("x509_subject"), "cn": first("x509_common_name"),
                           "version": None, "cipher": None}
        return meta

    def reload_tls(self) -> None:
        """SIGHUP: the gRPC side reads the TLS files again (the host reloads its own)."""
        self.grpc_tls.reload()

    def health_checks(self) -> list[Check]:
        up = self.grpc is not None
        return [Check("grpc_listening", up, f"{self.config.grpc_listen} (port {self.grpc_port})" if up
                      else "the gRPC server is not serving")]

    async def aclose(self) -> None:
        if self.grpc is not None:
            await self.grpc.stop(grace=5)
        if self.pending:
            await asyncio.wait(list(self.pending.values()), timeout=5)


class GrpcTLS:
    """The gRPC side's TLS from the same --tls-* flags: dynamic credentials whose fetcher
    (called by gRPC for each new handshake) hands over the files SIGHUP read last.

    gRPC knows client certificates as required or not requested: `optional` does not ask
    for one here, and a key with --tls-key-password cannot be used (gRPC takes only
    unencrypted PEM keys); both are said at start."""

    def __init__(self, tls: TLSConfig) -> None:
        self.tls = tls
        self.fresh: Any = None

    def _configuration(self) -> Any:
        tls = self.tls
        with open(tls.cert, "rb") as f:  # type: ignore[arg-type]
            chain = f.read()
        with open(tls.key, "rb") as f:  # type: ignore[arg-type]
            key = f.read()
        root = None
        if tls.client_ca and tls.auth == "required":
            with open(tls.client_ca, "rb") as f:
                root = f.read()
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=root)

    def credentials(self) -> grpc.ServerCredentials | None:
        tls = self.tls
        if not tls.cert:
            return None
        if tls.key_password:
            raise ValueError("--tls-key-password: the gRPC side takes only an unencrypted key")
        if tls.auth == "optional":
            log.warning("--tls-client-auth optional: the gRPC side does not ask for client certificates")
        return grpc.dynamic_ssl_server_credentials(self._configuration(), self._fetch,
                                                   require_client_authentication=tls.auth == "required")

    def _fetch(self) -> Any:
        fresh, self.fresh = self.fresh, None
        return fresh

    def reload(self) -> None:
        if not self.tls.cert:
            return
        try:
            self.fresh = self._configuration()
        except (OSError, ValueError, RuntimeError) as e:
            log.error("SIGHUP: the gRPC side cannot reload the TLS files (%s); keeping the previous certificate", e)
            return
        log.info("SIGHUP: the gRPC side reloaded %s; new connections use it", self.tls.cert)
