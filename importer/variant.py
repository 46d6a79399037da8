"""The `doc` column made by the importer: each body that is a JSON object, as a Spark VARIANT.

Spark reads a Parquet group of two binaries, `value` and `metadata`, as a VARIANT when the
read schema says VARIANT. So an importer that stages its rows (importer/write.py) stages
`doc` in that shape, encoded by native/variant.c, and Spark's write copies it instead of
parsing every body. Parsing was half of what `doc` cost Spark's write at ingest (3 of 6 us
per row, measured; docs/schema.md), and Spark's CPU is what the whole mesh shares.

Without the C module (`LOGJAM_NATIVE=off`, or no compiler) `DocEncoder.load()` is None, and
Spark makes `doc` in the write's plan (`table.schema.with_doc`), as it does for an importer
that cannot stage (a remote Spark). Both make the same VARIANT: native/variant.c follows
Spark's parse_json byte for byte (tests/test_variant.py), and tests/test_doc.py lands rows
both ways.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from logjam import native as _native
from table.schema import DOC_ARROW_TYPE

MODULE = "importer._native_variant"


class DocEncoder:
    """Encodes a staged table's bodies as `doc`, a batch at a time; one per writer thread."""

    def __init__(self, built: tuple[Any, Any]) -> None:
        self._ffi, self._lib = built
        self._batch = self._ffi.gc(self._lib.lj_variant_new(), self._lib.lj_variant_free)
        if self._batch == self._ffi.NULL:
            raise MemoryError("lj_variant_new")

    @classmethod
    def load(cls) -> DocEncoder | None:
        """An encoder, or None when the C module is switched off or missing (Spark parses instead)."""
        built = _native.load(MODULE)
        return cls(built) if built is not None else None

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
                                     children=[value, metadata])


def _binary(ffi: Any, rows: int, offsets: Any, data: Any) -> pa.Array:
    """A large-binary array copied out of the encoder's buffers (which its next batch reuses)."""
    return pa.Array.from_buffers(pa.large_binary(), rows, [None, pa.py_buffer(_copy(ffi, offsets, 8 * (rows + 1))),
                                                            pa.py_buffer(_copy(ffi, data, offsets[rows]))])


def _copy(ffi: Any, pointer: Any, size: int) -> bytes:
    return ffi.buffer(pointer, size)[:] if size else b""
