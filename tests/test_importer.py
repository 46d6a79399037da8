"""logjam-importer against real things: a real logjam-device, the real Producer, and the real Delta table.

An importer given `--warehouse` commits with delta-rs and needs no Spark; the tests read what
landed from the table's log (tests/table_support.py). The last test leaves `--warehouse` out,
so that the importer asks the session's `logjam-spark` (tests/spark_fixture.py) where it is.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
import zmq

from importer.split import worker_of
from logjam.meta import Compression, Meta
from logjam.producer import Producer
from harness.processes import command, free_port, start, stop, wait_for
from tests import table_support

PROBE_APP_ENV = "probe-ready"


class Importer:
    """A real logjam-importer process; with `warehouse` it commits to that warehouse's table and needs no Spark."""

    def __init__(self, device, *extra: str, warehouse: Path | None = None, state_dir: Path | None = None,
                 spark: str | None = None) -> None:
        self.metrics_port = free_port()
        argv = [command("logjam-importer"), "--sub", device.pub, "--metrics-port", str(self.metrics_port),
                "--plaintext", *extra]
        if spark is not None:
            argv += ["--spark", spark]
        if warehouse is not None:
            argv += ["--warehouse", str(warehouse)]
            # Scratch space belongs to one test's warehouse, never to the repository's ./data.
            state_dir = state_dir or warehouse.parent / "importer-state"
        if state_dir is not None:
            argv += ["--state-dir", str(state_dir)]
        self.proc = start(argv)
        self._out: str | None = None

    def metric(self, name: str, **labels: str) -> float:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).read().decode()
        except OSError:
            return -1.0
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def wait_ready(self, device, timeout: float = 60) -> None:
        """Until this importer has received a probe: it proves the SUB subscription is live, and the
        probe's row is in a batch ahead of anything sent after (a device heartbeat, which is also
        counted as received, proves only the first)."""
        with Producer(device.pull, mode="push", linger_ms=0) as probe:
            def received() -> bool:
                if self.proc.poll() is not None:
                    raise AssertionError(f"logjam-importer exited early:\n{self.output()}")
                probe.send(PROBE_APP_ENV, "logs.probe", {"probe": True})
                # A worker that does not own the probe's stream skips it.
                return (self.metric("logjam_importer_rows_total", app_env=PROBE_APP_ENV)
                        + self.metric("logjam_importer_messages_skipped_total")) > 0
            wait_for(received, timeout=timeout, interval=0.1, what="the importer to receive")

    def stop(self) -> int:
        code = stop(self.proc, timeout=60)
        self.output()
        return code

    def output(self) -> str:
        if self._out is None and self.proc.poll() is not None:
            self._out = self.proc.stdout.read() if self.proc.stdout else ""
        return self._out or ""


def read_rows(warehouse: Path, app_envs: list[str]) -> list:
    """The rows of the test's table for the given streams, read from its Delta log."""
    return table_support.rows(warehouse, app_envs)


def count_rows(warehouse: Path, app_envs: list[str]) -> int:
    return table_support.count(warehouse, app_envs)


