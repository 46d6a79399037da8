"""`--check` pieces every program that opens the table shares (runtime/check.py): is the Spark URL one
we can open, and is a local warehouse dir writable. A warehouse may be a URL (hdfs://, s3a://):
only local paths are checked."""

from __future__ import annotations

import re

from runtime.check import Checker

_SPARK_URL = re.compile(r"sc://[^/:]+(:\d+)?(/.*)?|local(\[(\d+|\*)(,\d+)?\])?|spark://\S+|yarn|k8s://\S+|mesos://\S+")


def spark_url(c: Checker, flag: str, url: str) -> None:
    if _SPARK_URL.fullmatch(url):
        c.ok(f"{flag} {url}")
    else:
        c.error(f"{flag} {url}: not sc://HOST:PORT or a Spark master URL (local[*], spark://HOST:PORT, ...)")


def local_dir(c: Checker, flag: str, path: str | None) -> None:
    if path and ("://" not in path or path.startswith("file://")):
        c.writable_dir(flag, path.removeprefix("file://"))
