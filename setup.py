"""The C modules (native/): everything else about the package is in pyproject.toml.

`cffi_modules` is a setup() keyword cffi adds, with no pyproject.toml spelling; the
builders and the build flags are in native/build.py.
"""

from setuptools import setup

setup(cffi_modules=[f"native/build.py:{name}" for name in ("device", "link", "scan", "sub_drain", "variant", "decode", "syslog", "otlp")])
