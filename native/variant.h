/* JSON bodies to Spark's VARIANT (Parquet's Variant binary encoding, unshredded), a batch at a time
 * (importer/variant.py).
 *
 * Also the module's cffi declaration (native/build.py reads it without its #include and
 * #pragma lines): only declarations below.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* One batch's documents as two Arrow large-binary columns and a validity bitmap. The
 * arrays belong to the batch and are reused by its next lj_variant_encode. */
typedef struct lj_variant_batch {
    uint8_t *value;          /* every row's Variant value, back to back */
    int64_t *value_offsets;  /* rows + 1 */
    uint8_t *meta;           /* every row's Variant metadata (its key dictionary), back to back */
    int64_t *meta_offsets;   /* rows + 1 */
    uint8_t *valid;          /* bit i (LSB first) set when row i has a document */
    size_t rows;
    size_t made;             /* rows with a document */
    void *state;             /* the encoder's own buffers */
} lj_variant_batch;

lj_variant_batch *lj_variant_new(void);
void lj_variant_free(lj_variant_batch *batch);

/* Encodes the bodies data[offsets[i] : offsets[i + 1]] for which want[i] is non-zero; a body
 * that does not start with one JSON object (with unique keys, at most 128 levels deep, each
 * part within 16 MiB) gets no document; what follows that object is ignored, as Spark does. Returns 0, or -1 when memory ran out (the batch is then empty). */
int lj_variant_encode(lj_variant_batch *batch, const uint8_t *data, const int32_t *offsets,
                      const uint8_t *want, size_t rows);
