"""Pure tests of the importer's row decoding and worker split (no Spark, no sockets)."""

from __future__ import annotations

import datetime
import zlib

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from importer.decode import BatchBuilder, split_app_env
from table.paths import partition_dir, table_path
from table.schema import ARROW_SCHEMA
from importer.split import StreamFilter, worker_of
from logjam.message import Message
from logjam.meta import Compression, Meta

NOW_US = 1_763_700_000_123_456


def rows(*msgs: Message) -> list[dict]:
    b = BatchBuilder()
    for m in msgs:
        b.add(m, NOW_US)
    table = b.build()
    assert table.schema == ARROW_SCHEMA
    assert len(b) == 0
    return table.to_pylist()


@pytest.mark.parametrize("compression", list(Compression))
def test_every_compression_decodes(compression: Compression) -> None:
    payload = {"message": "hello", "code": 200, "total_time": 12.5, "@metadata": {"protocol": "courier"}}
    msg = Message.build("shop-prod", "logs.app", payload, compression=compression, created_ms=1_700_000_000_250,
                        seq=42, device=3)
    (row,) = rows(msg)
    assert orjson.loads(row["body"]) == payload
    assert row["parse_error"] is None and row["raw"] is None
    assert (row["app_env"], row["app"], row["env"], row["topic"]) == ("shop-prod", "shop", "prod", "logs.app")
    assert (row["device"], row["seq"]) == (3, 42)
    assert row["created_at"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=datetime.timezone.utc)
    assert row["date"] == datetime.date(2023, 11, 14)
    assert row["ingested_at"].timestamp() == pytest.approx(NOW_US / 1e6)
    assert (row["message"], row["code"], row["total_time"], row["protocol"]) == ("hello", 200, 12.5, "courier")


def test_typed_columns_from_logjam_request_and_beats_event() -> None:
    logjam = {"action": "Users#show", "code": 404, "total_time": 7, "request_id": "abc", "host": "web1",
              "severity": 2}
    beats = {"message": "line", "host": {"name": "node7"}, "log": {"level": "warn"}, "@metadata": {"protocol": "lumberjack"}}
    r1, r2 = rows(Message.build("a-b", "logs", logjam), Message.build("a-b", "logs", beats))
    assert (r1["action"], r1["code"], r1["total_time"], r1["request_id"], r1["host"], r1["severity"]) == (
        "Users#show", 404, 7.0, "abc", "web1", 2)
    assert r1["message"] is None and r1["protocol"] is None
    assert (r2["message"], r2["host"], r2["level"], r2["protocol"]) == ("line", "node7", "warn", "lumberjack")


def test_fields_of_the_wrong_type_become_null_not_errors() -> None:
    body = {"code": "not a number", "severity": 2**63 + 5, "total_time": [1], "message": {"nested": 1}, "level": True,
            "@metadata": "not an object"}
    (row,) = rows(Message.build("a-b", "logs", b'{"code": "not a number", "severity": 9223372036854775813, '
                                b'"total_time": [1], "message": {"nested": 1}, "level": true, "@metadata": "not an object"}'))
    assert row["parse_error"] is None
    assert (row["code"], row["severity"], row["total_time"], row["message"], row["protocol"]) == (None,) * 5
    assert row["level"] == "true"
    assert orjson.loads(row["body"]) == body


def test_valid_json_that_is_not_an_object_is_kept_without_typed_columns() -> None:
    (row,) = rows(Message.build("a-b", "logs", b"[1, 2]"))
    assert row["body"] == "[1, 2]" and row["parse_error"] is None and row["message"] is None


@pytest.mark.parametrize(
    ("compression", "body", "reason"),
    [
        (Compression.NONE, b"{not json", "bad_json"),
        (Compression.NONE, b"\xff\xfe{", "bad_json"),
        (Compression.ZLIB, b"definitely not zlib", "decompression_failed"),
        (Compression.SNAPPY, b"\x05garbage", "decompression_failed"),
        (Compression.LZ4, b"\x00\x00\x00\x10\xff\xff", "decompression_failed"),
        (Compression.LZ4, b"\xff\xff\xff\xff\x00", "decompressed_too_large"),
    ],
)
def test_broken_bodies_become_rows_with_parse_error(compression: int, body: bytes, reason: str) -> None:
    msg = Message("shop-prod", "logs", body, Meta(compression, 1, 1_700_000_000_000, 5))
    b = BatchBuilder()
    assert b.add(msg, NOW_US).startswith(reason)
    (row,) = b.build().to_pylist()
    assert b.parse_errors == 1
    assert row["parse_error"].startswith(reason + ":")
    assert row["raw"] == body
    assert row["seq"] == 5 and row["app_env"] == "shop-prod"
    if compression == Compression.NONE:
        assert row["body"] == body.decode("utf-8", "replace")
    else:
        assert row["body"] is None


