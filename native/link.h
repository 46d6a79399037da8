/* The bridges' device link in C: send a batch's requests and read the device's replies
 * (bridges/host/native_link.py drives it).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lj_zmq.h"

/* Per-reply statuses lj_link_drain writes (native_link.py OK, REFUSED, UNEXPECTED). */
#define LJ_REPLY_OK 0
#define LJ_REPLY_REFUSED 1
#define LJ_REPLY_UNEXPECTED 2

int lj_link_send(void *sock, const char *app, size_t app_len, const char *topic, size_t topic_len,
                 const unsigned char *blob, const uint32_t *lens, const int64_t *created,
                 int start, int n, unsigned int compression, int *err);
int lj_link_drain(void *sock, unsigned char *status, int max, int *nbad, int *err);
long lj_count(void *sock, long want);
