"""The one engine contract (docs/architecture.md, logjam.errors.until_error), checked on every engine.

Each protocol has an `XServer` and an `XClient`; `feed(bytes)` returns a list; good input
followed by a violation in one read gives the good events first and raises the
ProtocolError on the next call (Lumberjack at once: its compressed frame is all or
nothing); and once raised, every later call raises again.
"""

from __future__ import annotations

import pytest

from bridges.courier import engine as courier
from bridges.lumberjack import engine as lumberjack
from bridges.otlp import engine as otlp
from bridges.rustlog import engine as rustlog
from bridges.segment import engine as segment
from bridges.syslog import engine as syslog
from bridges.syslog import relp
from logjam.errors import HeldErrors, ProtocolError
from tests.test_courier_engine import RUBY_HELO, helo
from tests.test_segment_engine import SETUP

PING = b"PING\0\0\0\0"
RUSTLOG_PRODUCE = rustlog.frame(b'{"type":"Produce","topic":"logs","partition":0,"records":["x"]}')

# (server factory, one good request, bytes that violate the protocol)
ENGINES = {
    "courier": (courier.CourierServer, helo(RUBY_HELO) + PING, helo(RUBY_HELO)),  # a second HELO
    "segment": (segment.SegmentServer, SETUP, b"\0\0\0\x63\x7f\xff\xff\xff"),
    "rustlog": (rustlog.RustlogServer, RUSTLOG_PRODUCE, b"\0\0\0\0"),
    "syslog": (syslog.SyslogServer, b"11 <13>1 - - -<14>x\n", b"0 x"),  # a zero length
    "relp": (relp.RelpServer, b"1 open 0\n2 syslog 1 a\n", b"2 open 0\n"),  # a second open
}


@pytest.mark.parametrize("protocol", ["courier", "lumberjack", "rustlog", "segment", "otlp", "syslog", "relp"])
def test_every_protocol_has_a_server_and_a_client(protocol: str) -> None:
    module = {"courier": courier, "lumberjack": lumberjack, "rustlog": rustlog, "segment": segment, "otlp": otlp,
              "syslog": syslog, "relp": relp}[protocol]
    name = protocol.capitalize()
    assert hasattr(module, f"{name}Server") and hasattr(module, f"{name}Client")


@pytest.mark.parametrize("protocol", sorted(ENGINES))
def test_good_events_first_then_the_error_on_the_next_call(protocol: str) -> None:
    make, good, bad = ENGINES[protocol]
    alone = make().feed(good)
    assert isinstance(alone, list) and alone, "a list of events"
    server = make()
    events = server.feed(good + bad)
    assert isinstance(events, list) and events, "the good events of the read come first"
    with pytest.raises(ProtocolError):
        server.feed(b"")
    with pytest.raises(ProtocolError):
        server.feed(good)  # failed for good


SERVERS = {"courier": courier.CourierServer, "lumberjack": lumberjack.LumberjackServer, "rustlog": rustlog.RustlogServer,
           "segment": segment.SegmentServer, "otlp": otlp.OtlpServer, "syslog": syslog.SyslogServer,
           "relp": relp.RelpServer}


@pytest.mark.parametrize("protocol", sorted(SERVERS))
def test_one_name_for_a_half_read_frame_and_one_held_error(protocol: str) -> None:
    """The host's session reads `mid_frame` of every server engine (--frame-timeout), and
    every server holds its error the one way, `HeldErrors`."""
    server = SERVERS[protocol]()
    assert server.mid_frame is False
    assert isinstance(server, HeldErrors)
    half = {"otlp": b"POST /v1/logs HTTP/1.1\r\n", "relp": b"1 op"}.get(protocol, b"\0")
    assert server.feed(half) == []
    assert server.mid_frame is True


def test_lumberjack_raises_at_once_and_stays_failed() -> None:
    client = lumberjack.LumberjackClient()
    good = client.send([{"message": "a"}])
    server = lumberjack.LumberjackServer()
    assert isinstance(server.feed(good), list)
    with pytest.raises(ProtocolError):
        lumberjack.LumberjackServer().feed(good + b"2Z")
    failed = lumberjack.LumberjackServer()
    with pytest.raises(ProtocolError):
        failed.feed(b"9Z")
    with pytest.raises(ProtocolError):
        failed.feed(good)


def test_otlp_answers_the_good_request_first_then_raises() -> None:
    """HTTP/1.1 answers in order, so the OTLP engine reads the request after a good one only
    once that one is answered: the error comes on the call after the answer."""
    post = otlp.OtlpClient().send(b"")  # an empty ExportLogsServiceRequest
    assert otlp.OtlpServer().feed(post) == [otlp.ExportRequest(b"", False)]
    server = otlp.OtlpServer()
    assert server.feed(post + b"GARBAGE\r\n\r\n") == [otlp.ExportRequest(b"", False)]
    assert server.send(otlp.Outcome("ok")).startswith(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(ProtocolError):
        server.feed(b"")
    with pytest.raises(ProtocolError):
        server.feed(post)  # failed for good
