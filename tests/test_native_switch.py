"""LOGJAM_NATIVE, the one switch for every C path: its values, the build it checks, what processes say at start."""

from __future__ import annotations

import ast
import importlib
import subprocess

import pytest

from logjam import constants, native
from harness.device import start_device
from harness.native import c_module
from harness.processes import REPO, command, stop

pytestmark = pytest.mark.timeout(60)


def built_modules() -> list[str]:
    """The modules native/build.py builds (its `_builder("name", ...)` calls): the one list of them."""
    tree = ast.parse((REPO / "native" / "build.py").read_text())
    return sorted(node.args[0].value for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_builder")


def test_the_build_list_is_every_c_module():
    assert built_modules() == ["bridges.host._native_link", "bridges.lumberjack._native_scan",
                               "bridges.otlp._native_otlp", "bridges.syslog._native_syslog",
                               "devices._native", "importer._native_decode", "importer._native_variant",
                               "logjam._native_sub"]


@pytest.mark.parametrize("name", built_modules())
def test_every_module_is_built_from_todays_constants(name):
    """Each C module carries the checksum of logjam/constants.py it was compiled with (the loader refuses others)."""
    _, lib = c_module(name)
    assert lib.LJ_CONSTANTS_ID == constants.constants_id()
    assert importlib.import_module(name).__file__.endswith(".so")  # installed, not compiled at start


def test_only_the_modules_that_call_libzmq_are_bound_to_it():
    for name in ("bridges.lumberjack._native_scan", "importer._native_variant", "importer._native_decode",
                 "bridges.otlp._native_otlp"):
        assert not hasattr(c_module(name)[1], "lj_zmq_bind")
    for name in ("devices._native", "bridges.host._native_link", "logjam._native_sub"):
        assert hasattr(c_module(name)[1], "lj_zmq_bind")


def test_the_switch_takes_three_values(monkeypatch):
    for value, want in (("", "auto"), ("auto", "auto"), ("OFF", "off"), (" require ", "require")):
        monkeypatch.setenv(native.ENV, value)
        assert native.mode() == want
    monkeypatch.setenv(native.ENV, "native")
    with pytest.raises(ValueError, match="auto, off, require"):
        native.mode()


def test_a_missing_build_is_an_error_under_require_and_the_python_path_under_auto(monkeypatch, caplog):
    monkeypatch.setenv(native.ENV, "require")
    with pytest.raises(native.NativeUnavailable, match="is not built"):
        native.load("logjam._native_never_built")
    monkeypatch.setenv(native.ENV, "auto")
    assert native.load("logjam._native_never_built") is None
    assert "logjam._native_never_built Python (is not built" in native.describe(["logjam._native_never_built"])
    monkeypatch.setenv(native.ENV, "off")
    assert native.load("devices._native") is None


@pytest.mark.parametrize("mode, says", [("require", "devices._native C"), ("off", "native: off")])
def test_the_device_says_at_start_which_loop_runs(mode, says):
    if mode == "require":
        c_module("devices._native")
    dev = start_device(native=mode)
    try:
        assert stop(dev.proc) == 0
        assert says in dev.output()
    finally:
        stop(dev.proc)


def test_a_bad_switch_value_stops_the_device_at_start():
    proc = subprocess.run([command("logjam-device"), "--bind", "127.0.0.1", "-t", "0", "-p", "0", "-P", "0", "-s", "0",
                           "--allow-plaintext"],
                          env={**__import__("os").environ, native.ENV: "sometimes"}, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode != 0
    assert "LOGJAM_NATIVE='sometimes'" in proc.stderr + proc.stdout


def test_the_device_has_no_engine_flag():
    proc = subprocess.run([command("logjam-device"), "--engine", "native"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "--engine" in proc.stderr
