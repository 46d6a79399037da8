/* One 64-bit hash of a byte string for the importer's C tables (native/dedupe.c, native/pick.c):
 * keys are names and idempotency keys, ~10-100 bytes, so 8 bytes a step. The tables compare
 * the bytes themselves; the hash only says where to look. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t lj_hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 32);
}
