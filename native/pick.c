/* Picks for a chunk already in sequence; see native/pick.h.
 *
 * Two small open-addressing tables (app-envs, topics) from a name's bytes to what Python
 * decided about it. A worker sees a few streams and many messages, so every lookup hits but
 * the first of each name, which goes back to Python once. */

#include "pick.h"

#include <stdlib.h>
#include <string.h>

#include "lj_hash.h"

typedef struct {
    uint64_t hash;
    uint8_t *key;
    size_t len;
    int64_t number, slot; /* the decoder's name number; the stream's count slot */
    int used, keeps;
} name_t;

typedef struct {
    name_t *e;
    uint64_t mask;
    int64_t count;
} map_t;

struct lj_pick {
    map_t streams, topics;
    int64_t *counts, *slots; /* per stream slot */
    int64_t nslots, room;
    int64_t touched, picks, skipped;
};

static void map_free(map_t *m) {
    if (m->e)
        for (uint64_t i = 0; i <= m->mask; i++) free(m->e[i].key);
    free(m->e);
    memset(m, 0, sizeof *m);
}

static name_t *map_find(const map_t *m, const uint8_t *key, size_t len, uint64_t hash) {
    if (!m->e) return NULL;
    for (uint64_t i = hash & m->mask;; i = (i + 1) & m->mask) {
        name_t *e = &m->e[i];
        if (!e->used) return e;
        if (e->hash == hash && e->len == len && memcmp(e->key, key, len) == 0) return e;
    }
}

/* The free slot for a key not in the map, growing it first when half full; NULL: no memory. */
static name_t *map_slot(map_t *m, uint64_t hash) {
    if (!m->e || 2 * (uint64_t)(m->count + 1) > m->mask + 1) {
        uint64_t size = m->e ? 2 * (m->mask + 1) : 64;
        name_t *e = calloc((size_t)size, sizeof *e);
        if (!e) return NULL;
        for (uint64_t i = 0; m->e && i <= m->mask; i++) {
            if (!m->e[i].used) continue;
            uint64_t j = m->e[i].hash & (size - 1);
            while (e[j].used) j = (j + 1) & (size - 1);
            e[j] = m->e[i];
        }
        free(m->e);
        m->e = e;
        m->mask = size - 1;
    }
    uint64_t i = hash & m->mask;
    while (m->e[i].used) i = (i + 1) & m->mask;
    return &m->e[i];
}

/* Adds a name not yet in the map: its entry, or NULL (no memory, or known already). */
static name_t *map_add(map_t *m, const uint8_t *key, size_t len) {
    uint64_t hash = lj_hash_bytes(key, len);
    name_t *known = map_find(m, key, len, hash);
    if (known && known->used) return NULL;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return NULL;
    name_t *e = map_slot(m, hash);
    if (!e) {
        free(copy);
        return NULL;
    }
    memcpy(copy, key, len);
    *e = (name_t){.hash = hash, .key = copy, .len = len, .used = 1};
    m->count++;
    return e;
}

lj_pick_t *lj_pick_new(void) { return calloc(1, sizeof(lj_pick_t)); }

void lj_pick_clear(lj_pick_t *t) {
    map_free(&t->streams);
    map_free(&t->topics);
    t->nslots = t->touched = 0;
}

void lj_pick_free(lj_pick_t *t) {
    if (!t) return;
    lj_pick_clear(t);
    free(t->counts);
    free(t->slots);
    free(t);
}

int64_t lj_pick_stream(lj_pick_t *t, const uint8_t *name, size_t len, int64_t number, int keeps) {
    if (t->nslots == t->room) {
        int64_t room = t->room ? 2 * t->room : 64;
        int64_t *counts = realloc(t->counts, (size_t)room * sizeof *counts);
        if (!counts) return -1;
        t->counts = counts;
        int64_t *slots = realloc(t->slots, (size_t)room * sizeof *slots);
        if (!slots) return -1;
        t->slots = slots;
        t->room = room;
    }
    name_t *e = map_add(&t->streams, name, len);
    if (!e) return -1;
    e->number = number;
    e->keeps = keeps != 0;
    e->slot = t->nslots;
    t->counts[t->nslots] = 0;
    return t->nslots++;
}

int lj_pick_topic(lj_pick_t *t, const uint8_t *name, size_t len, int64_t number) {
    name_t *e = map_add(&t->topics, name, len);
    if (!e) return -1;
    e->number = number;
    return 0;
}

/* A message's frame f (0: app-env, 1: topic) in the map, or NULL (unknown, or out of bounds). */
static const name_t *frame_name(const map_t *m, const uint8_t *data, size_t data_len, const uint32_t *p, int f) {
    uint64_t at = p[2 * f], len = p[2 * f + 1];
    if (at + len > data_len) return NULL;
    const name_t *e = map_find(m, data + at, (size_t)len, lj_hash_bytes(data + at, (size_t)len));
    return e && e->used ? e : NULL;
}

int64_t lj_pick_run(lj_pick_t *t, const uint8_t *data, size_t data_len, const uint32_t *pos, int64_t n,
                    int64_t start, int64_t journal, int64_t *picks) {
    for (int64_t k = 0; k < t->touched; k++) t->counts[t->slots[k]] = 0;
    t->touched = t->picks = t->skipped = 0;
    int64_t i = start;
    for (; i < n; i++) {
        const uint32_t *p = pos + 6 * i;
        const name_t *stream = frame_name(&t->streams, data, data_len, p, 0);
        if (!stream) break;
        if (!stream->keeps) {
            t->skipped++;
            continue;
        }
        const name_t *topic = frame_name(&t->topics, data, data_len, p, 1);
        if (!topic) break;
        int64_t *out = picks + 4 * t->picks++;
        out[0] = i;
        out[1] = stream->number;
        out[2] = topic->number;
        out[3] = journal;
        if (t->counts[stream->slot]++ == 0) t->slots[t->touched++] = stream->slot;
    }
    return i;
}

int64_t lj_pick_find(const uint8_t *data, size_t data_len, const uint32_t *pos, int64_t n, const uint8_t *name,
                     size_t len) {
    for (int64_t i = 0; i < n; i++) {
        const uint32_t *p = pos + 6 * i;
        if ((uint64_t)p[0] + p[1] > data_len) return i;
        if (p[1] == len && memcmp(data + p[0], name, len) == 0) return i;
    }
    return n;
}

void lj_pick_result(const lj_pick_t *t, lj_pick_result_t *out) {
    *out = (lj_pick_result_t){t->picks, t->skipped, t->touched, t->slots, t->counts};
}
