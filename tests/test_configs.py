"""Each entry point turns its flags and TOML into one frozen config, and never changes the Namespace doing it."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from bridges.cli import build_parser as bridge_parser, load_protocol
from bridges.host.config import BridgeConfig, TLSConfig
from devices.cli import build_parser as device_parser
from devices.config import DeviceConfig
from importer.cli import build_parser as importer_parser
from importer.config import DEFAULT_SUB, ImporterConfig
from logjam import defaults
from runtime.config import parse_config
from runtime.curve import ServerCurve
from harness.processes import REPO
from tools.mesh import DEFAULTS
from tools.send import SendConfig, build_parser as send_parser
from tools.sql import SqlConfig, build_parser as sql_parser
from tools.tail import TailConfig, build_parser as tail_parser
from warehouse.config import MaintenanceConfig, SparkServerConfig
from warehouse.spark_jvm import spark_conf
from warehouse.spark_server import build_parser as spark_parser

pytestmark = pytest.mark.timeout(30)


def built(parser: argparse.ArgumentParser, argv: list[str], build: Callable[[argparse.Namespace], Any]) -> Any:
    """The config, after checking that building it left the parsed flags as they were."""
    seen: list[dict[str, Any]] = []

    def recording(args: argparse.Namespace) -> Any:
        before = dict(vars(args))
        config = build(args)
        seen.append(before == vars(args))
        return config

    _, config = parse_config(parser, argv, recording)
    assert seen == [True], "building the config changed the Namespace"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, dataclasses.fields(config)[0].name, None)
    return config


def test_importer_config_from_flags_and_toml(tmp_path: Path) -> None:
    toml = tmp_path / "importer.toml"
    toml.write_text('sub = ["tcp://a:1,tcp://b:2", "tcp://c:3"]\nreplay-ports = "5,6,7"\nworker = 1\nworkers = 2\n')
    config = built(importer_parser(), ["--config", str(toml), "--own-devices", "--metrics-port", "9000",
                                       "--metrics-port-offset", "1"], ImporterConfig.from_flags)
    assert config.subs == ("tcp://a:1", "tcp://b:2", "tcp://c:3") and config.owned == ("tcp://b:2",)
    assert dict(config.replay_port_of) == {"tcp://a:1": 5, "tcp://b:2": 6, "tcp://c:3": 7}
    assert config.replay_ports(config.owned) == "6" and config.metrics_port == 9001 and config.worker_id == 1
    plain = built(importer_parser(), [], ImporterConfig.from_flags)
    assert plain.subs == (DEFAULT_SUB,) and plain.metrics_port is None and plain.worker_id == 0


def test_device_config_from_flags_and_toml(tmp_path: Path) -> None:
    """--instance K is applied while the config is built (id, every port, the journal's directory),
    and the CURVE flags become a typed ServerCurve without reading a key file."""
    toml = tmp_path / "device.toml"
    toml.write_text(f'data-dir = "{tmp_path / "dev"}"\ndevice-id = 4\nmetrics-port = 9631\ninstance-port-step = 10\n')
    config = built(device_parser(), ["--config", str(toml), "--instance", "2", "-x", "lz4", "--no-ipc",
                                     "--keys", str(tmp_path / "keys"), "--allow-plaintext", "pull"],
                   DeviceConfig.from_flags)
    assert config.device_id == 6 and config.data_dir == f"{tmp_path / 'dev'}-2" and not config.ipc
    assert (config.router_port, config.pub_port, config.replay_port, config.metrics_port) == (
        defaults.ROUTER_PORT + 20, defaults.PUB_PORT + 20, defaults.REPLAY_PORT + 20, 9651)
    assert config.compress == 3
    assert config.curve == ServerCurve(tmp_path / "keys" / "server.key_secret", tmp_path / "keys" / "allowed",
                                       frozenset({"pull"}))
    plain = built(device_parser(), ["--allow-plaintext"], DeviceConfig.from_flags)
    assert plain.curve is not None and plain.curve.secret is None and not plain.curve.secured("router")
    assert (plain.router_port, plain.metrics_port, plain.data_dir) == (defaults.ROUTER_PORT, None, None)


@pytest.mark.parametrize("argv,error", [
    (["-d", str(2**32 - 1), "--instance", "1"], "does not fit in 32 bits"),
    (["--allow-plaintext", "router,nope"], "unknown socket nope"),
])
def test_device_refusals_are_usage_errors(argv: list[str], error: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        parse_config(device_parser(), argv, DeviceConfig.from_flags)
    assert e.value.code == 2 and error in capsys.readouterr().err


def test_importer_refusals_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as e:
        parse_config(importer_parser(), ["--own-devices"], ImporterConfig.from_flags)
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        parse_config(importer_parser(), ["--own-devices", "--check"], ImporterConfig.from_flags)
    assert e.value.code == 1


def test_spark_server_config_carries_its_maintenance(tmp_path: Path) -> None:
    config = built(spark_parser(), ["--warehouse", str(tmp_path / "w"), "--metastore", str(tmp_path / "m"),
                                    "--no-compact", "--compact-min-files", "4", "--conf", "a.b=c"],
                   SparkServerConfig.from_flags)
    assert config.maintenance == MaintenanceConfig(compact=False, compact_min_files=4)
    assert config.warehouse == str((tmp_path / "w").resolve()) and config.metastore == (tmp_path / "m").resolve()
    assert spark_conf(config)["a.b"] == "c"


def test_sql_maintenance_is_logjam_spark_defaults_with_its_own_flags() -> None:
    config = built(sql_parser(), ["--compact", "--retention-days", "3", "--vacuum-grace-hours", "2", "--older-than", "1m"],
                   SqlConfig.from_flags)
    m = config.maintenance
    assert (m.retention_days, m.vacuum_grace_hours, m.compact_older_than) == (3, 2, 60.0)
    d = MaintenanceConfig()
    assert (m.compact_target_bytes, m.compact_min_files, m.checkpoint_every) == (
        d.compact_target_bytes, d.compact_min_files, d.checkpoint_every)


def test_maintenance_flags_are_checked_where_the_config_is_built() -> None:
    with pytest.raises(SystemExit) as e:
        parse_config(sql_parser(), ["--compact", "--vacuum-grace-hours", "-1"], SqlConfig.from_flags)
    assert e.value.code == 2
    with pytest.raises(ValueError, match="--checkpoint-every must be at least 1 commit"):
        MaintenanceConfig(checkpoint_every=0)


def test_tail_and_send_configs() -> None:
    tail = built(tail_parser(), ["--app-env", "a", "--app-env", "b", "--json"], TailConfig.from_flags)
    assert (tail.sub, tail.app_env, tail.topic, tail.mode) == (("tcp://127.0.0.1:9606",), ("a", "b"), (), "json")
    send = built(send_parser(), ["courier", "x", "--to", "h:1", "y"], SendConfig.from_flags)
    assert (send.protocol, send.messages, send.to) == ("courier", ("x", "y"), "h:1")


def bridge(protocol: str, argv: list[str]) -> BridgeConfig:
    cls = load_protocol(protocol)
    return built(bridge_parser(cls), argv, BridgeConfig.builder(cls.Config, cls.knobs))


def test_bridge_config_from_flags_and_toml(tmp_path: Path) -> None:
    toml = tmp_path / "courier.toml"
    toml.write_text('device = ["tcp://a:1,tcp://b:2"]\ntls-cert = "c.pem"\ntls-key = "k.pem"\n'
                    'tls-client-ca = "ca.pem"\nbatch-size = 100\nmax-event-size = 5000\n')
    config = bridge("courier", ["--config", str(toml), "--tls-handshake-timeout", "3", "--pipeline-depth", "4"])
    assert config.host.device == ("tcp://a:1", "tcp://b:2")
    assert config.host.tls == TLSConfig(cert="c.pem", key="k.pem", client_ca="ca.pem", handshake_timeout=3.0)
    assert config.host.tls.auth == "required"
    assert (config.host.pipeline_depth, config.host.batch_size, config.host.keepalive_interval) == (4, 100, 2.0)
    assert config.protocol.max_event_size == 5000 and config.host.deprecated == ()


@pytest.mark.parametrize("protocol,knobs", [
    ("lumberjack", (2, 2048, 2.0)), ("courier", (16, 256, 2.0)), ("segment", (32, None, 10.0)),
    ("rustlog", (None, None, None)),
])
def test_bridge_shared_knobs_have_one_name_and_each_protocols_default(protocol: str, knobs: tuple) -> None:
    host = bridge(protocol, []).host
    assert (host.pipeline_depth, host.batch_size, host.keepalive_interval) == knobs


@pytest.mark.parametrize("protocol,old,new,value", [
    ("lumberjack", "pipeline", "pipeline_depth", 5),
    ("lumberjack", "max-batch", "batch_size", 77),
    ("courier", "max-pending-batches", "pipeline_depth", 3),
    ("courier", "ack-interval", "keepalive_interval", 1.5),
    ("segment", "max-pending-appends", "pipeline_depth", 9),
])
def test_bridge_old_knob_names_still_work_for_one_release(tmp_path: Path, protocol: str, old: str, new: str,
                                                           value: float) -> None:
    renamed = (f"--{old}", "--" + new.replace("_", "-"))
    flagged = bridge(protocol, [f"--{old}", str(value)]).host
    assert getattr(flagged, new) == value and flagged.deprecated == (renamed,)
    toml = tmp_path / "old.toml"
    toml.write_text(f"{old} = {value}\n")
    from_file = bridge(protocol, ["--config", str(toml)]).host
    assert getattr(from_file, new) == value and from_file.deprecated == (renamed,)
    # Given both, the new name wins.
    both = bridge(protocol, [f"--{old}", str(value), renamed[1], "1"]).host
    assert getattr(both, new) == 1


@pytest.mark.parametrize("protocol,argv", [
    ("rustlog", ["--pipeline", "2"]), ("segment", ["--batch-size", "2"]), ("lumberjack", ["--ack-interval", "1"]),
])
def test_a_bridge_takes_only_the_knobs_it_has(protocol: str, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bridge(protocol, argv)
    assert e.value.code == 2


def test_bridge_refusals_are_usage_errors() -> None:
    for protocol, argv in [("courier", ["--keepalive-interval", "6"]), ("courier", ["--ack-interval", "0"]),
                           ("lumberjack", ["--tls-cert", "c.pem"]), ("segment", ["--device", "h:1"])]:
        with pytest.raises(SystemExit) as e:
            bridge(protocol, argv)
        assert e.value.code == 2, (protocol, argv)


def test_supervisord_conf_header_lists_every_mesh_default() -> None:
    """The header comment of supervisord.conf names every variable tools/mesh.py gives a default, with
    that default, and no other."""
    header = (REPO / "supervisord.conf").read_text().split("\n[", 1)[0]
    listed = dict(re.findall(r"\b(LOGJAM_\w+)=(\S+)", header))

    def normal(key: str, value: str) -> str | Path:
        return Path(value) if key == "LOGJAM_DATA_DIR" else value

    assert {k: normal(k, v) for k, v in listed.items()} == {k: normal(k, v) for k, v in DEFAULTS.items()}
