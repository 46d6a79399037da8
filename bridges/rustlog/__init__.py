"""The RustLog bridge: both wire dialects (JSON and the reference broker's binary), a durable partitioned log, and forwarding to a logjam-device."""
