"""Render docs/performance.md from benchmarks/targets.toml and the latest results (`make perf-doc`).

One section per benchmark of targets.toml, in its order: what the benchmark measures (its
docstring's first line), the command that runs it, and a table of its targets, each with its
reason and the latest result against it; then the other figures of that result and the
hardware it ran on. A benchmark without a result file in the results directory
(benchmarks/results.py, `build/results/`) is listed with its command and targets as "not run".
Variants (the same benchmark run another way, e.g. under LOGJAM_NATIVE=off) get a table each.

Usage: .venv/bin/python benchmarks/perf_doc.py [--results DIR] [--out docs/performance.md] [--check]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.results import REPO, Target, load_targets, results_dir, targets_of  # noqa: E402

OUT = REPO / "docs" / "performance.md"

HEAD = """# Performance

What each benchmark under `benchmarks/` measures, the command that runs it, its targets and
why, and its latest result. This page is generated: `make perf-doc` renders it from
`benchmarks/targets.toml` (the targets and their reasons) and the JSON every benchmark writes
into `build/results/` when it runs (`benchmarks/results.py`); edit those, not this page. A
result is the latest run's, on the hardware named under it, with the settings its command
shows: a run with small settings (fewer messages, one round) gives rough figures, and figures
measured on a machine shared with other work move from run to run. To measure again, run the
command, then `make perf-doc`.

Every benchmark runs the real programs (devices, bridges, importers, `logjam-spark`) on spare
loopback ports and a temporary data directory; the mesh benchmarks start the whole mesh as
`make up` runs it (`harness/mesh.py`). Most compare with a reference measured in the same run
on the same input (decoding alone, `zmq.proxy`, Spark's own writes, the table without its
lookup layout), so that a ratio says more than an absolute rate.
"""


def describe(run: str) -> str:
    """The first line of the docstring of the script `run` names."""
    script = next((REPO / w for w in run.split() if w.startswith("benchmarks/") and w.endswith(".py")), None)
    if script is None or not script.exists():
        return ""
    doc = (ast.get_docstring(ast.parse(script.read_text())) or "").strip()
    first = doc.splitlines()[0] if doc else ""
    first = first.removeprefix("Benchmark: ")
    return first[:1].upper() + first[1:]


def number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        a = abs(value)
        if a >= 1000:
            return f"{value:,.0f}"
        if a >= 10:
            return f"{value:.1f}"
        if a >= 0.01 or a == 0:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def with_unit(value: Any, unit: str) -> str:
    text = number(value)
    if not unit or value is None or isinstance(value, bool):
        return text
    return f"{text}{unit}" if unit == "x" else f"{text} {unit}"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def hardware(hw: dict[str, Any]) -> str:
    memory = hw.get("memory_bytes")
    parts = [hw.get("cpu") or "unknown CPU", f"{hw.get('cores')} cores",
             f"{memory / 2**30:.1f} GiB memory" if memory else None, f"Python {hw.get('python')}", hw.get("os")]
    return ", ".join(p for p in parts if p)


def result_files(results: Path, benchmark: str) -> list[dict[str, Any]]:
    """The benchmark's latest result, then its variants' (sorted by name)."""
    out = []
    main = results / f"{benchmark}.json"
    if main.exists():
        out.append(json.loads(main.read_text()))
    for path in sorted(results.glob(f"{benchmark}.*.json")):
        doc = json.loads(path.read_text())
        if doc.get("benchmark") == benchmark and doc.get("variant"):
            out.append(doc)
    return out


def target_rows(targets: dict[str, Target], result: dict[str, Any] | None) -> list[str]:
    rows = ["| target | why | result | met |", "| --- | --- | --- | --- |"]
    checks = (result or {}).get("checks", {})
    for name, t in targets.items():
        mine = [c for c in checks.values() if c["target"] == name]
        if not mine:
            outcome = "not run" if result is None else "not measured"
            rows.append(f"| `{name}` {cell(t.text())} | {cell(t.why)} | {outcome} | |")
            continue
        for c in mine:
            label = f" ({cell(c['label'])})" if c.get("label") else ""
            rows.append(f"| `{name}`{label} {cell(t.text())} | {cell(t.why)} | "
                        f"{cell(with_unit(c['measured'], t.unit))} | {'met' if c['met'] else '**missed**'} |")
    return rows


def result_block(result: dict[str, Any]) -> list[str]:
    lines = [f"Ran `{result['command']}` in {number(result.get('seconds'))} s on {hardware(result.get('hardware', {}))}."]
    figures = result.get("figures", {})
    if figures:
        lines += ["", "| figure | value |", "| --- | --- |"]
        lines += [f"| {cell(name)} | {cell(with_unit(f['value'], f.get('unit', '')))} |" for name, f in figures.items()]
    return lines


def section(benchmark: str, spec: dict[str, Any], results: Path) -> list[str]:
    targets = targets_of(benchmark, {benchmark: spec})
    found = result_files(results, benchmark)
    main = next((r for r in found if not r.get("variant")), None)
    lines = [f"## {benchmark}", ""]
    about = describe(spec["run"])
    if about:
        lines += [about, ""]
    lines += [f"Command: `{spec['run']}`", ""]
    if spec.get("note"):
        lines += [f"Target: none; {spec['note']}.", ""]
    if targets:
        lines += target_rows(targets, main) + [""]
    if main is not None:
        lines += result_block(main) + [""]
    elif not targets:
        lines += ["Result: not run.", ""]
    for r in found:
        if not r.get("variant"):
            continue
        lines += [f"### {benchmark}, variant `{r['variant']}`", ""]
        if targets:
            lines += target_rows(targets, r) + [""]
        lines += result_block(r) + [""]
    return lines


def render(results: Path) -> str:
    table = load_targets()
    lines = [HEAD, "| benchmark | command | targets | latest result |", "| --- | --- | --- | --- |"]
    for benchmark, spec in table.items():
        found = result_files(results, benchmark)
        main = next((r for r in found if not r.get("variant")), None)
        n = len(targets_of(benchmark, table))
        if main is None:
            state = "not run"
        elif main.get("passed") is None:
            state = "ran (no target checked)"
        else:
            checks = main["checks"].values()
            state = f"{sum(c['met'] for c in checks)} of {len(checks)} met"
        lines.append(f"| [{benchmark}](#{benchmark}) | `{spec['run']}` | {n or 'none'} | {state} |")
    lines.append("")
    for benchmark, spec in table.items():
        lines += section(benchmark, spec, results)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=None, help="results directory (default: build/results)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="only say whether --out is up to date (exit 1 if not)")
    args = ap.parse_args()
    text = render(args.results or results_dir())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        print(f"{args.out}: {'up to date' if current == text else 'out of date (make perf-doc)'}")
        return 0 if current == text else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
