"""Process infrastructure every entry point builds on: flags and TOML (config), the /metrics and /healthz
listener (health) and --check (check). Above the wire library (logjam/), below devices, bridges,
the importer and the tools."""
