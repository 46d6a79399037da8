"""One syslog message (RFC 5424 or RFC 3164) as the event body: lenient, never raises.

Whatever a sender put in a frame becomes a body; what the parser recognised goes under
`syslog`, the text after the header is `message`, and the frame itself is kept as `raw`
(docs/protocols/syslog.md has the mapping). Real senders stray from both RFCs (no PRI, no
hostname, an ISO timestamp in a 3164 header, a 5424 header cut short), so nothing here is
an error: the parser takes what it can read and the rest stays in `message`.

- RFC 5424: `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD [MSG]`, `-` for a missing
  field. MSG may begin with a UTF-8 BOM, which is dropped. Structured data becomes
  `{"SD-ID": {"param": "value"}}` with its three escapes (`\\"`, `\\\\`, `\\]`) undone; a
  backslash before any other character stays, as RFC 5424 says; a repeated parameter
  becomes a list of its values.
- RFC 3164: `<PRI>Mmm dd hh:mm:ss HOSTNAME TAG[PID]: MSG`. The timestamp has no year and no
  zone: it is read as UTC in the year that puts it nearest the time the bridge received it,
  so a December 31 message received on January 1 keeps last year (and a clock a little
  ahead across New Year gets next year).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

BOM = b"\xef\xbb\xbf"
_UTC = datetime.timezone.utc
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_PRI = re.compile(rb"<(\d{1,3})>")
_3164_TS = re.compile(rb"([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)? ")
_ISO_TS = re.compile(rb"\d{4}-\d\d-\d\dT\S+ ")
_TAG = re.compile(r"([^\s\[\]:]{1,64})(?:\[([^\]\s]{0,128})\])?:(?: |$)")
_SD_ESCAPE = re.compile(r'\\(["\\\]])')
_NIL = "-"


def text(data: bytes) -> str:
    """Bytes as text: UTF-8, with what is not UTF-8 replaced (the `raw` field keeps it escaped)."""
    return data.decode("utf-8", "replace")


def raw_text(data: bytes) -> str:
    """The frame as JSON-safe text: UTF-8 as is, other bytes as `\\xNN`."""
    return data.decode("utf-8", "backslashreplace")


def iso_ms(value: str) -> tuple[str, int] | None:
    """A 5424 (ISO 8601) timestamp as (normalised text, epoch ms), or None when unreadable."""
    try:
        ts = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=_UTC)
    try:
        ms = int(ts.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):
        return None
    return ts.isoformat(), ms


def infer_year(month: int, day: int, hms: tuple[int, int, int], received_ms: int) -> datetime.datetime | None:
    """The 3164 timestamp in the year (UTC) that puts it nearest `received_ms`; None if no year has that day."""
    now = datetime.datetime.fromtimestamp(received_ms / 1000, _UTC)
    best: datetime.datetime | None = None
    for year in (now.year - 1, now.year, now.year + 1):
        try:
            ts = datetime.datetime(year, month, day, *hms, tzinfo=_UTC)
        except ValueError:  # Feb 29 outside a leap year, day 31 of a short month
            continue
        if best is None or abs(ts - now) < abs(best - now):
            best = ts
    return best


def structured_data(sd: str) -> tuple[dict[str, Any], str] | None:
    """Parse SD elements at the start of `sd`; returns (elements, rest) or None when it is not SD."""
    out: dict[str, Any] = {}
    i, n = 0, len(sd)
    while i < n and sd[i] == "[":
        end_id = i + 1
        while end_id < n and sd[end_id] not in " ]":
            end_id += 1
        if end_id >= n or end_id == i + 1:
            return None
        params: dict[str, Any] = out.setdefault(sd[i + 1:end_id], {})
        i = end_id
        while i < n and sd[i] == " ":
            eq = sd.find("=", i + 1)
            if eq < 0 or eq + 1 >= n or sd[eq + 1] != '"':
                return None
            name = sd[i + 1:eq]
            j = eq + 2
            value_start = j
            while j < n and sd[j] != '"':
                j += 2 if sd[j] == "\\" else 1
            if j >= n:
                return None
            value = _SD_ESCAPE.sub(r"\1", sd[value_start:j])
            if name in params:
                old = params[name]
                params[name] = (old if isinstance(old, list) else [old]) + [value]
            else:
                params[name] = value
            i = j + 1
        if i >= n or sd[i] != "]":
            return None
        i += 1
    return out, sd[i:]


def _pri(raw: bytes) -> tuple[dict[str, Any], int]:
    m = _PRI.match(raw)
    if m is None or int(m.group(1)) > 191:
        return {}, 0
    pri = int(m.group(1))
    return {"priority": pri, "facility": pri >> 3, "severity": pri & 7}, m.end()


def _rfc5424(header: dict[str, Any], raw: bytes, at: int) -> tuple[dict[str, Any], str, str | None]:
    """`raw[at:]` follows `<PRI>1 `: header fields, the message and the ISO timestamp."""
    fields = raw[at:].split(b" ", 5)
    names = ("timestamp", "hostname", "app_name", "procid", "msgid")
    syslog = {"format": "rfc5424", **header, "version": 1}
    for name, value in zip(names, fields):
        if value != b"-":
            syslog[name] = text(value)
    rest = text(fields[5]) if len(fields) > 5 else ""
    message = rest
    if rest.startswith(_NIL):
        message = rest[2:] if rest[1:2] == " " else rest[1:]
    elif rest.startswith("["):
        parsed = structured_data(rest)
        if parsed is not None:
            syslog["structured_data"], message = parsed
            message = message[1:] if message.startswith(" ") else message
    # The BOM is MSG's own first bytes; dropped after decoding (U+FEFF).
    message = message.removeprefix("\ufeff")
    return syslog, message, syslog.get("timestamp")


def _rfc3164(header: dict[str, Any], raw: bytes, at: int,
             received_ms: int) -> tuple[dict[str, Any], str, str | None, int | None]:
    syslog: dict[str, Any] = {"format": "rfc3164" if header else "unknown", **header}
    ms: int | None = None
    iso: str | None = None
    m = _3164_TS.match(raw, at)
    if m is not None:
        syslog["timestamp"] = text(m.group(0)[:-1])
        month = _MONTHS.get(m.group(1).decode())
        day = int(m.group(2))
        ts = infer_year(month, day, (int(m.group(3)), int(m.group(4)), int(m.group(5))), received_ms) \
            if month and day else None
        if ts is not None:
            iso = ts.isoformat()
            ms = int(ts.timestamp() * 1000)
        at = m.end()
    else:
        m = _ISO_TS.match(raw, at)
        if m is not None:
            value = text(m.group(0)[:-1])
            read = iso_ms(value)
            if read is not None:
                syslog["timestamp"] = value
                iso, ms = read
                at = m.end()
    rest = text(raw[at:])
    if m is not None or header:
        # HOSTNAME follows a timestamp, unless the first word is already the tag ("host tag:
        # msg" vs "tag: msg"); without a timestamp there is none (rsyslog reads it so too).
        first, _, after = rest.partition(" ")
        if m is not None and first and not _TAG.match(rest) and after:
            syslog["hostname"] = first
            rest = after
        t = _TAG.match(rest)
        if t is not None:
            syslog["app_name"] = t.group(1)
            if t.group(2):
                syslog["procid"] = t.group(2)
            rest = rest[t.end():]
    return syslog, rest, iso, ms


def parse(raw: bytes, received_ms: int) -> tuple[dict[str, Any], int | None]:
    """The body of one syslog message and its time in epoch ms (None: use the receive time)."""
    header, at = _pri(raw)
    if header and raw[at:at + 2] == b"1 ":
        syslog, message, ts = _rfc5424(header, raw, at + 2)
        read = iso_ms(ts) if ts else None
        body: dict[str, Any] = {"message": message, "syslog": syslog, "raw": raw_text(raw)}
        if read is not None:
            body["@timestamp"] = read[0]
        return body, read[1] if read is not None else None
    syslog, message, iso, ms = _rfc3164(header, raw, at, received_ms)
    body = {"message": message, "syslog": syslog, "raw": raw_text(raw)}
    if iso is not None:
        body["@timestamp"] = iso
    return body, ms
