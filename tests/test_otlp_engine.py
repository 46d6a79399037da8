"""The OTLP decoding step and mapping (bridges/otlp/engine.py): vectors in protobuf and OTLP/JSON,
app-env rules, gzip bounds, and the Hypothesis property that arbitrary bytes give records or a
ProtocolError, nothing else."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from bridges.otlp import engine
from logjam.errors import ProtocolError, RemoteProtocolError

TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SPAN = bytes.fromhex("b7ad6b7169203331")


def kv(key: str, **value) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def request(*resources: ResourceLogs) -> ExportLogsServiceRequest:
    return ExportLogsServiceRequest(resource_logs=list(resources))


def resource_logs(attrs: list[KeyValue], *records: LogRecord, scope: str = "lib") -> ResourceLogs:
    return ResourceLogs(
        resource=Resource(attributes=attrs),
        scope_logs=[ScopeLogs(scope=InstrumentationScope(name=scope, version="1.0", attributes=[kv("s", bool_value=True)]),
                              log_records=list(records))],
    )


SERVICE = [kv("service.name", string_value="checkout"), kv("deployment.environment.name", string_value="prod")]

RECORD = LogRecord(
    time_unix_nano=1_700_000_000_123_456_789, observed_time_unix_nano=1_700_000_001_000_000_000,
    severity_number=9, severity_text="INFO", body=AnyValue(string_value="paid"),
    attributes=[
        kv("order", int_value=-(2**63)), kv("ok", bool_value=True), kv("ratio", double_value=0.25),
        kv("inf", double_value=float("inf")), kv("raw", bytes_value=b"\x00\xff"),
        kv("list", array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="a")])),
        kv("map", kvlist_value=KeyValueList(values=[kv("k", string_value="v")])),
    ],
    trace_id=TRACE, span_id=SPAN, flags=1, event_name="order.paid",
)

EXPECTED_BODY = {
    "message": "paid",
    "severity_text": "INFO",
    "severity_number": 9,
    "attributes": {"order": -(2**63), "ok": True, "ratio": 0.25, "inf": "inf", "raw": "AP8=",
                   "list": [1, "a"], "map": {"k": "v"}},
    "event_name": "order.paid",
    "trace_id": TRACE.hex(),
    "span_id": SPAN.hex(),
    "flags": 1,
    "time_unix_nano": 1_700_000_000_123_456_789,
    "observed_time_unix_nano": 1_700_000_001_000_000_000,
    "resource": {"attributes": {"service.name": "checkout", "deployment.environment.name": "prod"}},
    "scope": {"name": "lib", "version": "1.0", "attributes": {"s": True}},
}


def otlp_json(req: ExportLogsServiceRequest) -> bytes:
    """OTLP/JSON as the spec writes it: protobuf's JSON with hex ids (int64 already strings)."""
    d = json_format.MessageToDict(req)
    for rl in d.get("resourceLogs", []):
        for sl in rl.get("scopeLogs", []):
            for rec in sl.get("logRecords", []):
                for name in ("traceId", "spanId"):
                    if name in rec:
                        rec[name] = base64.b64decode(rec[name]).hex()
    return json.dumps(d).encode()


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_the_vector_maps_to_the_documented_body(encoding: str) -> None:
    req = request(resource_logs(SERVICE, RECORD))
    data = otlp_json(req) if encoding == "json" else req.SerializeToString()
    if encoding == "json":
        assert b'"traceId": "0af7651916cd43dd8448eb211c80319c"' in data and b'"-9223372036854775808"' in data
    [res] = engine.decode(data, json=encoding == "json")
    assert res.app_env == "checkout-prod"
    assert res.bodies == (EXPECTED_BODY,)
    assert res.created_ms == (1_700_000_000_123,)


def test_each_resource_is_its_own_stream_and_records_are_numbered_across_the_request() -> None:
    unknown = [kv("service.name", string_value="unknown_service:python")]
    older = [kv("service.name", string_value="web"), kv("deployment.environment", string_value="staging")]
    bare = [kv("service.name", string_value="api")]
    rec = LogRecord(observed_time_unix_nano=5_000_000, body=AnyValue(int_value=7))
    out = engine.decode(request(resource_logs(SERVICE, rec, rec), resource_logs(unknown, rec), resource_logs(older, rec),
                                resource_logs(bare, rec), resource_logs([], rec)).SerializeToString(),
                        default_environment="dev")
    assert [r.app_env for r in out] == ["checkout-prod", None, "web-staging", "api-dev", None]
    assert [r.first for r in out] == [0, 2, 3, 4, 5]
    # A non-string body stays a value under "body"; created_at falls back to the observed time.
    assert out[1].bodies[0]["body"] == 7 and "message" not in out[1].bodies[0]
    assert out[1].created_ms == (5,)


