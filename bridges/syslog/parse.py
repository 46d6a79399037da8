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
import functools
import re
from typing import Any

_UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_MS = datetime.timedelta(milliseconds=1)
FUTURE = datetime.timedelta(days=31)  # how far ahead of the bridge a 3164 timestamp may be
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_3164_TS = re.compile(r"([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)? ")
_ISO_TS = re.compile(r"\d{4}-\d\d-\d\dT\S+ ")
_5424_NAMES = ("timestamp", "hostname", "app_name", "procid", "msgid")
_fromisoformat = datetime.datetime.fromisoformat
_TAG = re.compile(r"([^\s\[\]:]{1,64})(?:\[([^\]\s]{0,128})\])?:(?: |$)")
_SD_ESCAPE = re.compile(r'\\(["\\\]])')
_SD_ID = re.compile(r"[^ \]]*")
_SD_PARAM = re.compile(r' ([^=]*)="((?:[^"\\]|\\.)*)"', re.S)
# `<PRI>`'s digits as the header may write them (one to three, leading zeros too) and their value.
_PRIS = {f"{p:0{width}d}": p for width in (1, 2, 3) for p in range(min(192, 10 ** width))}


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
    sd_id, sd_param = _SD_ID.match, _SD_PARAM.match
    while i < n and sd[i] == "[":
        end_id = sd_id(sd, i + 1).end()  # SD-ID ends at SP or "]"
        if end_id >= n or end_id == i + 1:
            return None
        params: dict[str, Any] = out.setdefault(sd[i + 1:end_id], {})
        i = end_id
        # Each ` NAME="VALUE"`: NAME up to the first "=", VALUE up to the first `"` that no
        # backslash escapes (a backslash escapes whatever follows it). A SP that does not
        # begin one leaves `sd[i]` a SP, so the element is not SD (below).
        while (m := sd_param(sd, i)) is not None:
            name, value = m.group(1, 2)
            if "\\" in value:
                value = _SD_ESCAPE.sub(r"\1", value)
            if name in params:
                old = params[name]
                params[name] = (old if isinstance(old, list) else [old]) + [value]
            else:
                params[name] = value
            i = m.end()
        if i >= n or sd[i] != "]":
            return None
        i += 1
    return out, sd[i:]


def _rfc5424(pri: int, s: str, raw_s: str) -> tuple[dict[str, Any], int]:
    """The body of `s`, which begins `<PRI>1 `: the header fields and the message; and its time."""
    syslog: dict[str, Any] = {"format": "rfc5424", "priority": pri, "facility": pri >> 3, "severity": pri & 7,
                              "version": 1}
    # `<PRI>1 ` holds one SP, at its end: splitting all of `s` once more is splitting what follows it.
    fields = s.split(" ", 6)
    if len(fields) == 7:  # a whole header: the fields unrolled, as the loop below sets them
        _, ts, host, app, procid, msgid, message = fields
        if ts != "-":
            syslog["timestamp"] = ts
        if host != "-":
            syslog["hostname"] = host
        if app != "-":
            syslog["app_name"] = app
        if procid != "-":
            syslog["procid"] = procid
        if msgid != "-":
            syslog["msgid"] = msgid
    else:
        for name, value in zip(_5424_NAMES, fields[1:]):
            if value != "-":
                syslog[name] = value
        ts, message = syslog.get("timestamp", "-"), ""
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
    body: dict[str, Any] = {"message": message, "syslog": syslog, "raw": raw_s}
    if ts != "-":
        try:
            when = _fromisoformat(ts)
        except ValueError:
            return body, 0
        body["@timestamp"] = ts  # RFC 3339, as sent
        return body, epoch_ms(when)
    return body, 0


def epoch_ms(when: datetime.datetime) -> int:
    """`when` as epoch milliseconds (UTC when it has no zone), 0 for 1970 or before: the mapper's
    reading of an `@timestamp` (bridges.host.mapping.parse_timestamp), from the datetime at hand."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=_UTC)
    ms = (when - _EPOCH) // _MS
    return ms if ms > 0 else 0


@functools.lru_cache(maxsize=4096)
def _inferred(month: int, day: int, hms: tuple[int, int, int], received_ms: int) -> tuple[str, int] | None:
    """`infer_year` as ISO 8601 text and epoch milliseconds; a burst of lines shares a few
    timestamps and (over a stream) the time it was received, so each is worked out once."""
    ts = infer_year(month, day, hms, received_ms)
    return None if ts is None else (ts.isoformat(), epoch_ms(ts))


def _rfc3164(pri: int, s: str, at: int, received_ms: int) -> tuple[dict[str, Any], str, str | None, int]:
    """The header fields, the message, and `@timestamp` with its epoch ms (None, 0 without one)."""
    header = pri >= 0
    syslog: dict[str, Any] = {"format": "rfc3164", "priority": pri, "facility": pri >> 3, "severity": pri & 7} \
        if header else {"format": "unknown"}
    iso: str | None = None
    ms = 0
    m = _3164_TS.match(s, at)
    if m is not None:
        syslog["timestamp"] = m.group(0)[:-1]
        month = _MONTHS.get(m.group(1))
        inferred = _inferred(month, int(m.group(2)), (int(m.group(3)), int(m.group(4)), int(m.group(5))),
                             received_ms) if month else None
        if inferred is not None:
            iso, ms = inferred
        at = m.end()
    else:
        m = _ISO_TS.match(s, at)
        if m is not None:
            value = m.group(0)[:-1]
            try:
                when = _fromisoformat(value)
            except ValueError:
                pass
            else:
                syslog["timestamp"] = iso = value
                ms = epoch_ms(when)
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
    return syslog, rest, iso, ms


def parse(raw: bytes, received_ms: int) -> dict[str, Any]:
    """The body of one syslog message; its `@timestamp`, when it has one, is the event's time."""
    return parse_timed(raw, received_ms)[0]


def parse_timed(raw: bytes, received_ms: int) -> tuple[dict[str, Any], int]:
    """`parse`, and the body's time as the mapper reads its `@timestamp` (`epoch_ms`; 0 when
    there is none), so that the bridge need not read the text again."""
    try:
        s = raw_s = raw.decode()
    except UnicodeDecodeError:
        s, raw_s = text(raw), raw_text(raw)
    # `<PRI>`, read here rather than in a function of its own: this runs for every message.
    pri, at = -1, 0
    if s[:1] == "<":
        end = s.find(">", 1, 5)
        if end > 0:
            pri = _PRIS.get(s[1:end], -1)
            if pri >= 0:
                if s.startswith("1 ", end + 1):
                    return _rfc5424(pri, s, raw_s)
                at = end + 1
    syslog, message, iso, ms = _rfc3164(pri, s, at, received_ms)
    body: dict[str, Any] = {"message": message, "syslog": syslog, "raw": raw_s}
    if iso is not None:
        body["@timestamp"] = iso
    return body, ms
