/* The device link's wire work: a whole batch of requests, or of replies, per call.
 *
 * Why C: a Logjam request is five ZeroMQ frames and each reply two, and through pyzmq
 * every frame is a Python call (and every "is there more?" another). At tens of
 * thousands of events per second that was most of a bridge's CPU. These functions work
 * on pyzmq's own socket (`Socket.underlying`), with the framing of `Message.to_frames()`
 * and `Meta.pack()`:
 *
 * - `lj_link_send` sends messages [start, n) of a batch laid out as one joined body
 *   buffer plus per-message lengths and created_ms, stopping (not blocking) at the
 *   high-water mark; it returns how many it sent.
 * - `lj_link_drain` reads every waiting reply ([app-env, status]) and classifies each:
 *   202 Accepted, another status (the device refused the request), or a reply we do not
 *   understand.
 * - `lj_count` receives and counts whole messages (the benchmarks' subscriber).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "link.h"
#include "lj_constants.h"
#include "lj_zmq_calls.h"

static const char accepted[] = LJ_STATUS_ACCEPTED;

int lj_link_send(void *sock, const char *app, size_t app_len, const char *topic, size_t topic_len,
                 const unsigned char *blob, const uint32_t *lens, const int64_t *created,
                 int start, int n, unsigned int compression, int *err)
{
    size_t off = 0;
    unsigned char meta[LJ_META_SIZE];
    int i, k;
    *err = 0;
    for (i = 0; i < start; i++) off += lens[i];
    /* Meta.pack(): tag, compression, version, device 0, created_ms, sequence 0 (big-endian). */
    memset(meta, 0, sizeof meta);
    meta[0] = LJ_META_TAG >> 8;
    meta[1] = LJ_META_TAG & 0xFF;
    meta[2] = (unsigned char)compression;
    meta[3] = LJ_META_VERSION;
    for (i = start; i < n; i++) {
        uint64_t c = (uint64_t)created[i];
        if (zmq_send(sock, "", 0, LJ_DONTWAIT | LJ_SNDMORE) < 0) {
            int e = zmq_errno();
            if (e != EAGAIN) *err = e;
            break;
        }
        /* A multipart message is queued whole once its first frame is: these cannot block. */
        for (k = 0; k < 8; k++) meta[8 + k] = (unsigned char)(c >> (56 - 8 * k));
        zmq_send(sock, app, app_len, LJ_SNDMORE);
        zmq_send(sock, topic, topic_len, LJ_SNDMORE);
        zmq_send(sock, blob + off, lens[i], LJ_SNDMORE);
        zmq_send(sock, meta, sizeof meta, 0);
        off += lens[i];
    }
    return i - start;
}

static int lj_more(void *sock)
{
    int more = 0;
    size_t len = sizeof more;
    if (zmq_getsockopt(sock, LJ_RCVMORE, &more, &len) != 0) return 0;
    return more;
}

int lj_link_drain(void *sock, unsigned char *status, int max, int *nbad, int *err)
{
    unsigned char buf[32], st[32];
    int n = 0;
    *nbad = 0;
    *err = 0;
    while (n < max) {
        int frames = 1, r, st_len = -1;
        /* A reply is [app-env, status] (the device echoes the request's first data frame). */
        if (zmq_recv(sock, buf, sizeof buf, LJ_DONTWAIT) < 0) {
            int e = zmq_errno();
            if (e != EAGAIN) *err = e;
            break;
        }
        while (lj_more(sock)) {
            r = zmq_recv(sock, buf, sizeof buf, 0);
            if (r < 0) break;
            if (++frames == 2) {
                st_len = r;
                memcpy(st, buf, (size_t)r < sizeof st ? (size_t)r : sizeof st);
            }
        }
        if (frames != 2) status[n] = LJ_REPLY_UNEXPECTED;
        else if (st_len == (int)sizeof accepted - 1 && memcmp(st, accepted, sizeof accepted - 1) == 0)
            status[n] = LJ_REPLY_OK;
        else status[n] = LJ_REPLY_REFUSED;
        if (status[n] != LJ_REPLY_OK) ++*nbad;
        n++;
    }
    return n;
}

long lj_count(void *sock, long want)
{
    unsigned char buf[8];
    long got = 0;
    while (got < want) {
        if (zmq_recv(sock, buf, sizeof buf, 0) < 0) break; /* RCVTIMEO, ETERM */
        while (lj_more(sock)) zmq_recv(sock, buf, sizeof buf, 0);
        got++;
    }
    return got;
}
