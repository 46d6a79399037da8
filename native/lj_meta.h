/* The Logjam meta frame check every C path shares: the one rule of logjam/meta.py.
 *
 * Included by the .c files only (never part of a cffi declaration). The layout and tag
 * come from lj_constants.h, generated from logjam/constants.py.
 */
#pragma once

#include <stddef.h>

#include "lj_constants.h"

/* A meta frame is LJ_META_SIZE bytes, starts with the tag in either byte order (producers
 * on either endianness), names a known compression and carries our layout version. */
static inline int lj_meta_ok(const unsigned char *d, size_t n) {
    unsigned tag;
    if (n != LJ_META_SIZE) return 0;
    tag = (unsigned)d[0] << 8 | d[1];
    if (tag != LJ_META_TAG && tag != LJ_META_TAG_SWAPPED) return 0;
    return d[2] <= LJ_COMPRESSION_MAX && d[3] == LJ_META_VERSION;
}
