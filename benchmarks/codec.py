"""Codec overhead: our compress/decompress against the bare library call on the same bodies.

Prints encode and decode MB/s (of uncompressed bytes) per method and the ratio
ours / bare. For LZ4 the bare call includes splitting off the 4-byte length
prefix, since no caller can hand these bodies to the library without it. The target
(benchmarks/targets.toml) is a ratio near 1: the wrapper (bounds checks, gzip detection,
length prefix) adds almost nothing.
"""

from __future__ import annotations

import random
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lz4.block  # noqa: E402
import orjson  # noqa: E402
import snappy  # noqa: E402

from benchmarks.results import Run  # noqa: E402
from logjam.compression import compress, decompress  # noqa: E402
from logjam.meta import Compression  # noqa: E402

ROUNDS = 7
TARGET_S = 0.15


def bodies(n: int = 400) -> list[bytes]:
    rng = random.Random(7)
    words = ["GET", "POST", "users", "orders", "timeout", "cache", "hit", "miss", "db", "render", "ok", "retry"]
    out = []
    for i in range(n):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) for _ in range(rng.randint(20, 80))]
        out.append(orjson.dumps({
            "action": f"Users#{rng.choice(words)}", "code": rng.choice([200, 200, 302, 404, 500]),
            "total_time": rng.random() * 300, "request_id": f"{rng.getrandbits(128):032x}",
            "host": f"web{rng.randint(1, 40)}", "lines": lines,
        }))
    return out


def _once(fn: Callable[[object], object], inputs: list, volume: int) -> float:
    reps = 0
    start = time.perf_counter()
    while True:
        for x in inputs:
            fn(x)
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed > TARGET_S:
            return reps * volume / elapsed / 1e6


def compare(ours: Callable, our_inputs: list, bare: Callable, bare_inputs: list, volume: int) -> tuple[float, float]:
    """Best-of-ROUNDS MB/s for both, alternating so that load from other processes hits both alike."""
    best_ours = best_bare = 0.0
    for _ in range(ROUNDS):
        best_ours = max(best_ours, _once(ours, our_inputs, volume))
        best_bare = max(best_bare, _once(bare, bare_inputs, volume))
    return best_ours, best_bare


def main() -> int:
    run = Run("codec")
    data = bodies()
    volume = sum(map(len, data))
    print(f"{len(data)} JSON bodies, {volume / len(data):.0f} bytes on average")
    bare_encode = {
        Compression.ZLIB: zlib.compress,
        Compression.SNAPPY: snappy.compress,
        Compression.LZ4: lambda b: struct.pack(">I", len(b)) + lz4.block.compress(b, store_size=False),
    }
    lowest = 1.0
    print(f"{'method':8} {'op':7} {'ours MB/s':>10} {'bare MB/s':>10} {'ratio':>6}")
    for method, enc in bare_encode.items():
        wires = [compress(method, b) for b in data]
        if method == Compression.LZ4:
            # The least any caller must do with these bytes: split off the length prefix.
            bare_dec_inputs: list = wires
            bare_dec = lambda w: lz4.block.decompress(w[4:], uncompressed_size=int.from_bytes(w[:4], "big"))  # noqa: E731
        elif method == Compression.ZLIB:
            bare_dec_inputs, bare_dec = wires, zlib.decompress
        else:
            bare_dec_inputs, bare_dec = wires, snappy.decompress
        pairs = [
            ("encode", *compare(lambda b: compress(method, b), data, enc, data, volume)),
            ("decode", *compare(lambda w: decompress(method, w), wires, bare_dec, bare_dec_inputs, volume)),
        ]
        for op, ours, bare in pairs:
            ratio = ours / bare
            lowest = min(lowest, ratio)
            print(f"{method.name.lower():8} {op:7} {ours:10.1f} {bare:10.1f} {ratio:6.2f}")
            run.figure(f"{method.name.lower()} {op}, ours", ours, "MB/s")
            run.figure(f"{method.name.lower()} {op}, bare library", bare, "MB/s")
    print(f"lowest ratio ours/bare: {lowest:.2f} (target >= {run.target('lowest_ratio'):.2f})")
    run.check("lowest_ratio", lowest)
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
