"""Bridges: TCP/TLS servers (and syslog's UDP) that turn other shippers' protocols into Logjam messages.

`bridges.host` is the shared server, device link, mapping and metrics; each protocol
package (lumberjack, courier, segment, rustlog, otlp, syslog) adds a sans-IO engine and its session.
"""
