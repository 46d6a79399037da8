"""What the device says about itself: heartbeats on PUB, the subscriptions each answered by one, and stats.

Subscribers learn the journal id from heartbeats: one is published at start, and
PUB is an XPUB in manual mode, so that a new subscription takes effect only when
`take_subscriptions` applies it, and the device follows that at once with a heartbeat:
the first message a new subscriber gets is one.
"""

from __future__ import annotations

import json

import zmq
from zmq.backend import Socket as _RawSocket

from devices.hold import JournalHealth

HEARTBEAT = b"heartbeat"
STATS = b"stats"

_NB = zmq.NOBLOCK
_SM = zmq.SNDMORE
_recv = _RawSocket.recv
_send = _RawSocket.send
_Again = zmq.Again


def heartbeat_body(journal_id: str, first: int) -> bytes:
    """`{"journal": id, "first": oldest seq still held}`."""
    return b'{"journal":"%s","first":%d}' % (journal_id.encode(), first)


def take_subscriptions(pub: zmq.Socket) -> bool:
    """Apply the (un)subscriptions waiting on the manual-mode XPUB `pub`; True when one subscribed."""
    new = False
    while True:
        try:
            event = _recv(pub, _NB)
        except _Again:
            break
        if event[:1] == b"\x01":
            pub.setsockopt(zmq.SUBSCRIBE, event[1:])
            new = True
        elif event[:1] == b"\x00":
            pub.setsockopt(zmq.UNSUBSCRIBE, event[1:])
    return new


def publish_stats(sock: zmq.Socket, device_label: bytes, seq: int, journal_id: str, health: JournalHealth) -> None:
    """["stats", device id, last seq, JSON: journal id and whether it can be written]."""
    _send(sock, STATS, _SM)
    _send(sock, device_label, _SM)
    _send(sock, str(seq).encode(), _SM)
    _send(sock, json.dumps({"journal": journal_id, **health.stats()}, separators=(",", ":")).encode())
