"""Flags plus an optional TOML file, the way every logjam-mesh entry point is configured.

TOML keys are the long flag names (dashes or underscores). Values from the file
become argparse defaults, so a flag on the command line always wins. Abbreviated flags
are refused everywhere (`--conf` is a flag of its own, not `--config`): build parsers
with `allow_abbrev=False`, which `parse_args` checks. `--check` (runtime/check.py) rides
along with `--config`; under it a bad flag or file exits 1 instead of argparse's 2.

An entry point turns the flags into its typed config once (`parse_config`, with the
config's classmethod `from_flags`, which calls this module's `from_flags` to fill a
dataclass's fields from the flags of the same names), and passes that frozen object down,
never the `argparse.Namespace`: `--check` reads the object a start runs with.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tomllib
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file with the same keys as the long flags")
    parser.add_argument("--check", action="store_true",
                        help="validate the flags, the config, TLS files and directories, print what would run, "
                             "and exit 0 (ok) or 1 without starting anything")


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
               validate: Callable[[argparse.ArgumentParser, argparse.Namespace], None] | None = None,
               ) -> argparse.Namespace:
    """Flags over TOML; `validate` may call parser.error for what argparse cannot check."""
    if parser.allow_abbrev:
        raise TypeError(f"{parser.prog}: build the parser with allow_abbrev=False")
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--check", action="store_true")
    known, _ = pre.parse_known_args(argv)
    try:
        args = _parse(parser, known.config, argv)
        if validate is not None:
            validate(parser, args)
        return args
    except SystemExit as e:
        # Under --check every failure is exit 1 (argparse's usage errors are 2), --help stays 0.
        if known.check and e.code not in (0, None):
            raise SystemExit(1) from None
        raise


def parse_config(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                 build: Callable[[argparse.Namespace], T]) -> tuple[argparse.Namespace, T]:
    """`parse_args`, then the typed config `build` makes of the flags, once; a ValueError from
    `build` is a usage error like a bad flag (exit 2, or 1 under --check)."""
    built: list[T] = []

    def checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        try:
            built.append(build(args))
        except ValueError as e:
            parser.error(str(e))

    args = parse_args(parser, argv, checked)
    return args, built[0]


def from_flags(cls: type[T], args: argparse.Namespace, *, prefix: str = "", **values: Any) -> T:
    """`cls` (a dataclass) with each field read from the flag of the same name (after `prefix`:
    `prefix="tls_"` reads field `cert` from `--tls-cert`), except `values`."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    return cls(**{name: values[name] if name in values else getattr(args, prefix + name) for name in names})


def _parse(parser: argparse.ArgumentParser, config: str | None, argv: Sequence[str] | None) -> argparse.Namespace:
    if config:
        try:
            with open(config, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            parser.error(f"--config {config}: {e}")
        dests = {a.dest for a in parser._actions}
        defaults = {}
        for key, value in data.items():
            dest = key.replace("-", "_")
            if dest not in dests or dest in ("help", "config", "check"):
                parser.error(f"--config {config}: unknown key {key!r}")
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


# One fsync vocabulary for every store (the device journal, the segment and rustlog stores).
FSYNC_POLICIES = ("always", "interval", "never")
# Spellings the device journal used before, still accepted in flags and TOML.
FSYNC_ALIASES = {"batch": "always", "os": "never"}


def fsync_policy(text: str) -> str:
    """An argparse `type`: one of FSYNC_POLICIES (or an old alias of one)."""
    policy = FSYNC_ALIASES.get(text, text)
    if policy not in FSYNC_POLICIES:
        raise argparse.ArgumentTypeError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, not {text!r}")
    return policy
