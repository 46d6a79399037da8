/* The device's C loop for ROUTER and PULL: drain, check, number and publish whole batches.
 *
 * Why C: pyzmq makes one Python object per received frame and needs one more call per
 * frame to learn whether another part follows; for a 4-frame message that alone costs
 * several times what `zmq.proxy` spends on the whole message. These functions hold a
 * batch of messages as zmq_msg_t's: `lj_drain` (PULL) and `lj_drain_router` (ROUTER)
 * receive and check them (the rules of logjam/meta.py and logjam/validation.py, whose
 * constants come in through lj_constants.h), `lj_number` stamps device, created_ms and
 * sequence into fresh meta frames, `lj_encode` serializes the numbered batch in the
 * journal's record format, `lj_publish` hands the frames to the PUB socket without
 * copying, and `lj_reply` sends the queued 202/400/pong replies after that.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "device.h"
#include "lj_constants.h"
#include "lj_meta.h"
#include "lj_zmq_calls.h"

typedef lj_zmq_msg_t lj_msg_t;

static const char *const topic_prefixes[] = {LJ_TOPIC_PREFIXES};

static int meta_ok(lj_msg_t *m) {
    return lj_meta_ok(zmq_msg_data(m), zmq_msg_size(m));
}

static int app_env_ok(lj_msg_t *m) {
    const unsigned char *d = zmq_msg_data(m);
    size_t n = zmq_msg_size(m), i;
    int dash = 0;
    if (n == 0 || n > LJ_MAX_NAME_LENGTH) return 0;
    for (i = 0; i < n; i++) {
        if (d[i] < 32 || d[i] > 127) return 0;
        if (d[i] == '-') dash = 1;
    }
    return dash;
}

static int topic_ok(lj_msg_t *m) {
    const unsigned char *d = zmq_msg_data(m);
    size_t n = zmq_msg_size(m), i;
    if (n > LJ_MAX_NAME_LENGTH) return 0;
    for (i = 0; i < sizeof(topic_prefixes) / sizeof(topic_prefixes[0]); i++) {
        size_t p = strlen(topic_prefixes[i]);
        if (n >= p && memcmp(d, topic_prefixes[i], p) == 0) return 1;
    }
    return 0;
}

/* Blocking receive of a further part (it is already queued: multipart is atomic). */
static int recv_part(lj_msg_t *m, void *sock) {
    int rc;
    zmq_msg_init(m);
    do { rc = zmq_msg_recv(m, sock, 0); } while (rc < 0 && zmq_errno() == EINTR);
    return rc;
}

static void tally(lj_batch_t *b, int i) {
    lj_msg_t *app = &b->f[i][0];
    size_t n = zmq_msg_size(app);
    const void *d = zmq_msg_data(app);
    int j;
    if (b->napps < 0) return;
    for (j = 0; j < b->napps; j++) {
        lj_msg_t *seen = &b->f[b->app_first[j]][0];
        if (zmq_msg_size(seen) == n && memcmp(zmq_msg_data(seen), d, n) == 0) { b->app_count[j]++; return; }
    }
    if (b->napps == LJ_APPS) { b->napps = -1; return; }
    b->app_first[b->napps] = i;
    b->app_count[b->napps] = 1;
    b->napps++;
}

/* Take up to `max` messages. Good ones stay in b->f[0..n), dropped ones are closed and
   recorded. Returns the number taken, or -errno on a socket error (ETERM). */
