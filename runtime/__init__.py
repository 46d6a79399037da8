"""Process infrastructure every entry point builds on: flags and TOML (config), the /metrics and /healthz
listener (health), --check (check), CURVE keys and the ZAP gatekeeper (curve), stopping on a signal
(lifecycle), rate-limited log lines (ratelimit), and the durable files and segmented log under every
store (durable, seglog). Above the wire library (logjam/), below devices, bridges, the importer and
the tools."""
