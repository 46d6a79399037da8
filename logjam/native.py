"""The one switch for the mesh's C fast paths, and their loader.

The C sources are in native/ and are compiled when the package is installed (setup.py,
native/build.py), never when a process starts. `LOGJAM_NATIVE` chooses for every native
path in a process at once:

- `auto` (the default): the C module when it was built, else the Python path, logged once;
- `off`: always the Python path;
- `require`: the C module or an error (`NativeUnavailable`) when it is first asked for,
  which every entry point does at start (`announce`).

`load(name)` imports a built module, checks it was built from today's
logjam/constants.py, and binds a module that calls libzmq (it exports `lj_zmq_bind`) to
the libzmq pyzmq loaded (lj_zmq.h says why no module links one). Every path has a Python
twin that the tests run against the C one.

The loader names no module itself: each caller passes its own (`devices._native`,
`bridges.host._native_link`, ...), so the wire library knows nothing of the layers above
it. native/build.py is the one list of what is built.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from logjam.constants import constants_id

log = logging.getLogger(__name__)

ENV = "LOGJAM_NATIVE"
MODES = ("auto", "off", "require")

class NativeUnavailable(RuntimeError):
    """LOGJAM_NATIVE=require, and a C module cannot be loaded."""


def mode() -> str:
    """The switch's value; a value outside auto/off/require is an error, never read as auto."""
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r}: expected one of {', '.join(MODES)}")
    return value


# name -> (ffi, lib), or the reason it cannot be used.
_loaded: dict[str, tuple[Any, Any] | str] = {}


def load(name: str) -> tuple[Any, Any] | None:
    """(ffi, lib) of the built module `name` (a dotted module name), or None for the Python path.

    Raises NativeUnavailable under LOGJAM_NATIVE=require when it cannot be loaded."""
    current = mode()
    if current == "off":
        return None
    if name not in _loaded:
        _loaded[name] = _import(name)
        if isinstance(_loaded[name], str) and current == "auto":
            log.warning("native: %s unavailable (%s); using the Python path", name, _loaded[name])
    got = _loaded[name]
    if isinstance(got, str):
        if current == "require":
            raise NativeUnavailable(f"{ENV}=require, but {name} {got}")
        return None
    return got


def _import(name: str) -> tuple[Any, Any] | str:
    """The module's (ffi, lib), or why not."""
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        return f"is not built ({e}); install with a C compiler and Python headers: pip install -e ."
    ffi, lib = module.ffi, module.lib
    if lib.LJ_CONSTANTS_ID != constants_id():
        return "was built from other logjam/constants.py values (a stale build); reinstall: pip install -e ."
    if hasattr(lib, "lj_zmq_bind"):  # only the modules that call libzmq export it (native/build.py)
        path = _libzmq_path()
        if path is None or lib.lj_zmq_bind(path.encode()) != 0:
            return f"cannot bind to pyzmq's libzmq ({path or 'not found among the mapped libraries'})"
    return ffi, lib


def _libzmq_path() -> str | None:
    """The libzmq pyzmq loaded into this process: the mapped file named libzmq, else pyzmq's
    own extension (a pyzmq with libzmq linked in statically exports its symbols there)."""
    import zmq.backend.cython._zmq as backend

    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libzmq") and os.path.exists(path):
                    return path
    except OSError:
        pass
    return backend.__file__


def describe(names: list[str]) -> str:
    """One line for a process's start log: which path each of `names` runs, and why."""
    current = mode()
    if current == "off":
        return f"native: off ({ENV}=off), Python paths for {', '.join(names)}"
    parts = []
    for name in names:
        got = load(name)
        parts.append(f"{name} C" if got is not None else f"{name} Python ({_loaded[name]})")
    return f"native ({ENV}={current}): " + "; ".join(parts)


def announce(logger: logging.Logger, names: list[str]) -> None:
    """Log at start which path runs; under require, fail now rather than at the first message."""
    logger.info("%s", describe(names))