int lj_drain(lj_batch_t *b, void *sock, int max) {
    int taken = 0, i, k, more, reason, err;
    lj_msg_t scratch;
    b->n = 0; b->ndrops = 0; b->napps = 0; b->nreplies = 0; b->pings = 0;
    if (max > LJ_MAX_BATCH) max = LJ_MAX_BATCH;
    while (taken < max) {
        lj_msg_t *f = b->f[b->n];
        zmq_msg_init(&f[0]);
        if (zmq_msg_recv(&f[0], sock, LJ_DONTWAIT) < 0) {
            err = zmq_errno();
            zmq_msg_close(&f[0]);
            if (err == EAGAIN || err == EINTR || taken > 0) break;
            return -err;
        }
        taken++;
        k = 1;
        more = zmq_msg_more(&f[0]);
        while (more && k < 4) {
            if (recv_part(&f[k], sock) < 0) {
                err = zmq_errno();
                for (i = 0; i <= k; i++) zmq_msg_close(&f[i]);
                return -err;
            }
            more = zmq_msg_more(&f[k]);
            k++;
        }
        reason = 0;
        if (more) {
            reason = LJ_DROP_FRAME_COUNT;
            while (more) {
                if (recv_part(&scratch, sock) < 0) { zmq_msg_close(&scratch); break; }
                more = zmq_msg_more(&scratch);
                zmq_msg_close(&scratch);
            }
        } else if (k < 3) {
            reason = LJ_DROP_FRAME_COUNT;
        } else {
            if (k == 3) {
                /* A legacy client without meta: created_ms 0 makes lj_number use now. */
                unsigned char *d;
                zmq_msg_init_size(&f[3], LJ_META_SIZE);
                d = zmq_msg_data(&f[3]);
                memset(d, 0, LJ_META_SIZE);
                d[0] = LJ_META_TAG >> 8; d[1] = LJ_META_TAG & 0xFF; d[3] = LJ_META_VERSION;
                k = 4;
            } else if (!meta_ok(&f[3])) {
                reason = LJ_DROP_BROKEN_META;
            }
            if (!reason && !app_env_ok(&f[0])) reason = LJ_DROP_BAD_APP_ENV;
            if (!reason && !topic_ok(&f[1])) reason = LJ_DROP_BAD_TOPIC;
        }
        if (reason) {
            size_t n = zmq_msg_size(&f[0]);
            if (n > LJ_NAME_MAX) n = LJ_NAME_MAX;
            b->drop_reason[b->ndrops] = (unsigned char)reason;
            b->drop_len[b->ndrops] = (unsigned short)n;
            memcpy(b->drop_app[b->ndrops], zmq_msg_data(&f[0]), n);
            b->ndrops++;
            for (i = 0; i < k; i++) zmq_msg_close(&f[i]);
            continue;
        }
        tally(b, b->n);
        b->n++;
    }
    return taken;
}

static void put_be(unsigned char *p, uint64_t v, int bytes) {
    int i;
    for (i = bytes - 1; i >= 0; i--) { p[i] = (unsigned char)v; v >>= 8; }
}

/* Replace every meta with a fresh frame: normalised tag, our device, the client's
   created_ms unless 0, and consecutive sequence numbers from first_seq. (A fresh
   frame, because a received frame's bytes may be shared.) */
void lj_number(lj_batch_t *b, uint32_t device, uint64_t first_seq, uint64_t now_ms) {
    int i, j, zero;
    for (i = 0; i < b->n; i++) {
        lj_msg_t fresh;
        const unsigned char *old = zmq_msg_data(&b->f[i][3]);
        unsigned char *d;
        zmq_msg_init_size(&fresh, LJ_META_SIZE);
        d = zmq_msg_data(&fresh);
        d[0] = LJ_META_TAG >> 8; d[1] = LJ_META_TAG & 0xFF; d[2] = old[2]; d[3] = LJ_META_VERSION;
        put_be(d + 4, device, 4);
        zero = 1;
        for (j = 8; j < 16; j++) if (old[j]) { zero = 0; break; }
        if (zero) put_be(d + 8, now_ms, 8); else memcpy(d + 8, old + 8, 8);
        put_be(d + 16, first_seq + (uint64_t)i, 8);
        zmq_msg_move(&b->f[i][3], &fresh);  /* releases the client's meta */
        zmq_msg_close(&fresh);
    }
}

/* Publish the batch in order; the frames move to the socket without a copy. */
int lj_publish(lj_batch_t *b, void *pub) {
    int i, k, rc;
    for (i = 0; i < b->n; i++) {
        for (k = 0; k < 4; k++) {
            do { rc = zmq_msg_send(&b->f[i][k], pub, k < 3 ? LJ_SNDMORE : 0); } while (rc < 0 && zmq_errno() == EINTR);
            if (rc < 0) {
                int err = zmq_errno();
                for (; k < 4; k++) zmq_msg_close(&b->f[i][k]);
                for (i = i + 1; i < b->n; i++) for (k = 0; k < 4; k++) zmq_msg_close(&b->f[i][k]);
                b->n = 0;
                return -err;
            }
        }
    }
    b->n = 0;
    return 0;
}

