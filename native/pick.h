/* The importer's receive stage for a chunk already in sequence (importer/receive.py
 * `Receiver._pick_ordered`): each message's app-env and topic looked up by their bytes, the
 * messages of streams this worker keeps turned into picks for native/decode.h's lj_dec_run,
 * in one call. The tables are filled from Python: a name C does not know stops the run there,
 * Python decides about it (importer/receive.py `_stream`, `_topic`), registers the answer and
 * goes on; so the Python loop stays the reference for what is picked.
 *
 * Also part of the module's cffi declaration (native/build.py reads it before
 * native/decode.h): only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct lj_pick lj_pick_t;

lj_pick_t *lj_pick_new(void);
void lj_pick_free(lj_pick_t *t);
/* Forgets every name (their numbers changed). */
void lj_pick_clear(lj_pick_t *t);
/* Registers an app-env: its decoder name number, whether this worker keeps it; returns its
 * slot (its row count is counts()[slot]), or -1 when memory ran out or it is known already. */
int64_t lj_pick_stream(lj_pick_t *t, const uint8_t *name, size_t len, int64_t number, int keeps);
/* Registers a topic's decoder name number: 0, or -1 when memory ran out or it is known already. */
int lj_pick_topic(lj_pick_t *t, const uint8_t *name, size_t len, int64_t number);

/* Picks messages start .. n-1 of a drained chunk (data/pos as logjam/raw.py has them: 6
 * positions a message) in order: a kept stream's message appends (index, app-env number,
 * topic number, journal) to picks (room for 4 * (n - start) numbers) and counts a row for its
 * stream; another's counts as skipped. Stops at the first message whose app-env or topic is
 * not registered (or whose positions are out of bounds) and returns its index; n when all
 * are done. What the call did: lj_pick_result. */
int64_t lj_pick_run(lj_pick_t *t, const uint8_t *data, size_t data_len, const uint32_t *pos, int64_t n,
                    int64_t start, int64_t journal, int64_t *picks);

/* The first of messages 0 .. n-1 whose app-env is exactly `name` (or whose positions are out of
 * bounds); n when there is none. For the heartbeat, which a chunk in sequence must not hold:
 * looking at the app-env frames only costs a fraction of searching the whole chunk's bytes. */
int64_t lj_pick_find(const uint8_t *data, size_t data_len, const uint32_t *pos, int64_t n, const uint8_t *name,
                     size_t len);

typedef struct {
    int64_t picks;     /* picks appended (4 numbers each) */
    int64_t skipped;   /* messages of streams not kept */
    int64_t touched;   /* streams counted: their slots are slots[0 .. touched) */
    const int64_t *slots;
    const int64_t *counts; /* per slot: rows counted by the last run (0 for the others) */
} lj_pick_result_t;

void lj_pick_result(const lj_pick_t *t, lj_pick_result_t *out);
