/* Finding the J frames of a Lumberjack stream: a run of back-to-back v2 JSON frames in one call.
 *
 * Why: a Beats window is one C frame that inflates to thousands of J frames, and reading
 * each 10-byte header in Python (unpack, bounds checks, three appends) cost more than
 * everything else the engine does. This reads the headers of a whole run and returns
 * their seqs, payload offsets and payload lengths as arrays; the payloads stay where
 * they are, in the buffer. No libzmq here: this module is not bound to it.
 */
#include <stddef.h>
#include <stdint.h>

#include "scan.h"

#define LJ_T_JSON 0x4A  /* 'J' */
#define LJ_HEADER 10    /* version, type, seq (4), length (4) */

static uint32_t lj_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Whole J frames of `version` from buf[pos:end], up to cap of them. Stops at anything else:
   another frame type or version, a frame larger than max_frame (Python raises for it), or a
   frame that has not fully arrived. Offsets are from buf + base. */
int lj_scan_json(const unsigned char *buf, size_t pos, size_t end, size_t base, unsigned char version,
                 uint32_t max_frame, uint32_t *seqs, uint32_t *offs, uint32_t *lens, int cap, size_t *next)
{
    int n = 0;
    while (n < cap && end - pos >= LJ_HEADER && buf[pos] == version && buf[pos + 1] == LJ_T_JSON) {
        uint32_t len = lj_be32(buf + pos + 6);
        if (len > max_frame || end - pos - LJ_HEADER < len) break;
        seqs[n] = lj_be32(buf + pos + 2);
        offs[n] = (uint32_t)(pos + LJ_HEADER - base);
        lens[n] = len;
        n++;
        pos += LJ_HEADER + (size_t)len;
    }
    *next = pos;
    return n;
}
