"""The sans-IO syslog and RELP engines and the message parser: vectors whole, byte by byte and
with trailing data; limits; the December to January rollover; properties over arbitrary bytes."""

from __future__ import annotations

import datetime
import time

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from bridges.syslog import relp
from bridges.syslog.engine import (
    NON_TRANSPARENT,
    OCTET_COUNTING,
    Frame,
    Frames,
    SyslogClient,
    SyslogServer,
    datagram_message,
)
from bridges.syslog.parse import infer_year, parse, structured_data
from logjam.errors import FrameTooLarge, LocalProtocolError, ProtocolError

# (wire bytes, the frames they hold)
STREAM_VECTORS = [
    (b"11 <13>1 - - -", [Frame(b"<13>1 - - -", OCTET_COUNTING)]),
    (b"12 <13>1 - - -\n", [Frame(b"<13>1 - - -", OCTET_COUNTING)]),  # one trailing LF inside the count
    (b"13 <13>1 - - -\n\n", [Frame(b"<13>1 - - -\n", OCTET_COUNTING)]),  # only one
    (b"<13>hello\n", [Frame(b"<13>hello", NON_TRANSPARENT)]),
    (b"<13>hello\r\n\n<14>x\n", [Frame(b"<13>hello", NON_TRANSPARENT), Frame(b"<14>x", NON_TRANSPARENT)]),
    (b"5 a\nb c<1>lf\n3 xyz", [Frame(b"a\nb c", OCTET_COUNTING), Frame(b"<1>lf", NON_TRANSPARENT),
                              Frame(b"xyz", OCTET_COUNTING)]),
]


def _flat(events: list) -> list:
    """The events with each run (`Frames`, `Syslogs`) as one event per message, in order."""
    out = []
    for ev in events:
        out += ev.frames() if isinstance(ev, (Frames, relp.Syslogs)) else [ev]
    return out


def _bytewise(engine, data: bytes) -> list:
    out = []
    for i in range(len(data)):
        out += _flat(engine.feed(data[i:i + 1]))
    return out


@pytest.mark.parametrize("wire,frames", STREAM_VECTORS)
def test_stream_vectors_whole_bytewise_and_with_trailing_data(wire: bytes, frames: list[Frame]) -> None:
    assert _flat(SyslogServer().feed(wire)) == frames
    assert _bytewise(SyslogServer(), wire) == frames
    server = SyslogServer()
    tail = b"<13>1 partial message"
    assert _flat(server.feed(wire + b"%d %b" % (len(tail), tail[:8]))) == frames  # trailing data: a frame begun
    assert server.mid_frame
    assert server.feed(tail[8:]) == [Frames(OCTET_COUNTING, [tail])]


def test_client_frames_what_the_server_reads() -> None:
    msgs = [b"<13>1 - h a - - - one", b"<14>two", b"x" * 300]
    for framing in (OCTET_COUNTING, NON_TRANSPARENT):
        client = SyslogClient(framing)
        wire = b"".join(client.send(m) for m in msgs)
        assert [f.raw for f in _flat(SyslogServer().feed(wire))] == msgs
    with pytest.raises(LocalProtocolError):
        SyslogClient(NON_TRANSPARENT).send(b"two\nlines")
    with pytest.raises(LocalProtocolError):
        SyslogServer().send(object())
    with pytest.raises(ProtocolError):
        SyslogClient().feed(b"anything")


@pytest.mark.parametrize("wire,reason", [
    (b"0 x", "bad_frame_length"), (b"01 x", "bad_frame_length"), (b"1234567890 x", "bad_frame_length"),
    (b"12x34 ", "bad_frame_length"),
])
def test_bad_lengths(wire: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError) as err:
        SyslogServer().feed(wire)
    assert err.value.reason == reason


def test_limits_before_any_allocation() -> None:
    server = SyslogServer(max_frame=100)
    with pytest.raises(FrameTooLarge):
        server.feed(b"101 ")  # the length alone
    with pytest.raises(FrameTooLarge):
        server.feed(b"1 x")  # failed for good
    with pytest.raises(FrameTooLarge):
        SyslogServer(max_frame=100).feed(b"<13>" + b"x" * 200)  # an LF-framed line without its LF
    assert SyslogServer(max_frame=100).feed(b"100 " + b"x" * 100) == [Frames(OCTET_COUNTING, [b"x" * 100])]


def test_datagrams() -> None:
    assert datagram_message(b"<13>hi\n\0") == b"<13>hi"
    assert datagram_message(b"\n") == b""


# ---------------------------------------------------------------- the parser

NOW = int(datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.timezone.utc).timestamp() * 1000)


