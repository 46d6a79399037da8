"""Every benchmark has its targets in benchmarks/targets.toml and writes its result as data, and
`make perf-doc` renders docs/performance.md from those.

tests/ never imports benchmarks/ (tests/test_layers.py), so this reads the files and runs the
scripts as a person would: benchmarks/perf_doc.py against results written here.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from harness.processes import REPO

BENCH = REPO / "benchmarks"
NOT_BENCHMARKS = {"__init__.py", "results.py", "perf_doc.py", "device_ceiling.py"}


def targets() -> dict:
    return tomllib.loads((BENCH / "targets.toml").read_text())


def scripts() -> list[Path]:
    """Every runnable benchmark: a script of benchmarks/ with a __main__ block."""
    return [p for p in sorted(BENCH.glob("*.py")) if p.name not in NOT_BENCHMARKS and "__main__" in p.read_text()]


def test_every_target_has_one_bound_and_a_reason() -> None:
    for bench, section in targets().items():
        assert section["run"].startswith(".venv/bin/python benchmarks/"), bench
        specs = {k: v for k, v in section.items() if isinstance(v, dict)}
        assert specs or section.get("note"), f"[{bench}] has neither targets nor a note saying why"
        for name, spec in specs.items():
            assert len({"min", "max", "is"} & spec.keys()) == 1, (bench, name)
            assert spec.get("why", "").strip(), (bench, name)


def test_every_benchmark_is_in_targets_toml_and_records_its_result() -> None:
    commands = " ".join(s["run"] for s in targets().values())
    for script in scripts():
        assert f"benchmarks/{script.name}" in commands, f"{script.name} has no section in targets.toml"
        names = {node.args[0].value for node in ast.walk(ast.parse(script.read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Run"
                 and node.args and isinstance(node.args[0], ast.Constant)}
        assert names, f"{script.name} writes no result (benchmarks/results.py Run)"
        assert names <= targets().keys(), f"{script.name}: {names - targets().keys()} not in targets.toml"


def test_perf_doc_lists_every_benchmark_with_its_command_and_targets(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "codec.json").write_text(json.dumps({
        "benchmark": "codec", "variant": None, "command": ".venv/bin/python benchmarks/codec.py", "seconds": 12.0,
        "hardware": {"cpu": "Test CPU 9000", "cores": 2, "memory_bytes": 2**33, "python": "3.11.7", "os": "Linux"},
        "figures": {"zlib encode, ours": {"value": 10.5, "unit": "MB/s"}},
        "checks": {"lowest_ratio": {"target": "lowest_ratio", "label": None, "bound": "min", "limit": 0.9, "unit": "x",
                                    "measured": 0.95, "met": True}}, "passed": True}))
    out = tmp_path / "performance.md"
    subprocess.run([sys.executable, str(BENCH / "perf_doc.py"), "--results", str(results), "--out", str(out)],
                   check=True, capture_output=True, cwd=REPO)
    page = out.read_text()
    for bench, section in targets().items():
        assert f"## {bench}\n" in page and f"`{section['run']}`" in page, bench
        for name, spec in section.items():
            if isinstance(spec, dict):
                assert f"`{name}`" in page and spec["why"] in page, (bench, name)
    codec = page.split("## codec\n")[1].split("\n## ")[0]
    assert "0.95x | met" in codec and "Test CPU 9000, 2 cores, 8.0 GiB memory" in codec and "10.5 MB/s" in codec
    courier = page.split("## courier\n")[1].split("\n## ")[0]
    assert "not run" in courier
    check = subprocess.run([sys.executable, str(BENCH / "perf_doc.py"), "--results", str(results), "--out", str(out),
                            "--check"], capture_output=True, cwd=REPO)
    assert check.returncode == 0, check.stdout
