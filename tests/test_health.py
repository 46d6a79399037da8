"""/metrics and /healthz on --metrics-port (runtime.health), through real processes.

A device says it is publishing and its journal is writable; a bridge says whether its
device link is up, following the device as it goes away and comes back; the importer's
and logjam-spark's verdicts are checked on a `make up` mesh in tests/test_mesh_ops.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.bridge_support import start_bridge, stop_bridge
from harness.device import start_device
from harness.processes import free_port, stop, wait_for


def healthz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()


@pytest.mark.timeout(60)
def test_device_healthz_says_publishing_and_journal_writable(tmp_path) -> None:
    port = free_port()
    dev = start_device(extra=["--metrics-port", str(port), "--data-dir", str(tmp_path), "--heartbeat-interval", "0.5"])
    try:
        status, doc = healthz(port)
        assert status == 200 and doc["healthy"] is True, doc
        assert set(doc["checks"]) == {"publishing", "journal", "curve", "input"}
        assert doc["checks"]["curve"]["detail"].startswith("CURVE off")  # start_device: --allow-plaintext
        assert doc["checks"]["journal"] == {"ok": True, "detail": "writable"}
        assert "last heartbeat" in doc["checks"]["publishing"]["detail"]
        assert "logjam_device_published_total" in metrics_text(port)
    finally:
        stop(dev.proc)


@pytest.mark.timeout(90)
def test_device_whose_journal_cannot_write_is_unhealthy_until_it_can(tmp_path) -> None:
    from tests.disk_support import limit_file_size
    from tests.test_device_disk_full import Sender

    port = free_port()
    dev = start_device(extra=["--metrics-port", str(port), "--data-dir", str(tmp_path), "--heartbeat-interval", "0.2"])
    sender = Sender(dev.router, "health")
    try:
        assert healthz(port)[0] == 200
        segment = next((tmp_path / "journal").glob("*.journal"))
        limit_file_size(dev.proc.pid, segment.stat().st_size + 100 * 1024)
        sender.start()
        status, doc = wait_for(lambda: (r := healthz(port))[0] == 503 and r, timeout=20, what="unhealthy")
        assert doc["checks"]["journal"]["ok"] is False
        assert doc["checks"]["journal"]["detail"].startswith("not writable: holding ")
        # No heartbeat goes out while the journal cannot take it: publishing fails too, after its limit.
        wait_for(lambda: healthz(port)[1]["checks"]["publishing"]["ok"] is False, timeout=20,
                 what="the publishing check to fail")
        limit_file_size(dev.proc.pid, None)
        wait_for(lambda: healthz(port)[0] == 200, timeout=20, what="healthy once the journal writes again")
    finally:
        sender.halt.set()
        stop(dev.proc)


@pytest.mark.timeout(90)
def test_bridge_healthz_follows_the_device_link(tmp_path) -> None:
    router = free_port()
    mport = free_port()
    b = start_bridge("lumberjack", f"tcp://127.0.0.1:{router}", "--metrics-port", str(mport))
    try:
        status, doc = healthz(mport)
        assert status == 503 and doc["healthy"] is False, doc
        assert doc["checks"]["listening"]["ok"] is True
        assert doc["checks"]["device_link"]["ok"] is False
        assert f"tcp://127.0.0.1:{router}" in doc["checks"]["device_link"]["detail"]

        dev = start_device(ports={"router": router})
        try:
            wait_for(lambda: healthz(mport)[0] == 200, timeout=20, what="bridge healthy once the device is up")
            assert healthz(mport)[1]["checks"]["device_link"]["detail"].startswith("connected to")
        finally:
            stop(dev.proc)
        wait_for(lambda: healthz(mport)[0] == 503, timeout=20, what="bridge unhealthy once the device is gone")
        assert "logjam_bridge_connections_total" in metrics_text(mport)
    finally:
        stop_bridge(b)


@pytest.mark.timeout(60)
def test_importer_waiting_for_spark_to_name_its_warehouse_is_unhealthy(tmp_path) -> None:
    from harness.processes import command, start

    mport, spark = free_port(), free_port()
    proc = start([command("logjam-importer"), "--spark", f"sc://127.0.0.1:{spark}", "--sub", f"tcp://127.0.0.1:{free_port()}",
                  "--state-dir", str(tmp_path / "state"), "--metrics-port", str(mport - 3), "--metrics-port-offset", "3",
                  "--plaintext"])
    try:
        def answer() -> tuple[int, dict] | None:
            try:
                return healthz(mport)
            except OSError:
                return None

        status, doc = wait_for(answer, timeout=30, what="the importer's /healthz (--metrics-port + offset)")
        assert status == 503 and doc["checks"]["table"]["ok"] is False, doc
        assert doc["checks"]["table"]["detail"] == f"starting: asking sc://127.0.0.1:{spark} for its warehouse"
        assert "logjam_importer_rows_written_total" in metrics_text(mport)
    finally:
        stop(proc)