def test_a_record_without_any_time_has_created_ms_zero_and_empty_ids_are_left_out() -> None:
    [res] = engine.decode(request(resource_logs(SERVICE, LogRecord())).SerializeToString())
    assert res.created_ms == (0,)
    assert res.bodies[0] == {"resource": EXPECTED_BODY["resource"], "scope": EXPECTED_BODY["scope"]}


@pytest.mark.parametrize("name", ["unknown_service", "unknown_service:node", "", "bad\x01name"])
def test_service_names_that_do_not_name_a_stream(name: str) -> None:
    assert engine.app_env_of({"service.name": name, "deployment.environment.name": "prod"}, "default") is None


@pytest.mark.parametrize("body", [
    b"\xff\xff\xff",
    b"\x0a\x05\x0a\x03\x0a\x01",  # truncated
])
def test_malformed_protobuf_is_a_bad_request(body: bytes) -> None:
    with pytest.raises(engine.BadRequest):
        engine.decode(body)


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"resourceLogs": 5}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"spanId": "00"}]}]}]}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": "soon"}]}]}]}',
])
def test_malformed_json_is_a_bad_request(body: bytes) -> None:
    with pytest.raises(engine.BadRequest):
        engine.decode(body, json=True)


def test_json_ignores_unknown_fields_and_takes_integer_enums_and_numbers_for_int64() -> None:
    body = b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": 17, "timeUnixNano": 2000000,' \
           b' "body": {"stringValue": "x"}, "future": 1}]}]}]}'
    [res] = engine.decode(body, json=True)
    assert res.bodies[0]["severity_number"] == 17 and res.bodies[0]["message"] == "x"
    assert res.created_ms == (2,)


def test_gunzip_is_bounded_before_it_inflates_everything() -> None:
    assert engine.gunzip(gzip.compress(b"abc"), 3) == b"abc"
    with pytest.raises(engine.TooLarge):
        engine.gunzip(gzip.compress(b"\0" * 10_000), 4096)
    with pytest.raises(engine.BadRequest):
        engine.gunzip(b"not gzip", 4096)
    with pytest.raises(engine.BadRequest):
        engine.gunzip(gzip.compress(b"abc" * 1000)[:-10], 4096)


def test_responses_success_and_partial_success() -> None:
    assert engine.response() == ExportLogsServiceResponse()
    partial = engine.response(3, "refused")
    assert partial.partial_success.rejected_log_records == 3
    assert json.loads(engine.response_json(partial)) == {
        "partialSuccess": {"rejectedLogRecords": "3", "errorMessage": "refused"}}


def test_the_request_key_is_the_same_for_the_same_bytes() -> None:
    a = request(resource_logs(SERVICE, RECORD)).SerializeToString()
    assert engine.request_key(a) == engine.request_key(bytes(a))
    assert engine.request_key(a) != engine.request_key(a + b"\x00")


def _check(data: bytes, json_: bool) -> None:
    try:
        out = engine.decode(data, json=json_)
    except ProtocolError as e:
        assert isinstance(e, RemoteProtocolError) and e.reason
        return
    assert isinstance(out, list)
    for res in out:
        assert isinstance(res, engine.ResourceRecords)
        assert len(res.bodies) == len(res.created_ms)
        for body in res.bodies:
            json.dumps(body)  # a JSON object, whatever came in


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_give_records_or_a_protocol_error(data: bytes) -> None:
    _check(data, False)
    _check(data, True)


VALID = request(resource_logs(SERVICE, RECORD, RECORD)).SerializeToString()


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(VALID) - 1), st.integers(0, 255), st.integers(0, len(VALID)))
def test_mutated_and_truncated_requests_give_records_or_a_protocol_error(at: int, byte: int, cut: int) -> None:
    mutated = VALID[:at] + bytes([byte]) + VALID[at + 1:]
    _check(mutated[:cut], False)
    _check(otlp_json(request(resource_logs(SERVICE, RECORD)))[:cut], True)


# -- OTLP/HTTP framing: OtlpServer and OtlpClient


def post(body: bytes, *, json_: bool = False, headers: bytes = b"", target: bytes = b"/v1/logs",
         method: bytes = b"POST") -> bytes:
    kind = b"application/json" if json_ else b"application/x-protobuf"
    return (b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (method, target, kind, len(body), headers)) + body


