"""The event -> Logjam message mapping every bridge shares."""

import orjson
import pytest

from bridges.host.mapping import EventMapper, body_from_bytes, parse_timestamp
from logjam.meta import Compression


@pytest.mark.parametrize(
    "data, body",
    [
        (b'{"message":"hi","n":1}', {"message": "hi", "n": 1}),
        (b"plain text", {"message": "plain text"}),
        (b"[1,2]", {"message": "[1,2]"}),
        (b"\xff\xfe", {"message_base64": "//4="}),
        ("héllo".encode(), {"message": "héllo"}),
    ],
)
def test_body_from_bytes(data, body):
    assert body_from_bytes(data) == body


@pytest.mark.parametrize(
    "value, ms",
    [
        ("2024-01-02T03:04:05.678Z", 1704164645678),
        ("2024-01-02T03:04:05.678+01:00", 1704164645678 - 3600_000),
        ("2024-01-02T03:04:05", 1704164645000),
        (1700000000, 1700000000000),
        (1700000000.5, 1700000000500),
        (1700000000123, 1700000000123),
        ("yesterday", None),
        (True, None),
        (None, None),
        (-5, None),
    ],
)
def test_parse_timestamp(value, ms):
    assert parse_timestamp(value) == ms


def test_message_adds_metadata_and_timestamp():
    fallbacks = []
    m = EventMapper(app_env="lj-default", topic="logs.lumberjack", app_env_field="fields.app", on_fallback=lambda: fallbacks.append(1))
    msg = m.message(
        {"message": "x", "@timestamp": "2024-01-02T03:04:05.678Z", "fields": {"app": "shop-prod"}, "@metadata": {"beat": "filebeat"}},
        {"protocol": "lumberjack", "seq": 3},
        created_ms=5,
    )
    assert msg.app_env == "shop-prod" and msg.topic == "logs.lumberjack"
    assert msg.meta.created_ms == 1704164645678
    assert orjson.loads(msg.body)["@metadata"] == {"beat": "filebeat", "protocol": "lumberjack", "seq": 3}
    assert fallbacks == []


@pytest.mark.parametrize("fields", [{}, {"app": 7}, {"app": "noenv"}, {"app": "bad\x01-x"}])
def test_invalid_app_env_field_falls_back_and_counts(fields):
    fallbacks = []
    m = EventMapper(app_env="lj-default", topic="logs", app_env_field="fields.app", on_fallback=lambda: fallbacks.append(1))
    msg = m.message({"fields": fields}, {}, created_ms=42)
    assert msg.app_env == "lj-default" and msg.meta.created_ms == 42 and fallbacks == [1]


def test_compression_and_override():
    m = EventMapper(app_env="a-b", topic="logs", compression=Compression.LZ4)
    msg = m.message({"message": "y" * 100}, {"protocol": "t"}, app_env="c-d")
    assert msg.app_env == "c-d" and msg.meta.compression == Compression.LZ4
    assert msg.json()["message"] == "y" * 100
