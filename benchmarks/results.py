"""Every benchmark's result as data: what it ran, on what hardware, its figures and its targets.

A benchmark makes one `Run` when it starts (`run = Run("codec")`), takes its targets from
benchmarks/targets.toml through it (`run.target("lowest_ratio")`), records what it measured
(`run.figure(...)` for a number, `run.check(...)` for a number held against a target) and
calls `run.save()` at the end. That writes `build/results/<benchmark>.json` (or
`<benchmark>.<variant>.json`; `LOGJAM_BENCH_RESULTS` names another directory), the latest
result of that benchmark: benchmarks/perf_doc.py (`make perf-doc`) renders docs/performance.md
from these files. What a benchmark prints is its own; this module prints nothing.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGETS_FILE = Path(__file__).with_name("targets.toml")
# The settings a result depends on besides its flags: recorded with the command.
ENVIRONMENT = ("LOGJAM_NATIVE", "RUSTLOG_BENCH_BATCHES", "RUSTLOG_BENCH_BRIDGE_CMD")


def results_dir() -> Path:
    return Path(os.environ.get("LOGJAM_BENCH_RESULTS") or REPO / "build" / "results")


def load_targets(path: Path = TARGETS_FILE) -> dict[str, dict[str, Any]]:
    """targets.toml: benchmark -> its table (`run`, `about`, and one inline table per target)."""
    return tomllib.loads(path.read_text())


@dataclass(frozen=True, slots=True)
class Target:
    """One target: the measured value must be at least `min`, at most `max`, or equal to `is`."""

    name: str
    bound: str  # "min", "max" or "is"
    value: float | bool
    unit: str
    why: str

    def met(self, measured: float | bool) -> bool:
        if self.bound == "is":
            return measured == self.value
        if isinstance(measured, float) and math.isnan(measured):
            return False
        return measured >= self.value if self.bound == "min" else measured <= self.value

    def text(self) -> str:
        sign = {"min": ">=", "max": "<=", "is": "is"}[self.bound]
        value = str(self.value).lower() if isinstance(self.value, bool) else f"{self.value:g}"
        unit = "" if not self.unit else self.unit if self.unit == "x" else f" {self.unit}"
        return f"{sign} {value}{unit}"


def targets_of(benchmark: str, table: dict[str, dict[str, Any]] | None = None) -> dict[str, Target]:
    """The targets of one benchmark from targets.toml (every inline table of its section)."""
    section = (table if table is not None else load_targets()).get(benchmark)
    if section is None:
        raise KeyError(f"benchmarks/targets.toml has no [{benchmark}]")
    out = {}
    for name, spec in section.items():
        if not isinstance(spec, dict):
            continue
        bounds = [b for b in ("min", "max", "is") if b in spec]
        if len(bounds) != 1 or "why" not in spec:
            raise ValueError(f"targets.toml [{benchmark}] {name}: needs one of min/max/is, and why")
        out[name] = Target(name, bounds[0], spec[bounds[0]], spec.get("unit", ""), spec["why"])
    return out


def hardware() -> dict[str, Any]:
    """What the result was measured on: CPU model, cores, memory, Python, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": memory,
            "python": platform.python_version(), "os": f"{platform.system()} {platform.release()} {platform.machine()}"}


def _source() -> dict[str, Any] | None:
    """The checkout the benchmark ran from (commit, uncommitted changes), for the record only."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "uncommitted_changes": bool(dirty)}


def command_line(argv: list[str] | None = None) -> str:
    """How to run it again: the settings of ENVIRONMENT that were set, then the script and its arguments."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else Path("?")
    try:
        argv[0] = str(script.relative_to(REPO))
    except ValueError:
        pass
    env = [f"{k}={shlex.quote(os.environ[k])}" for k in ENVIRONMENT if os.environ.get(k)]
    return " ".join([*env, ".venv/bin/python", *map(shlex.quote, argv)])


class Run:
    """One run of one benchmark: its targets in, its figures and verdicts out (`save`)."""

    def __init__(self, benchmark: str, *, variant: str | None = None, argv: list[str] | None = None) -> None:
        self.benchmark, self.variant = benchmark, variant
        self.targets = targets_of(benchmark)
        self.command = command_line(argv)
        self.figures: dict[str, dict[str, Any]] = {}
        self.checks: dict[str, dict[str, Any]] = {}
        self.started = time.time()
        self._t0 = time.monotonic()

    def target(self, name: str) -> Any:
        """A target's value (what the benchmark prints beside its figure)."""
        return self.targets[name].value

    def figure(self, name: str, value: Any, unit: str = "") -> Any:
        """A measured number without a target of its own; returns `value`."""
        self.figures[name] = {"value": _plain(value), "unit": unit}
        return value

    def check(self, name: str, measured: Any, label: str | None = None) -> bool:
        """`measured` held against target `name` (once per `label` when one target covers several
        measurements, e.g. every lookup query); returns whether it is met."""
        target = self.targets[name]
        met = target.met(measured)
        self.checks[name if label is None else f"{name}[{label}]"] = {
            "target": name, "label": label, "bound": target.bound, "limit": _plain(target.value),
            "unit": target.unit, "measured": _plain(measured), "met": met}
        return met

    def save(self) -> Path:
        """Write the result; the file of an earlier run of the same benchmark (and variant) is replaced."""
        name = self.benchmark + (f".{self.variant}" if self.variant else "")
        out = results_dir()
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            "benchmark": self.benchmark, "variant": self.variant, "command": self.command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "seconds": round(time.monotonic() - self._t0, 1), "hardware": hardware(), "source": _source(),
            "figures": self.figures, "checks": self.checks,
            "passed": all(c["met"] for c in self.checks.values()) if self.checks else None,
        }
        path = out / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(path)
        return path


def _plain(value: Any) -> Any:
    """A value JSON can hold: numpy scalars and the like as Python numbers, NaN and inf as None."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) or hasattr(value, "__float__"):
        f = float(value)
        if math.isnan(f) or math.isinf(f):
            return None
        return int(value) if isinstance(value, int) else f
    return value
