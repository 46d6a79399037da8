"""Compile a small C extension with cffi once, cache it, and load it: the mesh's native fast paths.

The device's hot loop (`devices/native.py`) and the bridges' device link
(`bridges/host/native_link.py`) each declare a few C functions that call libzmq
directly. Both must link against the very libzmq that pyzmq loaded (the C code
drives pyzmq's own sockets through `Socket.underlying`), and both must build at most
once per machine, so the compile-and-cache logic lives here.

`load_module()` returns None, never raises, when no compiler, Python headers or
writable cache is available: every native path has a pure-Python fallback.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def libzmq_path() -> str | None:
    """The libzmq that pyzmq loaded into this process; an extension must use the same one."""
    import zmq.backend.cython._zmq  # noqa: F401  (make sure it is mapped)

    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if "libzmq" in os.path.basename(path) and os.path.exists(path):
                    return path
    except OSError:
        return None
    return None


def cache_dir() -> Path:
    base = os.environ.get("LOGJAM_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "logjam-mesh"
    )
    return Path(base)


def load_module(prefix: str, cdef: str, source: str, logger: logging.Logger = log) -> tuple[Any, Any] | None:
    """(ffi, lib) of the extension declared by `cdef` and defined by `source`; None if impossible."""
    try:
        import cffi
    except ImportError:
        logger.info("cffi is not installed; using the Python loop")
        return None
    libzmq = libzmq_path()
    if libzmq is None:
        logger.info("cannot locate the loaded libzmq; using the Python loop")
        return None
    key = hashlib.sha256("\0".join([cdef, source, libzmq, sys.version, cffi.__version__]).encode()).hexdigest()[:16]
    name = f"{prefix}_{key}"
    cache = cache_dir()
    target = cache / f"{name}.so"
    try:
        if not target.exists():
            cache.mkdir(parents=True, exist_ok=True)
            ffi = cffi.FFI()
            ffi.cdef(cdef)
            ffi.set_source(
                name, source,
                extra_compile_args=["-O2"],
                extra_link_args=[libzmq, f"-Wl,-rpath,{os.path.dirname(libzmq)}"],
            )
            # Build privately, then rename: processes starting together never see half a file.
            tmp = tempfile.mkdtemp(dir=cache, prefix="build-")
            try:
                built = ffi.compile(tmpdir=tmp, verbose=False)
                os.replace(built, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        spec = importlib.util.spec_from_file_location(name, target)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.ffi, module.lib
    except Exception as e:  # no compiler, no Python headers, an unwritable cache...
        logger.warning("native fast path unavailable (%s); using the Python loop", e)
        return None
