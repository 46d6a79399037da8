"""The columns OpenTelemetry users look for (docs/schema.md): `trace_id` and `span_id`, and `level` from
OTLP's `severity_text`/`severity_number` and the syslog bridge's `syslog.severity`, each source and its
precedence, on the Python path (importer/decode.py) and the C one (native/decode.c) alike: every case
goes through both and the tables must be equal (tests/test_importer_decode_native.py's `same`)."""

from __future__ import annotations

import orjson
import pytest

from importer.decode import BatchBuilder
from tests.test_importer_decode_native import in_c_alone, msg, same

pytestmark = pytest.mark.native

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"

# (body, trace_id, span_id)
ID_CASES: list[tuple[bytes, str | None, str | None]] = [
    # OTLP, as the bridge writes it (docs/protocols/otlp.md): already lowercase
    (b'{"trace_id":"%s","span_id":"%s"}' % (TRACE.encode(), SPAN.encode()), TRACE, SPAN),
    (b'{"trace_id":"%s","span_id":"%s"}' % (TRACE.upper().encode(), SPAN.upper().encode()), TRACE, SPAN),
    (b'{"trace.id":"abCD","span.id":"EF01"}', "abcd", "ef01"),  # ECS, dotted
    (b'{"trace":{"id":"ab"},"span":{"id":"cd"}}', "ab", "cd"),  # ECS, nested
    (b'{"traceId":"AB","spanId":"Cd"}', "ab", "cd"),  # OTLP/JSON's spelling
    # precedence: <x>_id, <x>.id (nested, else dotted), <x>Id; the first present and not null
    (b'{"traceId":"33","trace":{"id":"22"},"trace_id":"11"}', "11", None),
    (b'{"traceId":"33","trace.id":"44","trace":{"id":"22"}}', "22", None),
    (b'{"traceId":"33","trace.id":"44"}', "44", None),
    (b'{"trace_id":null,"trace":{"id":null},"traceId":"33"}', "33", None),
    (b'{"trace":"text","trace.id":"ab","span":{"other":1},"spanId":"cd"}', "ab", "cd"),
    (b'{"trace":{"id":"ab"},"trace.id":"cd"}', "ab", None),  # an object `trace`: the dotted key is not read
    (b'{"trace_id":"zz","traceId":"ab"}', None, None),  # present but no id: NULL, not the next key
    # hex strings only, of an even length up to 64
    (b'{"trace_id":"%s","span_id":"%s"}' % (b"aB" * 32, b"ab" * 33), "ab" * 32, None),
    (b'{"trace_id":"abc","span_id":""}', None, None),
    (b'{"trace_id":123456,"span_id":true}', None, None),
    (b'{"trace_id":["ab"],"span_id":{"id":"ab"}}', None, None),
    (b'{"trace_id":"0x12","span_id":" ab"}', None, None),
    (b'{"trace_id":"ab\\n","span_id":"\\u0061b"}', None, "ab"),
    (b'{"trace_id":"\xef\xbc\x91\xef\xbc\x92","span_id":"g0"}', None, None),  # fullwidth digits are not hex
    (b'{"tr\\u0061ce_id":"ab","span":{"\\u0069d":"CD"}}', "ab", "cd"),  # escaped keys are the same keys
    (b'{"message":"trace span \\u00e9"}', None, None),
    (b'{"x":{"trace_id":"ab"}}', None, None),  # top level only
]

OTEL_NAMES = {1: "TRACE", 4: "TRACE", 5: "DEBUG", 8: "DEBUG", 9: "INFO", 10: "INFO", 12: "INFO", 13: "WARN",
              16: "WARN", 17: "ERROR", 20: "ERROR", 21: "FATAL", 24: "FATAL"}
SYSLOG_NAMES = ["emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"]

# (body, level)
LEVEL_CASES: list[tuple[bytes, str | None]] = [
    *[(b'{"severity_number":%d}' % n, name) for n, name in OTEL_NAMES.items()],
    *[(b'{"severity_number":%s}' % v, None) for v in (b"0", b"25", b"-1", b'"9"', b"9.0", b"true", b"null",
                                                     b"18446744073709551615", b"99999999999999999999")],
    *[(b'{"syslog":{"format":"rfc5424","priority":%d,"facility":1,"severity":%d}}' % (8 + n, n), name)
      for n, name in enumerate(SYSLOG_NAMES)],
    *[(b'{"syslog":{"severity":%s}}' % v, None) for v in (b"8", b"-1", b'"3"', b"3.0", b"null", b"false")],
    (b'{"syslog":{"format":"unknown"}}', None),
    (b'{"syslog":"text"}', None),
    (b'{"syslog.severity":3}', None),  # the bridge nests it; a dotted key is not read
    (b'{"severity_text":"Warning"}', "Warning"),
    (b'{"severity_text":"\\u00e9rror"}', "\u00e9rror"),
    (b'{"severity_text":"","severity_number":17}', "ERROR"),  # empty text: the number
    (b'{"severity_text":5,"severity_number":17}', "ERROR"),  # text that is not a string: the number
    # precedence: level, log.level, string severity, severity_text, severity_number, syslog.severity
    (b'{"severity_text":"WARN","severity_number":9}', "WARN"),
    (b'{"severity_number":9,"syslog":{"severity":3}}', "INFO"),
    (b'{"severity_number":99,"syslog":{"severity":3}}', "err"),
    (b'{"severity":"high","severity_text":"x","severity_number":9}', "high"),
    (b'{"severity":3,"severity_text":"x"}', "x"),  # an integer severity is not a level (it is `severity`)
    (b'{"log":{"level":"warn"},"severity_text":"x"}', "warn"),
    (b'{"log.level":"debug","severity_number":9}', "debug"),
    (b'{"log":{"offset":1},"syslog":{"severity":6}}', "info"),
    (b'{"level":"info","severity_text":"x","syslog":{"severity":0}}', "info"),
    (b'{"level":7,"severity_number":9}', "7"),
    (b'{"level":{"a":1},"severity_text":"x"}', None),  # a present level of another type ends it, as before
    (b'{"level":null,"severity_text":"x"}', "x"),
]


