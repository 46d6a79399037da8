"""Which importer worker owns what: whole devices (`owned_endpoints`), or streams by a CRC32 of the app-env.

With `--own-devices`, worker I of N subscribes only to the devices at positions I, I+N, ...
of the `--sub` list, so it receives about 1/N of the traffic whatever the mix of app-envs,
and lands every stream they carry. Without it, every worker receives everything and keeps
the streams whose app-env CRC32 is I modulo N (`StreamFilter`).

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


def owned_endpoints(endpoints: Sequence[str], worker: int, workers: int) -> list[str]:
    """The device endpoints worker `worker` of `workers` owns: every `workers`-th, from position `worker`.

    Raises ValueError when it would own none (more importers than devices): an importer
    without a device would sit idle while claiming a share it cannot take.
    """
    if not 0 <= worker < workers:
        raise ValueError(f"--worker must be in 0..{workers - 1}, got {worker}")
    if worker >= len(endpoints):
        raise ValueError(f"importer {worker} of {workers} would own no device: there are {len(endpoints)} --sub "
                         f"endpoints, and with --own-devices every importer owns whole devices; run at most as many "
                         f"importers as devices (LOGJAM_IMPORTERS <= LOGJAM_DEVICES)")
    return list(endpoints[worker::workers])


def split_list(values: Sequence[str] | str | None) -> list[str]:
    """Flags that may repeat and may each hold a comma-separated list (supervisord passes one value)."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [v.strip() for value in values for v in str(value).split(",") if v.strip()]


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
