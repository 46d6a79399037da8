"""`--check` of every entry point: validate what a start would need, print what would run, exit 0 or 1.

Flags and the TOML file are validated by parsing them (runtime/config.py makes a parse
error exit 1 under --check). Each entry point then hands a `Checker` the files it would
read and the directories it would write, and the lines saying what it would start; the
checker prints `ok`/`error` per item on stdout and the verdict is the exit status.
Nothing is started or bound, and nothing is left behind: a directory is tested by
making and removing a temporary directory in it (or, when it does not exist yet, in its
nearest existing parent, where the process would create it).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, TextIO, TypeVar

T = TypeVar("T")


class Checker:
    def __init__(self, prog: str, out: TextIO | None = None) -> None:
        self.prog = prog
        self.out = out or sys.stdout
        self.errors: list[str] = []
        self.lines: list[str] = []
        self.plan: list[str] = []

    def ok(self, text: str) -> None:
        self.lines.append(f"ok     {text}")

    def error(self, text: str) -> None:
        self.errors.append(text)
        self.lines.append(f"error  {text}")

    def warning(self, text: str) -> None:
        """Something that works today but should change (not an error: the verdict stays ok)."""
        self.lines.append(f"warn   {text}")

    def would_run(self, text: str) -> None:
        self.plan.append(text)

    def attempt(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run fn (loading a file, building a context); its exception becomes an error line."""
        try:
            result = fn()
        except (Exception, SystemExit) as e:  # any failure to load is the answer we are after
            self.error(f"{what}: {e}")
            return None
        self.ok(what)
        return result

    def readable_file(self, flag: str, path: str | None) -> None:
        if not path:
            return
        p = Path(path)
        if not p.is_file():
            self.error(f"{flag} {path}: no such file")
        elif not os.access(p, os.R_OK):
            self.error(f"{flag} {path}: not readable")
        else:
            self.ok(f"{flag} {path}: readable")

    def writable_dir(self, flag: str, path: str | os.PathLike[str] | None) -> None:
        if not path:
            return
        p = Path(path).absolute()
        if p.exists() and not p.is_dir():
            self.error(f"{flag} {path}: exists and is not a directory")
            return
        target = p if p.exists() else next((q for q in p.parents if q.exists()), None)
        if target is None or not target.is_dir():
            self.error(f"{flag} {path}: cannot be created ({target} is not a directory)")
            return
        # Try it: os.access says yes to root on a read-only mount or /proc.
        try:
            tempfile.TemporaryDirectory(dir=target, prefix=".logjam-check-").cleanup()
        except OSError as e:
            self.error(f"{flag} {path}: {'not writable' if target == p else f'cannot be created in {target}'} "
                       f"({e.strerror or e})")
            return
        self.ok(f"{flag} {path}: writable" if target == p else f"{flag} {path}: will be created in {target}")

    def port(self, flag: str, value: int | None, zero_ok: bool = False) -> None:
        if value is None:
            return
        if not (0 if zero_ok else 1) <= value <= 65535:
            self.error(f"{flag} {value}: not a TCP port")

    def distinct_ports(self, ports: dict[str, int | None]) -> None:
        seen: dict[int, str] = {}
        for flag, port in ports.items():
            if not port:
                continue
            if port in seen:
                self.error(f"{seen[port]} and {flag} are both {port}")
            seen.setdefault(port, flag)

    def report(self) -> int:
        """Print the findings and the plan; 0 when nothing is wrong."""
        w = self.out.write
        for line in self.lines:
            w(f"{self.prog}: {line}\n")
        if self.errors:
            w(f"{self.prog}: check FAILED ({len(self.errors)} error{'s' if len(self.errors) > 1 else ''}); "
              "would not start\n")
        else:
            for line in self.plan:
                w(f"{self.prog}: would run: {line}\n")
            w(f"{self.prog}: check ok\n")
        self.out.flush()
        return 1 if self.errors else 0