def decoded(bodies: list[bytes]) -> list[dict]:
    """The rows of both paths (compared whole by `same`)."""
    return same([msg(b, seq=i + 1) for i, b in enumerate(bodies)]).to_pylist()


def test_trace_and_span_ids_from_each_spelling_in_order():
    got = decoded([b for b, _, _ in ID_CASES])
    assert [(r["trace_id"], r["span_id"]) for r in got] == [(t, s) for _, t, s in ID_CASES]


def test_level_from_otlp_severity_and_syslog_severity_after_the_older_sources():
    got = decoded([b for b, _ in LEVEL_CASES])
    assert [r["level"] for r in got] == [level for _, level in LEVEL_CASES]


def test_an_integer_severity_still_fills_severity_only():
    (row,) = decoded([b'{"severity":3,"syslog":{"severity":4}}'])
    assert (row["severity"], row["level"]) == (3, "warning")


OTLP_BODY = {"message": "GET /", "severity_text": "Information", "severity_number": 9, "attributes": {"k": "v"},
             "trace_id": TRACE, "span_id": SPAN, "time_unix_nano": 1_795_000_000_000_000_000,
             "resource": {"attributes": {"service.name": "shop"}}, "scope": {"name": "s"},
             "@metadata": {"protocol": "otlp", "protocol_version": "1", "_id": "otlp:ab:0"}}
SYSLOG_BODY = {"message": "disk full", "raw": "<11>1 - h app - - - disk full", "@timestamp": "2026-11-23T12:00:00Z",
               "syslog": {"format": "rfc5424", "priority": 11, "facility": 1, "severity": 3, "version": 1,
                          "hostname": "h", "app_name": "app"},
               "@metadata": {"protocol": "syslog", "protocol_version": "rfc6587", "_id": "i:1"}}


def test_otlp_and_syslog_bodies_are_decoded_in_c_not_deferred():
    """Their new cells are made in C (`in_c_alone`: no row deferred to the Python path)."""
    bodies = [OTLP_BODY, {**OTLP_BODY, "trace_id": TRACE.upper(), "severity_text": ""}, SYSLOG_BODY,
              {"trace": {"id": TRACE}, "span.id": SPAN, "log": {"level": "warn"}}]
    msgs = [msg(orjson.dumps({**body, "@metadata": {"_id": str(i)}}), seq=i + 1) for i, body in enumerate(bodies)]
    rows = in_c_alone(msgs).select(["level", "trace_id", "span_id"]).to_pylist()
    assert [tuple(r.values()) for r in rows] == [("Information", TRACE, SPAN), ("INFO", TRACE, SPAN),
                                                  ("err", None, None), ("warn", TRACE, SPAN)]


def test_otlp_and_syslog_bodies_as_their_bridges_write_them():
    """The bodies of docs/protocols/otlp.md and syslog.md's tables (with the fields around them)."""
    otlp = OTLP_BODY
    otlp_numbered = {k: v for k, v in otlp.items() if k != "severity_text"}
    otlp_numbered["@metadata"] = {**otlp["@metadata"], "_id": "otlp:ab:1"}  # another record, not a copy
    syslog = SYSLOG_BODY
    rows = decoded([orjson.dumps(otlp), orjson.dumps(otlp_numbered), orjson.dumps(syslog)])
    assert [(r["level"], r["trace_id"], r["span_id"], r["protocol"]) for r in rows] == [
        ("Information", TRACE, SPAN, "otlp"), ("INFO", TRACE, SPAN, "otlp"), ("err", None, None, "syslog")]


def test_rows_without_any_of_the_keys_and_untyped_rows_read_null():
    b = BatchBuilder()
    for i, body in enumerate([b'{"message":"m","trace":1}', b"[1]", b"not json", b'{"span_id":"ab"}', b"{}"]):
        b.add_raw("a-b", "t", body, 0, 1, 0, i + 1, 1_000_000)
    table = b.build()
    assert table.column("trace_id").to_pylist() == [None] * 5
    assert table.column("span_id").to_pylist() == [None, None, None, "ab", None]
