/* Reading the headers of a run of Lumberjack v2 J frames (bridges/lumberjack/scan.py).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

int lj_scan_json(const unsigned char *buf, size_t pos, size_t end, size_t base, unsigned char version,
                 uint32_t max_frame, uint32_t *seqs, uint32_t *offs, uint32_t *lens, int cap, size_t *next);
