/* The importer's memory of recent idempotency keys in C: importer/dedupe.py's `RecentKeys`
 * (its Python twin, and the reference for what it answers), asked by native/decode.c once per
 * row and from Python through importer/decode_native.py's `NativeRecentKeys`.
 *
 * The last `capacity` distinct keys in the order they were first seen; a key is any byte
 * string (the empty one too, as in the twin: the callers decide what is no key). Exact: keys
 * are compared byte for byte, a hash only finds where to look. Memory is bounded by the
 * capacity: for each key remembered, a 64-byte ring entry (holding the key when it is at most
 * 56 bytes, else pointing at a copy) and two 8-byte table slots.
 *
 * Also the module's cffi declaration (native/build.py reads it before native/decode.h):
 * only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct lj_dd lj_dd_t;

/* NULL when capacity < 1 or too large (2**30), or when memory ran out. */
lj_dd_t *lj_dd_new(int64_t capacity);
void lj_dd_free(lj_dd_t *dd);
/* 1 when `key` is remembered (a duplicate); otherwise remembers it (forgetting the oldest key
 * at capacity) and returns 0; -1 when memory ran out (nothing changed). */
int lj_dd_seen(lj_dd_t *dd, const uint8_t *key, size_t len);
/* 1 when `key` is remembered; neither adds nor refreshes. */
int lj_dd_contains(const lj_dd_t *dd, const uint8_t *key, size_t len);
/* Keys remembered (at most the capacity). */
int64_t lj_dd_len(const lj_dd_t *dd);
