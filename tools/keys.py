"""`logjam-keys`: the one way to create and hand out the mesh's CURVE keys (docs/security.md).

    logjam-keys init            the devices' pair, the bundled clients' pair and the allowlist
    logjam-keys add NAME        a key pair NAME for one more client, admitted to the allowlist
    logjam-keys add NAME --public FILE   admit a public certificate made elsewhere, as NAME
    logjam-keys revoke NAME     take NAME out of the allowlist

Every command works on `--keys DIR` (default `$LOGJAM_DATA_DIR/keys`, else `./data/keys`, where
every process looks). `make up` runs `init` before it starts anything; `init` and `add` keep
what exists. A device reads its allowlist again on SIGHUP. The files and their modes are
runtime/curve.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from logjam import curve as files
from runtime import curve

PROG = "logjam-keys"
SIGHUP = "send the devices SIGHUP to apply it (`supervisorctl signal HUP all`, or kill -HUP <pid>)"


def build_parser() -> argparse.ArgumentParser:
    keys = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    keys.add_argument("--keys", metavar="DIR", type=Path,
                      help="the mesh's keys directory (default $LOGJAM_DATA_DIR/keys, else ./data/keys)")
    p = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("init", parents=[keys], allow_abbrev=False,
                   help="create the mesh's keys where missing: server and client pairs, allowed/client.key")
    add = sub.add_parser("add", parents=[keys], allow_abbrev=False,
                         help="create a key pair NAME (NAME.key, NAME.key_secret) and admit it")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--public", metavar="FILE", type=Path,
                     help="admit this public certificate (made on the client's host) instead of creating a pair")
    revoke = sub.add_parser("revoke", parents=[keys], allow_abbrev=False, help="take NAME out of the allowlist")
    revoke.add_argument("name", metavar="NAME")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keys: Path = args.keys or files.default_dir()
    try:
        return run(args, keys)
    except (ValueError, OSError) as e:  # KeyFileError is a ValueError: it says what is wrong and what to do
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace, keys: Path) -> int:
    if args.command == "init":
        made = curve.ensure(keys)
        print(f"created {', '.join(made)} in {keys}" if made else f"{keys} already holds the mesh's keys")
        return 0
    if args.command == "add" and args.public is not None:
        print(f"admitted {curve.admit(keys, args.name, args.public)}; {SIGHUP}")
        return 0
    if args.command == "add":
        made = curve.create_pair(keys, args.name)
        secret, public = files.secret_file(keys, args.name), files.public_file(keys, args.name)
        admitted = curve.admit(keys, args.name, public)
        print(f"{'created' if made else 'kept'} {secret} and {public}; admitted {admitted}; {SIGHUP}")
        print(f"the client connects with --curve-secret {secret} --curve-server-key {files.public_file(keys, files.SERVER)}")
        return 0
    removed = curve.revoke(keys, args.name)
    if removed is None:
        print(f"{PROG}: error: {args.name} is not in the allowlist {keys / files.ALLOWED}", file=sys.stderr)
        return 1
    print(f"removed {removed}; {SIGHUP}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
