/* importer/dedupe.py's RecentKeys in C; see native/dedupe.h.
 *
 * The keys live in a ring in first-seen order, and an open-addressing table with linear
 * probing finds a key's ring slot. The table has at least twice as many slots as the
 * capacity, so probes stay short; forgetting a key shifts the entries after it back (no
 * tombstones), so a long-running importer never slows down.
 *
 * Laid out for a memory far larger than the caches (1M keys by default, ~80 MB): at capacity
 * every new key is one lookup, one forgetting and one insertion, and each pointer followed
 * is a cache miss. So a table slot holds the key's 32-bit tag (the hash's high half, which
 * also gives the key's home slot) beside its ring slot: probes, the search for the slot to
 * forget and the shift after it read the table alone, and a ring entry is read only when
 * a tag matches. A ring entry holds a key of up to INLINE bytes itself (an idempotency key
 * with its stream's name is 30-60 bytes), so remembering one costs no malloc; the ring is
 * written in order, which the hardware prefetches. Longer keys get a malloc'd copy. */

#include "dedupe.h"

#include <stdlib.h>
#include <string.h>

#include "lj_hash.h"

#define MAX_CAPACITY (1LL << 30)
#define INLINE 56 /* key bytes a ring entry holds itself: the entry is one 64-byte cache line */

typedef struct {
    uint32_t tag;
    uint32_t len; /* the key's length, or LONG: the key is in `heap` (its length first) */
    union {
        uint8_t bytes[INLINE];
        struct {
            size_t len;
            uint8_t *copy;
        } heap;
    } key;
} entry_t;

#define LONG UINT32_MAX

struct lj_dd {
    int64_t capacity, count;
    int64_t oldest; /* once full: the ring slot that is forgotten next */
    entry_t *ring;  /* capacity */
    uint64_t *table; /* mask + 1 slots: tag << 32 | (ring slot + 1), or 0 for empty */
    uint64_t mask;
};

static inline uint32_t tag_of(uint64_t hash) { return (uint32_t)(hash >> 32); }
static inline uint64_t home_of(const lj_dd_t *dd, uint32_t tag) { return tag & dd->mask; }
static inline uint64_t slot_value(uint32_t tag, int64_t r) { return (uint64_t)tag << 32 | (uint64_t)(r + 1); }

lj_dd_t *lj_dd_new(int64_t capacity) {
    if (capacity < 1 || capacity > MAX_CAPACITY) return NULL;
    lj_dd_t *dd = calloc(1, sizeof *dd);
    if (!dd) return NULL;
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)capacity) slots *= 2;
    dd->capacity = capacity;
    dd->mask = slots - 1; /* at most 2**31 - 1: the tag's 32 bits cover it */
    /* calloc: pages a small memory never uses are never touched */
    dd->ring = calloc((size_t)capacity, sizeof(entry_t));
    dd->table = calloc((size_t)slots, sizeof(uint64_t));
    if (!dd->ring || !dd->table) {
        lj_dd_free(dd);
        return NULL;
    }
    return dd;
}

static void release(entry_t *e) {
    if (e->len == LONG) free(e->key.heap.copy);
}

void lj_dd_free(lj_dd_t *dd) {
    if (!dd) return;
    if (dd->ring)
        for (int64_t i = 0; i < dd->count; i++) release(&dd->ring[i]);
    free(dd->ring);
    free(dd->table);
    free(dd);
}

static int same_key(const entry_t *e, const uint8_t *key, size_t len) {
    if (e->len != LONG) return e->len == len && memcmp(e->key.bytes, key, len) == 0;
    return e->key.heap.len == len && memcmp(e->key.heap.copy, key, len) == 0;
}

/* The table slot holding `key`, or the empty slot where its probe ends (table[slot] == 0). */
static uint64_t find(const lj_dd_t *dd, const uint8_t *key, size_t len, uint32_t tag) {
    uint64_t i = home_of(dd, tag);
    for (;;) {
        uint64_t v = dd->table[i];
        if (!v) return i;
        if ((uint32_t)(v >> 32) == tag && same_key(&dd->ring[(uint32_t)v - 1], key, len)) return i;
        i = (i + 1) & dd->mask;
    }
}

/* The table slot holding ring slot r: a probe that compares whole slot values, never a key. */
static uint64_t find_slot_of(const lj_dd_t *dd, int64_t r) {
    uint32_t tag = dd->ring[r].tag;
    uint64_t want = slot_value(tag, r), i = home_of(dd, tag);
    while (dd->table[i] != want) i = (i + 1) & dd->mask;
    return i;
}

/* Empties table slot i, moving back the entries whose probe passed over it. */
static void unlink_slot(lj_dd_t *dd, uint64_t i) {
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & dd->mask;
        uint64_t v = dd->table[j];
        if (!v) break;
        uint64_t home = home_of(dd, (uint32_t)(v >> 32));
        /* the entry at j stays when its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        dd->table[i] = v;
        i = j;
    }
    dd->table[i] = 0;
}

int lj_dd_contains(const lj_dd_t *dd, const uint8_t *key, size_t len) {
    return dd->table[find(dd, key, len, tag_of(lj_hash_bytes(key, len)))] != 0;
}

int64_t lj_dd_len(const lj_dd_t *dd) { return dd->count; }

/* Fills ring entry e with `key`; -1 when its copy could not be made (e unchanged). */
static int store(entry_t *e, uint32_t tag, const uint8_t *key, size_t len) {
    if (len <= INLINE) {
        e->tag = tag;
        e->len = (uint32_t)len;
        memcpy(e->key.bytes, key, len);
        return 0;
    }
    uint8_t *copy = malloc(len);
    if (!copy) return -1;
    memcpy(copy, key, len);
    e->tag = tag;
    e->len = LONG;
    e->key.heap.len = len;
    e->key.heap.copy = copy;
    return 0;
}

int lj_dd_seen(lj_dd_t *dd, const uint8_t *key, size_t len) {
    uint32_t tag = tag_of(lj_hash_bytes(key, len));
    uint64_t slot = find(dd, key, len, tag);
    if (dd->table[slot]) return 1;
    int64_t r;
    if (dd->count < dd->capacity) {
        r = dd->count;
        if (store(&dd->ring[r], tag, key, len)) return -1;
        dd->count++;
    } else {
        /* forget the oldest key; the shift may move this key's empty slot, so look again */
        r = dd->oldest;
        uint64_t old_slot = find_slot_of(dd, r);
        entry_t kept = dd->ring[r];
        if (store(&dd->ring[r], tag, key, len)) return -1;
        unlink_slot(dd, old_slot); /* reads the table alone, so the ring entry may hold the new key already */
        release(&kept);
        dd->oldest = (r + 1) % dd->capacity;
        slot = find(dd, key, len, tag);
    }
    dd->table[slot] = slot_value(tag, r);
    return 0;
}
