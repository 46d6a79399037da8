"""The Logjam wire format and the pieces every logjam-mesh process shares.

`Message` and `Meta` are the one representation of a Logjam message; `compression`
holds the four body codecs; `validation` the stream-name and topic rules;
`Producer` and `Subscriber` are the client and consumer ends of a device.
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