def test_rfc5424_vector_with_bom_and_structured_data() -> None:
    raw = (b'<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 '
           b'[exampleSDID@32473 iut="3" eventSource="Application" eventID="1011"][examplePriority@32473 class="high"]'
           b' \xef\xbb\xbfAn application event log entry...')
    body = parse(raw, NOW)
    assert body["message"] == "An application event log entry..."
    assert body["syslog"] == {
        "format": "rfc5424", "priority": 165, "facility": 20, "severity": 5, "version": 1,
        "timestamp": "2003-10-11T22:14:15.003Z", "hostname": "mymachine.example.com", "app_name": "evntslog",
        "msgid": "ID47",
        "structured_data": {"exampleSDID@32473": {"iut": "3", "eventSource": "Application", "eventID": "1011"},
                            "examplePriority@32473": {"class": "high"}},
    }
    assert body["@timestamp"] == "2003-10-11T22:14:15.003Z"  # RFC 3339 as sent; the mapper reads it
    assert body["raw"] == raw.decode()
    orjson.dumps(body)


def test_structured_data_escapes_undone_and_other_backslashes_kept() -> None:
    sd, rest = structured_data(r'[a@1 x="q\"b\\s\]e\n" x="2"] msg')
    assert sd == {"a@1": {"x": ['q"b\\s]e\\n', "2"]}}
    assert rest == " msg"
    assert structured_data('[a@1 x="unterminated') is None


def test_rfc3164_vector() -> None:
    body = parse(b"<34>Oct 11 22:14:15 mymachine su[9]: 'su root' failed for lonvick on /dev/pts/8", NOW)
    assert body["message"] == "'su root' failed for lonvick on /dev/pts/8"
    assert body["syslog"] == {"format": "rfc3164", "priority": 34, "facility": 4, "severity": 2,
                              "timestamp": "Oct 11 22:14:15", "hostname": "mymachine", "app_name": "su", "procid": "9"}
    assert body["@timestamp"] == "2026-10-11T22:14:15+00:00"


@pytest.mark.parametrize("stamp,now,year", [
    ("Dec 31 23:59:59", datetime.datetime(2027, 1, 1, 0, 0, 5), 2026),  # sent last year, received this one
    ("Jan  1 00:00:01", datetime.datetime(2026, 12, 31, 23, 59, 58), 2027),  # a sender's clock ahead across New Year
    ("Jun 15 12:00:00", datetime.datetime(2026, 6, 15, 11, 0), 2026),
    ("Jan  5 01:00:00", datetime.datetime(2026, 11, 27), 2026),  # a January line shipped late, not next year's
    ("Feb 29 12:00:00", datetime.datetime(2027, 3, 1), 2024),  # the latest leap year not in the future
])
def test_3164_year_is_inferred_across_new_year(stamp: str, now: datetime.datetime, year: int) -> None:
    received = int(now.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000)
    body = parse(b"<13>%b host app: m" % stamp.encode(), received)
    assert body["@timestamp"].startswith(f"{year}-")
    assert infer_year(12, 31, (23, 59, 59), received) is not None


def test_lenient_everything_else() -> None:
    assert parse(b"no header at all", NOW) == {"message": "no header at all", "syslog": {"format": "unknown"},
                                                  "raw": "no header at all"}
    body = parse(b"<13>1 - - - - -", NOW)
    assert body["message"] == "" and "@timestamp" not in body
    assert "@timestamp" not in parse(b"<13>1 yesterday h a - - - m", NOW)  # not ISO 8601: received time
    body = parse(b"<13>tag: text \xff", NOW)
    assert body["syslog"]["app_name"] == "tag" and body["message"] == "text \ufffd"
    assert body["raw"] == "<13>tag: text \\xff"


# ---------------------------------------------------------------- RELP

RELP_VECTORS = [
    (b"1 open 14 relp_version=0\n", [relp.Open(1, {"relp_version": "0"})]),
    (b"1 open 0\n2 syslog 5 <13>x\n3 close 0\n", [relp.Open(1, {}), relp.Syslog(2, b"<13>x"), relp.Close(3)]),
    (b"1 open 0\n2 syslog 3 a\nb\n", [relp.Open(1, {}), relp.Syslog(2, b"a\nb")]),  # LF inside data
]


@pytest.mark.parametrize("wire,events", RELP_VECTORS)
def test_relp_vectors_whole_bytewise_and_with_trailing_data(wire: bytes, events: list) -> None:
    assert _flat(relp.RelpServer().feed(wire)) == events
    assert _bytewise(relp.RelpServer(), wire) == events
    server = relp.RelpServer()
    assert _flat(server.feed(wire + b"9 sys")) == events
    assert server.mid_frame


