/* Drain a SUB socket's Logjam messages into one buffer and two number columns (logjam/raw.py).
 *
 * An importer receives every message a device publishes, most of them only to check its
 * sequence number; through pyzmq that costs a Python object per frame, about 16 us a
 * message on the benchmark machine (benchmarks/e2e.py: a worker that owned no stream used
 * 0.42 of a core at 14k messages/s). Here a message costs a memcpy: the app-env, topic and
 * body frames are appended to `buf`, their offsets and lengths go to `pos` (6 per message)
 * and the meta frame is decoded into `meta` (4 per message: compression, device,
 * created_ms, seq). Messages that are not 4 frames or whose meta frame is broken are
 * skipped and counted (a stats socket or a foreign publisher on the same port).
 *
 * libzmq comes through lj_zmq_calls.h (bound at load time to pyzmq's libzmq).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "lj_constants.h"
#include "lj_meta.h"
#include "lj_zmq_calls.h"
#include "sub_drain.h"

static uint64_t be(const unsigned char *d, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | d[i];
    return v;
}

static int meta_ok(lj_zmq_msg_t *m) {
    return lj_meta_ok(zmq_msg_data(m), zmq_msg_size(m));
}

static void close_frames(lj_zmq_msg_t *f, int n) {
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

/* One whole message into s->pending: 1 taken, 0 none waiting, 2 skipped, -1 a socket error. */
static int take(lj_sub_t *s, void *sock) {
    lj_zmq_msg_t extra;
    int n = 0, more = 1;
    while (more) {
        lj_zmq_msg_t *m = n < 4 ? &s->pending[n] : &extra;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, n == 0 ? LJ_DONTWAIT : 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(m);
            close_frames(s->pending, n < 4 ? n : 4);
            return e == EAGAIN ? 0 : -1;
        }
        more = zmq_msg_more(m);
        if (n >= 4) zmq_msg_close(m);
        n++;
    }
    if (n != 4 || !meta_ok(&s->pending[3])) {
        close_frames(s->pending, n < 4 ? n : 4);
        s->bad++;
        return 2;
    }
    s->npending = 4;
    return 1;
}

/* Up to `max` messages; returns how many, -1 on a socket error before any, or -2 when the
 * first message alone needs more than `cap` bytes (then *used says how many). */
int lj_sub_drain(lj_sub_t *s, void *sock, int max, unsigned char *buf, size_t cap, uint32_t *pos,
                 uint64_t *meta, size_t *used) {
    int n = 0;
    size_t at = 0;
    while (n < max) {
        if (!s->npending) {
            int r = take(s, sock);
            if (r == 0) break;
            if (r < 0) {
                if (n == 0) return -1;
                break;
            }
            if (r == 2) continue;
        }
        size_t need = zmq_msg_size(&s->pending[0]) + zmq_msg_size(&s->pending[1]) + zmq_msg_size(&s->pending[2]);
        if (at + need > cap) {
            if (n == 0) {
                *used = need;
                return -2;
            }
            break;
        }
        for (int k = 0; k < 3; k++) {
            size_t len = zmq_msg_size(&s->pending[k]);
            memcpy(buf + at, zmq_msg_data(&s->pending[k]), len);
            pos[6 * n + 2 * k] = (uint32_t)at;
            pos[6 * n + 2 * k + 1] = (uint32_t)len;
            at += len;
        }
        const unsigned char *d = zmq_msg_data(&s->pending[3]);
        meta[4 * n] = d[2];
        meta[4 * n + 1] = be(d + 4, 4);
        meta[4 * n + 2] = be(d + 8, 8);
        meta[4 * n + 3] = be(d + 16, 8);
        close_frames(s->pending, 4);
        s->npending = 0;
        n++;
    }
    *used = at;
    return n;
}

void lj_sub_close(lj_sub_t *s) {
    if (s->npending) close_frames(s->pending, s->npending);
    s->npending = 0;
}
