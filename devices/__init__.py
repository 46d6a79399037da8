"""logjam-device: the ZeroMQ device every client sends to and every importer subscribes to.

`devices.device` holds the sockets and the loop, `devices.intake` the drains that read
its inputs, `devices.stamp` the byte-level meta and name rules they apply,
`devices.metrics` the Prometheus endpoint, and `devices.cli` the `logjam-device` entry point.
"""