static void record_drop(lj_batch_t *b, int reason, lj_msg_t *app) {
    size_t n = app ? zmq_msg_size(app) : 0;
    if (n > LJ_NAME_MAX) n = LJ_NAME_MAX;
    b->drop_reason[b->ndrops] = (unsigned char)reason;
    b->drop_len[b->ndrops] = (unsigned short)n;
    if (n) memcpy(b->drop_app[b->ndrops], zmq_msg_data(app), n);
    b->ndrops++;
}

/* Queue a reply: the routing id moves in; the app-env (if any) is shared, not copied. */
static void add_reply(lj_batch_t *b, lj_msg_t *rid, lj_msg_t *app, int status) {
    int j = b->nreplies++;
    zmq_msg_init(&b->reply_rid[j]);
    zmq_msg_move(&b->reply_rid[j], rid);
    zmq_msg_init(&b->reply_app[j]);
    if (app) zmq_msg_copy(&b->reply_app[j], app);
    b->reply_status[j] = (unsigned char)status;
}

#define LJ_ACCEPTED 1
#define LJ_BAD_REQUEST 2
#define LJ_PONG 3
#define LJ_PING_BAD 4
#define LJ_PARTS 7

/* ROUTER: [rid] [""]? app topic body meta, or a ping ["", "ping", app, body, meta].
   Good messages go to b->f as on PULL; requests and pings queue a reply for lj_reply,
   which the caller sends after publishing. */
int lj_drain_router(lj_batch_t *b, void *sock, int max) {
    int taken = 0, np, more, extra, request, first, count, reason, i, err;
    lj_msg_t parts[LJ_PARTS], scratch;
    b->n = 0; b->ndrops = 0; b->napps = 0; b->nreplies = 0; b->pings = 0;
    if (max > LJ_MAX_BATCH) max = LJ_MAX_BATCH;
    while (taken < max) {
        zmq_msg_init(&parts[0]);
        if (zmq_msg_recv(&parts[0], sock, LJ_DONTWAIT) < 0) {
            err = zmq_errno();
            zmq_msg_close(&parts[0]);
            if (err == EAGAIN || err == EINTR || taken > 0) break;
            return -err;
        }
        taken++;
        np = 1; extra = 0;
        more = zmq_msg_more(&parts[0]);
        while (more) {
            if (np < LJ_PARTS) {
                if (recv_part(&parts[np], sock) < 0) {
                    err = zmq_errno();
                    for (i = 0; i <= np; i++) zmq_msg_close(&parts[i]);
                    return -err;
                }
                more = zmq_msg_more(&parts[np]);
                np++;
            } else {
                if (recv_part(&scratch, sock) < 0) { zmq_msg_close(&scratch); break; }
                more = zmq_msg_more(&scratch);
                zmq_msg_close(&scratch);
                extra = 1;
            }
        }
        request = np >= 2 && zmq_msg_size(&parts[1]) == 0;
        first = request ? 2 : 1;
        count = extra ? 99 : np - first;
        reason = 0;
        if (request && count >= 1 && zmq_msg_size(&parts[first]) == 4
                && memcmp(zmq_msg_data(&parts[first]), "ping", 4) == 0) {
            b->pings++;
            if (count == 4 && meta_ok(&parts[first + 3])) {
                add_reply(b, &parts[0], NULL, LJ_PONG);
            } else {
                record_drop(b, count == 4 ? LJ_DROP_BROKEN_META : LJ_DROP_FRAME_COUNT, count >= 2 ? &parts[first + 1] : NULL);
                add_reply(b, &parts[0], NULL, LJ_PING_BAD);
            }
            for (i = 0; i < np; i++) zmq_msg_close(&parts[i]);
            continue;
        }
        if (count != 4) reason = LJ_DROP_FRAME_COUNT;
        else if (!meta_ok(&parts[first + 3])) reason = LJ_DROP_BROKEN_META;
        else if (!app_env_ok(&parts[first])) reason = LJ_DROP_BAD_APP_ENV;
        else if (!topic_ok(&parts[first + 1])) reason = LJ_DROP_BAD_TOPIC;
        if (reason) {
            lj_msg_t *app = count >= 1 && first < np ? &parts[first] : NULL;
            record_drop(b, reason, app);
            if (request) add_reply(b, &parts[0], app, LJ_BAD_REQUEST);
            for (i = 0; i < np; i++) zmq_msg_close(&parts[i]);
            continue;
        }
        for (i = 0; i < 4; i++) {
            zmq_msg_init(&b->f[b->n][i]);
            zmq_msg_move(&b->f[b->n][i], &parts[first + i]);
        }
        if (request) add_reply(b, &parts[0], &b->f[b->n][0], LJ_ACCEPTED);
        for (i = 0; i < np; i++) zmq_msg_close(&parts[i]);
        tally(b, b->n);
        b->n++;
    }
    return taken;
}

