/* An OTLP ExportLogsServiceRequest, read from its protobuf wire bytes, written as the
 * bridge's JSON bodies (bridges/otlp/records.py; the mapping is docs/protocols/otlp.md).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations below.
 *
 * Two calls per request. `lj_otlp_scan` finds the request's resources and scopes (where
 * each Resource, InstrumentationScope and schema_url is, how many records each scope
 * has); Python maps those once each, as records.py does, into the text every body of a
 * scope shares. `lj_otlp_write` then writes every record's body: its own fields as JSON,
 * its scope's shared text, its index in the request, `tail`. The `_json` twins do the same
 * for OTLP/JSON, as bridges/otlp/json_doc.py reads it (their spans are of JSON values).
 *
 * Whatever these do not read exactly as protobuf (upb), records.py and json_doc.py would,
 * they decline (LJ_OTLP_DECLINE) and the Python path decides: never a different answer.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define LJ_OTLP_DECLINE -1  /* not read here: the Python path decides (it may still be a good request) */
#define LJ_OTLP_ROOM -2     /* a table or the output is too small: call again with more room */
#define LJ_OTLP_DOUBLES -3  /* finite doubles met: their values are in `doubles`; call again with their text */

/* One ResourceLogs. A span is an offset and length into the request; `has_*` says it was there. */
typedef struct {
    uint32_t has_resource, resource_off, resource_len;  /* the Resource message */
    uint32_t schema_off, schema_len;                    /* schema_url (valid UTF-8) */
    uint32_t scopes;                                    /* its ScopeLogs, the next in the scope table */
} lj_otlp_resource;

/* One ScopeLogs. */
typedef struct {
    uint32_t has_scope, scope_off, scope_len;  /* the InstrumentationScope message */
    uint32_t schema_off, schema_len;           /* schema_url (valid UTF-8) */
    uint32_t logs_off, logs_len;               /* the ScopeLogs message itself */
    uint32_t records;                          /* its LogRecords */
    uint32_t record_bytes;                     /* their wire bytes, together */
} lj_otlp_scope;

/* The request's resources (the count is returned) and scopes (*n_scopes) into the tables;
 * *records: the records of all scopes. LJ_OTLP_ROOM when a table is too small. */
int lj_otlp_scan(const uint8_t *buf, size_t len, lj_otlp_resource *resources, int resource_cap,
                 lj_otlp_scope *scopes, int scope_cap, int *n_scopes, uint64_t *records);

/* Where lj_otlp_write writes, and the finite doubles it needs written for it. */
typedef struct {
    uint8_t *out;          /* the bodies, joined */
    size_t cap;
    uint32_t *lens;        /* per record: its body's length */
    int64_t *created_ms;   /* per record: time_unix_nano, else observed_time_unix_nano, in ms (0: neither) */
    uint32_t *scope_ends;  /* per scope: where its bodies end in out */
    /* Finite doubles as JSON text (what orjson writes for each), in the order the records
     * hold them: doubles_text, each ending at doubles_ends[i]; doubles_given of them. */
    const uint8_t *doubles_text;
    const uint32_t *doubles_ends;
    uint32_t doubles_given;
    /* When doubles_given is 0 and the records hold finite doubles, up to doubles_cap of them:
     * protobuf, their values; OTLP/JSON, where each number is in the request (offset, length). */
    double *doubles;
    uint32_t *double_spans;
    uint32_t doubles_cap;
    uint32_t doubles_met;
} lj_otlp_out;

/* Every record of the scanned scopes, in order, numbered from 0: `{`, its fields, `,` when
 * it has any, its scope's shared text (shared[shared_ends[s-1]:shared_ends[s]]), its index,
 * `tail`. Returns the bytes written, or LJ_OTLP_DECLINE, LJ_OTLP_ROOM, LJ_OTLP_DOUBLES
 * (out->doubles_met of them, in out->doubles when they fit in doubles_cap). */
int64_t lj_otlp_write(const uint8_t *buf, const lj_otlp_scope *scopes, int n_scopes,
                      const uint8_t *shared, const uint32_t *shared_ends,
                      const uint8_t *tail, size_t tail_len, lj_otlp_out *out);

/* The same for OTLP/JSON: the spans are of the values of `resource`, `scope`, the
 * `schemaUrl`s (any JSON value: Python reads and checks them) and `logRecords`; `records`
 * counts its items, `record_bytes` is its length. `close` (room for len of them) is the
 * scan's index of the document, which the write reads: keep it between the two calls. */
int lj_otlp_json_scan(const uint8_t *buf, size_t len, uint32_t *close, lj_otlp_resource *resources,
                      int resource_cap, lj_otlp_scope *scopes, int scope_cap, int *n_scopes, uint64_t *records);

int64_t lj_otlp_json_write(const uint8_t *buf, const uint32_t *close, const lj_otlp_scope *scopes, int n_scopes,
                           const uint8_t *shared, const uint32_t *shared_ends,
                           const uint8_t *tail, size_t tail_len, lj_otlp_out *out);
