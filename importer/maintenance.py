"""Table maintenance in `logjam-spark`: compaction and retention on a schedule (work in progress)."""

from __future__ import annotations

import argparse
import threading
from typing import Any


def run_maintenance(spark: Any, args: argparse.Namespace, stopping: threading.Event) -> None:
    stopping.wait()
