"""Importer CPU per message for its receive -> decode -> batch path, without sockets or Spark.

e2e-like messages (benchmarks/e2e.py's events as the Lumberjack bridge maps them: about
400 bytes of JSON with `@metadata` and its `_id`, spread over `--streams` streams) are laid
out as the SUB drain hands them over (`logjam.raw.RawBatch`, 4096 messages a chunk, the
chunks alternating between `--devices` devices, as e2e's two devices) and fed to a real
`Receiver` with a `Sequencer` (in order), a `GroupCommit` and a deduplicating
`BatchBuilder` whose memory already holds --remembered other keys (a running importer's: each
new key makes it forget one); batches are cut as the worker cuts them, into Arrow tables.
What is timed is the process's CPU time for all of it. With --commit each batch then goes the
way the importer's commit takes it (importer/commit.py `TableTarget.append`: partition values,
`doc` encoded, one Delta commit through delta-rs with its app transactions) into a temporary
Delta table, so the number is SUB frames to committed row (for a --tree from before the Delta
table: that tree's own placement of its files). The drain itself (native/sub_drain.c) is not in it.

--compare runs each LOGJAM_NATIVE setting (require, off) in a process of its own and prints
them together; --tree DIR imports the importer from another checkout (with its C modules
built in place), to compare a change with the code before it in the same hour.

Usage: LOGJAM_NATIVE=off|auto python benchmarks/importer_decode.py [--messages N] [--rounds R] [--commit]
           [--remembered N] [--compare] [--tree DIR] [--profile]
"""

from __future__ import annotations

import argparse
import array
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# --tree: the checkout whose importer is measured (this one unless told).
_TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv[:-1] else str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, _TREE)

import zmq  # noqa: E402

from harness.lumberjack_load import body  # noqa: E402
from importer.batch import GroupCommit  # noqa: E402
from importer.decode import BatchBuilder  # noqa: E402
from importer.decode_native import NativeBatchBuilder  # noqa: E402
from importer.dedupe import DEFAULT_CAPACITY, RecentKeys  # noqa: E402
from importer.metrics import ImporterMetrics  # noqa: E402
from importer.receive import Receiver  # noqa: E402
from importer.report import GapReport, Tally  # noqa: E402
from importer.sequence import Ledger, Sequencer  # noqa: E402

try:
    from importer.sequence import Position  # noqa: E402
except ImportError:  # a --tree from before the Delta table
    from importer.checkpoint import Position  # type: ignore[no-redef]  # noqa: E402
from importer.split import StreamFilter  # noqa: E402
from logjam.raw import RawBatch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's benchmarks/, whatever --tree says
from benchmarks.results import Run  # noqa: E402

CHUNK = 4096


