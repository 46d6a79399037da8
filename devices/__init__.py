"""logjam-device: the ZeroMQ device every client sends to and every importer subscribes to.

`devices.device` holds the sockets and the hot loop, `devices.stamp` the byte-level
meta and name rules it applies, `devices.metrics` the Prometheus endpoint, and
`devices.cli` the `logjam-device` entry point.
"""
