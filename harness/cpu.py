"""CPU seconds of the processes a benchmark measures, read from /proc: what each cost, whatever else
the shared machine is doing."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """Every descendant a process has now, from /proc (none once it is gone)."""
    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in children(k)]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, every thread of it (ended ones included), from /proc/<pid>/stat in
    clock ticks. OSError once the process is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def fine_cpu_seconds(pid: int) -> float:
    """The CPU time of every live thread of a process, from /proc/<pid>/task/*/schedstat in
    nanoseconds where the kernel has it (else `cpu_seconds`): clock ticks are too coarse for runs of
    a fraction of a CPU-second. Threads that ended are missed, so only for a process whose threads
    live as long as it does (the device's, ZeroMQ I/O threads included)."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)


def tree_cpu_seconds(pid: int) -> float:
    """`cpu_seconds` of a process and of every descendant it has now (logjam-spark and the JVM it
    launched); one that ended meanwhile counts nothing."""
    total = 0.0
    for p in [pid, *children(pid)]:
        try:
            total += cpu_seconds(p)
        except OSError:
            pass
    return total


def cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    """`cpu_seconds` summed per named group of processes (harness/mesh.py `Mesh.pids`); one that ended
    meanwhile counts nothing."""
    out = {}
    for name, group in pids.items():
        total = 0.0
        for pid in group:
            try:
                total += cpu_seconds(pid)
            except OSError:
                pass
        out[name] = total
    return out