@pytest.mark.timeout(180)
def test_published_messages_land_in_the_table_with_their_columns(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    imp = Importer(device, "--flush-interval", "0.5", warehouse=warehouse)
    try:
        imp.wait_ready(device)
        sent: dict[tuple[str, int], dict] = {}
        created_ms = 1_763_700_000_000
        n_per = 50
        for compression in Compression:
            with Producer(device.router, compression=compression) as p:
                for i in range(n_per):
                    app_env = ("shop-prod", "blog-dev")[i % 2]
                    body = {"message": f"{compression.name} {i}", "code": 200 + i, "total_time": i / 4,
                            "host": "web1", "request_id": f"r{compression}-{i}",
                            "@metadata": {"protocol": "lumberjack"}}
                    p.submit(app_env, "logs.rails", body, created_ms=created_ms + i)
                    sent[(body["request_id"])] = (app_env, body)
                assert p.flush().accepted == n_per
        # Broken bodies: one that is not JSON, one that claims zlib but is not.
        with Producer(device.router) as p:
            p.submit("shop-prod", "logs.rails", b"{this is not json")
            assert p.flush().accepted == 1
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(device.router)
        dealer.send_multipart([b"", b"shop-prod", b"logs.rails", b"not zlib at all",
                               Meta(Compression.ZLIB, 0, created_ms, 1).pack()])
        assert dealer.poll(5000) and dealer.recv_multipart()[-1] == b"202 Accepted"
        dealer.close()

        total = len(sent) + 2
        streams = ["shop-prod", "blog-dev"]
        wait_for(lambda: count_rows(warehouse, streams) >= total, timeout=90, interval=0.5,
                 what=f"{total} rows in Spark")
        assert count_rows(warehouse, streams) == total
        rows = read_rows(warehouse, streams)
    finally:
        assert imp.stop() == 0, imp.output()

    assert len({(r.device, r.seq) for r in rows}) == total, "a row was written twice"
    good = [r for r in rows if r.parse_error is None]
    bad = [r for r in rows if r.parse_error is not None]
    assert len(good) == len(sent)
    for r in good:
        app_env, body = sent[r.request_id]
        assert (r.app_env, r.topic, r.device) == (app_env, "logs.rails", device.device_id)
        assert (r.app, r.env) == tuple(app_env.split("-"))
        assert orjson.loads(r.body) == body
        assert (r.message, r.code, r.total_time, r.host, r.protocol) == (
            body["message"], body["code"], body["total_time"], "web1", "lumberjack")
        assert int(r.created_at.timestamp() * 1000) == created_ms + body["code"] - 200
        assert str(r.date) == "2025-11-21"
        assert r.ingested_at >= r.created_at
    assert sorted(r.parse_error.split(":")[0] for r in bad) == ["bad_json", "decompression_failed"]
    assert {bytes(r.raw) for r in bad} == {b"{this is not json", b"not zlib at all"}
    assert re.search(r"wrote \d+ rows; 2 parse errors", imp.output())


@pytest.mark.timeout(180)
def test_two_workers_split_a_mixed_stream_without_overlap_or_loss(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    streams = [f"app{i}-prod" for i in range(12)]
    assert {worker_of(s, 2) for s in streams} == {0, 1}
    workers = [Importer(device, "--worker", str(i), "--workers", "2", "--flush-interval", "0.5",
                        warehouse=warehouse) for i in range(2)]
    try:
        for w in workers:
            w.wait_ready(device)
        per_stream = 40
        with Producer(device.router) as p:
            for i in range(per_stream * len(streams)):
                p.submit(streams[i % len(streams)], "logs.app", {"n": i})
            assert p.flush().accepted == per_stream * len(streams)
        total = per_stream * len(streams)
        wait_for(lambda: count_rows(warehouse, streams) >= total, timeout=90, interval=0.5,
                 what=f"{total} rows from two workers")
        rows = read_rows(warehouse, streams)
        assert len(rows) == total
        assert sorted(orjson.loads(r.body)["n"] for r in rows) == list(range(total))
        for i, w in enumerate(workers):
            mine = sum(1 for s in streams if worker_of(s, 2) == i)
            probes = w.metric("logjam_importer_rows_total", app_env=PROBE_APP_ENV)
            assert w.metric("logjam_importer_rows_total") == per_stream * mine + probes
    finally:
        for w in workers:
            assert w.stop() == 0, w.output()


@pytest.mark.timeout(180)
def test_sigterm_mid_stream_flushes_the_batch(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    # Nothing is written before SIGTERM: no time or size flush can happen in this test.
    imp = Importer(device, "--flush-interval", "3600", "--batch-rows", "10000000",
                   warehouse=warehouse)
    stop_sending = threading.Event()
    sent = 0

    def publish() -> None:
        nonlocal sent
        with Producer(device.pull, mode="push") as p:
            while not stop_sending.is_set():
                p.send("flush-test", "logs.app", {"n": sent})
                sent += 1
                if sent % 100 == 0:
                    time.sleep(0.001)  # keep well inside the SUB high-water mark

    try:
        imp.wait_ready(device)
        t = threading.Thread(target=publish)
        t.start()
        wait_for(lambda: imp.metric("logjam_importer_rows_total", app_env="flush-test") >= 500, timeout=30,
                 what="rows buffered in the importer")
        assert count_rows(warehouse, ["flush-test"]) == 0
        imp.proc.send_signal(15)
        assert imp.proc.wait(60) == 0, imp.output()
    finally:
        stop_sending.set()
        if "t" in locals():
            t.join()
        imp.stop()
    m = re.search(r"wrote (\d+) rows", imp.output())
    assert m, imp.output()
    written = int(m.group(1))
    assert written >= 500
    rows = read_rows(warehouse, ["flush-test", PROBE_APP_ENV])
    assert len(rows) == written
    ns = sorted(orjson.loads(r.body)["n"] for r in rows if r.app_env == "flush-test")
    assert ns == list(range(len(ns))), "the flushed rows are a prefix of what was sent, without holes"


@pytest.mark.timeout(180)
def test_without_a_warehouse_the_importer_writes_where_the_spark_server_keeps_its_tables(device, spark_server) -> None:
    imp = Importer(device, "--flush-interval", "0.5", spark=spark_server.url)
    try:
        imp.wait_ready(device, timeout=120)
        with Producer(device.router) as p:
            for i in range(30):
                p.submit("server-warehouse", "logs.app", {"n": i})
            assert p.flush().accepted == 30
        wait_for(lambda: count_rows(spark_server.warehouse, ["server-warehouse"]) >= 30, timeout=60, interval=0.5,
                 what="30 rows in the server's warehouse")
    finally:
        assert imp.stop() == 0, imp.output()
    assert count_rows(spark_server.warehouse, ["server-warehouse"]) == 30
    assert f"at {spark_server.warehouse.resolve()}/messages" in imp.output()
