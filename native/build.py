"""Build the mesh's C modules from the sources beside this file, with cffi, at install time.

setup.py names the builders below in `cffi_modules`, so `pip install -e .` (and
`make venv`) compiles them into their packages; nothing is compiled when a process
starts. Each module's cffi declaration is its header (without #include and #pragma
lines), so declarations are written once. The wire constants come from
logjam/constants.py, written here as lj_constants.h (into native/generated/).

Only the modules that call libzmq get lj_zmq.c, and none links libzmq: they bind to the
libzmq pyzmq loaded when logjam/native.py loads them (see lj_zmq.h).

Every module is compiled with -Wall. LOGJAM_NATIVE_WERROR=1 (CI sets it) adds -Werror and
makes a failed build fail the install; otherwise a failed build (no compiler, no Python
headers) leaves the package installed without it, and every process says so at start.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GENERATED = HERE / "generated"


def _constants():
    """logjam/constants.py, loaded by path: the build environment has none of the package's dependencies."""
    spec = importlib.util.spec_from_file_location("_logjam_constants", ROOT / "logjam" / "constants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look the module up
    spec.loader.exec_module(module)
    return module


def write_constants_header() -> Path:
    """native/generated/lj_constants.h, rewritten only when its text changes (keeps rebuilds incremental)."""
    GENERATED.mkdir(exist_ok=True)
    target = GENERATED / "lj_constants.h"
    text = _constants().c_header()
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return target


def _cdef(header: str) -> str:
    """A header as cffi declarations: cffi parses neither #include nor #pragma."""
    lines = (HERE / header).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith(("#include", "#pragma")))


def strict() -> bool:
    return os.environ.get("LOGJAM_NATIVE_WERROR", "") not in ("", "0")


def _builder(module: str, header: str, sources: list[str], *, zmq: bool, headers: tuple[str, ...] = ()) -> FFI:
    """`headers`: others whose declarations `header` uses (it #includes them), declared before it."""
    write_constants_header()
    ffi = FFI()
    cdef = (_cdef("lj_zmq.h") if zmq else "") + "".join(_cdef(h) + "\n" for h in headers) + _cdef(header)
    # Exported so the loader can refuse a module built from other constants.
    ffi.cdef(cdef + "\n#define LJ_CONSTANTS_ID ...\n")
    rel = [os.path.relpath(HERE / s, ROOT) for s in sources + (["lj_zmq.c"] if zmq else [])]
    ffi.set_source(
        module,
        "".join(f'#include "{h}"\n' for h in (*headers, header)) + '#include "lj_constants.h"\n',
        sources=rel,
        include_dirs=[os.path.relpath(HERE, ROOT), os.path.relpath(GENERATED, ROOT)],
        extra_compile_args=["-O2", "-Wall"] + (["-Werror"] if strict() else []),
        # dlopen/dlsym: in libc since glibc 2.34, in libdl before.
        libraries=["dl"] if zmq else [],
        depends=[os.path.relpath(h, ROOT) for h in sorted(HERE.glob("*.h"))],  # every header: a rebuild too many, never one too few
        optional=not strict(),
    )
    return ffi


device = _builder("devices._native", "device.h", ["device.c"], zmq=True)
link = _builder("bridges.host._native_link", "link.h", ["link.c"], zmq=True)
scan = _builder("bridges.lumberjack._native_scan", "scan.h", ["scan.c"], zmq=False)
sub_drain = _builder("logjam._native_sub", "sub_drain.h", ["sub_drain.c"], zmq=True)
variant = _builder("importer._native_variant", "variant.h", ["variant.c"], zmq=False)
decode = _builder("importer._native_decode", "decode.h", ["decode.c", "dedupe.c", "pick.c"], zmq=False,
                  headers=("dedupe.h", "pick.h"))
otlp = _builder("bridges.otlp._native_otlp", "otlp.h", ["otlp_protobuf.c", "otlp_json.c", "otlp_body.c"], zmq=False)
syslog = _builder("bridges.syslog._native_syslog", "syslog.h", ["syslog.c"], zmq=False)

if __name__ == "__main__":
    # `python native/build.py` writes lj_constants.h, for compiling or linting the C by hand.
    print(write_constants_header())
