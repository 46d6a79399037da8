"""Run by tests/test_s3_server.py as its own process (its JVM ends with it): a classic local[2]
Spark session as logjam's tools open one (table/session.py: Delta's jars and settings), with the
settings read as JSON from stdin over it, reads the Delta table at argv[1] and prints its row
count and distinct row count as one JSON line on stdout."""

from __future__ import annotations

import json
import sys


def main() -> None:
    conf: dict[str, str] = json.load(sys.stdin)
    from table.session import open_session

    spark = open_session("local[2]", app_name="test_s3_server", conf=conf)
    try:
        df = spark.read.format("delta").load(sys.argv[1])
        print(json.dumps({"count": df.count(), "distinct": df.distinct().count()}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
