"""What a failed commit was about, in a few words a person can act on.

delta-rs reports a failed write with the store's own error text inside its message (an OS
error for a local table, the object store's answer for S3), and a Spark session wraps a
JVM stack trace; this finds the cause in either, so that the importer's one log line says
what to fix.
"""

from __future__ import annotations

import re

# (pattern in the error text, what to call it): first match wins, most specific first.
_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.IGNORECASE), name) for p, name in (
    (r"No space left on device|ENOSPC|Disk quota exceeded|DiskSpaceQuotaExceeded", "disk full"),
    (r"File name too long|ENAMETOOLONG|PathComponentTooLong", "name too long"),
    (r"Permission denied|AccessDeniedException|EACCES|Operation not permitted", "permission denied"),
    (r"Read-only file system|EROFS", "read-only filesystem"),
    (r"Not a directory|ENOTDIR|File exists|EEXIST|FileAlreadyExistsException|exists and is not a directory",
     "path in the way"),
    (r"CommitFailedError|Transaction failed|version already exists", "commit conflict"),
    (r"StatusCode\.UNAVAILABLE|Connection refused|failed to connect|Channel shutdown|SESSION_CLOSED"
     r"|INVALID_HANDLE\.SESSION|SparkConnectGrpcException.*UNAVAILABLE|Socket closed", "Spark unreachable"),
    (r"OutOfMemoryError|Java heap space", "Spark out of memory"),
    (r"OPERATION_CANCELED|interrupted", "interrupted"),
))


def cause(e: BaseException) -> str | None:
    """The kind of failure, or None when the text names none we know."""
    text = _text(e)
    for pattern, name in _CAUSES:
        if pattern.search(text):
            return name
    return None


def describe(e: BaseException) -> str:
    """`<cause>: <first line>` (or just the first line), for one log line."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    found = cause(e)
    return f"{found}: {first}" if found else first


def _text(e: BaseException) -> str:
    parts, seen = [], set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(parts)
