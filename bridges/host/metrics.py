"""Prometheus metrics every bridge exposes on --metrics-port (with /healthz, runtime.health)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from runtime.health import HealthCheck, MetricsServer
from runtime.health import serve as serve_http


class BridgeMetrics:
    def __init__(self, protocol: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["protocol"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels + list(extra), registry=self.registry)

        self._connections = counter("logjam_bridge_connections", "Client connections accepted")
        self._refused = counter("logjam_bridge_connections_refused", "Connections refused at --max-connections")
        self._active = Gauge("logjam_bridge_connections_active", "Open client connections", labels, registry=self.registry)
        self._events_in = counter("logjam_bridge_events_received", "Events decoded from clients")
        self._events_acked = counter("logjam_bridge_events_acked", "Events accepted by the device and acknowledged")
        self._rejected = counter("logjam_bridge_device_rejected", "Events the device answered 400 Bad Request")
        self._errors = counter("logjam_bridge_protocol_errors", "Connections ended by a protocol error", ("reason",))
        self._fallbacks = counter("logjam_bridge_app_env_fallbacks", "Events whose --app-env-field was missing or invalid")
        self._inflight = Gauge("logjam_bridge_device_inflight", "Requests awaiting the device", labels, registry=self.registry)
        self._tls_reloads = counter("logjam_bridge_tls_reloads", "SIGHUP reloads of the TLS files", ("result",))
        self._shed = counter("logjam_bridge_connections_shed", "Idle connections closed to admit a new client")
        self._refused_peer = counter("logjam_bridge_connections_refused_per_peer",
                                     "Connections refused at --max-connections-per-peer (also counted in _refused)")
        self._tls_refused = counter("logjam_bridge_tls_refused", "TLS handshakes that failed, by reason", ("reason",))
        self._inflated = Gauge("logjam_bridge_inflated_bytes", "Inflated bytes decoded and not yet acked, process-wide",
                               labels, registry=self.registry)
        self._inflate_waits = counter("logjam_bridge_inflate_waits",
                                      "Times a connection waited for the --max-inflated-bytes budget")
        self._rerouted = counter("logjam_bridge_batches_rerouted",
                                 "Batches sent to another device than their connection's, or skipping a device's "
                                 "turn, because it was hung (--device-deadline) or down", ("reason",))
        self.protocol = protocol
        self.shed = self._shed.labels(protocol)
        self.refused_per_peer = self._refused_peer.labels(protocol)
        self.inflated_bytes = self._inflated.labels(protocol)
        self.inflate_waits = self._inflate_waits.labels(protocol)
        self.connections = self._connections.labels(protocol)
        self.refused = self._refused.labels(protocol)
        self.active = self._active.labels(protocol)
        self.events_received = self._events_in.labels(protocol)
        self.events_acked = self._events_acked.labels(protocol)
        self.device_rejected = self._rejected.labels(protocol)
        self.app_env_fallbacks = self._fallbacks.labels(protocol)
        self.device_inflight = self._inflight.labels(protocol)

    def protocol_error(self, reason: str) -> None:
        self._errors.labels(self.protocol, reason).inc()

    def rerouted(self, reason: str) -> None:
        self._rerouted.labels(self.protocol, reason).inc()

    def tls_reload(self, ok: bool) -> None:
        self._tls_reloads.labels(self.protocol, "ok" if ok else "failed").inc()

    def tls_refused(self, reason: str) -> None:
        self._tls_refused.labels(self.protocol, reason).inc()

    def serve(self, port: int, addr: str = "0.0.0.0", health: HealthCheck | None = None) -> MetricsServer:
        return serve_http(self.registry, port, addr, health=health)
