/* importer/dedupe.py's RecentKeys in C; see native/dedupe.h.
 *
 * The keys live in a ring in first-seen order (each a malloc'd copy with its hash), and an
 * open-addressing table with linear probing finds a key's ring slot. The table has at least
 * twice as many slots as the capacity, so probes stay short; forgetting a key shifts the
 * entries after it back (no tombstones), so a long-running importer never slows down. */

#include "dedupe.h"

#include <stdlib.h>
#include <string.h>

#include "lj_hash.h"

#define MAX_CAPACITY (1LL << 30)

typedef struct {
    uint64_t hash;
    uint8_t *key; /* NULL while the slot is unused */
    size_t len;
} entry_t;

struct lj_dd {
    int64_t capacity, count;
    int64_t oldest; /* once full: the ring slot that is forgotten next */
    entry_t *ring;  /* capacity */
    uint32_t *table; /* mask + 1 slots: a ring slot + 1, or 0 for empty */
    uint64_t mask;
};

lj_dd_t *lj_dd_new(int64_t capacity) {
    if (capacity < 1 || capacity > MAX_CAPACITY) return NULL;
    lj_dd_t *dd = calloc(1, sizeof *dd);
    if (!dd) return NULL;
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)capacity) slots *= 2;
    dd->capacity = capacity;
    dd->mask = slots - 1;
    /* calloc: pages a small memory never uses are never touched */
    dd->ring = calloc((size_t)capacity, sizeof(entry_t));
    dd->table = calloc((size_t)slots, sizeof(uint32_t));
    if (!dd->ring || !dd->table) {
        lj_dd_free(dd);
        return NULL;
    }
    return dd;
}

void lj_dd_free(lj_dd_t *dd) {
    if (!dd) return;
    if (dd->ring)
        for (int64_t i = 0; i < dd->count; i++) free(dd->ring[i].key);
    free(dd->ring);
    free(dd->table);
    free(dd);
}

/* The table slot holding `key`, or the empty slot where its probe ends (table[slot] == 0). */
static uint64_t find(const lj_dd_t *dd, const uint8_t *key, size_t len, uint64_t hash) {
    uint64_t i = hash & dd->mask;
    for (;;) {
        uint32_t at = dd->table[i];
        if (!at) return i;
        const entry_t *e = &dd->ring[at - 1];
        if (e->hash == hash && e->len == len && memcmp(e->key, key, len) == 0) return i;
        i = (i + 1) & dd->mask;
    }
}

/* Empties table slot i, moving back the entries whose probe passed over it. */
static void unlink_slot(lj_dd_t *dd, uint64_t i) {
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & dd->mask;
        uint32_t at = dd->table[j];
        if (!at) break;
        uint64_t home = dd->ring[at - 1].hash & dd->mask;
        /* the entry at j stays when its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        dd->table[i] = at;
        i = j;
    }
    dd->table[i] = 0;
}

int lj_dd_contains(const lj_dd_t *dd, const uint8_t *key, size_t len) {
    return dd->table[find(dd, key, len, lj_hash_bytes(key, len))] != 0;
}

int64_t lj_dd_len(const lj_dd_t *dd) { return dd->count; }

int lj_dd_seen(lj_dd_t *dd, const uint8_t *key, size_t len) {
    uint64_t hash = lj_hash_bytes(key, len);
    uint64_t slot = find(dd, key, len, hash);
    if (dd->table[slot]) return 1;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return -1;
    memcpy(copy, key, len);
    int64_t r;
    if (dd->count < dd->capacity) {
        r = dd->count++;
    } else {
        /* forget the oldest key; the shift may move this key's empty slot, so look again */
        r = dd->oldest;
        entry_t *old = &dd->ring[r];
        unlink_slot(dd, find(dd, old->key, old->len, old->hash));
        free(old->key);
        dd->oldest = (r + 1) % dd->capacity;
        slot = find(dd, key, len, hash);
    }
    dd->ring[r] = (entry_t){hash, copy, len};
    dd->table[slot] = (uint32_t)(r + 1);
    return 0;
}
