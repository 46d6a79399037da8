/* Draining a SUB socket's Logjam messages into columns (logjam/raw.py drives it).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lj_zmq.h"

typedef struct {
    lj_zmq_msg_t pending[4]; /* a message received but not yet copied (it did not fit) */
    int npending;            /* 0 or 4 */
    uint64_t bad;            /* messages skipped: not 4 frames, or a broken meta frame */
} lj_sub_t;

int lj_sub_drain(lj_sub_t *s, void *sock, int max, unsigned char *buf, size_t cap, uint32_t *pos,
                 uint64_t *meta, size_t *used);
void lj_sub_close(lj_sub_t *s);
