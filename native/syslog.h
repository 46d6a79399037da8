/* Parsing RFC 5424 syslog messages and writing their event bodies, a run in one call
 * (bridges/syslog/native.py says when it is used; bridges/syslog/parse.py is its Python twin).
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
