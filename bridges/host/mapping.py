"""How a bridge turns one event into a Logjam message (the contract in docs/bridges.md)."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import orjson

from logjam.message import Message
from logjam.meta import Compression, now_ms
from logjam.validation import is_valid_app_env


def body_from_bytes(data: bytes) -> dict[str, Any]:
    """A JSON object stays itself; anything else becomes {"message": text} or {"message_base64": ...}."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return value
    try:
        return {"message": bytes(data).decode("utf-8")}
    except UnicodeDecodeError:
        return {"message_base64": base64.b64encode(data).decode("ascii")}


def parse_timestamp(value: Any) -> int | None:
    """`@timestamp` as epoch milliseconds: ISO 8601 text, or epoch seconds/milliseconds as a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        # Beyond year 5138 in seconds means the number was milliseconds already.
        ms = value if value > 1e11 else value * 1000
        return int(ms) if 0 < ms < 2**63 else None
    if isinstance(value, str) and value:
        try:
            ts = datetime.datetime.fromisoformat(value.strip())
        except ValueError:
            return None
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=datetime.timezone.utc)
        ms = int(ts.timestamp() * 1000)
        return ms if ms > 0 else None
    return None


def _lookup(body: dict[str, Any], path: list[str]) -> Any:
    value: Any = body
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


class EventMapper:
    def __init__(
        self,
        *,
        app_env: str,
        topic: str,
        app_env_field: str | None = None,
        compression: int = Compression.NONE,
        on_fallback: Any = None,
    ) -> None:
        self.app_env = app_env
        self.topic = topic
        self.field_path = app_env_field.split(".") if app_env_field else None
        self.compression = compression
        self._on_fallback = on_fallback

    def app_env_for(self, body: dict[str, Any]) -> str:
        """--app-env-field's value when it is a valid stream name, else --app-env (counted)."""
        if self.field_path is None:
            return self.app_env
        value = _lookup(body, self.field_path)
        if isinstance(value, str) and is_valid_app_env(value):
            return value
        if self._on_fallback is not None:
            self._on_fallback()
        return self.app_env

    def message(
        self,
        body: dict[str, Any],
        metadata: dict[str, Any],
        *,
        created_ms: int | None = None,
        app_env: str | None = None,
    ) -> Message:
        """Add @metadata (merged over any the event carries), pick app-env and created_ms, encode."""
        existing = body.get("@metadata")
        body["@metadata"] = {**existing, **metadata} if isinstance(existing, dict) else metadata
        ts = parse_timestamp(body.get("@timestamp"))
        return Message.build(
            app_env or self.app_env_for(body),
            self.topic,
            orjson.dumps(body, default=str),
            compression=self.compression,
            created_ms=ts or created_ms or now_ms(),
        )
