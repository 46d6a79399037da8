"""`--check` through the real commands: good configs exit 0 and say what would run, broken
ones exit 1 and say what is wrong; nothing is started or left behind. `make check`
(`python -m tools.mesh check`) runs it for every program of supervisord.conf.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from runtime.curve import ensure
from tools.mesh import DEFAULTS
from harness.processes import REPO, command

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def mesh_keys(tmp_path_factory) -> Path:
    """A data dir with the mesh's CURVE keys, as `make up` leaves it: clients find their key there."""
    data = tmp_path_factory.mktemp("data")
    ensure(data / "keys")
    os.environ["LOGJAM_TEST_DATA_DIR"] = str(data)
    return data


def check(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if env is None:
        env = dict(os.environ, LOGJAM_DATA_DIR=os.environ["LOGJAM_TEST_DATA_DIR"])
    return subprocess.run([command(argv[0]), *argv[1:], "--check"], capture_output=True, text=True, timeout=90,
                          cwd=cwd, env=env)


def test_curve_keys(tmp_path: Path) -> None:
    """Clients and devices find the mesh's keys through $LOGJAM_DATA_DIR; without them both fail
    alike and name the command that creates them."""
    env = dict(os.environ, LOGJAM_DATA_DIR=str(tmp_path))
    res = check("logjam-tail", "--sub", "tcp://127.0.0.1:1", env=env)
    assert res.returncode == 1 and "client.key_secret" in res.stdout and "--plaintext" in res.stdout, res.stdout
    assert "is missing: `logjam-keys init` creates the mesh's keys" in res.stdout, res.stdout
    assert check("logjam-tail", "--sub", "tcp://127.0.0.1:1", "--plaintext", env=env).returncode == 0
    good = check("logjam-importer", "--state-dir", str(tmp_path / "state"))
    assert good.returncode == 0 and "CURVE client key" in good.stdout, good.stdout
    dev = check("logjam-device", env=env)
    assert dev.returncode == 1 and "server.key_secret is missing: `logjam-keys init` creates" in dev.stdout, dev.stdout
    assert not (tmp_path / "keys").exists()  # --check creates nothing
    assert check("logjam-device").returncode == 0  # the mesh's keys, as `make up` left them
    assert check("logjam-device", "--allow-plaintext", env=env).returncode == 0  # no key needed
    # A bad flag is refused while the config is built, as a start refuses it.
    bad = check("logjam-device", "--allow-plaintext", "router,nope", env=env)
    assert bad.returncode == 1 and "unknown socket nope" in bad.stderr, bad.stderr


def test_device_good_and_broken(tmp_path: Path) -> None:
    config = tmp_path / "device.toml"
    config.write_text(f'data-dir = "{tmp_path / "data"}"\nmetrics-port = 9999\ndevice-id = 4\n')
    ok = check("logjam-device", "--config", str(config))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "would run: device 4: ROUTER" in ok.stdout
    assert f"journal in {tmp_path / 'data' / 'journal'}" in ok.stdout
    assert "metrics and /healthz on :9999" in ok.stdout
    assert not (tmp_path / "data").exists(), "--check created the data dir"

    (tmp_path / "file").write_text("")
    bad = check("logjam-device", "--data-dir", str(tmp_path / "file" / "data"), "-t", "9605")
    assert bad.returncode == 1
    assert "error  --router-port and --pull-port are both 9605" in bad.stdout
    assert "cannot be created" in bad.stdout and "check FAILED" in bad.stdout

    config.write_text('router-port = "nine"\n')
    assert check("logjam-device", "--config", str(config)).returncode == 1
    config.write_text("no-such-key = 1\n")
    res = check("logjam-device", "--config", str(config))
    assert res.returncode == 1 and "unknown key 'no-such-key'" in res.stderr
    res = check("logjam-device", "--no-such-flag")
    assert res.returncode == 1 and "unrecognized arguments" in res.stderr


def test_bridge_tls_files_are_loaded(tmp_path: Path, certs) -> None:
    good = check("logjam-bridge", "lumberjack", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                 "--tls-client-ca", str(certs.ca), "--metrics-port", "9632")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "TLS (client certificates: required; SIGHUP reloads the files)" in good.stdout
    # A key that belongs to another certificate only fails when OpenSSL loads the pair.
    mismatch = check("logjam-bridge", "lumberjack", "--tls-cert", str(certs.server_cert),
                     "--tls-key", str(certs.client_key))
    assert mismatch.returncode == 1 and "KEY_VALUES_MISMATCH" in mismatch.stdout, mismatch.stdout
    missing = check("logjam-bridge", "courier", "--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", str(certs.server_key))
    assert missing.returncode == 1 and f"--tls-cert {tmp_path / 'nope.crt'}: no such file" in missing.stdout
    # Flags that do not go together are refused while the config is built, as a start refuses them.
    nokey = check("logjam-bridge", "courier", "--tls-cert", str(certs.server_cert))
    assert nokey.returncode == 1 and "--tls-cert needs --tls-key" in nokey.stderr
    noca = check("logjam-bridge", "courier", "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                 "--tls-client-auth", "optional")
    assert noca.returncode == 1 and "--tls-client-auth optional needs --tls-client-ca" in noca.stderr


def test_bridge_data_dir_and_device(tmp_path: Path) -> None:
    good = check("logjam-bridge", "segment", "--data-dir", str(tmp_path / "seg"))
    assert good.returncode == 0 and f"store in {tmp_path / 'seg'}" in good.stdout
    (tmp_path / "seg-file").write_text("")
    bad = check("logjam-bridge", "rustlog", "--data-dir", str(tmp_path / "seg-file"))
    assert bad.returncode == 1 and "exists and is not a directory" in bad.stdout
    bad = check("logjam-bridge", "rustlog", "--device", "127.0.0.1:9604")
    assert bad.returncode == 1 and "--device 127.0.0.1:9604: not tcp://HOST:PORT" in bad.stderr
    assert check("logjam-bridge", "nosuch").returncode == 1


@pytest.mark.parametrize("argv,error", [
    (["courier", "--ack-interval", "9"], "--ack-interval must be in (0, 5] seconds"),
    (["lumberjack", "--max-decompressed-size", str(2**32)], "decompressed size limits must be between 1 and 2^32-1"),
    (["rustlog", "--app-env-map", "t=NOT VALID"], "--app-env-map 't=NOT VALID'"),
    (["segment", "--device", "udp://h:1"], "--device udp://h:1: not tcp://HOST:PORT"),
])
def test_bridge_check_refuses_what_a_start_refuses(argv: list[str], error: str) -> None:
    """One config path: --check reports the error a start exits with, built by the same code."""
    checked = check("logjam-bridge", *argv)
    assert checked.returncode == 1 and error in checked.stderr, checked.stdout + checked.stderr
    started = subprocess.run([command("logjam-bridge"), *argv, "--listen", "127.0.0.1:0", "--plaintext"],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 2 and error in started.stderr, started.stderr


def test_device_instance_and_importer_owning_devices(tmp_path: Path) -> None:
    """Device K of a host (--instance) and an importer that owns every N-th --sub endpoint."""
    dev = check("logjam-device", "--instance", "2", "--instance-port-step", "10", "-d", "1",
                "--data-dir", str(tmp_path / "device"), "--metrics-port", "9631")
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert "device 3: ROUTER tcp://*:9624, PULL :9625, PUB :9626, stats :9641" in dev.stdout
    assert f"journal in {tmp_path / 'device-2' / 'journal'}" in dev.stdout and "replay on :9627" in dev.stdout
    assert "metrics and /healthz on :9651" in dev.stdout
    subs = ",".join(f"tcp://127.0.0.1:{9606 + 100 * k}" for k in range(3))
    imp = check("logjam-importer", "--sub", subs, "--replay-ports", "9607,9707,9807", "--worker", "0", "--workers", "2",
                "--own-devices", "--state-dir", str(tmp_path / "state"))
    assert imp.returncode == 0, imp.stdout + imp.stderr
    assert "(worker 0 of 2, owning its devices): subscribe to tcp://127.0.0.1:9606, tcp://127.0.0.1:9806," in imp.stdout
    assert "replay from port 9607,9807" in imp.stdout
    bad = check("logjam-importer", "--sub", subs, "--worker", "3", "--workers", "4", "--own-devices")
    assert bad.returncode == 1 and "importer 3 of 4 would own no device" in bad.stderr
    bad = check("logjam-importer", "--sub", subs, "--replay-ports", "9607,9707")
    assert bad.returncode == 1 and "--replay-ports needs one port per --sub endpoint (3)" in bad.stderr


def test_importer_spark_sql(tmp_path: Path) -> None:
    imp = check("logjam-importer", "--worker", "1", "--workers", "2", "--state-dir", str(tmp_path / "state"),
                "--metrics-port", "9640", "--metrics-port-offset", "1")
    assert imp.returncode == 0, imp.stdout + imp.stderr
    assert "importer (worker 1 of 2)" in imp.stdout and "metrics and /healthz on :9641" in imp.stdout
    bad = check("logjam-importer", "--worker", "2", "--workers", "2")
    assert bad.returncode == 1 and "--worker must be in 0..1" in bad.stderr
    bad = check("logjam-importer", "--spark", "http://x", "--state-dir", "/proc/nope")
    assert bad.returncode == 1 and "--spark http://x: not sc://" in bad.stdout and "/proc/nope" in bad.stdout

    spark = check("logjam-spark", "--warehouse", str(tmp_path / "w"), "--metastore", str(tmp_path / "m"),
                  "--port", "15099", "--jdbc-port", "0")
    assert spark.returncode == 0, spark.stdout + spark.stderr
    assert "spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer" in spark.stdout
    assert not (tmp_path / "w").exists() and not (tmp_path / "m").exists()
    bad = check("logjam-spark", "--conf", "no-equals-sign", "--port", "10000")
    assert bad.returncode == 1
    assert "--conf wants KEY=VALUE" in bad.stdout and "--port and --jdbc-port are both 10000" in bad.stdout

    assert check("logjam-sql", "SELECT 1").returncode == 0
    bad = check("logjam-sql")
    assert bad.returncode == 1 and "give a query" in bad.stdout


def test_send_and_tail(certs) -> None:
    good = check("logjam-send", "courier", "--to", "127.0.0.1:5043", "--tls-ca", str(certs.ca), "a", "b")
    assert good.returncode == 0 and "send 2 message argument(s) as courier to 127.0.0.1:5043 with TLS" in good.stdout
    bad = check("logjam-send", "logjam", "--tls")
    assert bad.returncode == 1 and "without TLS" in bad.stdout
    assert check("logjam-tail", "--sub", "tcp://127.0.0.1:1", "--json").returncode == 0
    bad = check("logjam-tail", "--sub", "127.0.0.1:1")
    assert bad.returncode == 1 and "expected an endpoint" in bad.stderr


def mesh_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    env.update(LOGJAM_DATA_DIR=str(tmp_path / "data"), **overrides)
    return env


def test_make_check_good_and_broken_mesh(tmp_path: Path) -> None:
    good = subprocess.run(["make", "-s", "check"], cwd=REPO, env=mesh_env(tmp_path), capture_output=True, text=True,
                          timeout=110)
    assert good.returncode == 0, good.stdout + good.stderr
    for name in ("logjam-spark", "logjam-device", "logjam-device-1", "bridge-lumberjack", "bridge-courier",
                 "bridge-segment", "bridge-rustlog", "bridge-otlp", "bridge-syslog", "bridge-relp",
                 "logjam-importer-0", "logjam-importer-1"):
        assert f"== {name}: ok" in good.stdout
    assert "mesh check ok: 12 programs" in good.stdout

    # Two programs on one port, and a device id the device refuses.
    bad = subprocess.run([command("python"), "-m", "tools.mesh", "check"], cwd=REPO,
                         env=mesh_env(tmp_path, LOGJAM_COURIER_PORT="5044", LOGJAM_DEVICE_ID="-1"),
                         capture_output=True, text=True, timeout=110)
    assert bad.returncode == 1, bad.stdout
    assert "== logjam-device: FAILED (exit 1)" in bad.stdout
    assert "port 5044 is used twice" in bad.stdout
    assert "mesh check FAILED" in bad.stdout

    # More importers than devices: each importer owns whole devices, so one would own none.
    bad = subprocess.run([command("python"), "-m", "tools.mesh", "check"], cwd=REPO,
                         env=mesh_env(tmp_path, LOGJAM_DEVICES="2", LOGJAM_IMPORTERS="3"),
                         capture_output=True, text=True, timeout=110)
    assert bad.returncode == 1, bad.stdout
    assert "== mesh: LOGJAM_IMPORTERS=3 > LOGJAM_DEVICES=2" in bad.stdout
    assert "== logjam-importer-2: FAILED (exit 1)" in bad.stdout and "would own no device" in bad.stdout
    up = subprocess.run([command("python"), "-m", "tools.mesh", "up"], cwd=REPO,
                        env=mesh_env(tmp_path, LOGJAM_DEVICES="1", LOGJAM_IMPORTERS="2"),
                        capture_output=True, text=True, timeout=60)
    assert up.returncode == 2 and "LOGJAM_IMPORTERS=2 > LOGJAM_DEVICES=1" in up.stderr, up.stderr
