"""Which importer worker owns which stream: CRC32 of the app-env, modulo the worker count.

CRC32 is stable across processes, hosts and Python versions (Python's `hash()` is salted
per process), so every worker computes the same owner for the same stream without talking
to the others.
"""

from __future__ import annotations

import zlib
from typing import Sequence


def worker_of(app_env: str, workers: int) -> int:
    """The worker (0..workers-1) that owns `app_env`."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    return zlib.crc32(app_env.encode("utf-8", "surrogateescape")) % workers


class StreamFilter:
    """Decides, after receipt, which streams this worker writes: its CRC32 share, narrowed by prefixes.

    Importers subscribe to every stream and filter here instead of with ZeroMQ prefixes,
    because a device numbers all streams with one counter: gap tracking needs them all.
    """

    __slots__ = ("worker", "workers", "prefixes", "_cache")

    def __init__(self, worker: int | None = None, workers: int | None = None, prefixes: Sequence[str] = ()) -> None:
        if (worker is None) != (workers is None):
            raise ValueError("--worker and --workers go together")
        if workers is not None and worker is not None and not 0 <= worker < workers:
            raise ValueError(f"--worker must be in 0..{workers - 1}, got {worker}")
        self.worker = worker
        self.workers = workers
        self.prefixes = tuple(prefixes)
        # Few distinct streams, many messages: remember each verdict.
        self._cache: dict[str, bool] = {}

    def keeps(self, app_env: str) -> bool:
        verdict = self._cache.get(app_env)
        if verdict is None:
            verdict = self._decide(app_env)
            if len(self._cache) < 100_000:
                self._cache[app_env] = verdict
        return verdict

    def _decide(self, app_env: str) -> bool:
        if self.prefixes and not app_env.startswith(self.prefixes):
            return False
        if self.workers is None:
            return True
        return worker_of(app_env, self.workers) == self.worker