def test_relp_answers_in_order_only() -> None:
    server = relp.RelpServer()
    server.feed(b"1 open 0\n2 syslog 1 a\n3 syslog 1 b\n")
    assert server.send(relp.Response(1, data=relp.open_answer())).startswith(b"1 rsp ")
    with pytest.raises(LocalProtocolError):
        server.send(relp.Response(3))
    assert server.send(relp.Response(2)) == b"2 rsp 6 200 OK\n"
    assert server.send(relp.ServerClose()) == b"0 serverclose 0\n"


def test_relp_client_and_server_round_trip() -> None:
    client, server = relp.RelpClient(), relp.RelpServer()
    events = _flat(server.feed(client.send("open") + client.send("syslog", b"m") + client.send("close")))
    assert [type(e) for e in events] == [relp.Open, relp.Syslog, relp.Close]
    assert events[0].offers["relp_version"] == "0" and events[0].offers["commands"] == "syslog"
    answers = b"".join(server.send(relp.Response(e.txnr, data=relp.open_answer() if isinstance(e, relp.Open) else b""))
                       for e in events)
    got = client.feed(answers)
    assert [(r.txnr, r.code) for r in got] == [(1, 200), (2, 200), (3, 200)]
    assert client.unanswered == 0
    with pytest.raises(ProtocolError):
        relp.RelpClient().feed(b"5 rsp 6 200 OK\n")  # answers nothing sent


@pytest.mark.parametrize("wire,reason", [
    (b"1 syslog 1 a\n", "relp_not_open"),
    (b"1 open 0\n1 open 0\n", "relp_reopen"),
    (b"1 open 0\n2 starttls 0\n", "relp_unknown_command"),
    (b"1 open 0\n2 close 0\n3 syslog 1 a\n", "relp_after_close"),
    (b"0 open 0\n", "relp_bad_txnr"),
    (b"x open 0\n", "relp_bad_header"),
    (b"1 open 3 abcX", "relp_bad_trailer"),
    (b"1 open 0X", "relp_bad_trailer"),
])
def test_relp_violations(wire: bytes, reason: str) -> None:
    server = relp.RelpServer()
    with pytest.raises(ProtocolError) as err:
        while True:
            server.feed(wire)
            wire = b""
    assert err.value.reason == reason


def test_relp_datalen_checked_before_the_data() -> None:
    with pytest.raises(FrameTooLarge):
        relp.RelpServer(max_frame=100).feed(b"1 open 101 ")


# ---------------------------------------------------------------- properties

def _feed_all(engine, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            events = engine.feed(chunk)
            assert isinstance(events, list)
            while events:
                events = engine.feed(b"")
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_bytes_give_events_or_protocol_errors(chunks: list[bytes]) -> None:
    for engine in (SyslogServer(max_frame=1 << 12), relp.RelpServer(max_frame=1 << 12), relp.RelpClient()):
        _feed_all(engine, chunks)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=2**41))
def test_the_parser_never_fails_and_keeps_the_raw_bytes(raw: bytes, received_ms: int) -> None:
    body = parse(raw, received_ms)
    orjson.dumps(body)  # JSON-safe
    assert body["raw"].encode("utf-8", "surrogatepass") == raw or "\\x" in body["raw"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=80).filter(lambda b: b[:1].isdigit() is False), max_size=6))
def test_counted_frames_round_trip_any_message(messages: list[bytes]) -> None:
    client = SyslogClient(OCTET_COUNTING)
    wire = b"".join(client.send(m) for m in messages)
    got = [f.raw for f in _flat(SyslogServer().feed(wire))]
    assert got == [m[:-1] if m.endswith(b"\n") else m for m in messages if m != b"\n"]


def test_a_message_trickling_in_costs_no_rescans() -> None:
    """A big frame fed a byte at a time is appended, not copied and parsed again per byte:
    linear (well under a second here), where a copy per read would take minutes."""
    size = 1 << 20
    message = b"<13>1 - h a - - - " + b"x" * (size - 18)
    for engine, wire in (
        (SyslogServer(max_frame=size), SyslogClient(OCTET_COUNTING).send(message)),
        (SyslogServer(max_frame=size), SyslogClient(NON_TRANSPARENT).send(message)),
        (relp.RelpServer(max_frame=size), b"1 open 0\n" + relp.frame(2, "syslog", message)),
    ):
        started = time.process_time()
        got = []
        for i in range(len(wire)):
            got += engine.feed(wire[i:i + 1])
        assert [e.raw for e in _flat(got) if not isinstance(e, relp.Open)] == [message]
        assert time.process_time() - started < 10
