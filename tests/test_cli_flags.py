"""Every flag each entry point documents in --help parses, abbreviations are refused, and
`logjam-spark --conf KEY=VALUE` is `--conf`, not an abbreviation of `--config` (issue 17).

The flags come from each real command's `--help` output; each is then parsed on its own
(with a value its type accepts) through the same `runtime.config.parse_args` the entry
points use, which is where the TOML pre-parser took `--conf` for `--config`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from bridges.cli import PROTOCOLS, build_parser as bridge_parser, load_protocol
from devices.cli import build_parser as device_parser
from importer.cli import build_parser as importer_parser
from warehouse.spark_server import build_parser as spark_parser
from tools.sql import build_parser as sql_parser
from runtime.config import parse_args
from tools.send import build_parser as send_parser
from tools.tail import build_parser as tail_parser
from harness.processes import command

# command line prefix, parser factory, positional arguments a parse needs
ENTRY_POINTS: dict[str, tuple[list[str], Callable[[], argparse.ArgumentParser], list[str]]] = {
    "logjam-device": (["logjam-device"], device_parser, []),
    "logjam-importer": (["logjam-importer"], importer_parser, []),
    "logjam-spark": (["logjam-spark"], spark_parser, []),
    "logjam-sql": (["logjam-sql"], sql_parser, []),
    "logjam-send": (["logjam-send"], send_parser, ["lumberjack"]),
    "logjam-tail": (["logjam-tail"], tail_parser, []),
    **{f"logjam-bridge {p}": (["logjam-bridge", p], lambda p=p: bridge_parser(load_protocol(p)), [])
       for p in PROTOCOLS},
}

# Values tried in order until the flag's type accepts one.
CANDIDATES = ["7", "none", "127.0.0.1:7", "tcp://127.0.0.1:7"]


def help_flags(argv: list[str]) -> set[str]:
    out = subprocess.run([command(argv[0]), *argv[1:], "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # The option list: each flag starts a line indented by two (help text wraps deeper).
    return set(re.findall(r"^ {2}(?:-\w(?: \S+)?, )?(--[a-z][a-z0-9-]*)", out.stdout, re.M)) - {"--help"}


def sample(action: argparse.Action, tmp_path: Path) -> list[str]:
    """What to put after the flag: nothing for switches, else a value the flag accepts."""
    if action.nargs == 0:
        return []
    if action.dest == "config":
        path = tmp_path / "empty.toml"
        path.write_text("")
        return [str(path)]
    if action.choices:
        return [str(list(action.choices)[-1])]
    if action.dest == "conf":
        return ["spark.test.key=value"]
    convert = action.type or str
    for value in CANDIDATES:
        try:
            convert(value)  # type: ignore[operator]
            return [value]
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
    raise AssertionError(f"no sample value for {action.option_strings}")


def parsed(ns: argparse.Namespace, action: argparse.Action, values: list[str]) -> bool:
    """The flag's value landed where the program reads it."""
    got = getattr(ns, action.dest)
    if action.nargs == 0:
        return got == action.const
    want = action.type(values[0]) if callable(action.type) else values[0]
    if isinstance(got, list) and not isinstance(want, list):
        return got[-1] == want
    return got == want


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_documented_flag_parses(name: str, tmp_path: Path) -> None:
    argv, factory, positionals = ENTRY_POINTS[name]
    documented = help_flags(argv)
    parser = factory()
    assert not parser.allow_abbrev
    # Hidden flags are old names kept for one release (bridges' shared knobs); they parse too.
    actions = {s: a for a in parser._actions for s in a.option_strings if s.startswith("--")}
    hidden = {s for s, a in actions.items() if a.help == argparse.SUPPRESS}
    assert documented == set(actions) - hidden - {"--help"}, "--help and the parser disagree"
    documented |= hidden
    for flag in sorted(documented):
        action = actions[flag]
        values = sample(action, tmp_path)
        ns = parse_args(factory(), [*positionals, flag, *values])
        assert parsed(ns, action, values), (flag, values, getattr(ns, action.dest))


@pytest.mark.timeout(30)
def test_logjam_spark_conf_is_not_an_abbreviation_of_config(tmp_path: Path) -> None:
    ns = parse_args(spark_parser(), ["--conf", "spark.sql.shuffle.partitions=4", "--conf", "a.b=c"])
    assert ns.conf == ["spark.sql.shuffle.partitions=4", "a.b=c"] and ns.config is None
    config = tmp_path / "spark.toml"
    config.write_text('driver-memory = "1g"\n')
    ns = parse_args(spark_parser(), ["--conf", "x.y=z", "--config", str(config)])
    assert ns.conf == ["x.y=z"] and ns.driver_memory == "1g"
    # Through the real command: --check prints the spark-submit line it would run, --conf included.
    out = subprocess.run([command("logjam-spark"), "--check", "--conf", "spark.test.key=42",
                          "--warehouse", str(tmp_path / "w"), "--metastore", str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--conf spark.test.key=42" in out.stdout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv", [["logjam-spark", "--metrics", "1"], ["logjam-device", "--data", "x"],
                                  ["logjam-importer", "--state", "x"], ["logjam-tail", "--hear"]])
def test_abbreviations_are_refused(argv: list[str]) -> None:
    out = subprocess.run([command(argv[0]), *argv[1:], "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "unrecognized arguments" in out.stderr, out.stderr