def test_a_request_whole_byte_by_byte_and_with_the_next_one_behind_it() -> None:
    data = post(VALID)
    assert engine.OtlpServer().feed(data) == [engine.ExportRequest(VALID, False)]
    server = engine.OtlpServer()
    got = [e for i in range(len(data)) for e in server.feed(data[i:i + 1])]
    assert got == [engine.ExportRequest(VALID, False)]
    # A second request right behind the first is read once the first is answered.
    server = engine.OtlpServer()
    assert server.feed(data + post(b"{}", json_=True)) == [engine.ExportRequest(VALID, False)]
    answer = server.send(engine.Outcome("ok"))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\n")
    assert server.feed(b"") == [engine.ExportRequest(b"{}", True)]
    assert server.send(engine.Outcome("ok", 2, "refused")).endswith(
        b'{"partialSuccess":{"rejectedLogRecords":"2","errorMessage":"refused"}}')


def test_gzip_bodies_are_inflated_with_the_bound() -> None:
    assert engine.OtlpServer().feed(post(gzip.compress(VALID), headers=b"Content-Encoding: gzip\r\n")) == [
        engine.ExportRequest(VALID, False)]
    [refusal] = engine.OtlpServer(limit=1000).feed(post(gzip.compress(b"\0" * 5000), headers=b"Content-Encoding: gzip\r\n"))
    assert refusal.status == 413 and not refusal.close


@pytest.mark.parametrize("request_,status,close", [
    (post(b"x", target=b"/v1/traces"), 404, False),
    (post(b"", method=b"PUT"), 405, False),
    (post(b"x", headers=b"Content-Encoding: br\r\n"), 415, False),
    (b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n", 415, False),
    (post(b"x" * 5000), 413, True),
    (post(b"not gzip", headers=b"Content-Encoding: gzip\r\n"), 400, False),
])
def test_refusals(request_: bytes, status: int, close: bool) -> None:
    server = engine.OtlpServer(limit=4096)
    [refusal] = server.feed(request_)
    assert (refusal.status, refusal.close) == (status, close)
    answer = server.send(refusal)
    assert answer.startswith(b"HTTP/1.1 %d " % status)
    assert (b"connection: close" in answer) == close and server.must_close == close


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives() -> None:
    server = engine.OtlpServer(limit=100)
    head = b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert server.feed(head + b"40\r\n" + b"{" * 64 + b"\r\n") == []
    assert server.mid_frame
    [refusal] = server.feed(b"40\r\n" + b"{" * 64 + b"\r\n")
    assert refusal.status == 413 and refusal.close
    assert server.send(refusal).startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")


def test_a_503_says_when_to_retry_and_errors_are_google_rpc_status() -> None:
    server = engine.OtlpServer(retry_after=2)
    server.feed(post(VALID))
    answer = server.send(engine.Outcome("retry", message="hold on"))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable") and b"retry-after: 2" in head
    from google.rpc.status_pb2 import Status

    assert Status.FromString(body) == Status(code=14, message="hold on")


def test_the_client_reads_what_the_server_writes() -> None:
    client, server = engine.OtlpClient(json=True), engine.OtlpServer()
    for n in range(2):  # keep-alive: a second request on the same engines
        assert server.feed(client.send(b"{}")) == [engine.ExportRequest(b"{}", True)]
        [reply] = client.feed(server.send(engine.Outcome("ok")))
        assert (reply.status, reply.headers["content-type"], reply.body) == (200, "application/json", b"{}")
    with pytest.raises(ProtocolError):
        engine.OtlpClient().feed(b"garbage\r\n\r\n")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_to_the_http_engine_give_events_or_a_protocol_error(data: bytes) -> None:
    server = engine.OtlpServer(limit=1024)
    try:
        events = server.feed(data) + server.feed(b"")
    except ProtocolError as e:
        assert isinstance(e, RemoteProtocolError)
        return
    assert all(isinstance(e, (engine.ExportRequest, engine.Refusal)) for e in events)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 400), st.binary(min_size=1, max_size=4))
def test_a_mutated_request_gives_events_or_a_protocol_error(at: int, junk: bytes) -> None:
    data = post(VALID[:200])
    at = min(at, len(data))
    _http_check(data[:at] + junk + data[at:])


def _http_check(data: bytes) -> None:
    server = engine.OtlpServer(limit=1024)
    try:
        for e in server.feed(data):
            assert isinstance(e, (engine.ExportRequest, engine.Refusal))
    except ProtocolError as e:
        assert isinstance(e, RemoteProtocolError)
