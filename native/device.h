/* The device's C loop for ROUTER and PULL (devices/native.py drives it; docs/device.md).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations and integer #defines below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lj_zmq.h"

#define LJ_MAX_BATCH 1024 /* messages per drain */
#define LJ_APPS 64        /* distinct stream names tallied per batch before giving up */
#define LJ_NAME_MAX 255   /* a dropped message keeps this much of its app-env */

/* Why a message was dropped (devices/native.py REASON_CODES). */
#define LJ_DROP_FRAME_COUNT 1
#define LJ_DROP_BROKEN_META 2
#define LJ_DROP_BAD_APP_ENV 3
#define LJ_DROP_BAD_TOPIC 4

/* One batch: good messages as [app-env, topic, body, meta] in f[0..n), the dropped ones
   recorded, and the ROUTER replies still to send. */
typedef struct {
    int n;
    int ndrops;
    int napps;
    int app_first[LJ_APPS];
    int app_count[LJ_APPS];
    unsigned char drop_reason[LJ_MAX_BATCH];
    unsigned short drop_len[LJ_MAX_BATCH];
    unsigned char drop_app[LJ_MAX_BATCH][LJ_NAME_MAX + 1];
    lj_zmq_msg_t f[LJ_MAX_BATCH][4];
    int nreplies;
    int pings;
    unsigned char reply_status[LJ_MAX_BATCH];
    lj_zmq_msg_t reply_rid[LJ_MAX_BATCH];
    lj_zmq_msg_t reply_app[LJ_MAX_BATCH];
} lj_batch_t;

int lj_drain(lj_batch_t *b, void *sock, int max);
void lj_number(lj_batch_t *b, uint32_t device, uint64_t first_seq, uint64_t now_ms);
int lj_publish(lj_batch_t *b, void *pub);
int lj_drain_router(lj_batch_t *b, void *sock, int max);
void lj_reply(lj_batch_t *b, void *sock, const char *fqdn, size_t fqdn_len);
void lj_discard(lj_batch_t *b);
const unsigned char *lj_data(lj_batch_t *b, int i, int k, size_t *len);
size_t lj_encode(lj_batch_t *b, unsigned char *out, size_t cap);
