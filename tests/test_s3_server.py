"""The tests' S3 server (harness/s3.py, versitygw) against the clients the table has on S3.

Checked: what makes commits safe without a lock service holds on this server (of 32 concurrent
`PUT`s with `If-None-Match: *` to one key exactly one succeeds, the rest get 412, and the body
kept is the winner's; 20 rounds), so a server that stops enforcing it fails here; delta-rs
(`deltalake`) commits to it from several spawned writer processes at once with
`conditional_put=etag`, each commit carrying its writer's app transaction, and the log ends with
every commit once and every writer's transaction version right; and a classic Spark session
with the `delta` and `s3` jar sets reads that table through `s3a://` to the same rows.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from harness.processes import log_tail
from harness.s3 import S3Server, S3ServerMissing, running_s3_server

ROUNDS = 20
RACERS = 32
BODY_BYTES = 64 * 1024  # big enough that the racing writes overlap on the server, not just their headers

WRITERS = 4
APPENDS = 10  # per writer
ROWS = 50  # per append, spread over the partitions
PARTS = ("p0", "p1", "p2", "p3")
SEED_ROWS = 10  # the commit that creates the table (version 0)
BUCKET = "lake"
CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_API_MODE")
TABLE = "messages"


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[S3Server]:
    with running_s3_server(Path(tmp_path_factory.mktemp("s3"))) as server:
        yield server


def _race(s3: S3Server, bucket: str, rounds: int) -> None:
    """`rounds` rounds of RACERS concurrent `PUT`s with `If-None-Match: *` to one new key each:
    exactly one 200, the rest 412 PreconditionFailed, and the winner's body stored."""
    from botocore.exceptions import ClientError

    # One attempt per request: a retried PUT whose first try had landed would answer 412 to its
    # own win, and a pool smaller than the racers would queue them instead of racing them.
    client = s3.client(retries={"max_attempts": 1}, max_pool_connections=RACERS)
    try:
        for round_ in range(rounds):
            key = f"round-{round_:02d}/00000000000000000001.json"
            bodies = [bytes([racer]) * BODY_BYTES for racer in range(RACERS)]
            gate = threading.Barrier(RACERS)
            outcomes: list[Any] = [None] * RACERS

            def race(racer: int) -> None:
                gate.wait(timeout=30)
                try:
                    res = client.put_object(Bucket=bucket, Key=key, Body=bodies[racer], IfNoneMatch="*")
                    outcomes[racer] = res["ResponseMetadata"]["HTTPStatusCode"]
                except ClientError as e:
                    outcomes[racer] = (e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"])
                except Exception as e:  # a transport error is a failure of the round, reported as such
                    outcomes[racer] = repr(e)

            threads = [threading.Thread(target=race, args=(r,), daemon=True) for r in range(RACERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in threads), f"round {round_}: a PUT did not finish within 60s"
            winners = [r for r, o in enumerate(outcomes) if o == 200]
            losers = [o for o in outcomes if o != 200]
            assert len(winners) == 1, f"round {round_}: {len(winners)} PUTs succeeded: {Counter(map(str, outcomes))}"
            assert losers == [(412, "PreconditionFailed")] * (RACERS - 1), f"round {round_}: {Counter(map(str, losers))}"
            stored = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert stored == bodies[winners[0]], f"round {round_}: the stored body is not the winner's"
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_one_conditional_put_wins_each_round(s3: S3Server) -> None:
    _race(s3, s3.create_bucket("race"), ROUNDS)


@pytest.mark.timeout(60)
def test_sidecar_metadata_keeps_etags_and_conditional_puts(tmp_path: Path) -> None:
    """The backend a filesystem without user xattrs gets: ETags (what `conditional_put=etag`
    compares) kept in the sidecar directory, and conditional PUTs still exclusive."""
    with running_s3_server(tmp_path, sidecar=True) as s3:
        client = s3.client()
        bucket = s3.create_bucket("side")
        etag = client.put_object(Bucket=bucket, Key="k", Body=b"first")["ETag"]
        assert client.head_object(Bucket=bucket, Key="k")["ETag"] == etag
        assert client.get_object(Bucket=bucket, Key="k", IfMatch=etag)["Body"].read() == b"first"
        assert any((tmp_path / "meta").rglob("*")), "versitygw kept nothing in the sidecar directory"
        assert not any(name.startswith("user.") for name in os.listxattr(s3.root / bucket / "k"))
        _race(s3, bucket, 3)


def test_a_binary_of_another_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.s3

    other = tmp_path / "versitygw"
    other.write_bytes(b"\x7fELF" + b"\tgithub.com/versity/versitygw\tv1.7.0\th1:x=\n" * 4)
    monkeypatch.setattr(harness.s3, "VERSITYGW", other)
    with pytest.raises(S3ServerMissing, match="make s3-server"):
        harness.s3.versitygw()
    other.unlink()
    with pytest.raises(S3ServerMissing, match="is missing"):
        harness.s3.versitygw()


def _write(uri: str, options: dict[str, str], writer: int, appends: int, start: Any) -> list[float]:
    """One writer process: `appends` commits of ROWS rows over PARTS, commit `seq` carrying the app
    transaction (writer-<writer>, seq); the seconds each commit took. Spawned: delta-rs refuses forked children."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    start.wait(60)
    took = []
    for seq in range(appends):
        batch = pa.table({
            "writer": pa.array([writer] * ROWS, pa.int32()),
            "seq": pa.array([seq] * ROWS, pa.int32()),
            "row": pa.array(range(ROWS), pa.int32()),
            "part": pa.array([PARTS[(seq + r) % len(PARTS)] for r in range(ROWS)]),
        })
        begun = time.monotonic()
        write_deltalake(uri, batch, mode="append", storage_options=options,
                        commit_properties=CommitProperties(app_transactions=[Transaction(f"writer-{writer}", seq)]))
        took.append(time.monotonic() - begun)
    return took


@dataclass(frozen=True, slots=True)
class WrittenTable:
    uri: str
    commit_seconds: tuple[float, ...]  # every append's write_deltalake, all writers
    wall_seconds: float  # from the writers' start to the last of them done


@pytest.fixture(scope="module")
def written_table(s3: S3Server) -> WrittenTable:
    """WRITERS spawned processes × APPENDS appends, at once, to a table made with SEED_ROWS rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    s3.create_bucket(BUCKET)
    uri = s3.url(BUCKET, TABLE)
    seed = pa.table({"writer": pa.array([-1] * SEED_ROWS, pa.int32()), "seq": pa.array([0] * SEED_ROWS, pa.int32()),
                     "row": pa.array(range(SEED_ROWS), pa.int32()),
                     "part": pa.array([PARTS[r % len(PARTS)] for r in range(SEED_ROWS)])})
    write_deltalake(uri, seed, partition_by=["part"], storage_options=s3.storage_options())

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(WRITERS) as pool:
        # The spawned interpreters take a while to import deltalake; the barrier starts them together.
        start = manager.Barrier(WRITERS + 1)
        pending = [pool.apply_async(_write, (uri, s3.storage_options(), w, APPENDS, start)) for w in range(WRITERS)]
        start.wait(60)
        begun = time.monotonic()
        took = [t for p in pending for t in p.get(timeout=120)]
        wall = time.monotonic() - begun
    return WrittenTable(uri, tuple(took), wall)


@pytest.mark.timeout(180)
def test_delta_rs_writers_commit_each_append_once(s3: S3Server, written_table: WrittenTable) -> None:
    from deltalake import DeltaTable

    dt = DeltaTable(written_table.uri, storage_options=s3.storage_options())
    assert dt.version() == WRITERS * APPENDS
    rows = dt.to_pyarrow_table(columns=["writer", "seq", "part"]).to_pylist()
    assert len(rows) == SEED_ROWS + WRITERS * APPENDS * ROWS
    per_commit = Counter((r["writer"], r["seq"]) for r in rows if r["writer"] >= 0)
    assert per_commit == {(w, s): ROWS for w in range(WRITERS) for s in range(APPENDS)}
    assert {r["part"] for r in rows} == set(PARTS)
    for w in range(WRITERS):
        assert dt.transaction_version(f"writer-{w}") == APPENDS - 1
    # Every version's commit file is there once: conditional PUT, not overwrite, made each.
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{TABLE}/_delta_log/")["Contents"]]
    commits = sorted(k.rsplit("/", 1)[1] for k in keys if k.endswith(".json"))
    assert commits == [f"{v:020d}.json" for v in range(WRITERS * APPENDS + 1)]
    took = sorted(written_table.commit_seconds)
    print(f"\n{WRITERS} writers x {APPENDS} appends in {written_table.wall_seconds:.2f}s; "
          f"write_deltalake p50 {took[len(took) // 2] * 1000:.0f} ms, p90 {took[int(len(took) * 0.9)] * 1000:.0f} ms")


@pytest.mark.spark
@pytest.mark.timeout(720)
def test_spark_reads_the_table_through_s3a(s3: S3Server, written_table: WrittenTable, tmp_path: Path) -> None:
    from runtime.jars import jar_paths

    conf = {
        # hadoop-aws; Delta's jars and settings are the session's own (table/session.py delta_conf).
        "spark.driver.extraClassPath": ":".join(str(p) for p in jar_paths("s3")),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
        **s3.spark_conf(),
    }
    # Its own process, so that whatever its JVM or pyspark raises reaches the failure as printed.
    log = tmp_path / "spark.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("spark_s3a_count.py")), s3.url(BUCKET, TABLE, scheme="s3a")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            # pyspark sets SPARK_CONNECT_MODE_ENABLED in this process once any test here has made a Connect
            # session; inherited, it turns the child's classic session into a Connect one with no URL.
            env={k: v for k, v in os.environ.items() if k not in CONNECT_ENV},
        )
        try:
            # 40 s alone; in the full suite beside three other JVMs on two cores its start took over 240 s once.
            out, _ = proc.communicate(json.dumps(conf).encode(), timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"the s3a read did not finish within 600 s; its stderr ends:\n{log_tail(log)}")
    assert proc.returncode == 0, f"the s3a read exited {proc.returncode}; its stderr ends:\n{log_tail(log)}"
    counts = json.loads(out.decode().strip().splitlines()[-1])
    count, distinct = counts["count"], counts["distinct"]
    expected = SEED_ROWS + WRITERS * APPENDS * ROWS
    assert (count, distinct) == (expected, expected)
