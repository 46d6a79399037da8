"""Every kind of event body through every way into the mesh, as the mapping documents say.

One real `logjam-device` for the module; per case a real `logjam-bridge` process (or the
device's ROUTER itself, for the Logjam path) and a subscriber on the device's PUB. The
seven kinds go in one request, in this order, each acknowledged, each arriving as one
Logjam message whose body is what docs/protocols/<protocol>.md says: a JSON object stays itself with `@metadata` merged
over its own; anything else is `{"message": text}`, or `{"message_base64": ...}` for bytes
that are not UTF-8 (Courier adds `"tags": ["_unmarshal_failure"]`, as its servers do).
Every message then goes through the importer's decoder (importer/decode.py), the row the
table would hold. The legacy Courier connection (JDAT first, no HELO) once crashed the
bridge on the first event that was not a JSON object.

Every case runs twice: with the device and the bridge under LOGJAM_NATIVE=require (the C loop,
link and Lumberjack scanner) and under off (their Python twins).
"""

from __future__ import annotations

import base64
import socket
import uuid
from typing import Any, Callable

import orjson
import pytest

from bridges.lumberjack.engine import AckFrame, LumberjackClient
from bridges.segment import engine as wire
from importer.decode import BatchBuilder
from logjam.message import Message
from logjam.producer import Producer
from tests.bridge_support import collect, no_more, ready_subscriber, start_bridge, stop_bridge
from harness.device import start_device
from tests.conftest import NATIVE_MODES
from harness.courier_client import TestCourierClient
from harness.processes import stop, wait_for
from tests.rustlog_clients import BinaryClient, JsonClient, RawConn
from harness.segment_client import SegmentTestClient

# Native-sensitive (LOGJAM_NATIVE picks the C paths or their Python twins): each test runs on both (`device`).
pytestmark = [pytest.mark.timeout(90), pytest.mark.native]

INVALID_UTF8 = b"\xff\xfe\x80 not utf-8"
# Each kind in the order it is sent, and the body it must arrive as (without @metadata).
KINDS: list[tuple[str, bytes, dict[str, Any]]] = [
    ("object", b'{"kind":"object","n":1,"@timestamp":"2024-05-01T12:00:00.250Z"}',
     {"kind": "object", "n": 1, "@timestamp": "2024-05-01T12:00:00.250Z"}),
    ("array", b'[1,"two",{"three":3}]', {"message": '[1,"two",{"three":3}]'}),
    ("scalar", b"42", {"message": "42"}),
    ("invalid_utf8", INVALID_UTF8, {"message_base64": base64.b64encode(INVALID_UTF8).decode()}),
    ("empty", b"", {"message": ""}),
    ("whitespace", b" \t\r\n ", {"message": " \t\r\n "}),
    ("own_metadata", b'{"kind":"meta","@metadata":{"beat":"filebeat","_id":"client-key-1"}}', {"kind": "meta"}),
]
PAYLOADS = [raw for _, raw, _ in KINDS]
WRAPPED = {"array", "scalar", "invalid_utf8", "empty", "whitespace"}


@pytest.fixture(scope="module", params=NATIVE_MODES)
def native(request) -> str:
    """LOGJAM_NATIVE of the module's device and of every case's bridge: require, then off."""
    return request.param


@pytest.fixture(scope="module")
def device(native):
    dev = start_device(native=native)
    yield dev
    assert stop(dev.proc) == 0, dev.output()


# ------------------------------------------------------------------ senders: each returns once acknowledged

def send_lumberjack(port: int) -> None:
    client = LumberjackClient()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(client.send(PAYLOADS))
        acks: list[AckFrame] = []
        while not acks or acks[-1].seq != client.last_seq:
            data = sock.recv(65536)
            assert data, f"closed before the ack of the window; got {acks}"
            acks += client.feed(data)


def courier_sender(handshake: bool, kind: str) -> Callable[[int], None]:
    def send(port: int) -> None:
        with TestCourierClient(port, handshake=handshake) as client:
            payload = client.send(PAYLOADS, kind=kind)
            client.wait_all_acked()
        assert payload.acks[-1][1] == len(PAYLOADS)
    return send


def send_segment(port: int) -> None:
    segment = "mesh/kinds/0.#epoch.0"
    with SegmentTestClient(port) as c:
        c.hello()
        assert isinstance(c.create_segment(segment), wire.SegmentCreated)
        writer = uuid.uuid4()
        assert isinstance(c.setup_append(writer, segment), wire.AppendSetup)
        c.append(writer, PAYLOADS, len(PAYLOADS))
        assert c.expect(wire.DataAppended).event_number == len(PAYLOADS)


def send_rustlog_json(port: int) -> None:
    with RawConn(port) as conn:
        j = JsonClient(conn)
        assert j.create("kinds")["success"]
        assert j.produce("kinds", 0, PAYLOADS) == {"type": "ProduceResponse", "base_offset": 0,
                                                   "record_count": len(PAYLOADS)}


