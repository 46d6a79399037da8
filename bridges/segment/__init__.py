"""The segment-append bridge: Pravega's segment-store wire protocol in front of a Logjam device."""
