"""The syslog bridge maps a run of messages in one call (`bridges.syslog.bridge.map_run`): it
must give byte for byte what mapping each message on its own gives (`parse`, then
`EventMapper.add` with that message's @metadata), for any message, with or without
compression, TXNRs or app-env from APP-NAME, and numbered from the mapper's one key counter. And RELP's `send_ok` answers a run as `send`
answers each of its frames."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from bridges.host.mapping import EventMapper
from bridges.syslog import relp
from bridges.syslog.bridge import AppEnv, map_run
from bridges.syslog.parse import parse
from logjam.errors import LocalProtocolError
from logjam.meta import Compression

RECEIVED = 1_764_244_800_000  # 2025-11-27 12:00 UTC
COMMON = {"protocol": "syslog", "protocol_version": "rfc6587", "peer": "10.0.0.1:514", "received_at": RECEIVED,
          "framing": "octet-counting"}

# Pieces real senders put in messages, so that generated messages reach every branch of the
# parser (5424 with and without SD, 3164 with either timestamp, no header) and not only "unknown".
PIECES = ["<13>", "<165>", "<0>", "<191>", "<192>", "<013>", "1 ", "-", " ", "- ", "2026-11-27T10:00:00.123Z ",
          "2003-10-11T22:14:15.003+02:00 ", "1969-12-31T23:59:59Z ", "1970-01-01T00:00:00Z ", "2026-11-27 ",
          "2026-11-27T10:00:00 ", "Dec 31 23:59:59 ", "Oct 11 22:14:15 ", "Feb 29 01:02:03 ", "Jan  5 00:00:01 ",
          "host ", "app ", "1234 ", "ID47 ", "tag: ", "su[9]: ", '[a@1 x="1"]', '[a@1 x="q\\"b" x="2"][b@2]',
          '[bad', "\ufeff", "é", "msg", "\t", '"', "\\", "\n"]
messages = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=12).map(lambda p: "".join(p).encode()),
    st.binary(min_size=1, max_size=120),
)


class _Fallbacks:
    def __init__(self) -> None:
        self.n = 0

    def inc(self, amount: int = 1) -> None:
        self.n += amount


def _app_env(environment: str | None) -> AppEnv:
    host = SimpleNamespace(config=SimpleNamespace(app_env="syslog-default"),
                           metrics=SimpleNamespace(app_env_fallbacks=_Fallbacks()))
    return AppEnv(host, environment)  # type: ignore[arg-type]


def _one_by_one(mapper: EventMapper, raws: list[bytes], txnrs: list[int] | None, app_env: AppEnv) -> list[Any]:
    """How the bridge mapped before runs: one `add` per message, its @metadata a dict of its own."""
    out = mapper.batches()
    for i, raw in enumerate(raws):
        body = parse(raw, RECEIVED)
        meta = {**COMMON, "txnr": txnrs[i]} if txnrs is not None else dict(COMMON)
        mapper.add(out, body, meta, created_ms=RECEIVED, app_env=app_env(body))
    return [(m.app_env, m.topic, m.body, m.meta.created_ms, m.meta.compression) for m in out.messages()]


def _as_run(mapper: EventMapper, raws: list[bytes], txnrs: list[int] | None, app_env: AppEnv) -> list[Any]:
    out = mapper.batches()
    map_run(mapper, out, raws, COMMON, RECEIVED, app_env, txnrs)
    assert out.n == len(raws)
    return [(m.app_env, m.topic, m.body, m.meta.created_ms, m.meta.compression) for m in out.messages()]


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=12), st.booleans(),
       st.sampled_from([Compression.NONE, Compression.ZLIB]), st.sampled_from([None, "prod"]))
def test_a_run_maps_byte_for_byte_as_each_message_alone(raws: list[bytes], relp_run: bool, compression: int,
                                                        environment: str | None) -> None:
    txnrs = list(range(7, 7 + len(raws))) if relp_run else None
    one = EventMapper(app_env="syslog-default", topic="logs.syslog", compression=compression, instance="i")
    run = EventMapper(app_env="syslog-default", topic="logs.syslog", compression=compression, instance="i")
    one_app, run_app = _app_env(environment), _app_env(environment)
    assert _as_run(run, raws, txnrs, run_app) == _one_by_one(one, raws, txnrs, one_app)
    assert run_app.fallback.n == one_app.fallback.n  # the same fallbacks counted
    # The key counter goes on where it stopped: a second run numbers as further single events would.
    assert _as_run(run, raws[:1], txnrs and txnrs[:1], run_app) == _one_by_one(one, raws[:1], txnrs and txnrs[:1],
                                                                                 one_app)


def test_app_env_from_app_name_groups_runs_in_order() -> None:
    raws = [b"<13>1 - h web - - - a", b"<13>1 - h web - - - b", b"<13>1 - h db - - - c", b"<13>1 - h - - - - d",
            b"<13>1 - h web - - - e"]
    mapper = EventMapper(app_env="syslog-default", topic="logs.syslog", instance="i")
    got = _as_run(mapper, raws, None, _app_env("prod"))
    assert [m[0] for m in got] == ["web-prod", "web-prod", "db-prod", "syslog-default", "web-prod"]
    assert [b'"_id":"i:%d"' % k in m[2] for k, m in enumerate(got, 1)] == [True] * 5


def test_send_ok_is_send_for_each_and_keeps_the_order() -> None:
    wire = b"1 open 0\n" + b"".join(b"%d syslog 1 x\n" % t for t in range(2, 7))
    one, run = relp.RelpServer(), relp.RelpServer()
    one.feed(wire)
    run.feed(wire)
    one.send(relp.Response(1))
    run.send(relp.Response(1))
    assert run.send_ok([2, 3, 4]) == b"".join(one.send(relp.Response(t)) for t in (2, 3, 4))
    assert run.unanswered == one.unanswered == 2
    with pytest.raises(LocalProtocolError):
        run.send_ok([6])  # 5 is older
    with pytest.raises(LocalProtocolError):
        relp.RelpServer().send_ok([1])  # nothing unanswered