static void send_bytes(void *sock, const char *s, size_t n, int flags) {
    zmq_send(sock, s, n, flags | LJ_DONTWAIT);
}

/* Send the queued replies in arrival order. ROUTER silently drops replies to peers that
   are gone or not reading (their HWM), which is what we want: one slow client never
   blocks the device. */
void lj_reply(lj_batch_t *b, void *sock, const char *fqdn, size_t fqdn_len) {
    int j;
    for (j = 0; j < b->nreplies; j++) {
        int st = b->reply_status[j];
        if (zmq_msg_send(&b->reply_rid[j], sock, LJ_SNDMORE | LJ_DONTWAIT) < 0) {
            zmq_msg_close(&b->reply_rid[j]);
            zmq_msg_close(&b->reply_app[j]);
            continue;
        }
        if (st == LJ_PONG) {
            send_bytes(sock, "ping", 4, LJ_SNDMORE);
            send_bytes(sock, LJ_STATUS_PONG, sizeof LJ_STATUS_PONG - 1, LJ_SNDMORE);
            send_bytes(sock, fqdn, fqdn_len, 0);
        } else if (st == LJ_PING_BAD) {
            send_bytes(sock, "ping", 4, LJ_SNDMORE);
            send_bytes(sock, LJ_STATUS_BAD_REQUEST, sizeof LJ_STATUS_BAD_REQUEST - 1, 0);
        } else {
            if (zmq_msg_send(&b->reply_app[j], sock, LJ_SNDMORE | LJ_DONTWAIT) < 0) zmq_msg_close(&b->reply_app[j]);
            if (st == LJ_ACCEPTED) send_bytes(sock, LJ_STATUS_ACCEPTED, sizeof LJ_STATUS_ACCEPTED - 1, 0);
            else send_bytes(sock, LJ_STATUS_BAD_REQUEST, sizeof LJ_STATUS_BAD_REQUEST - 1, 0);
        }
        zmq_msg_close(&b->reply_app[j]);
    }
    b->nreplies = 0;
}

void lj_discard(lj_batch_t *b) {
    int i, k;
    for (i = 0; i < b->n; i++) for (k = 0; k < 4; k++) zmq_msg_close(&b->f[i][k]);
    for (i = 0; i < b->nreplies; i++) { zmq_msg_close(&b->reply_rid[i]); zmq_msg_close(&b->reply_app[i]); }
    b->n = 0;
    b->nreplies = 0;
}

const unsigned char *lj_data(lj_batch_t *b, int i, int k, size_t *len) {
    *len = zmq_msg_size(&b->f[i][k]);
    return zmq_msg_data(&b->f[i][k]);
}

/* Serialize the numbered batch as a journal batch body (devices/journal.py): per message
   u16 app-env len | u16 topic len | u32 body len | app-env | topic | body | meta[24].
   Returns the size needed; writes only when it fits in `cap` (else the caller grows
   its buffer and calls again). Lengths fit: app-env and topic were checked to be at
   most 255 bytes, and lj_number made every meta 24 bytes. */
size_t lj_encode(lj_batch_t *b, unsigned char *out, size_t cap) {
    size_t need = 0, len[4];
    int i, k;
    for (i = 0; i < b->n; i++) {
        need += 8;
        for (k = 0; k < 4; k++) need += zmq_msg_size(&b->f[i][k]);
    }
    if (need > cap) return need;
    for (i = 0; i < b->n; i++) {
        for (k = 0; k < 4; k++) len[k] = zmq_msg_size(&b->f[i][k]);
        put_be(out, len[0], 2);
        put_be(out + 2, len[1], 2);
        put_be(out + 4, len[2], 4);
        out += 8;
        for (k = 0; k < 4; k++) {
            memcpy(out, zmq_msg_data(&b->f[i][k]), len[k]);
            out += len[k];
        }
    }
    return need;
}
