/* The libzmq calls the native modules make, through a table `lj_zmq_bind` fills.
 *
 * The macros keep the code reading as plain libzmq (`zmq_msg_recv(...)`); each expands to
 * a call through the table (see lj_zmq.h for why the table exists). Call nothing here
 * before lj_zmq_bind has returned 0: the Python loader (logjam/native.py) binds every
 * module that includes this header before handing it out.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "lj_zmq.h"

struct lj_zmq_api {
    int (*msg_init)(lj_zmq_msg_t *m);
    int (*msg_init_size)(lj_zmq_msg_t *m, size_t size);
    int (*msg_recv)(lj_zmq_msg_t *m, void *s, int flags);
    int (*msg_send)(lj_zmq_msg_t *m, void *s, int flags);
    int (*msg_close)(lj_zmq_msg_t *m);
    void *(*msg_data)(lj_zmq_msg_t *m);
    size_t (*msg_size)(const lj_zmq_msg_t *m);
    int (*msg_more)(const lj_zmq_msg_t *m);
    int (*msg_move)(lj_zmq_msg_t *dest, lj_zmq_msg_t *src);
    int (*msg_copy)(lj_zmq_msg_t *dest, lj_zmq_msg_t *src);
    int (*send)(void *s, const void *buf, size_t len, int flags);
    int (*recv)(void *s, void *buf, size_t len, int flags);
    int (*getsockopt)(void *s, int option, void *optval, size_t *optvallen);
    int (*errno_)(void);
};

extern struct lj_zmq_api lj_zmq;

#define zmq_msg_init lj_zmq.msg_init
#define zmq_msg_init_size lj_zmq.msg_init_size
#define zmq_msg_recv lj_zmq.msg_recv
#define zmq_msg_send lj_zmq.msg_send
#define zmq_msg_close lj_zmq.msg_close
#define zmq_msg_data lj_zmq.msg_data
#define zmq_msg_size lj_zmq.msg_size
#define zmq_msg_more lj_zmq.msg_more
#define zmq_msg_move lj_zmq.msg_move
#define zmq_msg_copy lj_zmq.msg_copy
#define zmq_send lj_zmq.send
#define zmq_recv lj_zmq.recv
#define zmq_getsockopt lj_zmq.getsockopt
#define zmq_errno lj_zmq.errno_

/* The libzmq flag and option values the modules use (stable across libzmq 4.x). */
#define LJ_DONTWAIT 1
#define LJ_SNDMORE 2
#define LJ_RCVMORE 13
