"""native/syslog.c against its Python twin (bridges/syslog/encode.py's `one`: parse.py, orjson and
the @metadata template): for generated messages, well-formed RFC 5424 and broken alike, the C
path writes the same event text and time, byte for byte, and leaves to Python exactly the
messages it must not take. And its reader of datagrams (bridges/syslog/receive.py) reads what
one recvfrom per datagram reads. Skipped under LOGJAM_NATIVE=off (nothing native to compare)."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import example, given, settings, strategies as st

from bridges.host.datagram import BURST, RECEIVE_BUFFER, RecvfromReader
from bridges.syslog.encode import Metadata, NativeEncoder, one
from bridges.syslog.receive import NativeReader
from harness.native import c_module

RECEIVED = 1_764_244_800_000  # 2025-11-27 12:00 UTC
COMMON = {"protocol": "syslog", "protocol_version": "rfc6587", "peer": "10.0.0.1:514", "received_at": RECEIVED,
          "framing": "octet-counting"}


@pytest.fixture(scope="module")
def encoder() -> NativeEncoder:
    return NativeEncoder(*c_module("bridges.syslog._native_syslog"))


def _compare(encoder: NativeEncoder, raws: list[bytes], relp: bool) -> int:
    """Asserts the C run equals `one` for each message; returns how many the C wrote itself."""
    meta = Metadata.of(COMMON, "i%", relp)
    txnrs = list(range(3, 3 + len(raws))) if relp else None
    blob, lens, stamps = encoder(raws, RECEIVED, meta, 40, txnrs)
    alone = [one(raw, RECEIVED, meta, 40 + i, txnrs and txnrs[i]) for i, raw in enumerate(raws)]
    assert blob == b"".join(text for text, _ in alone)
    assert list(lens) == [len(text) for text, _ in alone]
    assert list(stamps) == [ms for _, ms in alone]
    return sum(1 for size in encoder.c_part(raws, RECEIVED, meta, 40, txnrs)[1] if size)


# The pieces of a 5424 message, right and wrong, so that generated messages reach every branch:
# half of them are built from right pieces only, which the C should take (bar repeats in SD).
GOOD_PRIS = ["<13>", "<0>", "<191>", "<013>", "<1>"]
PRIS = ["<192>", "<>", "<1a>", "<1234>", "13>", ""]
GOOD_TIMESTAMPS = [
    "-", "2026-11-27T10:00:00.123Z", "2003-10-11T22:14:15.003+02:00", "2003-10-11T22:14:15-07:00",
    "1969-12-31T23:59:59.999Z", "1970-01-01T00:00:00.0005Z", "1970-01-01T00:00:01+01:00", "2024-02-29T01:02:03Z",
    "0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59.999999-23:59", "2000-02-29T00:00:00-00:00"]
TIMESTAMPS = [
    "2026-02-29T01:02:03Z", "2026-11-27T24:00:00Z", "2026-11-27T10:00:00.1234567Z", "2026-11-27T10:00:00,5Z",
    "2026-11-27t10:00:00Z", "2026-11-27T10:00:00z", "2026-11-27T10:00:00+0200", "2026-11-27T10:00Z",
    "2026-11-27", "0000-01-01T00:00:00Z", "2026-13-01T00:00:00Z", "2026-11-27T10:00:00.Z",
    "2026-11-27T10:00:00+24:00", "2026-04-31T00:00:00Z", "", "x"]
WORDS = st.sampled_from(["-", "host", "web-17.example.net", "app", "1234", "ID47", "", "é", "a\tb", '"q"', "\\"])
SD_TEXT = st.text(alphabet=st.sampled_from(list('ab=" \\]é[\n\x01')), max_size=8)
PARAMS = st.lists(st.tuples(st.sampled_from(["x", "y", "seq", "", "é", 'n"', "a b"]), SD_TEXT), max_size=3)
GOOD_SD_VALUE = st.lists(st.sampled_from(["a", "é", "\\\"", "\\\\", "\\]", "\\q", "]", "=", " ", "\x01"]),
                         max_size=8).map("".join)
GOOD_ELEMENT = st.builds(lambda sd_id, params: "[" + sd_id + "".join(f' {k}="{v}"' for k, v in params.items()) + "]",
                         st.sampled_from(["a@1", "meta@32473", "b", "é"]),
                         st.dictionaries(st.sampled_from(["x", "seq", "é", "n\\"]), GOOD_SD_VALUE, max_size=3))
ELEMENT = st.builds(lambda sd_id, params, close: "[" + sd_id + "".join(f' {k}="{v}"' for k, v in params) + close,
                    st.sampled_from(["a@1", "meta@32473", "b", "", "a@1 "]), PARAMS, st.sampled_from(["]", "", "] "]))
GOOD_SD = st.one_of(st.just("-"), st.lists(GOOD_ELEMENT, min_size=1, max_size=3).map("".join))
SD = st.one_of(GOOD_SD, st.lists(ELEMENT, min_size=1, max_size=3).map("".join), st.sampled_from(["-x", "[", ""]))
MSG = st.one_of(st.text(max_size=30), st.sampled_from(["", " ", "\ufeffhi", "- hi", "\ufeff", "x\x00y\x1f\x7f"]))


@st.composite
def rfc5424(draw: st.DrawFn) -> bytes:
    good = draw(st.booleans())
    ts = draw(st.sampled_from(GOOD_TIMESTAMPS if good else GOOD_TIMESTAMPS + TIMESTAMPS))
    pri = draw(st.sampled_from(GOOD_PRIS if good else GOOD_PRIS + PRIS))
    version = draw(st.sampled_from(["1 "] if good else ["1 ", "1", "2 ", "1  "]))
    head = pri + version + " ".join([ts] + [draw(WORDS) for _ in range(4)])
    sd = draw(GOOD_SD if good else SD)
    message = draw(MSG)
    raw = (head + " " + sd + (" " + message if draw(st.booleans()) else message)).encode()
    cut = None if good else draw(st.one_of(st.none(), st.integers(0, len(raw))))  # cut short, mid-character too
    return raw if cut is None else raw[:cut]


MESSAGES = st.one_of(rfc5424(), st.binary(max_size=80), st.text(max_size=40).map(str.encode))


@settings(max_examples=1500, deadline=None)
@given(st.lists(MESSAGES, min_size=1, max_size=10), st.booleans())
@example([b'<13>1 2026-11-27T10:00:00Z h a p m [x@1 a="1"][x@1 b="2"] dup id'], False)
@example([b'<13>1 - h a p m [x@1 a="1" a="2"] dup param', b"<13>Oct 11 22:14:15 host su[9]: 3164"], True)
@example([b"<13>1 - h a p m - \xff not utf-8", b'<13>1 - h a p m [a x="\\\\\\"\\]\\q"] esc'], False)
def test_the_c_writes_what_python_writes(encoder: NativeEncoder, raws: list[bytes], relp: bool) -> None:
    _compare(encoder, raws, relp)


def test_the_c_takes_what_senders_send(encoder: NativeEncoder) -> None:
    """The messages of rsyslog's, syslog-ng's and logger's RFC 5424 are the C's own (else it
    would pay nothing); the others are Python's, in order among them."""
    common = [b'<134>1 2026-11-27T10:00:00.123456+01:00 web-17 nginx 1000 - GET / 200',
              b'<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 '
              b'iut="3" eventSource="Application" eventID="1011"][examplePriority@32473 class="high"] '
              b'\xef\xbb\xbfhi',
              b'<13>1 2026-11-27T10:00:00Z host logger - - [timeQuality tzKnown="1" isSynced="0"] \xc3\xa9t\xc3\xa9',
              b"<14>1 - - - - - -", b"<14>1 - h a p m - - dash"]
    others = [b"<13>Nov 27 10:00:00 host su[9]: 3164", b"no header", b"<13>1 - h a",
              b"<13>1 2026-02-30T00:00:00Z h a p m - x"]
    assert _compare(encoder, common + others, relp=False) == len(common)
    assert _compare(encoder, others + common, relp=True) == len(common)


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_the_c_reader_reads_what_recvfrom_reads(family: int, host: str) -> None:
    """lj_syslog_recv against one recvfrom per datagram (bridges/host/datagram.py): the same
    datagrams, in order, each with its sender, from bursts of two senders interleaved."""
    native_reader = NativeReader(*c_module("bridges.syslog._native_syslog"))
    with socket.socket(family, socket.SOCK_DGRAM) as server, socket.socket(family, socket.SOCK_DGRAM) as a, \
            socket.socket(family, socket.SOCK_DGRAM) as b:
        server.bind((host, 0))
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        server.setblocking(False)
        a.bind((host, 0))
        b.bind((host, 0))
        got: dict[str, tuple[list[bytes], list[str]]] = {}
        for name, read in (("c", native_reader), ("py", RecvfromReader())):
            sent = [(a if i % 7 < 4 else b, b"<13>1 - h app - - - %d" % i + b"x" * (i % 300)) for i in range(300)]
            sent.append((a, b""))  # an empty datagram is a datagram too
            for sock, data in sent:
                sock.sendto(data, server.getsockname()[:2])
            datas, peers = [], []
            deadline = time.monotonic() + 10
            while len(datas) < len(sent) and time.monotonic() < deadline:
                more, senders = read(server)
                assert len(more) <= BURST and len(more) == len(senders)
                datas += more
                peers += senders
            got[name] = (datas, peers)
            assert datas == [data for _, data in sent]
            assert peers == [f"{sock.getsockname()[0]}:{sock.getsockname()[1]}" for sock, _ in sent]
        assert got["c"] == got["py"]
        assert native_reader(server) == ([], [])  # nothing waits
