"""Flags plus an optional TOML file, the way every logjam-mesh entry point is configured.

TOML keys are the long flag names (dashes or underscores). Values from the file
become argparse defaults, so a flag on the command line always wins.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tomllib
from typing import Sequence


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file with the same keys as the long flags")


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config:
        try:
            with open(known.config, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            parser.error(f"--config {known.config}: {e}")
        dests = {a.dest for a in parser._actions}
        defaults = {}
        for key, value in data.items():
            dest = key.replace("-", "_")
            if dest not in dests or dest in ("help", "config"):
                parser.error(f"--config {known.config}: unknown key {key!r}")
            defaults[dest] = value
        parser.set_defaults(**defaults)
    return parser.parse_args(argv)


def setup_logging(name: str, verbose: bool = False) -> logging.Logger:
    """Log lines to stderr; supervisord captures them."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(message)s",
    )
    return logging.getLogger(name)
