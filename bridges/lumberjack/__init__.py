"""Lumberjack v1/v2 (Beats) bridge: `engine` is the sans-IO protocol, `bridge` the session glue."""
