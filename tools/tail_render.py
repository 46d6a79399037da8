"""How `logjam-tail` turns Messages and Gaps into text: one line, pretty, raw, or JSON.

Pure functions and small classes with no I/O, so every output mode can be checked
without sockets. Message content never reaches the terminal unescaped: control
characters in app-envs, topics and bodies are written as escapes, so a hostile
body cannot move the cursor, change colours or retitle the window.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from rich.cells import cell_len, set_cell_size
from rich.color import ColorSystem
from rich.style import Style

from logjam.compression import DEFAULT_MAX_DECOMPRESSED
from logjam.errors import ProtocolError, RemoteProtocolError
from logjam.message import Message
from logjam.meta import Compression
from logjam.subscriber import Gap

ELLIPSIS = "…"
ERROR_MARKER = "!! bad body"

# C0 and C1 controls plus DEL: C1 matters too, since some terminals take 0x9B as CSI.
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape_table(keep: tuple[int, ...] = ()) -> dict[int, str]:
    table: dict[int, str] = {}
    for c in _CONTROLS:
        if c in keep:
            continue
        table[c] = _NAMED.get(c) or f"\\x{c:02x}"
    return table


_ONE_LINE = _escape_table()
_MULTI_LINE = _escape_table(keep=(0x09, 0x0A))
# For raw bytes read as latin-1: printable ASCII stays, the backslash and everything else
# becomes an escape, so `codecs.escape_decode` gives the exact bytes back.
_RAW = {b: f"\\x{b:02x}" for b in [*range(0x00, 0x20), *range(0x7F, 0x100)]}
_RAW[0x5C] = "\\\\"


def one_line(text: str) -> str:
    """`text` with every control character escaped (newlines included)."""
    return text if text.isprintable() else text.translate(_ONE_LINE)


def multi_line(text: str) -> str:
    """`text` with control characters escaped except newline and tab."""
    return text.translate(_MULTI_LINE)


def escape_bytes(data: bytes) -> str:
    """Bytes as printable ASCII with `\\xNN` escapes; lossless and terminal-safe."""
    return data.decode("latin-1").translate(_RAW)


class BadEncoding(RemoteProtocolError):
    """A body decompressed fine but is not UTF-8 text."""

    reason = "bad_encoding"


_NOT_JSON = object()


def loads(text: str | bytes) -> Any:
    """Parsed JSON, or `_NOT_JSON`; never raises."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def dumps(value: Any, indent: bool = False) -> str:
    """JSON text; falls back to the standard library for integers beyond 64 bits."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, indent=2 if indent else None, separators=None if indent else (",", ":"))


@dataclass(frozen=True, slots=True)
class Body:
    """A decompressed, decoded body; `error` is set when either step failed."""

    text: str | None
    error: ProtocolError | None = None
    payload: bytes | None = None

    def json(self) -> Any:
        """The parsed body, or the text itself when it is not JSON."""
        assert self.text is not None
        value = loads(self.text)
        return self.text if value is _NOT_JSON else value


def decode_body(msg: Message, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> Body:
    try:
        payload = msg.payload(max_size)
    except ProtocolError as e:
        return Body(None, e)
    try:
        return Body(payload.decode("utf-8"), None, payload)
    except UnicodeDecodeError as e:
        return Body(None, BadEncoding(f"body is not UTF-8 (byte {e.start}): {escape_bytes(payload[:64])}"), payload)


def compression_name(method: int) -> str:
    try:
        return Compression(method).name.lower()
    except ValueError:
        return str(method)


def local_time(created_ms: int) -> str:
    """Time of day in the local zone, to the millisecond; '?' when out of range."""
    try:
        return datetime.fromtimestamp(created_ms / 1000).strftime("%H:%M:%S.") + f"{created_ms % 1000:03d}"
    except (OverflowError, OSError, ValueError):
        return "??:??:??.???"


def local_datetime(created_ms: int) -> str:
    try:
        return datetime.fromtimestamp(created_ms / 1000).astimezone().isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"created_ms={created_ms}"


class Palette:
    """ANSI styling through rich; with no colour system every method returns plain text."""

    STYLES = {
        "time": "dim",
        "app_env": "bold cyan",
        "topic": "green",
        "seq": "yellow",
        "heartbeat": "dim magenta",
        "gap": "bold yellow",
        "error": "bold red",
        "meta": "dim",
    }

    def __init__(self, color_system: ColorSystem | None) -> None:
        self.color_system = color_system
        self._styles = {k: Style.parse(v) for k, v in self.STYLES.items()}

    def __call__(self, kind: str, text: str) -> str:
        # The body keeps the terminal's default colour.
        if self.color_system is None or not text or kind == "body":
            return text
        return self._styles[kind].render(text, color_system=self.color_system)


def gap_text(gap: Gap) -> str:
    if gap.restart:
        return f"-- device {gap.device}: sequence went back from {gap.first} to {gap.last} (restart or wrap)"
    noun = "message" if gap.lost == 1 else "messages"
    return f"-- device {gap.device}: {gap.lost} {noun} lost (seq {gap.first}..{gap.last})"


def gap_object(gap: Gap) -> dict[str, Any]:
    return {"gap": {"device": gap.device, "lost": gap.lost, "first": gap.first, "last": gap.last, "restart": gap.restart}}


def message_object(msg: Message, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> dict[str, Any]:
    """The --json record: body is the parsed JSON, or a string; an `error` replaces it when unreadable."""
    obj: dict[str, Any] = {
        "app_env": msg.app_env,
        "topic": msg.topic,
        "device": msg.meta.device,
        "seq": msg.meta.seq,
        "created_ms": msg.meta.created_ms,
        "compression": compression_name(msg.meta.compression),
    }
    body = decode_body(msg, max_size)
    if body.error is None:
        obj["body"] = body.json()
    else:
        obj["body"] = None
        obj["error"] = {"reason": body.error.reason, "message": str(body.error)}
        obj["body_base64"] = base64.b64encode(msg.body).decode()
    return obj


class Renderer:
    """Formats items for one output mode; `width` (0 = unlimited) applies to line mode only."""

    MODES = ("lines", "pretty", "raw", "json")

    def __init__(self, mode: str = "lines", palette: Palette | None = None, width: int = 0,
                 max_size: int = DEFAULT_MAX_DECOMPRESSED) -> None:
        if mode not in self.MODES:
            raise ValueError(f"unknown output mode {mode!r}")
        self.mode = mode
        self.paint = palette or Palette(None)
        self.width = width
        self.max_size = max_size

    def gap(self, gap: Gap) -> str:
        if self.mode == "json":
            return dumps(gap_object(gap)) + "\n"
        return self.paint("gap", gap_text(gap)) + "\n"

    def message(self, msg: Message) -> str:
        if self.mode == "json":
            return dumps(message_object(msg, self.max_size)) + "\n"
        if self.mode == "raw":
            return self._raw(msg)
        if self.mode == "pretty":
            return self._pretty(msg)
        return self._line(msg)

    def _header(self, msg: Message) -> list[tuple[str, str]]:
        """The (style, text) parts before the body."""
        return [
            ("time", local_time(msg.meta.created_ms)),
            ("heartbeat" if msg.is_heartbeat else "app_env", one_line(msg.app_env)),
            ("heartbeat" if msg.is_heartbeat else "topic", one_line(msg.topic)),
            ("seq", f"{msg.meta.device}:{msg.meta.seq}"),
        ]

    def _join(self, parts: list[tuple[str, str]]) -> str:
        return " ".join(self.paint(kind, text) for kind, text in parts)

    def _fit(self, parts: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Cut the last parts so the line fits `width` cells, ending in an ellipsis."""
        if not self.width:
            return parts
        out: list[tuple[str, str]] = []
        room = self.width
        for i, (kind, text) in enumerate(parts):
            sep = 1 if i else 0
            need = cell_len(text) + sep
            if need <= room:
                out.append((kind, text))
                room -= need
                continue
            if room - sep >= 1:
                out.append((kind, set_cell_size(text, room - sep - 1) + ELLIPSIS))
            break
        return out

    def _body_line(self, msg: Message) -> tuple[str, str]:
        body = decode_body(msg, self.max_size)
        if body.error is not None:
            return "error", f"{ERROR_MARKER} [{body.error.reason}]: {one_line(str(body.error))}"
        text = body.text or ""
        if "\n" in text or "\r" in text:
            # Re-serialise indented JSON so it stays readable on one line.
            value = loads(text)
            if value is not _NOT_JSON:
                text = dumps(value)
        return ("heartbeat" if msg.is_heartbeat else "body"), one_line(text)

    def _line(self, msg: Message) -> str:
        parts = self._header(msg)
        parts.append(self._body_line(msg))
        return self._join(self._fit(parts)) + "\n"

    def _pretty(self, msg: Message) -> str:
        parts = self._header(msg)
        parts.append(("meta", f"({compression_name(msg.meta.compression)}, {len(msg.body)} bytes, "
                              f"{local_datetime(msg.meta.created_ms)})"))
        head = self._join(parts)
        body = decode_body(msg, self.max_size)
        if body.error is not None:
            text = self.paint("error", f"{ERROR_MARKER} [{body.error.reason}]: {one_line(str(body.error))}")
        else:
            value = loads(body.text or "")
            text = multi_line(body.text or "") if value is _NOT_JSON else dumps(value, indent=True)
        return f"{head}\n{text}\n"

    def _raw(self, msg: Message) -> str:
        parts = self._header(msg)
        parts.append(("meta", f"{compression_name(msg.meta.compression)} {len(msg.body)} bytes"))
        return f"{self._join(parts)}\n{escape_bytes(msg.body)}\n"
