"""The C modules (native/build.py) for a test of the C path next to its Python twin."""

from __future__ import annotations


def c_module(name: str) -> tuple:
    """(ffi, lib) of the built C module `name` (one native/build.py builds), for a test of the C path.

    Skips under LOGJAM_NATIVE=off (that run tests the Python twin) and, under auto, when the
    module was not built; under require a missing build raises, so CI cannot skip it."""
    import pytest

    from logjam import native

    if native.mode() == "off":
        pytest.skip("LOGJAM_NATIVE=off: the C path is not under test")
    loaded = native.load(name)
    if loaded is None:
        pytest.skip(f"{name} is not built (LOGJAM_NATIVE=auto)")
    return loaded
