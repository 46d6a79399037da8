/* The importer's per-message work: drained Logjam messages decoded into the columns of the
 * `messages` table, a chunk at a time (importer/decode_native.py drives it; importer/decode.py
 * is the reference it follows).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "dedupe.h"

/* String columns (Arrow string/binary: int32 offsets, data, validity bitmap). */
#define LJ_S_APP_ENV 0
#define LJ_S_APP 1
#define LJ_S_ENV 2
#define LJ_S_TOPIC 3
#define LJ_S_JOURNAL 4
#define LJ_S_BODY 5
#define LJ_S_PARSE_ERROR 6
#define LJ_S_RAW 7
#define LJ_S_MESSAGE 8
#define LJ_S_HOST 9
#define LJ_S_LEVEL 10
#define LJ_S_ACTION 11
#define LJ_S_REQUEST_ID 12
#define LJ_S_PROTOCOL 13
#define LJ_S_EVENT_ID 14
#define LJ_S_TRACE_ID 15
#define LJ_S_SPAN_ID 16
#define LJ_NSTR 17
/* Number columns: 8 bytes a row (int64, or a double for total_time) and a validity bitmap. */
#define LJ_N_DEVICE 0
#define LJ_N_SEQ 1
#define LJ_N_CREATED 2
#define LJ_N_INGESTED 3
#define LJ_N_SEVERITY 4
#define LJ_N_CODE 5
#define LJ_N_TOTAL_TIME 6
#define LJ_NNUM 7

/* What lj_dec_run stopped at (lj_dec_t.stop). */
#define LJ_DEC_DONE 0   /* every pick became a row */
#define LJ_DEC_DEFER 1  /* the next pick is for the Python path (compressed, not JSON, unusual) */
#define LJ_DEC_FULL 2   /* the chunk is full: build it, then go on */
#define LJ_DEC_NOMEM 3

typedef struct {
    int32_t *offsets;   /* cap + 1 */
    uint8_t *data;
    uint8_t *valid;     /* bit i (LSB first) set when row i is not NULL */
    int64_t len, room;  /* bytes in data, and allocated */
} lj_scol_t;

typedef struct {
    int64_t *values;    /* cap */
    uint8_t *valid;
} lj_ncol_t;

typedef struct {
    int64_t rows, cap;      /* rows in the open chunk; at most cap */
    int64_t body_bytes;     /* body bytes of those rows (what sizes a batch) */
    int stop;               /* LJ_DEC_* of the last lj_dec_run */
    lj_scol_t s[LJ_NSTR];
    lj_ncol_t n[LJ_NNUM];
    /* The idempotency keys remembered (native/dedupe.h), or NULL for no dedupe: a row whose
     * key (app-env, NUL, event id) is remembered is no row, and its pick (numbered from the
     * first pick of the last lj_dec_run) is in dups[0 .. ndups). */
    lj_dd_t *dedupe;
    int64_t *dups;
    int64_t ndups, dups_room;
    uint8_t *key;  /* the key being asked about */
    int64_t key_len, key_room;
    /* Names the picks refer to by number (app-envs, topics, journals), copied here. */
    uint8_t **name;
    uint32_t *name_len;
    int64_t names, names_room;
} lj_dec_t;

lj_dec_t *lj_dec_new(int64_t cap);
void lj_dec_free(lj_dec_t *d);
/* Registers a name; returns its number, or -1 when memory ran out. */
int64_t lj_dec_name(lj_dec_t *d, const uint8_t *text, size_t len);
void lj_dec_names_clear(lj_dec_t *d);
/* Empties the chunk (after its columns were copied out). */
void lj_dec_reset(lj_dec_t *d);

/* Decodes picks[4k .. ] = (message index in the drained batch, app-env name, topic name,
 * journal name or -1) into rows, in order, until all `npicks` are rows or one stops it
 * (d->stop). A message is drained as data/pos/meta (logjam/raw.py: 6 positions and 4 meta
 * numbers a message). Returns the picks consumed. */
int64_t lj_dec_run(lj_dec_t *d, const uint8_t *data, size_t data_len, const uint32_t *pos, const uint64_t *meta,
                   int64_t nmessages, const int64_t *picks, int64_t npicks, int64_t ingested_us);

/* One row given cell by cell (the Python path's row for a deferred pick): every column once,
 * then lj_dec_end_row. len < 0 is NULL. Each returns 0, or -1 when memory ran out. */
int lj_dec_put_str(lj_dec_t *d, int col, const uint8_t *text, int64_t len);
int lj_dec_put_int(lj_dec_t *d, int col, int64_t value, int valid);
int lj_dec_put_float(lj_dec_t *d, int col, double value, int valid);
void lj_dec_end_row(lj_dec_t *d, int64_t body_bytes);
