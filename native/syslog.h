/* Parsing RFC 5424 syslog messages and writing their event bodies, a run in one call
 * (bridges/syslog/encode.py says when it is used; parse.py and orjson are its Python twin), and
 * reading the datagrams waiting on a UDP socket, many per system call (bridges/syslog/receive.py).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

size_t lj_syslog_map(const uint8_t *in, const uint32_t *lens, size_t n, const uint8_t *pre, size_t pre_len,
                     const uint8_t *mid, size_t mid_len, const uint8_t *post, size_t post_len,
                     const int64_t *txnrs, int64_t key, int64_t received_ms, uint8_t *out, size_t cap,
                     uint32_t *out_lens, int64_t *stamps);

int lj_syslog_recv(int fd, uint8_t *buf, uint32_t slot, uint32_t n, uint32_t *lens, uint8_t *addrs,
                   uint32_t addr_room, uint32_t *addr_lens);
