"""`logjam-bridge otlp` with the npm OTLP/JSON exporter (`@opentelemetry/exporter-logs-otlp-http`
0.223.1, the newest that runs on Node 20), through a real logjam-device and subscriber.

OTLP/JSON is not protobuf's JSON: trace and span ids are hex and int64 values are strings;
the records here carry both, and the older `deployment.environment` names the stream.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.bridge_support import collect, no_more, ready_subscriber, start_bridge, stop_bridge
from harness.processes import free_port
from tests.lumberjack_support import NODE_DIR

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not installed")
    pkg = "@opentelemetry/exporter-logs-otlp-http"
    assert (NODE_DIR / "node_modules" / pkg).is_dir(), f"npm {pkg} missing: run `make node-clients`"
    return exe


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_npm_otlp_json_exporter_records_land_once_with_hex_ids(device, node, compression) -> None:
    b = start_bridge("otlp", device.router, "--grpc-listen", f"127.0.0.1:{free_port()}")
    try:
        sub = ready_subscriber(device.pub, device.router, "web-staging")
        tag = f"node-{compression}"
        out = subprocess.run(
            [node, "send_otlp_json.js", f"http://127.0.0.1:{b.port}/v1/logs", "20", tag, "web", "staging", compression],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=70,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout.splitlines()[-1]) == {"code": 0, "error": None}
        got = collect(sub, "web-staging", 20)
        assert sorted(body["message"] for _, body in got) == sorted(f"{tag} {i}" for i in range(20))
        assert len({body["@metadata"]["_id"] for _, body in got}) == 20
        for m, body in got:
            i = int(body["message"].split()[1])
            assert body["severity_text"] == "ERROR" and body["severity_number"] == 17
            assert body["attributes"] == {"i": i, "tag": tag, "big": 2**53 - 1}
            assert body["scope"] == {"name": "tests.otlp.node", "version": "4.5.6"}
            assert body["resource"]["attributes"]["deployment.environment"] == "staging"
            assert body["@metadata"]["transport"] == "http/json"
            if i % 2 == 0:
                assert body["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
                assert body["span_id"] == "b7ad6b7169203331"
                assert body["time_unix_nano"] == (1700000000123 + i) * 1_000_000
                assert m.meta.created_ms == 1700000000123 + i
            else:
                # The npm SDK stamps a record emitted without a time with the time it was emitted.
                assert "trace_id" not in body and "span_id" not in body
                assert m.meta.created_ms == body["time_unix_nano"] // 1_000_000
        assert not no_more(sub, "web-staging", 0.5)
    finally:
        stop_bridge(b)
