/* The JSON text helpers the C modules share: native/variant.c and native/decode.c read JSON
 * exactly as strictly (RFC 8259, well-formed UTF-8), so they read its escapes and UTF-8 one
 * way; native/otlp_*.c and native/syslog.c write strings as orjson does, so they escape one way.
 * Header-only (static inline): no module of its own. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The four hex digits at p as a number in *out: 0, or -1 when one is not a hex digit. */
static inline int lj_hex4(const uint8_t *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

/* The first byte at or after p that a JSON string reader must look at (`"`, `\\`, a C0
 * control or a non-ASCII byte), or end. Eight bytes a step: a log line's strings are long runs
 * of plain ASCII, and a byte at a time was most of the importer's JSON reading. A step finds a
 * word's first such byte exactly (the borrow of the zero-byte test only reaches bytes above
 * the first match, and those are never counted). */
static inline const uint8_t *lj_plain_run(const uint8_t *p, const uint8_t *end) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
        /* a byte's high bit: it is `"`, it is `\\`, it is below 0x20, it is 0x80 or above */
        uint64_t hit = (((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w) | w) & highs;
        if (hit) return p + (__builtin_ctzll(hit) >> 3);
        p += 8;
    }
#endif
    while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
    return p;
}

/* Length of the well-formed UTF-8 sequence at p (no overlongs, surrogates or code points past
 * U+10FFFF), or 0. */
static inline size_t lj_utf8_len(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    if (c < 0x80) return 1;
    size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || c > 0xF4 || (size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (n == 3 && ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0))) return 0;
    if (n == 4 && ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90))) return 0;
    return n;
}

/* Code point cp as UTF-8 at out (room for 4 bytes); returns its length. */
static inline size_t lj_utf8_put(uint8_t *out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { out[0] = 0xC0 | (cp >> 6); out[1] = 0x80 | (cp & 0x3F); return 2; }
    if (cp < 0x10000) {
        out[0] = 0xE0 | (cp >> 12); out[1] = 0x80 | ((cp >> 6) & 0x3F); out[2] = 0x80 | (cp & 0x3F);
        return 3;
    }
    out[0] = 0xF0 | (cp >> 18); out[1] = 0x80 | ((cp >> 12) & 0x3F); out[2] = 0x80 | ((cp >> 6) & 0x3F);
    out[3] = 0x80 | (cp & 0x3F);
    return 4;
}

/* A byte orjson escapes in a string (a C0 control, `"` or `\\`), written at o as orjson writes
 * it: \b \t \n \f \r by name, `"` and `\\` after a backslash, the rest as \u00xx (lowercase
 * hex). Returns where it ends (at most 6 bytes on). */
static inline uint8_t *lj_json_escape(uint8_t *o, uint8_t c) {
    static const char hex[] = "0123456789abcdef";
    *o++ = '\\';
    switch (c) {
    case '"': *o++ = '"'; break;
    case '\\': *o++ = '\\'; break;
    case '\b': *o++ = 'b'; break;
    case '\t': *o++ = 't'; break;
    case '\n': *o++ = 'n'; break;
    case '\f': *o++ = 'f'; break;
    case '\r': *o++ = 'r'; break;
    default:
        *o++ = 'u'; *o++ = '0'; *o++ = '0';
        *o++ = (uint8_t)hex[c >> 4]; *o++ = (uint8_t)hex[c & 15];
    }
    return o;
}
