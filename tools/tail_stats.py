"""`logjam-tail --stats`: message and byte rates per app-env and topic, and gaps per device.

`StatsBoard` only counts and builds rich renderables; `tools.tail` decides whether
they go to a live-refreshing screen (a terminal) or are printed as snapshots (a pipe).
Rates are measured over a sliding window of recent snapshots, so they settle instead
of jumping with every refresh.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from logjam.message import Message
from logjam.subscriber import GapTracker

Key = tuple[str, str]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def wire_size(msg: Message) -> int:
    """Bytes of all four frames as the device published them."""
    return len(msg.app_env.encode()) + len(msg.topic.encode()) + len(msg.body) + 24


class StatsBoard:
    def __init__(self, endpoints: Sequence[str], app_envs: Sequence[str], topics: Sequence[str],
                 window: float = 5.0, clock=time.monotonic) -> None:
        self.endpoints = list(endpoints)
        self.app_envs = list(app_envs)
        self.topics = list(topics)
        self.window = window
        self.clock = clock
        self.started = clock()
        self.counts: dict[Key, list[int]] = {}
        self.device_msgs: dict[int, int] = {}
        self.device_last_seq: dict[int, int] = {}
        self.heartbeat_at: dict[int, float] = {}
        self.messages = 0
        self._snapshots: deque[tuple[float, dict[Key, tuple[int, int]]]] = deque()
        self.snapshot()

    def observe(self, msg: Message, counted: bool) -> None:
        """Record one message; `counted` is False for messages the filters hide from the rate table."""
        dev = msg.meta.device
        self.device_msgs[dev] = self.device_msgs.get(dev, 0) + 1
        self.device_last_seq[dev] = msg.meta.seq
        if msg.is_heartbeat:
            self.heartbeat_at[dev] = self.clock()
        if not counted:
            return
        self.messages += 1
        c = self.counts.get((msg.app_env, msg.topic))
        if c is None:
            c = self.counts[(msg.app_env, msg.topic)] = [0, 0]
        c[0] += 1
        c[1] += wire_size(msg)

    def snapshot(self) -> None:
        now = self.clock()
        self._snapshots.append((now, {k: (v[0], v[1]) for k, v in self.counts.items()}))
        # Keep one snapshot at or before the window start, so the window is always covered.
        while len(self._snapshots) > 2 and self._snapshots[1][0] <= now - self.window:
            self._snapshots.popleft()

    def rates(self) -> dict[Key, tuple[float, float]]:
        """Messages/s and bytes/s per (app-env, topic) between the oldest and newest snapshot."""
        (t0, old), (t1, new) = self._snapshots[0], self._snapshots[-1]
        dt = t1 - t0
        out: dict[Key, tuple[float, float]] = {}
        for key, (n, b) in new.items():
            n0, b0 = old.get(key, (0, 0))
            out[key] = ((n - n0) / dt, (b - b0) / dt) if dt > 0 else (0.0, 0.0)
        return out

    def render(self, gaps: GapTracker | None, undecodable: int = 0, reconnects: int = 0) -> RenderableType:
        """Take a snapshot and build the tables."""
        self.snapshot()
        rates = self.rates()
        streams = Table(title="streams", title_justify="left", expand=False)
        for name, justify in (("app-env", "left"), ("topic", "left"), ("msgs/s", "right"),
                              ("bytes/s", "right"), ("msgs", "right"), ("bytes", "right")):
            streams.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        total = [0.0, 0.0, 0, 0]
        for key in sorted(self.counts):
            n, b = self.counts[key]
            mr, br = rates.get(key, (0.0, 0.0))
            total[0] += mr
            total[1] += br
            total[2] += n
            total[3] += b
            streams.add_row(key[0], key[1], f"{mr:.1f}", human_bytes(br), str(n), human_bytes(b))
        streams.add_row("total", "", f"{total[0]:.1f}", human_bytes(total[1]), str(total[2]),
                        human_bytes(total[3]), style="bold", end_section=True)

        devices = Table(title="devices", title_justify="left", expand=False)
        for name in ("device", "msgs", "last seq", "lost", "restarts", "heartbeat"):
            devices.add_column(name, justify="right", no_wrap=True)
        now = self.clock()
        for dev in sorted(self.device_msgs):
            hb = self.heartbeat_at.get(dev)
            if gaps is None:
                lost = restarts = "n/a"
            elif dev == 0:
                lost = restarts = "untracked"
            else:
                lost = str(gaps.lost.get(dev, 0))
                restarts = str(gaps.restarts.get(dev, 0))
            devices.add_row(str(dev), str(self.device_msgs[dev]), str(self.device_last_seq[dev]), lost,
                            restarts, "-" if hb is None else f"{now - hb:.0f}s ago",
                            style="bold red" if lost not in ("0", "n/a", "untracked") else None)

        notes = [f"sub {', '.join(self.endpoints)}  up {now - self.started:.0f}s  window {self.window:.0f}s"]
        if self.app_envs:
            notes.append(f"app-env {', '.join(self.app_envs)}: gap tracking off "
                         "(a device numbers all streams with one counter)")
        if self.topics:
            notes.append(f"topic {', '.join(self.topics)}")
        if undecodable:
            notes.append(f"{undecodable} undecodable messages skipped")
        if reconnects:
            notes.append(f"{reconnects} reconnects after silence")
        return Group(streams, devices, Text("\n".join(notes), style="dim"))