def chunks(n: int, devices: int = 1, streams: int = 4) -> list[RawBatch]:
    """`n` messages in chunks of CHUNK, chunk j from device j % devices + 1, each device's seqs in order."""
    rnd = random.Random(7)
    out = []
    seq = dict.fromkeys(range(1, devices + 1), 0)
    for j, first in enumerate(range(0, n, CHUNK)):
        device = j % devices + 1
        parts, pos, meta = [], array.array("I"), array.array("Q")
        at = 0
        for k in range(first, min(n, first + CHUNK)):
            frames = (f"shop{k % streams}-prod".encode(), b"logs", body(rnd, k))
            for f in frames:
                parts.append(f)
                pos.extend((at, len(f)))
                at += len(f)
            seq[device] += 1
            meta.extend((0, device, 1_795_000_000_000 + k, seq[device]))
        out.append(RawBatch(f"tcp://127.0.0.1:{device}", b"".join(parts), pos, meta, len(meta) // 4))
    return out


class Committer:
    """The importer's commit of each batch into a temporary table (an older --tree: its placed files)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lj-bench-commit-"))
        try:
            from importer.commit import TableTarget

            self.target = TableTarget(str(self.dir / "messages"), 0)
            self.place = None
        except ImportError:  # a --tree from before the Delta table
            from importer.place import grouped, place  # type: ignore[import-not-found]
            from importer.variant import DocEncoder

            self.doc, self.grouped, self.place = DocEncoder.load(), grouped, place
        self.n = 0

    def __call__(self, table, mark) -> None:  # type: ignore[no-untyped-def]
        self.n += 1
        if self.place is None:
            self.target.append(table, mark)
            return
        rows = self.grouped(table)
        self.place(rows.append_column("doc", self.doc.column(rows)), self.dir / "staging", self.dir / "root",
                   f"b{self.n}", lambda dirs: [d.mkdir(parents=True, exist_ok=True) for d in dirs])

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def full_memory(remembered: int) -> RecentKeys:
    """A dedupe memory already holding `remembered` keys no message repeats: a running importer's,
    where each new key also makes the memory forget its oldest (its default capacity is 1M keys,
    about 17 s of e2e's load per importer)."""
    keys = RecentKeys()
    keys.extend(f"earlier\0{n:020d}" for n in range(remembered))
    return keys


def run(batches: list[RawBatch], keep: list | None = None, placer: Committer | None = None,
        remembered: int = 0) -> tuple[float, int]:
    """CPU seconds for the receive -> decode -> batch path over `batches` (and the placing of each
    batch, given a `placer`), and the rows it made (the batches' tables go to `keep` when given).
    The dedupe memory starts with `remembered` other keys (`full_memory`)."""
    metrics = ImporterMetrics(0)
    devices = sorted({raw.meta[1] for raw in batches})
    endpoints = {d: f"tcp://127.0.0.1:{d}" for d in devices}
    ledger = Ledger({d: Position(f"j{d}", 0) for d in devices})
    ctx = zmq.Context()
    sequencer = Sequencer(ledger, metrics, context=ctx, device_endpoint=dict(endpoints), replay_port=1,
                          replay_timeout=1.0, stopping=lambda: False)
    native = NativeBatchBuilder.load(dedupe=full_memory(remembered))
    group = GroupCommit(native if native is not None else BatchBuilder(dedupe=full_memory(remembered)),
                        flush_interval=1.0)
    receiver = Receiver(group, StreamFilter(), Tally(), GapReport(metrics), sequencer, dict(endpoints))
    rows = 0

    def cut() -> int:
        batch = group.cut(None)
        if batch is None:
            return 0
        if keep is not None:
            keep.append(batch.table)
        if placer is not None:
            placer(batch.table, batch.mark)
        return batch.rows

    start = time.process_time()
    for raw in batches:
        receiver.receive([raw], lambda: False)
        if group.rows >= 65536:
            rows += cut()
    rows += cut()
    spent = time.process_time() - start
    ctx.term()
    return spent, rows


def compare(argv: list[str]) -> None:
    """This benchmark once per LOGJAM_NATIVE setting, each in a process of its own."""
    rest = [a for a in argv if a != "--compare"]
    for setting in ("require", "off"):
        env = dict(os.environ, LOGJAM_NATIVE=setting)
        subprocess.run([sys.executable, __file__, *rest], env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--remembered", type=int, default=DEFAULT_CAPACITY, metavar="N",
                    help="keys in the dedupe memory before a round starts, as in a running importer (default: its "
                         "capacity, so that every row's key makes it forget one; 0: an importer just started)")
    ap.add_argument("--commit", action="store_true", help="also commit each batch into a temporary Delta table")
    ap.add_argument("--compare", action="store_true", help="LOGJAM_NATIVE=require and off, one process each")
    ap.add_argument("--tree", help="the checkout whose importer is measured (default: this one)")
    ap.add_argument("--profile", action="store_true", help="one round under cProfile, top 25 by own time")
    args = ap.parse_args()
    if args.compare:
        compare(sys.argv[1:])
        return
    result = Run("importer_decode", variant="python" if os.environ.get("LOGJAM_NATIVE") == "off" else None)
    batches = chunks(args.messages, args.devices, args.streams)
    placer = Committer() if args.commit else None
    try:
        if args.profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.runcall(run, batches, None, placer, args.remembered)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return
        per = []
        for _ in range(args.rounds):
            spent, rows = run(batches, None, placer, args.remembered)
            assert rows == args.messages, (rows, args.messages)
            per.append(spent / rows * 1e6)
    finally:
        if placer is not None:
            placer.close()
    print(f"LOGJAM_NATIVE={os.environ.get('LOGJAM_NATIVE', 'auto')}{' --commit' if args.commit else ''} "
          f"[{_TREE}]: {args.messages} messages ({args.devices} devices, {args.streams} streams, {args.remembered} keys "
          f"remembered before) x {args.rounds}: "
          f"CPU per event min {min(per):.2f} us, median {sorted(per)[len(per) // 2]:.2f} us "
          f"({', '.join(f'{p:.2f}' for p in per)})")
    result.figure("CPU per event, min", min(per), "us")
    result.figure("CPU per event, median", sorted(per)[len(per) // 2], "us")
    result.save()


if __name__ == "__main__":
    main()
