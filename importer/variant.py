"""The `doc` column made by the importer: each body that is a JSON object, as a Spark VARIANT.

Spark reads a Parquet group of two binaries, `value` and `metadata`, as a VARIANT when the
read schema says VARIANT. So the importer encodes `doc` in that shape itself, and when it
places its own files (importer/place.py) `doc` is always encoded here, never by Spark.
Parsing was half of what `doc` cost Spark's write at ingest (3 of 6 us per row, measured;
docs/schema.md), and Spark's CPU is what the whole mesh shares.

The encoder always exists: `DocEncoder.load()` gives the C one (native/variant.c) when the
module is built and `LOGJAM_NATIVE` allows it, else its Python twin (importer/variant_py.py)
under `LOGJAM_NATIVE=off` or without a compiler. The twin is slower (about 20 us a row against
1 on ten-field log lines), not different: tests/test_variant.py compares the C with Spark's
parse_json byte for byte and the twin with the C, and tests/test_doc.py lands rows through
the importer's writer either way. Where the C departs from Spark, the twin departs with it
(importer/variant_py.py says where).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from importer.variant_py import PyDocEncoder
from logjam import native as _native
from table.schema import DOC_ARROW_TYPE

MODULE = "importer._native_variant"


class DocEncoder:
    """Encodes a batch's bodies as `doc` in C, a batch at a time; one per writer thread (it keeps buffers)."""

    def __init__(self, built: tuple[Any, Any]) -> None:
        self._ffi, self._lib = built
        self._batch = self._ffi.gc(self._lib.lj_variant_new(), self._lib.lj_variant_free)
        if self._batch == self._ffi.NULL:
            raise MemoryError("lj_variant_new")

    @classmethod
    def load(cls) -> DocEncoder | PyDocEncoder:
        """The C encoder, or its Python twin when the C module is switched off or missing; never None.

        Under LOGJAM_NATIVE=require a missing module raises `NativeUnavailable` (logjam/native.py)."""
        built = _native.load(MODULE)
        return cls(built) if built is not None else PyDocEncoder()

    def column(self, table: pa.Table) -> pa.StructArray:
        """`doc` for every row of `table`: NULL where the body is not one JSON object.

        A body orjson refused (`parse_error`) is tried too, as Spark's `try_parse_json` would:
        Jackson takes some numbers orjson does not (1e400)."""
        ffi, lib, batch = self._ffi, self._lib, self._batch
        body = table.column("body").combine_chunks()
        rows = len(body)
        want = pc.is_valid(body)
        want_bytes = want.cast(pa.uint8()).buffers()[1] if rows else pa.py_buffer(b"\0")
        _, offsets, data = body.buffers()
        data = data if data is not None and data.size else pa.py_buffer(b"\0")
        offsets_ptr = ffi.cast("int32_t *", ffi.from_buffer(offsets)) + body.offset
        if lib.lj_variant_encode(batch, ffi.from_buffer(data), offsets_ptr, ffi.from_buffer(want_bytes), rows):
            raise MemoryError("lj_variant_encode")
        value = _binary(ffi, rows, batch.value_offsets, batch.value)
        metadata = _binary(ffi, rows, batch.meta_offsets, batch.meta)
        validity = pa.py_buffer(_copy(ffi, batch.valid, (rows + 7) // 8))
        return pa.Array.from_buffers(DOC_ARROW_TYPE, rows, [validity], null_count=rows - batch.made,
                                     children=[metadata, value])


def _binary(ffi: Any, rows: int, offsets: Any, data: Any) -> pa.Array:
    """A large-binary array copied out of the encoder's buffers (which its next batch reuses)."""
    return pa.Array.from_buffers(pa.large_binary(), rows, [None, pa.py_buffer(_copy(ffi, offsets, 8 * (rows + 1))),
                                                            pa.py_buffer(_copy(ffi, data, offsets[rows]))])


def _copy(ffi: Any, pointer: Any, size: int) -> bytes:
    return ffi.buffer(pointer, size)[:] if size else b""
