"""The Log Courier bridge: `logjam-bridge courier` (engine.py is the sans-IO protocol, with wire.py its framing and messages.py its events and replies; bridge.py the session glue)."""
