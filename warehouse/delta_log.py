"""What maintenance reads of a Delta table's `_delta_log` beside its snapshot: the last checkpoint and the log's size.

Read through delta-rs's own object store (`DeltaStorageHandler`), so that a table on S3 is read
the same way as one on a local disk. The snapshot API does not say which version the last
checkpoint holds; `_delta_log/_last_checkpoint`, which every checkpoint writer rewrites after
its checkpoint file, does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from deltalake.fs import DeltaStorageHandler
from pyarrow.fs import FileSelector, FileType

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = f"{LOG_DIR}/_last_checkpoint"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    version: int
    written: float  # when `_last_checkpoint` was written, seconds since the epoch


class DeltaLog:
    """One table's `_delta_log`, as files."""

    def __init__(self, location: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.store = DeltaStorageHandler(location, dict(storage_options or {}))

    def last_checkpoint(self) -> Checkpoint | None:
        """The checkpoint `_last_checkpoint` names, or None when the table has none (or the file is torn)."""
        info = self.store.get_file_info([LAST_CHECKPOINT])[0]
        if info.type != FileType.File:
            return None
        try:
            doc = json.loads(self.store.open_input_file(LAST_CHECKPOINT).read())
            return Checkpoint(int(doc["version"]), info.mtime.timestamp())
        except (FileNotFoundError, ValueError, KeyError, TypeError):  # replaced or torn mid-read: none known
            return None

    def files(self) -> int:
        """Files in `_delta_log` (commits, checkpoints, `_last_checkpoint`): what a reader without a
        checkpoint lists, and what log cleanup keeps bounded."""
        return len(self.store.get_file_info_selector(FileSelector(LOG_DIR, allow_not_found=True)))
