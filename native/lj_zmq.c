/* lj_zmq_bind: fill the libzmq call table from the libzmq pyzmq already loaded (lj_zmq.h). */
#include <dlfcn.h>
#include <string.h>

#include "lj_zmq_calls.h"

struct lj_zmq_api lj_zmq;

/* dlsym returns void *; a function pointer is assigned through memcpy, which ISO C allows
   and -Wpedantic does not warn about. */
static int lj_sym(void *lib, const char *name, void *slot, size_t size)
{
    void *f = dlsym(lib, name);
    if (f == NULL) return -1;
    memcpy(slot, &f, size);
    return 0;
}

#define LJ_BIND(field, name) (lj_sym(lib, name, &api.field, sizeof api.field) == 0)

int lj_zmq_bind(const char *path)
{
    struct lj_zmq_api api;
    /* RTLD_NOLOAD: only a library that is already mapped; never a second libzmq. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    int ok;
    if (lib == NULL) return -1;
    ok = LJ_BIND(msg_init, "zmq_msg_init") && LJ_BIND(msg_init_size, "zmq_msg_init_size")
        && LJ_BIND(msg_recv, "zmq_msg_recv") && LJ_BIND(msg_send, "zmq_msg_send")
        && LJ_BIND(msg_close, "zmq_msg_close") && LJ_BIND(msg_data, "zmq_msg_data")
        && LJ_BIND(msg_size, "zmq_msg_size") && LJ_BIND(msg_more, "zmq_msg_more")
        && LJ_BIND(msg_move, "zmq_msg_move") && LJ_BIND(msg_copy, "zmq_msg_copy")
        && LJ_BIND(send, "zmq_send") && LJ_BIND(recv, "zmq_recv")
        && LJ_BIND(getsockopt, "zmq_getsockopt") && LJ_BIND(errno_, "zmq_errno");
    /* The handle stays open: the library must outlive every pointer taken from it. */
    if (!ok) return -1;
    lj_zmq = api;
    return 0;
}
