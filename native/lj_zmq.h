/* The libzmq message type and the call that binds the native modules to pyzmq's libzmq.
 *
 * The C code drives pyzmq's own sockets (`Socket.underlying`), so it must call the very
 * libzmq that pyzmq loaded, whichever pyzmq is installed now: linking a libzmq path at
 * build time would break (two libzmqs in one process) as soon as pyzmq is upgraded.
 * So nothing links libzmq; a module that calls it resolves its few functions at load
 * time, in `lj_zmq_bind`, from the libzmq already mapped into the process.
 *
 * This header is also the modules' cffi declaration (native/build.py reads it without
 * its #include and #pragma lines), so the rest holds only what cffi can parse: no #if.
 */
#pragma once

#include <stdint.h>

/* zmq_msg_t: 64 bytes, 8-aligned, in every libzmq 4.x ABI (pyzmq ships no zmq.h). */
typedef struct { uint64_t _[8]; } lj_zmq_msg_t;

/* Resolve the libzmq calls from the already loaded library at `path`
   (dlopen with RTLD_NOLOAD: it never loads a second copy). 0 on success, else -1. */
int lj_zmq_bind(const char *path);
