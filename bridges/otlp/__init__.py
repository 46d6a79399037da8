"""OTLP logs over gRPC and HTTP (protobuf and JSON): `logjam-bridge otlp`."""
