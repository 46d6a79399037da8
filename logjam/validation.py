"""Stream-name (app-env) and topic rules, as the reference device applies them.

The producer spec's ABNF allows only letters in application and environment names,
but real applications use digits and the reference device checks something looser:
every byte in 32..127 and at least one '-'. We follow the device (real clients rely
on it).
"""

from __future__ import annotations

# The limits live in logjam/constants.py, shared with the C modules; imported from here too.
from logjam.constants import MAX_NAME_LENGTH, TOPIC_PREFIXES  # noqa: F401
from logjam.errors import InvalidAppEnv, InvalidTopic


def _as_bytes(name: bytes | str) -> bytes:
    return name.encode("utf-8", "surrogateescape") if isinstance(name, str) else bytes(name)


def check_app_env(name: bytes | str) -> None:
    """Raise InvalidAppEnv unless `name` is a stream name the device publishes."""
    raw = _as_bytes(name)
    if not raw:
        raise InvalidAppEnv("stream name is empty")
    if len(raw) > MAX_NAME_LENGTH:
        raise InvalidAppEnv(f"stream name is {len(raw)} bytes, the limit is {MAX_NAME_LENGTH}")
    for i, b in enumerate(raw):
        if b < 32 or b > 127:
            raise InvalidAppEnv(f"stream name {raw[:64]!r} has byte 0x{b:02X} at {i}; only 32..127 allowed")
    if b"-" not in raw:
        raise InvalidAppEnv(f"stream name {raw[:64]!r} has no '-' between application and environment")


def is_valid_app_env(name: bytes | str) -> bool:
    try:
        check_app_env(name)
    except InvalidAppEnv:
        return False
    return True


def check_topic(topic: bytes | str) -> None:
    """Raise InvalidTopic unless `topic` starts with a known prefix."""
    raw = _as_bytes(topic)
    if not raw.startswith(TOPIC_PREFIXES):
        raise InvalidTopic(
            f"topic {raw[:64]!r} must start with one of: "
            + ", ".join(p.decode() for p in TOPIC_PREFIXES)
        )
    if len(raw) > MAX_NAME_LENGTH:
        raise InvalidTopic(f"topic is {len(raw)} bytes, the limit is {MAX_NAME_LENGTH}")


def is_valid_topic(topic: bytes | str) -> bool:
    """check_topic's rule as a bool (the limit is in bytes, as on the wire, not in characters)."""
    try:
        check_topic(topic)
    except InvalidTopic:
        return False
    return True
