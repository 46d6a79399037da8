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
  zone: it is read as UTC in the latest year that puts it no more than 31 days after the time
  the bridge received it, so a December 31 message received on January 1 keeps last year, a
  clock a little ahead across New Year gets next year, and a January line read in November
  (a file shipped late) is this year's.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_UTC = datetime.timezone.utc
FUTURE = datetime.timedelta(days=31)  # how far ahead of the bridge a 3164 timestamp may be
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_3164_TS = re.compile(r"([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)? ")
_ISO_TS = re.compile(r"\d{4}-\d\d-\d\dT\S+ ")
_5424_NAMES = ("timestamp", "hostname", "app_name", "procid", "msgid")
_fromisoformat = datetime.datetime.fromisoformat
_TAG = re.compile(r"([^\s\[\]:]{1,64})(?:\[([^\]\s]{0,128})\])?:(?: |$)")
_SD_ESCAPE = re.compile(r'\\(["\\\]])')


def text(data: bytes) -> str:
    """Bytes as text: UTF-8, with what is not UTF-8 replaced (the `raw` field keeps it escaped)."""
    return data.decode("utf-8", "replace")


def raw_text(data: bytes) -> str:
    """The frame as JSON-safe text: UTF-8 as is, other bytes as `\\xNN`."""
    return data.decode("utf-8", "backslashreplace")


def infer_year(month: int, day: int, hms: tuple[int, int, int], received_ms: int) -> datetime.datetime | None:
    """The 3164 timestamp (UTC) in the latest year that puts it at most `FUTURE` after `received_ms`
    (a log line is not from the future, bar a sender's clock a little ahead); None if no year of
    the last four has that day."""
    now = datetime.datetime.fromtimestamp(received_ms / 1000, _UTC)
    for year in range(now.year + 1, now.year - 5, -1):
        try:
            ts = datetime.datetime(year, month, day, *hms, tzinfo=_UTC)
        except ValueError:  # Feb 29 outside a leap year, day 31 of a short month
            continue
        if ts - now <= FUTURE:
            return ts
    return None


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


def _pri(s: str) -> tuple[int, int]:
    """(PRI, where the header goes on), or (-1, 0) without a valid `<0..191>`."""
    if s[:1] != "<":
        return -1, 0
    end = s.find(">", 1, 5)
    digits = s[1:end]
    if end < 0 or not digits.isdigit() or not digits.isascii():
        return -1, 0
    pri = int(digits)
    return (pri, end + 1) if pri <= 191 else (-1, 0)


def _valid_iso(value: str) -> bool:
    try:
        _fromisoformat(value)
    except ValueError:
        return False
    return True


def _rfc5424(pri: int, s: str, at: int) -> tuple[dict[str, Any], str]:
    """`s[at:]` follows `<PRI>1 `: the header fields and the message."""
    fields = s[at:].split(" ", 5)
    syslog: dict[str, Any] = {"format": "rfc5424", "priority": pri, "facility": pri >> 3, "severity": pri & 7,
                              "version": 1}
    for name, value in zip(_5424_NAMES, fields):
        if value != "-":
            syslog[name] = value
    message = fields[5] if len(fields) > 5 else ""
    first = message[:1]
    if first == "-":
        message = message[2:] if message[1:2] == " " else message[1:]
    elif first == "[":
        parsed = structured_data(message)
        if parsed is not None:
            syslog["structured_data"], message = parsed
            if message[:1] == " ":
                message = message[1:]
    # The BOM is MSG's own first bytes; dropped after decoding (U+FEFF).
    if message[:1] == "\ufeff":
        message = message[1:]
    return syslog, message


def _rfc3164(pri: int, s: str, at: int, received_ms: int) -> tuple[dict[str, Any], str, str | None]:
    header = pri >= 0
    syslog: dict[str, Any] = {"format": "rfc3164", "priority": pri, "facility": pri >> 3, "severity": pri & 7} \
        if header else {"format": "unknown"}
    iso: str | None = None
    m = _3164_TS.match(s, at)
    if m is not None:
        syslog["timestamp"] = m.group(0)[:-1]
        month = _MONTHS.get(m.group(1))
        ts = infer_year(month, int(m.group(2)), (int(m.group(3)), int(m.group(4)), int(m.group(5))), received_ms) \
            if month else None
        if ts is not None:
            iso = ts.isoformat()
        at = m.end()
    else:
        m = _ISO_TS.match(s, at)
        if m is not None:
            value = m.group(0)[:-1]
            if _valid_iso(value):
                syslog["timestamp"] = iso = value
                at = m.end()
    rest = s[at:]
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
    return syslog, rest, iso


def parse(raw: bytes, received_ms: int) -> dict[str, Any]:
    """The body of one syslog message; its `@timestamp`, when it has one, is the event's time."""
    try:
        s = raw_s = raw.decode()
    except UnicodeDecodeError:
        s, raw_s = text(raw), raw_text(raw)
    pri, at = _pri(s)
    if pri >= 0 and s[at:at + 2] == "1 ":
        syslog, message = _rfc5424(pri, s, at + 2)
        body: dict[str, Any] = {"message": message, "syslog": syslog, "raw": raw_s}
        ts = syslog.get("timestamp")
        if ts is not None and _valid_iso(ts):
            body["@timestamp"] = ts  # RFC 3339, as sent
        return body
    syslog, message, iso = _rfc3164(pri, s, at, received_ms)
    body = {"message": message, "syslog": syslog, "raw": raw_s}
    if iso is not None:
        body["@timestamp"] = iso
    return body
