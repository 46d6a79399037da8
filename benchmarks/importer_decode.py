"""Importer CPU per message for its receive -> decode -> batch path, without sockets or Spark.

e2e-like messages (benchmarks/e2e.py's events as the Lumberjack bridge maps them: about
400 bytes of JSON with `@metadata` and its `_id`) are laid out as the SUB drain hands them
over (`logjam.raw.RawBatch`, 4096 messages a chunk) and fed to a real `Receiver` with a
`Sequencer` (one device, in order), a `GroupCommit` and a deduplicating `BatchBuilder`;
batches are cut as the worker cuts them, into Arrow tables. What is timed is the process's
CPU time for all of it. The drain itself, the commit to Spark and the checkpoint are not
in it (native/sub_drain.c and importer/write.py have their own numbers).

Usage: LOGJAM_NATIVE=off|auto python benchmarks/importer_decode.py [--messages N] [--rounds R] [--profile]
"""

from __future__ import annotations

import argparse
import array
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq  # noqa: E402

from harness.lumberjack_load import body  # noqa: E402
from importer.batch import GroupCommit  # noqa: E402
from importer.checkpoint import Position  # noqa: E402
from importer.decode import BatchBuilder  # noqa: E402
from importer.decode_native import NativeBatchBuilder  # noqa: E402
from importer.dedupe import RecentKeys  # noqa: E402
from importer.metrics import ImporterMetrics  # noqa: E402
from importer.receive import Receiver  # noqa: E402
from importer.report import GapReport, Tally  # noqa: E402
from importer.sequence import Ledger, Sequencer  # noqa: E402
from importer.split import StreamFilter  # noqa: E402
from logjam.raw import RawBatch  # noqa: E402

CHUNK = 4096


def chunks(n: int) -> list[RawBatch]:
    rnd = random.Random(7)
    out = []
    for first in range(0, n, CHUNK):
        parts, pos, meta = [], array.array("I"), array.array("Q")
        at = 0
        for k in range(first, min(n, first + CHUNK)):
            frames = (f"shop{k % 4}-prod".encode(), b"logs", body(rnd, k))
            for f in frames:
                parts.append(f)
                pos.extend((at, len(f)))
                at += len(f)
            meta.extend((0, 1, 1_795_000_000_000 + k, k + 1))
        out.append(RawBatch("tcp://127.0.0.1:1", b"".join(parts), pos, meta, len(meta) // 4))
    return out


def run(batches: list[RawBatch], keep: list | None = None) -> tuple[float, int]:
    """CPU seconds for the receive -> decode -> batch path over `batches`, and the rows it made
    (the batches' tables go to `keep` when given)."""
    metrics = ImporterMetrics(0)
    ledger = Ledger({1: Position("j1", 0)})
    ctx = zmq.Context()
    sequencer = Sequencer(ledger, metrics, context=ctx, device_endpoint={1: "tcp://127.0.0.1:1"}, replay_port=1,
                          replay_timeout=1.0, stopping=lambda: False)
    native = NativeBatchBuilder.load(dedupe=RecentKeys())
    group = GroupCommit(native if native is not None else BatchBuilder(dedupe=RecentKeys()), flush_interval=1.0)
    receiver = Receiver(group, StreamFilter(), Tally(), GapReport(metrics), sequencer, {1: "tcp://127.0.0.1:1"})
    rows = 0
    start = time.process_time()
    for raw in batches:
        receiver.receive([raw], lambda: False)
        if group.rows >= 65536:
            cut = group.cut(None)
            rows += cut.rows if cut else 0
            if keep is not None and cut:
                keep.append(cut.table)
    cut = group.cut(None)
    rows += cut.rows if cut else 0
    if keep is not None and cut:
        keep.append(cut.table)
    spent = time.process_time() - start
    ctx.term()
    return spent, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="one round under cProfile, top 25 by own time")
    args = ap.parse_args()
    batches = chunks(args.messages)
    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.runcall(run, batches)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    per = []
    for _ in range(args.rounds):
        spent, rows = run(batches)
        assert rows == args.messages, (rows, args.messages)
        per.append(spent / rows * 1e6)
    print(f"LOGJAM_NATIVE={os.environ.get('LOGJAM_NATIVE', 'auto')}: {args.messages} messages x {args.rounds}: "
          f"CPU per message min {min(per):.2f} us, median {sorted(per)[len(per) // 2]:.2f} us "
          f"({', '.join(f'{p:.2f}' for p in per)})")


if __name__ == "__main__":
    main()
