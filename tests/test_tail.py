"""`logjam-tail` run as a real process against real ZeroMQ publishers on 127.0.0.1.

The publisher is an XPUB socket bound in the test: it is a PUB on the wire, and it
also hands us the tail's subscriptions, so the test knows exactly when the tail is
listening instead of guessing. That, and full control over device ids and sequence
numbers, is what the gap and broken-body cases need. The last tests run the same
checks through a real `logjam-device` (the conftest fixtures) with the real Producer,
and the formatter gets Hypothesis properties: any message renders in every mode
without raising and without a raw control character.
"""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
import time
import zlib
from pathlib import Path

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.color import ColorSystem

from logjam import Message, Meta
from logjam.compression import compress
from logjam.meta import Compression
from logjam.producer import Producer
from tools.tail_render import Palette, Renderer, escape_bytes
from harness.processes import command, stop, wait_for

pytestmark = pytest.mark.timeout(60)

CREATED_MS = 1_700_000_000_123  # 2023-11-14 22:13:20.123 UTC
CLOCK = "22:13:20.123"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

BASE_ENV = {k: v for k, v in os.environ.items()
            if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
BASE_ENV.update(TZ="UTC", PYTHONUNBUFFERED="1")


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


class Pub:
    """A bound XPUB: publishes Logjam messages and reports subscriptions."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.subscriptions: list[bytes] = []

    def wait_subscribed(self, tail: "Tail", n: int = 1, timeout: float = 15) -> list[bytes]:
        def got() -> bool:
            tail.check_alive()
            while self.sock.poll(20):
                frame = self.sock.recv()
                if frame[:1] == b"\x01":
                    self.subscriptions.append(frame[1:])
            return len(self.subscriptions) >= n

        wait_for(got, timeout=timeout, what=f"{n} subscriptions from logjam-tail")
        return self.subscriptions

    def send(self, app_env: str = "shop-prod", topic: str = "logs.web", body: bytes | dict = b'{"a":1}', *,
             device: int = 3, seq: int = 1, compression: int = Compression.NONE, created_ms: int = CREATED_MS,
             precompressed: bool = False) -> Message:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        wire = raw if precompressed else compress(compression, raw)
        msg = Message(app_env, topic, wire, Meta(compression, device, created_ms, seq))
        self.sock.send_multipart(msg.to_frames())
        return msg


class Tail:
    """A running `logjam-tail`; stdout and stderr are collected by threads."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        # --plaintext: the publishers here (fakes, start_device's devices) run without CURVE (tests/test_curve.py).
        self.proc = subprocess.Popen([command("logjam-tail"), *args, "--plaintext"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env={**BASE_ENV, **(env or {})})
        self.out = bytearray()
        self.err = bytearray()
        self._threads = [threading.Thread(target=self._pump, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, buf: bytearray) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            buf.extend(chunk)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            self.join()
            raise AssertionError(f"logjam-tail exited {self.proc.returncode}:\n{self.stdout}\n{self.stderr}")

    @property
    def stdout(self) -> str:
        return self.out.decode()

    @property
    def stderr(self) -> str:
        return self.err.decode()

    def lines(self) -> list[str]:
        text = self.stdout
        return text[: text.rfind("\n") + 1].splitlines()

    def wait_lines(self, n: int, timeout: float = 15) -> list[str]:
        def enough() -> list[str] | None:
            lines = self.lines()
            if len(lines) >= n:
                return lines
            self.check_alive()
            return None

        return wait_for(enough, timeout=timeout, what=f"{n} lines from logjam-tail (have {self.stdout!r})")

    def join(self, timeout: float = 10) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"logjam-tail still running after {timeout}s") from None
        for t in self._threads:
            t.join(5)
        return self.proc.returncode

    def stop(self, sig: int = signal.SIGTERM) -> int:
        stop(self.proc, 10, sig)
        return self.join()

    def assert_clean_exit(self, sig: int = signal.SIGTERM) -> None:
        code = self.stop(sig)
        assert code == 0, f"exit {code}\n{self.stderr}"
        assert "Traceback" not in self.stderr, self.stderr


@pytest.fixture
def tails():
    started: list[Tail] = []

    def make(*args: str, env: dict[str, str] | None = None) -> Tail:
        t = Tail(list(args), env)
        started.append(t)
        return t

    yield make
    for t in started:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def start_tail(tails, pub: Pub, *args: str, subs: int = 1, env: dict[str, str] | None = None) -> Tail:
    tail = tails("--sub", pub.endpoint, *args, env=env)
    pub.wait_subscribed(tail, subs)
    return tail


# -- default line mode ------------------------------------------------------------------


def test_default_lines_are_one_per_message_in_local_time(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub)
    pub.send(seq=1, body=b'{"a":1}')
    pub.send(seq=2, topic="logs.db", body=b'{\n  "multi": [1,\n 2]\n}')
    pub.send(seq=3, body=b"plain text\twith \x1b[31mescape\x1b[0m\nand a newline")
    pub.send("heartbeat", "tcp://host:9606", b"{}", seq=4)
    pub.send(seq=5, body=b'{"last":true}')
    lines = tail.wait_lines(4)
    assert lines == [
        f'{CLOCK} shop-prod logs.web 3:1 {{"a":1}}',
        f'{CLOCK} shop-prod logs.db 3:2 {{"multi":[1,2]}}',
        f"{CLOCK} shop-prod logs.web 3:3 plain text\\twith \\x1b[31mescape\\x1b[0m\\nand a newline",
        f'{CLOCK} shop-prod logs.web 3:5 {{"last":true}}',
    ]
    # Piped: no colour codes, no truncation.
    assert "\x1b" not in tail.stdout
    tail.assert_clean_exit()


def test_local_time_follows_tz(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, env={"TZ": "Asia/Kolkata"})
    pub.send()
    assert tail.wait_lines(1)[0].startswith("03:43:20.123 shop-prod")
    tail.assert_clean_exit()


def test_width_cuts_lines_with_an_ellipsis(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--width", "50")
    pub.send(body=json.dumps({"message": "x" * 200}).encode())
    pub.send(app_env="a-" + "b" * 80, seq=2)
    lines = tail.wait_lines(2)
    assert len(lines[0]) == 50 and lines[0].endswith("…") and lines[0].startswith(f"{CLOCK} shop-prod logs.web 3:1 {{")
    assert len(lines[1]) == 50 and lines[1].endswith("…") and lines[1].startswith(f"{CLOCK} a-bbbb")
    tail.assert_clean_exit()


def test_all_four_compressions_are_decompressed(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--json")
    sent = {}
    for seq, method in enumerate(Compression, start=1):
        body = {"method": method.name, "filler": "logjam " * 50}
        msg = pub.send(seq=seq, body=body, compression=method)
        assert method == Compression.NONE or msg.body != json.dumps(body).encode()
        sent[method.name.lower()] = body
    records = [json.loads(line) for line in tail.wait_lines(4)]
    assert {r["compression"]: r["body"] for r in records} == sent
    tail.assert_clean_exit()


def test_all_four_compressions_in_line_mode(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub)
    for seq, method in enumerate(Compression, start=1):
        pub.send(seq=seq, body={"via": method.name}, compression=method)
    lines = tail.wait_lines(4)
    assert [line.split(" ", 4)[4] for line in lines] == [json.dumps({"via": m.name}) for m in Compression]
    tail.assert_clean_exit()


# -- other output modes -------------------------------------------------------------------


def test_json_mode_fields(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--json")
    pub.send(seq=7, body=b'{"n":[1,2,{"x":null}]}', compression=Compression.LZ4)
    pub.send(seq=8, topic="events.signup", body=b"not json")
    first, second = (json.loads(line) for line in tail.wait_lines(2))
    assert first == {"app_env": "shop-prod", "topic": "logs.web", "device": 3, "seq": 7,
                     "created_ms": CREATED_MS, "compression": "lz4", "body": {"n": [1, 2, {"x": None}]}}
    assert second["body"] == "not json" and second["compression"] == "none" and second["seq"] == 8
    tail.assert_clean_exit()


def test_pretty_mode_indents_json(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--pretty")
    pub.send(seq=1, body=b'{"a":{"b":[1,2]}}', compression=Compression.SNAPPY)
    pub.send(seq=2, body=b"line one\nline two")
    lines = tail.wait_lines(10)
    assert lines[0].startswith(f"{CLOCK} shop-prod logs.web 3:1 (snappy, ")
    assert "2023-11-14T22:13:20.123+00:00" in lines[0]
    assert lines[1:8] == ["{", '  "a": {', '    "b": [', "      1,", "      2", "    ]", "  }"]
    assert lines[8] == "}"
    assert lines[9].startswith(f"{CLOCK} shop-prod logs.web 3:2 (none, 17 bytes")
    assert tail.wait_lines(12)[10:12] == ["line one", "line two"]
    tail.assert_clean_exit()


def test_raw_mode_shows_bytes_before_decompression(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--raw")
    msg = pub.send(seq=1, body={"k": "v" * 40}, compression=Compression.ZLIB)
    lines = tail.wait_lines(2)
    assert lines[0] == f"{CLOCK} shop-prod logs.web 3:1 zlib {len(msg.body)} bytes"
    assert lines[1] != json.dumps({"k": "v" * 40})
    assert codecs.escape_decode(lines[1])[0] == msg.body
    assert zlib.decompress(codecs.escape_decode(lines[1])[0]) == json.dumps({"k": "v" * 40}).encode()
    tail.assert_clean_exit()


# -- gaps -------------------------------------------------------------------------------


def test_gaps_are_shown_inline(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub)
    for seq in (999, 1000, 1013, 1014):  # 1001..1012 lost
        pub.send(seq=seq)
    pub.send(seq=1, body=b'{"after":"restart"}')
    pub.send(device=0, seq=50)
    pub.send(device=0, seq=90)  # device 0 is never tracked
    pub.send(device=5, seq=10)
    pub.send("heartbeat", "tcp://h:9606", b"{}", device=5, seq=12)  # hidden, but counted
    pub.send(device=5, seq=13)
    lines = tail.wait_lines(12)
    assert [line.split(" ")[3] if not line.startswith("--") else line for line in lines] == [
        "3:999", "3:1000",
        "-- device 3: 12 messages lost (seq 1001..1012)",
        "3:1013", "3:1014",
        "-- device 3: sequence went back from 1014 to 1 (restart or wrap)",
        "3:1", "0:50", "0:90", "5:10",
        "-- device 5: 1 message lost (seq 11..11)",
        "5:13",
    ]
    tail.assert_clean_exit()


def test_gaps_in_json_mode(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--json")
    pub.send(seq=1000)
    pub.send(seq=1013)
    records = [json.loads(line) for line in tail.wait_lines(3)]
    assert records[1] == {"gap": {"device": 3, "lost": 12, "first": 1001, "last": 1012, "restart": False}}
    assert [r.get("seq") for r in records] == [1000, None, 1013]
    tail.assert_clean_exit()


def test_gaps_are_tracked_across_topic_filters(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--topic", "logs.web")
    pub.send(seq=1)
    pub.send(seq=2, topic="events.x")  # filtered, but not a gap
    pub.send(seq=5)
    assert tail.wait_lines(3) == [
        f'{CLOCK} shop-prod logs.web 3:1 {{"a":1}}',
        "-- device 3: 2 messages lost (seq 3..4)",
        f'{CLOCK} shop-prod logs.web 3:5 {{"a":1}}',
    ]
    tail.assert_clean_exit()


# -- filters ---------------------------------------------------------------------------


def test_app_env_is_a_subscription_and_turns_gaps_off(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--app-env", "shop-", "--app-env", "blog-prod", "--json", subs=3)
    assert sorted(pub.subscriptions) == [b"blog-prod", b"heartbeat", b"shop-"]
    pub.send("other-prod", seq=1)
    pub.send("shop-prod", seq=2)
    pub.send("heartbeat", "tcp://h:9606", b"{}", seq=3)
    pub.send("blog-prod", seq=10)  # a hole in the numbers, but no gap may be reported
    pub.send("shop-test", seq=11)
    pub.send("blog-preview", seq=12)
    records = [json.loads(line) for line in tail.wait_lines(3)]
    assert [(r["app_env"], r["seq"]) for r in records] == [("shop-prod", 2), ("blog-prod", 10), ("shop-test", 11)]
    tail.assert_clean_exit()


def test_topic_filter_is_a_prefix_and_repeatable(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--topic", "logs.web", "--topic", "events", "--json")
    for seq, topic in enumerate(["logs.db", "logs.web.api", "events.signup", "javascript", "logs.web"], 1):
        pub.send(topic=topic, seq=seq)
    records = [json.loads(line) for line in tail.wait_lines(3)]
    assert [r["topic"] for r in records] == ["logs.web.api", "events.signup", "logs.web"]
    tail.assert_clean_exit()


def test_heartbeats_hidden_unless_asked(ctx, tails):
    pub = Pub(ctx)
    plain = start_tail(tails, pub, "--topic", "logs")
    shown = tails("--sub", pub.endpoint, "--heartbeats", "--topic", "logs")
    pub.wait_subscribed(shown, 1)
    # XPUB reports a subscription only once per prefix, so poll until the second tail sees data.
    seq = 0

    def both_see_data() -> bool:
        nonlocal seq
        seq += 1
        pub.send(seq=seq)
        return bool(shown.lines()) and bool(plain.lines())

    wait_for(both_see_data, what="both tails to receive")
    seq += 1
    pub.send("heartbeat", "tcp://device.example:9606", b"{}", seq=seq)
    seq += 1
    pub.send(seq=seq, body=b'{"end":1}')
    wait_for(lambda: any('"end"' in line for line in shown.lines()) and any('"end"' in line for line in plain.lines()),
             what="the last message in both tails")
    assert any(" heartbeat tcp://device.example:9606 3:" in line and line.endswith("{}") for line in shown.lines())
    assert not any("heartbeat" in line for line in plain.lines())
    plain.assert_clean_exit()
    shown.assert_clean_exit()


def test_several_sub_endpoints(ctx, tails):
    one, two = Pub(ctx), Pub(ctx)
    tail = tails("--sub", one.endpoint, "--sub", two.endpoint, "--json")
    one.wait_subscribed(tail)
    two.wait_subscribed(tail)
    one.send(device=1, seq=1)
    two.send(device=2, seq=1)
    records = [json.loads(line) for line in tail.wait_lines(2)]
    assert sorted(r["device"] for r in records) == [1, 2]
    tail.assert_clean_exit()


# -- bad input, --count, exits -----------------------------------------------------------


def _send_broken(pub: Pub) -> None:
    good = compress(Compression.LZ4, b'{"ok":1}' * 20)
    pub.send(seq=1, body=b"definitely not zlib", compression=Compression.ZLIB, precompressed=True)
    pub.send(seq=2, body=good[:-5], compression=Compression.LZ4, precompressed=True)
    pub.send(seq=3, body=b"\xff\xff\xff\xff\xff\xff", compression=Compression.SNAPPY, precompressed=True)
    pub.send(seq=4, body=b"\xff\xfe not utf-8")
    pub.send(seq=5, body=b'{"still":"tailing"}')


def test_broken_bodies_are_marked_and_tailing_continues(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub)
    _send_broken(pub)
    lines = tail.wait_lines(5)
    assert re.fullmatch(rf"{CLOCK} shop-prod logs.web 3:1 !! bad body \[decompression_failed\]: zlib: .+", lines[0])
    assert re.fullmatch(r".* 3:2 !! bad body \[decompression_failed\]: lz4: .+", lines[1])
    assert re.fullmatch(r".* 3:3 !! bad body \[(decompression_failed|decompressed_too_large)\]: snappy.+", lines[2])
    assert re.fullmatch(r".* 3:4 !! bad body \[bad_encoding\]: body is not UTF-8 \(byte 0\): \\xff\\xfe not utf-8", lines[3])
    assert lines[4] == f'{CLOCK} shop-prod logs.web 3:5 {{"still":"tailing"}}'
    tail.assert_clean_exit()


def test_broken_bodies_in_json_mode(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--json")
    _send_broken(pub)
    records = [json.loads(line) for line in tail.wait_lines(5)]
    assert [r["error"]["reason"] for r in records[:2]] == ["decompression_failed"] * 2
    assert records[0]["body"] is None and records[0]["body_base64"] == "ZGVmaW5pdGVseSBub3QgemxpYg=="
    assert records[3]["error"]["reason"] == "bad_encoding"
    assert records[4]["body"] == {"still": "tailing"} and "error" not in records[4]
    tail.assert_clean_exit()


def test_undecodable_messages_are_skipped_with_a_warning(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub)
    pub.sock.send_multipart([b"shop-prod", b"logs", b"{}", b"short meta"])
    pub.sock.send_multipart([b"stats", b"3"])
    pub.send(seq=9)
    assert tail.wait_lines(1)[0].endswith("3:9 {\"a\":1}")
    # Warnings are rate-limited to one per 5 s, so the two may be reported separately.
    skipped = lambda: sum(map(int, re.findall(r"skipped (\d+) undecodable messages", tail.stderr)))  # noqa: E731
    wait_for(lambda: skipped() == 2, timeout=15, what="a warning on stderr")
    tail.assert_clean_exit()


def test_count_exits_zero_after_n_messages(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--count", "3", "--topic", "logs.web", "--json")
    pub.send(seq=1, topic="logs.other")  # filtered messages do not count
    for seq in range(2, 10):
        pub.send(seq=seq)
    assert tail.join() == 0, tail.stderr
    assert [json.loads(line)["seq"] for line in tail.lines()] == [2, 3, 4]
    assert tail.stderr == ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_exit_cleanly(ctx, tails, sig):
    pub = Pub(ctx)
    tail = start_tail(tails, pub)
    pub.send()
    tail.wait_lines(1)
    tail.assert_clean_exit(sig)
    assert tail.stderr == ""


def test_sigterm_while_idle_with_no_publisher(tails):
    # Nothing listens on this endpoint: the tail must still stop promptly.
    tail = tails("--sub", "tcp://127.0.0.1:9", "--stats")
    wait_for(lambda: tail.proc.poll() is None and tail.stdout, timeout=15, what="a first stats table")
    tail.assert_clean_exit()


def test_reader_going_away_is_not_an_error(ctx):
    pub = Pub(ctx)
    proc = subprocess.Popen(f"{command('logjam-tail')} --plaintext --sub {pub.endpoint} | head -n 1", shell=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=BASE_ENV)
    pub.sock.poll(15000)
    seq = 0
    deadline = time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        seq += 1
        pub.send(seq=seq, body=b'{"x":"' + b"y" * 2000 + b'"}')
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert out.count(b"\n") == 1 and b"Traceback" not in err, err


# -- options and config ---------------------------------------------------------------------


def test_help_explains_gap_detection_limits():
    out = subprocess.run([command("logjam-tail"), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "With --app-env the subscription is a prefix" in text and "gap detection is OFF" in text
    for flag in ("--sub", "--app-env", "--topic", "--json", "--pretty", "--raw", "--count", "--heartbeats", "--stats"):
        assert flag in text


@pytest.mark.parametrize("args, message", [
    (["--count", "0"], "must be positive"),
    (["--json", "--raw"], "not allowed with"),
    (["--sub", "127.0.0.1:9606"], "expected an endpoint"),
    (["--sub", "bogus://x"], "--sub bogus://x"),
])
def test_bad_flags_are_rejected_clearly(args, message):
    out = subprocess.run([command("logjam-tail"), *args, "--plaintext"], capture_output=True, text=True, timeout=30,
                         env=BASE_ENV)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_config_file_with_flags_winning(ctx, tails, tmp_path: Path):
    pub = Pub(ctx)
    cfg = tmp_path / "tail.toml"
    cfg.write_text(f'sub = ["{pub.endpoint}"]\nmode = "json"\ntopic = ["events"]\ncount = 2\n')
    tail = tails("--config", str(cfg), "--topic", "logs.web")  # replaces the file's topic list
    pub.wait_subscribed(tail)
    pub.send(seq=1, topic="events.a")
    pub.send(seq=2)
    pub.send(seq=3)
    assert tail.join() == 0, tail.stderr
    assert [(r["topic"], r["seq"]) for r in map(json.loads, tail.lines())] == [("logs.web", 2), ("logs.web", 3)]


def test_config_file_errors(tmp_path: Path):
    cfg = tmp_path / "tail.toml"
    cfg.write_text('json = true\n')
    out = subprocess.run([command("logjam-tail"), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "unknown key 'json'" in out.stderr
    cfg.write_text('mode = "yaml"\n')
    out = subprocess.run([command("logjam-tail"), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "mode must be one of" in out.stderr


# -- --stats ---------------------------------------------------------------------------------


def test_stats_piped_prints_tables(ctx, tails):
    pub = Pub(ctx)
    tail = start_tail(tails, pub, "--stats", "--count", "25", "--interval", "0.2")
    for seq in range(1, 11):
        pub.send(seq=seq, body=b"x" * 100)
    for seq in range(20, 30):
        pub.send(seq=seq, topic="events.signup")
    pub.send("heartbeat", "tcp://h:9606", b"{}", seq=30)
    for seq in range(31, 36):
        pub.send("blog-prod", seq=seq)
    assert tail.join() == 0, tail.stderr
    text = tail.stdout
    assert "\x1b" not in text
    last = text[text.rfind("streams"):]
    rows = {tuple(c.strip() for c in line.split("│")[1:-1]) for line in last.splitlines() if "│" in line}
    by_stream = {r[:2]: r for r in rows if len(r) == 6}
    assert by_stream[("shop-prod", "logs.web")][4:] == ("10", "1.4 KiB")  # 10 x (9 + 8 + 100 + 24) bytes
    assert by_stream[("shop-prod", "events.signup")][4] == "10"
    assert by_stream[("blog-prod", "logs.web")][4] == "5"
    assert by_stream[("total", "")][4] == "25"
    devices = {r[0]: r for r in rows if len(r) == 6 and r[0].isdigit()}
    assert devices["3"][1:5] == ("26", "35", "9", "0")  # 26 messages incl. the heartbeat; 11..19 lost


def _pty_tail(args: list[str], cols: int = 120) -> tuple[subprocess.Popen, bytearray, threading.Thread]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    proc = subprocess.Popen([command("logjam-tail"), *args, "--plaintext"], stdin=slave, stdout=slave, stderr=subprocess.PIPE,
                            env={**BASE_ENV, "TERM": "xterm-256color"}, close_fds=True)
    os.close(slave)
    screen = bytearray()

    def pump() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            screen.extend(chunk)
        os.close(master)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return proc, screen, reader


def _finish(proc: subprocess.Popen, reader: threading.Thread) -> str:
    stop(proc, 10)
    reader.join(5)
    err = proc.stderr.read().decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    return err


def test_stats_live_table_on_a_terminal(ctx):
    pub = Pub(ctx)
    proc, screen, reader = _pty_tail(["--sub", pub.endpoint, "--stats", "--interval", "0.3"])
    try:
        wait_for(lambda: pub.sock.poll(20) and pub.sock.recv(), timeout=15, what="the tail's subscription")
        seq = 0
        row = re.compile(r"shop-prod\s*│\s*logs\.web\s*│\s*([\d.]+)\s*│\s*([\d.]+ (?:B|KiB|MiB))\s*│\s*(\d+)")

        def live_rate() -> float | None:
            nonlocal seq
            for _ in range(20):
                seq += 1
                pub.send(seq=seq, body=b"z" * 200)
            found = row.findall(ANSI.sub("", screen.decode(errors="replace")))
            return found and float(found[-1][0]) > 0 and found[-1]

        last = wait_for(live_rate, timeout=20, interval=0.01, what="a non-zero msgs/s row on the live table")
        assert int(last[2]) > 0 and not last[1].startswith("0 B")
        assert "\x1b[" in screen.decode(errors="replace")  # a real terminal gets colours and redraws
        assert "devices" in ANSI.sub("", screen.decode(errors="replace"))
    finally:
        _finish(proc, reader)


def test_lines_are_coloured_and_cut_on_a_terminal(ctx):
    pub = Pub(ctx)
    proc, screen, reader = _pty_tail(["--sub", pub.endpoint], cols=60)
    try:
        wait_for(lambda: pub.sock.poll(20) and pub.sock.recv(), timeout=15, what="the tail's subscription")
        pub.send(body=json.dumps({"m": "q" * 300}).encode())
        pub.send(seq=2, body=b"\x1b]0;pwned\x07", compression=Compression.ZLIB)
        wait_for(lambda: screen.count(b"\n") >= 2, what="two lines on the terminal")
    finally:
        _finish(proc, reader)
    raw = screen.decode()
    assert "\x1b[1;36mshop-prod\x1b[0m" in raw  # app-env in bold cyan
    first, second = (ANSI.sub("", line) for line in raw.splitlines()[:2])
    assert len(first) == 60 and first.endswith("…")
    assert second.endswith("3:2 \\x1b]0;pwned\\x07") and "\x07" not in raw


# -- through a real logjam-device ----------------------------------------------------------


def test_through_a_real_device_all_compressions(device, ctx, tails):
    tail = tails("--sub", device.pub, "--json", "--topic", "logs.tail")
    producers = {m: Producer(device.router, compression=m, context=ctx, linger_ms=0) for m in Compression}
    rounds = 0

    def all_four_seen() -> set[str]:
        # A SUB joins late, so keep sending until every method has come through once.
        nonlocal rounds
        rounds += 1
        for method, producer in producers.items():
            producer.submit("shop-prod", "logs.tail", {"method": method.name, "round": rounds})
        for producer in producers.values():
            assert producer.flush().accepted == 1
        tail.check_alive()
        methods = {json.loads(line)["compression"] for line in tail.lines()}
        return methods >= {"none", "zlib", "snappy", "lz4"} and methods

    try:
        wait_for(all_four_seen, timeout=20, interval=0.05, what="all four compressions through the device")
    finally:
        for producer in producers.values():
            producer.close()
    records = [json.loads(line) for line in tail.lines()]
    assert not any("gap" in r for r in records)  # a healthy device loses nothing
    assert all(r["device"] == device.device_id and r["app_env"] == "shop-prod" for r in records)
    assert all(r["body"]["method"].lower() == r["compression"] for r in records)
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    tail.assert_clean_exit()


def test_real_device_heartbeats_and_broken_body(device_factory, ctx, tails):
    dev = device_factory(device_id=7, extra=["--heartbeat-interval", "0.2"])
    tail = tails("--sub", dev.pub, "--heartbeats")
    wait_for(lambda: tail.check_alive() or any(" heartbeat tcp://" in line for line in tail.lines()),
             timeout=20, what="a device heartbeat in the tail")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(dev.pull)
    # The device never decompresses, so a corrupt zlib body reaches the tail as sent.
    push.send_multipart(Message("shop-prod", "logs.bad", b"not zlib", Meta(Compression.ZLIB, 0, CREATED_MS, 1)).to_frames())
    push.send_multipart(Message.build("shop-prod", "logs.good", {"fine": True}, compression=Compression.SNAPPY,
                                      created_ms=CREATED_MS).to_frames())
    lines = wait_for(lambda: tail.check_alive() or (any("logs.good" in line for line in tail.lines()) and tail.lines()),
                     what="the good message after the broken one")
    push.close()
    bad = [line for line in lines if "logs.bad" in line]
    good = [line for line in lines if "logs.good" in line]
    assert len(bad) == 1 and re.search(r" 7:\d+ !! bad body \[decompression_failed\]: zlib: ", bad[0])
    assert re.fullmatch(rf'{CLOCK} shop-prod logs\.good 7:\d+ {{"fine":true}}', good[0])
    assert all(re.search(r' \{"journal":"[0-9a-f]{16}","first":\d+\}$', line) for line in lines if " heartbeat " in line)
    assert not any(line.startswith("--") for line in lines)
    tail.assert_clean_exit()


# -- rendering properties (in-process: the formatter has no I/O) --------------------------
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


@settings(max_examples=300, deadline=None)
@given(
    app_env=st.text(max_size=40), topic=st.text(max_size=40), body=st.binary(max_size=300),
    compression=st.sampled_from(list(Compression)), seq=st.integers(0, 2**64 - 1),
    created_ms=st.integers(0, 2**64 - 1), width=st.integers(0, 200),
)
def test_any_message_renders_safely_in_every_mode(app_env, topic, body, compression, seq, created_ms, width):
    msg = Message(app_env, topic, body, Meta(compression, 9, created_ms, seq))
    for mode in Renderer.MODES:
        out = Renderer(mode, Palette(None), width).message(msg)
        assert out.endswith("\n")
        if mode == "json":
            record = json.loads(out)
            assert (record["app_env"], record["topic"], record["seq"]) == (app_env, topic, seq)
            assert ("error" in record) == (record["body"] is None)
        elif mode == "lines":
            assert out.count("\n") == 1 and not _CONTROL.search(out[:-1])
            if width:
                assert cell_len(out[:-1]) <= width
        else:
            assert not _CONTROL.search(out.replace("\n", "").replace("\t", ""))
    coloured = Renderer("lines", Palette(ColorSystem.STANDARD), width).message(msg)
    assert ANSI.sub("", coloured) == Renderer("lines", Palette(None), width).message(msg)


@given(st.binary(max_size=500))
def test_raw_escaping_is_lossless(data):
    text = escape_bytes(data)
    assert text.isascii() and text.isprintable()
    assert codecs.escape_decode(text)[0] == data
