"""`logjam-bridge otlp` with the real OTLP exporters, through a real logjam-device and subscriber.

The Python SDK's exporters (1.45.2) over gRPC and HTTP/protobuf, plain and TLS; raw requests
for a malformed and an oversize body; the device paused while the SDK exports (it is told to
retry, retries, and nothing is lost). The npm OTLP/JSON exporter is in test_otlp_json.py.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.sdk._logs.export import LogRecordExportResult

from tests.bridge_support import BridgeProcess, collect, no_more, ready_subscriber, start_bridge, stop_bridge
from harness.processes import free_port, port_open, wait_for
from tests.otlp_clients import grpc_exporter, http_exporter, post, raw_grpc_export, sdk_records, sorted_messages

pytestmark = pytest.mark.timeout(120)

SERVICE = {"service.name": "checkout", "deployment.environment.name": "prod"}


def start_otlp(device: Any, *extra: str) -> tuple[BridgeProcess, int]:
    grpc_port = free_port()
    b = start_bridge("otlp", device.router, "--grpc-listen", f"127.0.0.1:{grpc_port}", *extra)
    wait_for(lambda: port_open(grpc_port), timeout=20, what="the OTLP gRPC port")
    return b, grpc_port


@pytest.fixture
def bridge(device):
    b, grpc_port = start_otlp(device)
    yield b, grpc_port
    stop_bridge(b)


def check_fields(got: list[tuple[Any, dict[str, Any]]], tag: str, n: int, transport: str) -> None:
    """Every record once, with the documented fields."""
    assert sorted_messages(got) == sorted(f"{tag} {i}" for i in range(n))
    keys = {body["@metadata"]["_id"] for _, body in got}
    assert len(keys) == n
    for m, body in got:
        assert body["severity_text"] == "WARN" and body["severity_number"] == 13
        i = int(body["message"].split()[1])
        assert body["attributes"] == {"i": i, "tag": tag, "big": 2**62, "ok": True, "ratio": 0.5}
        assert body["scope"] == {"name": "tests.otlp", "version": "1.2.3"}
        assert body["resource"]["attributes"]["telemetry.sdk.name"] == "opentelemetry"
        meta = body["@metadata"]
        assert meta["protocol"] == "otlp" and meta["transport"] == transport
        assert meta["_id"].startswith("otlp:")
        # No time given by the logger: created_at is the SDK's observed time (ms).
        assert "time_unix_nano" not in body
        assert m.meta.created_ms == body["observed_time_unix_nano"] // 1_000_000


@pytest.mark.parametrize("transport", ["grpc", "http/protobuf"])
def test_sdk_exporter_records_land_once_with_the_documented_fields(device, bridge, transport) -> None:
    b, grpc_port = bridge
    sub = ready_subscriber(device.pub, device.router, "checkout-prod")
    fallback = ready_subscriber(device.pub, device.router, b.app_env)
    tag = transport.replace("/", "-")
    named = sdk_records(SERVICE, 40, tag)
    # The SDK's default service.name, unknown_service:<process>, counts as none: --app-env.
    unnamed = sdk_records({}, 5, f"{tag}-unnamed")
    exporter = grpc_exporter(grpc_port) if transport == "grpc" else http_exporter(b.port, gzip=True)
    try:
        # One request with two resources: each goes to its own stream.
        assert exporter.export(named + unnamed) == LogRecordExportResult.SUCCESS
    finally:
        exporter.shutdown()
    check_fields(collect(sub, "checkout-prod", 40), tag, 40, transport)
    check_fields(collect(fallback, b.app_env, 5), f"{tag}-unnamed", 5, transport)
    assert not no_more(sub, "checkout-prod", 0.5)


def test_grpc_and_http_over_tls_with_client_certificates(device, certs, monkeypatch) -> None:
    # requests (under the HTTP exporter) lets these variables override the CA the exporter was given.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    tls = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), "--tls-client-ca", str(certs.ca)]
    b, grpc_port = start_otlp(device, *tls)
    try:
        sub = ready_subscriber(device.pub, device.router, "checkout-prod")
        creds = grpc.ssl_channel_credentials(certs.ca.read_bytes(), certs.client_key.read_bytes(),
                                              certs.client_cert.read_bytes())
        g = grpc_exporter(grpc_port, tls=creds)
        h = http_exporter(b.port, scheme="https", certificate_file=str(certs.ca),
                          client_key_file=str(certs.client_key), client_certificate_file=str(certs.client_cert))
        try:
            assert g.export(sdk_records(SERVICE, 10, "tls-grpc")) == LogRecordExportResult.SUCCESS
            assert h.export(sdk_records(SERVICE, 10, "tls-http")) == LogRecordExportResult.SUCCESS
        finally:
            g.shutdown()
            h.shutdown()
        got = collect(sub, "checkout-prod", 20)
        assert sorted_messages(got) == sorted([f"tls-grpc {i}" for i in range(10)] + [f"tls-http {i}" for i in range(10)])
        for _, body in got:
            assert body["@metadata"]["tls"]["cn"] == "test-client"
        # Without a client certificate neither side takes the records.
        bare = grpc_exporter(grpc_port, tls=grpc.ssl_channel_credentials(certs.ca.read_bytes()), timeout=3)
        try:
            assert bare.export(sdk_records(SERVICE, 1, "nocert")) != LogRecordExportResult.SUCCESS
        finally:
            bare.shutdown()
        assert not no_more(sub, "checkout-prod", 0.5)
    finally:
        stop_bridge(b)


def test_malformed_requests_are_refused_without_retry(device, bridge) -> None:
    b, grpc_port = bridge
    status, headers, body = post(b.port, b"\xff\xff\xff garbage")
    assert status == 400
    assert status_pb2.Status.FromString(body).code == 3  # INVALID_ARGUMENT
    status, _, body = post(b.port, b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "xyz"}]}]}]}',
                           content_type="application/json")
    assert status == 400 and b"traceId" in body
    err = raw_grpc_export(grpc_port, b"\xff\xff\xff garbage")
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The bridge still serves: an empty request is a success.
    assert ExportLogsServiceResponse.FromString(raw_grpc_export(grpc_port, b"")) == ExportLogsServiceResponse()
    status, _, body = post(b.port, b"{}", content_type="application/json")
    assert status == 200 and body == b"{}"
    status, _, _ = post(b.port, b"", content_type="text/plain")
    assert status == 415
    # Not HTTP at all: a 400, and the connection closes.
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw:
        raw.sendall(b"GARBAGE\r\n\r\n")
        answer = b"".join(iter(lambda: raw.recv(4096), b""))
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"connection: close" in answer


def test_oversize_requests_get_413_and_resource_exhausted(device) -> None:
    b, grpc_port = start_otlp(device, "--max-frame-size", "4096")
    try:
        big = b"\x0a" + b"\xff" * 5000
        status, _, _ = post(b.port, big)
        assert status == 413
        err = raw_grpc_export(grpc_port, big)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        import gzip

        status, _, _ = post(b.port, gzip.compress(b"\x00" * 100_000), headers={"Content-Encoding": "gzip"})
        assert status == 413
    finally:
        stop_bridge(b)


@pytest.mark.parametrize("transport", ["grpc", "http/protobuf"])
def test_device_paused_the_sdk_is_told_to_retry_and_nothing_is_lost(device, transport) -> None:
    b, grpc_port = start_otlp(device, "--answer-timeout", "1", "--retry-after", "1")
    try:
        sub = ready_subscriber(device.pub, device.router, "checkout-prod")
        exporter = grpc_exporter(grpc_port, timeout=30) if transport == "grpc" else http_exporter(b.port, timeout=30)
        tag = f"paused-{transport.replace('/', '-')}"
        records = sdk_records(SERVICE, 30, tag)
        # What the bridge answers while the device is stopped: retry, with the delay.
        os.kill(device.proc.pid, signal.SIGSTOP)
        try:
            if transport == "grpc":
                err = raw_grpc_export(grpc_port, _one_request(), timeout=10)
                assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.UNAVAILABLE
                info = RetryInfo.FromString(dict(err.trailing_metadata())["google.rpc.retryinfo-bin"])
                assert info.retry_delay.seconds == 1
            else:
                status, headers, _ = post(b.port, _one_request())
                assert status == 503 and headers["retry-after"] == "1"
            result: list[Any] = []
            t = threading.Thread(target=lambda: result.append(exporter.export(records)))
            t.start()
            time.sleep(3.5)  # the exporter is answered "retry" at least twice meanwhile
            assert not result
        finally:
            os.kill(device.proc.pid, signal.SIGCONT)
        t.join(40)
        exporter.shutdown()
        assert result == [LogRecordExportResult.SUCCESS]
        got = collect(sub, "checkout-prod", 31)
        got += [(m, m.json()) for m in no_more(sub, "checkout-prod", 1.0)]
        ours = [g for g in got if g[1].get("message", "").startswith(tag)]
        # Every record arrived; a copy the device took twice carries the same _id.
        assert sorted(set(sorted_messages(ours))) == sorted(f"{tag} {i}" for i in range(30))
        assert len({body["@metadata"]["_id"] for _, body in ours}) == 30
    finally:
        os.kill(device.proc.pid, signal.SIGCONT)
        stop_bridge(b)


def _one_request() -> bytes:
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs

    return encode_logs(sdk_records(SERVICE, 1, "probe")).SerializeToString()


def test_sighup_reloads_tls_on_both_ports_and_metrics_and_healthz_show_the_bridge(device, tmp_path) -> None:
    import json
    import urllib.request

    from tests.bridge_support import client_tls
    from tests.test_tls_reload import install, reloads, two_certificates

    a, b_certs, cert, key = two_certificates(tmp_path)
    mport = free_port()
    b, grpc_port = start_otlp(device, "--tls-cert", str(cert), "--tls-key", str(key), "--metrics-port", str(mport))
    try:
        sub = ready_subscriber(device.pub, device.router, "checkout-prod")

        def both(certs: Any, tag: str) -> None:
            g = grpc_exporter(grpc_port, tls=grpc.ssl_channel_credentials(certs.ca.read_bytes()), timeout=5)
            try:
                assert g.export(sdk_records(SERVICE, 3, f"{tag}-grpc")) == LogRecordExportResult.SUCCESS
            finally:
                g.shutdown()
            status, _, _ = post(b.port, _one_request(), context=client_tls(certs))
            assert status == 200

        both(a, "before")
        install(b_certs.server_cert, b_certs.server_key, cert, key)
        os.kill(b.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(mport, "ok") == 1, timeout=10, what="the reload to be counted")
        both(b_certs, "after")  # only certificate B is trusted now, on both ports
        got = collect(sub, "checkout-prod", 8)
        assert len(got) == 8
        health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{mport}/healthz", timeout=5).read())
        assert health["healthy"] and health["checks"]["grpc_listening"]["ok"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        assert 'logjam_bridge_events_acked_total{protocol="otlp"} 8.0' in text
    finally:
        stop_bridge(b)
