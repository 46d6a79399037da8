"""One HTTP listener per process: Prometheus text on `/metrics` and a health verdict on `/healthz`.

Every long-running entry point (device, bridges, importers, logjam-spark) serves its
`--metrics-port` with `serve()`, so scraping and probing work the same everywhere.
`/metrics` is prometheus_client's own WSGI app for the process's registry. `/healthz`
asks the process's `HealthCheck` callable for a list of `Check`s, each a named yes/no
with a one-line reason, and answers 200 when all pass and 503 when any fails, with the
checks as JSON:

    {"healthy": false, "checks": {"device_link": {"ok": false, "detail": "no device connected"}}}

A health function that raises is a failing check, never a failed HTTP server.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


HealthCheck = Callable[[], Iterable[Check]]


def evaluate(health: HealthCheck | None) -> tuple[bool, dict[str, Any]]:
    """(healthy, the JSON document /healthz answers)."""
    try:
        checks = list(health()) if health is not None else [Check("process", True, "running")]
    except Exception as e:  # a broken probe says so instead of taking the listener down
        checks = [Check("health", False, f"health check raised {type(e).__name__}: {e}")]
    healthy = all(c.ok for c in checks)
    return healthy, {"healthy": healthy, "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in checks}}


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    # One slow scraper must not block the next probe; handler threads die with the process.
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def _ipv6_server(addr: str) -> type[_Server]:
    class Server6(_Server):
        address_family = socket.AF_INET6

    return Server6 if ":" in addr else _Server


def app(registry: CollectorRegistry, health: HealthCheck | None) -> Callable[..., Any]:
    metrics = make_wsgi_app(registry)

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO", "").rstrip("/") == "/healthz":
            healthy, doc = evaluate(health)
            body = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
            start_response("200 OK" if healthy else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        return metrics(environ, start_response)

    return wsgi


class MetricsServer:
    """The listener of `serve()`; `close()` stops it (tests; processes just exit)."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self.httpd = httpd
        self.thread = thread
        self.port: int = httpd.server_address[1]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0",
          health: HealthCheck | None = None) -> MetricsServer:
    """Serve /metrics and /healthz on addr:port from a daemon thread."""
    addr = "0.0.0.0" if addr in ("*", "") else addr.strip("[]")
    httpd = make_server(addr, port, app(registry, health), _ipv6_server(addr), handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, name=f"metrics:{port}", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


def fetch(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any] | None]:
    """GET a /healthz: (HTTP status, its JSON), or (0, None) when nothing answers. For `make status`."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, None
    except (OSError, ValueError):
        return 0, None