def send_rustlog_binary(port: int) -> None:
    with RawConn(port) as conn:
        b = BinaryClient(conn)
        assert b.create("kinds", 1) == ("create", 1)
        assert b.produce("kinds", 0, PAYLOADS) == ("produce", 0, len(PAYLOADS))


# case: (protocol, sender, the @metadata field that numbers the events, its first value)
BRIDGES = {
    "lumberjack": ("lumberjack", send_lumberjack, "seq", 1),
    "courier": ("courier", courier_sender(True, "JDAT"), "index", 0),
    "courier-evnt": ("courier", courier_sender(True, "EVNT"), "index", 0),
    "courier-legacy": ("courier", courier_sender(False, "JDAT"), "index", 0),  # JDAT first, no HELO: an old client
    "segment": ("segment", send_segment, "event_number", 1),
    "rustlog-json": ("rustlog", send_rustlog_json, "offset", 0),
    "rustlog-binary": ("rustlog", send_rustlog_binary, "offset", 0),
}


# ------------------------------------------------------------------ the checks

def imported(messages: list) -> list[dict[str, Any]]:
    """The rows the importer's decoder makes of these messages."""
    b = BatchBuilder()
    for m in messages:
        b.add(m, 1_763_700_000_000_000)
    return b.build().select(["body", "parse_error", "message"]).to_pylist()


@pytest.mark.parametrize("case", list(BRIDGES))
def test_every_body_kind_is_acknowledged_and_lands_as_the_mapping_says(device, native, tmp_path, case) -> None:
    protocol, send, position, first = BRIDGES[case]
    data = tmp_path / "data" if protocol in ("segment", "rustlog") else None
    bridge = start_bridge(protocol, device.router, data_dir=data, native=native)
    sub = ready_subscriber(device.pub, device.router, bridge.app_env)
    try:
        send(bridge.port)
        got = collect(sub, bridge.app_env, len(KINDS))
        assert no_more(sub, bridge.app_env, 0.5) == []
    finally:
        sub.close()
        stop_bridge(bridge)
    got.sort(key=lambda g: g[1]["@metadata"][position])
    assert [b["@metadata"][position] for _, b in got] == list(range(first, first + len(KINDS)))
    ids = set()
    for (kind, _, expected), (msg, body) in zip(KINDS, got):
        meta = body.pop("@metadata")
        if kind in WRAPPED and protocol == "courier":
            expected = {**expected, "tags": ["_unmarshal_failure"]}
        assert body == expected, kind
        assert meta["protocol"] == protocol and meta["peer"].startswith("127.0.0.1:"), (kind, meta)
        if kind == "own_metadata":
            assert meta["beat"] == "filebeat" and meta["_id"] == "client-key-1", meta  # merged over, its key kept
        ids.add(meta["_id"])
        if kind == "object":
            assert msg.meta.created_ms == 1714564800250  # its @timestamp
        else:
            assert msg.meta.created_ms > 1714564800250  # when it was received
    assert len(ids) == len(KINDS), "every event has its own key"
    rows = imported([m for m, _ in got])
    assert [r["parse_error"] for r in rows] == [None] * len(KINDS)
    assert [orjson.loads(r["body"]) for r in rows] == [m.json() for m, _ in got]
    assert [r["message"] for r in rows] == [e.get("message") for _, _, e in KINDS]


def test_the_logjam_path_carries_every_body_as_sent_and_the_importer_keeps_each(device) -> None:
    """Straight to the device's ROUTER (a Logjam producer: no bridge, no mapping): every body is
    accepted and published byte for byte; the importer stores a body that is not JSON as a row
    with `parse_error` (docs/schema.md), and JSON that is not an object as it is."""
    app_env = f"kinds-{uuid.uuid4().hex[:8]}"
    sub = ready_subscriber(device.pub, device.router, app_env)
    got: list[Message] = []
    try:
        with Producer(device.router, timeout=10) as p:
            for raw in PAYLOADS:
                p.submit(app_env, "logs.kinds", raw)
            result = p.flush()
        assert (result.accepted, result.rejected) == (len(KINDS), 0)
        wait_for(lambda: got.extend(no_more(sub, app_env, 0.2)) or len(got) >= len(KINDS), timeout=30,
                 what="the messages")
    finally:
        sub.close()
    assert [bytes(m.body) for m in got] == PAYLOADS
    rows = imported(got)
    errors = {kind: (r["parse_error"] or "").split(":")[0] or None for (kind, _, _), r in zip(KINDS, rows)}
    assert errors == {"object": None, "array": None, "scalar": None, "invalid_utf8": "bad_json", "empty": "bad_json",
                      "whitespace": "bad_json", "own_metadata": None}
    assert rows[0]["body"] == PAYLOADS[0].decode() and rows[1]["body"] == PAYLOADS[1].decode()