def test_out_of_range_meta_values_are_stored_not_fatal() -> None:
    msg = Message("a-b", "logs", b"{}", Meta(0, 9, 2**64 - 1, 2**64 - 1))
    (row,) = rows(msg)
    assert row["seq"] == -1  # u64 stored as signed 64-bit, as Java and Ruby consumers do
    assert row["created_at"].timestamp() == pytest.approx(NOW_US / 1e6, abs=0.001)


def test_split_app_env() -> None:
    assert split_app_env("my-shop-prod") == ("my-shop", "prod")
    assert split_app_env("noenv") == ("noenv", None)


@settings(max_examples=300, deadline=None)
@given(compression=st.sampled_from(list(Compression)), body=st.binary(max_size=300),
       created=st.integers(0, 2**64 - 1), seq=st.integers(0, 2**64 - 1))
def test_any_body_becomes_exactly_one_row(compression: int, body: bytes, created: int, seq: int) -> None:
    msg = Message("app-env", "logs", body, Meta(compression, 1, created, seq))
    b = BatchBuilder(max_body=1 << 20)
    b.add(msg, NOW_US)
    b.add(msg, NOW_US)
    table = b.build()
    assert table.num_rows == 2 and table.schema == ARROW_SCHEMA


def test_worker_of_is_crc32_and_stable() -> None:
    assert worker_of("shop-prod", 7) == zlib.crc32(b"shop-prod") % 7
    assert worker_of("shop-prod", 1) == 0
    with pytest.raises(ValueError):
        worker_of("a-b", 0)


@given(st.lists(st.text(min_size=1, max_size=20), max_size=50), st.integers(1, 8))
def test_workers_partition_every_stream_exactly_once(names: list[str], workers: int) -> None:
    filters = [StreamFilter(i, workers) for i in range(workers)]
    for name in names:
        assert sum(f.keeps(name) for f in filters) == 1


def test_prefixes_narrow_the_share() -> None:
    f = StreamFilter(prefixes=["shop-", "blog-prod"])
    assert f.keeps("shop-prod") and f.keeps("blog-prod") and not f.keeps("blog-dev")
    with pytest.raises(ValueError):
        StreamFilter(worker=1)
    with pytest.raises(ValueError):
        StreamFilter(worker=2, workers=2)


def test_paths() -> None:
    assert table_path("/w/") == "/w/messages"
    # Hive's escaping: a stream name with '/', '=' or '%' still maps to exactly one directory.
    assert partition_dir("/r", "a/b=c%d-prod", "2026-01-02") == "/r/app_env=a%2Fb%3Dc%25d-prod/date=2026-01-02"


def test_build_on_empty_builder_gives_empty_table() -> None:
    assert BatchBuilder().build().num_rows == 0
    assert isinstance(BatchBuilder().build(), pa.Table)


def test_importer_flags_and_config_file(tmp_path) -> None:
    from importer.cli import build_parser, main
    from runtime.config import parse_args

    for bad in (["--worker", "1"], ["--worker", "2", "--workers", "2"], ["--batch-rows", "0"]):
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 2
    cfg = tmp_path / "importer.toml"
    cfg.write_text('sub = ["tcp://dev1:9606", "tcp://dev2:9606"]\nworker = 1\nworkers = 3\nbatch-rows = 1000\n')
    args = parse_args(build_parser(), ["--config", str(cfg), "--flush-interval", "0.5"])
    assert (args.sub, args.worker, args.workers, args.batch_rows, args.flush_interval) == (
        ["tcp://dev1:9606", "tcp://dev2:9606"], 1, 3, 1000, 0.5)
    assert args.spark == "sc://127.0.0.1:15002"
