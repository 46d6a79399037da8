"""The real OTLP clients the OTLP bridge's tests drive: the Python SDK's exporters (gRPC and
HTTP/protobuf, 1.45.2) fed with records its own `LoggerProvider` made, and raw requests for
what no exporter sends (garbage, oversize)."""

from __future__ import annotations

import http.client
import ssl
from typing import Any, Sequence

from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor
from opentelemetry.sdk.resources import Resource


class Capture(LogRecordProcessor):
    """Keeps what the SDK's loggers emit, so a test hands exactly those to an exporter and sees
    each export's result (a batch processor would hide it)."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def on_emit(self, log_record: Any) -> None:
        self.records.append(log_record)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def sdk_records(resource: dict[str, Any], n: int, tag: str, *, scope: str = "tests.otlp") -> list[Any]:
    """`n` records emitted through the SDK under `resource`: body "<tag> <i>", attributes i and tag."""
    provider = LoggerProvider(resource=Resource.create(resource))
    capture = Capture()
    provider.add_log_record_processor(capture)
    logger = provider.get_logger(scope, "1.2.3")
    from opentelemetry._logs import SeverityNumber

    for i in range(n):
        logger.emit(body=f"{tag} {i}", severity_number=SeverityNumber.WARN, severity_text="WARN",
                    attributes={"i": i, "tag": tag, "big": 2**62, "ok": True, "ratio": 0.5})
    return capture.records


def grpc_exporter(port: int, *, tls: Any = None, timeout: float = 10.0, compression: Any = None) -> Any:
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter

    if tls is None:
        return OTLPLogExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=timeout, compression=compression)
    return OTLPLogExporter(endpoint=f"https://localhost:{port}", credentials=tls, timeout=timeout, compression=compression)


def http_exporter(port: int, *, scheme: str = "http", timeout: float = 10.0, gzip: bool = False, **tls: Any) -> Any:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    host = "localhost" if scheme == "https" else "127.0.0.1"
    return OTLPLogExporter(endpoint=f"{scheme}://{host}:{port}/v1/logs", timeout=timeout,
                           compression=Compression.Gzip if gzip else Compression.NoCompression, **tls)


def post(port: int, body: bytes, *, content_type: str = "application/x-protobuf", path: str = "/v1/logs",
         headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 request: (status, headers, body)."""
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=30)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type, **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def raw_grpc_export(port: int, body: bytes, timeout: float = 10.0) -> Any:
    """Export with hand-picked request bytes through grpcio's own channel; the RpcError or the reply bytes."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export")
        try:
            return call(body, timeout=timeout)
        except grpc.RpcError as e:
            return e


def sorted_messages(got: Sequence[tuple[Any, dict[str, Any]]]) -> list[str]:
    return sorted(body.get("message", "") for _, body in got)
