"""The Log Courier bridge: `logjam-bridge courier` (engine.py is the sans-IO protocol, bridge.py the session glue)."""
