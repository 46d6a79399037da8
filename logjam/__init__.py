"""The Logjam wire library: the ground floor, importing nothing above it (tests/test_layers.py).

`Message` and `Meta` are the one representation of a Logjam message; `compression`
holds the four body codecs; `validation` the stream-name and topic rules; `errors` the
one error family; `Producer`, `Subscriber` and the replay client are the ends of a device.
"""

from logjam.errors import (
    CompressionError,
    DecompressedTooLarge,
    InvalidAppEnv,
    InvalidTopic,
    LocalProtocolError,
    MetaError,
    ProtocolError,
    RemoteProtocolError,
)
from logjam.message import Message
from logjam.meta import Meta, Compression

__all__ = [
    "Compression",
    "CompressionError",
    "DecompressedTooLarge",
    "InvalidAppEnv",
    "InvalidTopic",
    "LocalProtocolError",
    "Message",
    "Meta",
    "MetaError",
    "ProtocolError",
    "RemoteProtocolError",
]
