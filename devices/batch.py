"""`TupleBatch`: the Python engine's batch, numbered, journaled and published by `Device._commit`.

The C engine's counterpart is `devices.native.NativeBatch`; both offer `number`,
`journal` and `publish`, and write identical journal bytes.
"""

from __future__ import annotations

import zmq
from zmq.backend import Socket as _RawSocket

from logjam.meta import META_CREATED, META_HEAD
from devices import stamp
from devices.journal import Journal
from devices.stamp import HEADS, ZERO_MS

_SM = zmq.SNDMORE
_send = _RawSocket.send


class TupleBatch(list):
    """Accepted messages as (app-env, topic, body, client meta); frames are bytes or zmq.Frame."""

    __slots__ = ("metas",)

    def number(self, device: int, first_seq: int, now: int) -> int:
        dev = stamp.device_bytes(device)
        now_b = now.to_bytes(8, "big")
        pack = stamp.pack_meta
        heads = HEADS
        created_at, head_at = META_CREATED, META_HEAD
        seq = first_seq - 1
        metas = []
        add = metas.append
        for _, _, _, meta in self:
            seq += 1
            created = meta[created_at]
            add(pack(heads[meta[head_at]], dev, now_b if created == ZERO_MS else created, seq))
        self.metas = metas
        return len(metas)

    def journal(self, journal: Journal, first_seq: int) -> None:
        journal.append(first_seq, [(a, t, b, m) for (a, t, b, _), m in zip(self, self.metas)])

    def publish(self, sock: zmq.Socket) -> None:
        send = _send
        metas = self.metas
        i = 0
        for app, topic, body, _ in self:
            send(sock, app, _SM)
            send(sock, topic, _SM)
            send(sock, body, _SM, False)
            send(sock, metas[i])
            i += 1
