"""A real S3 server for tests: versitygw (built by `make s3-server` into build/bin) over a local directory.

    with running_s3_server(tmp_path) as s3:
        s3.create_bucket("logs")
        write_deltalake(s3.url("logs", "messages"), table, storage_options=s3.storage_options())
        SparkSession.builder.config(map=s3.spark_conf())...   # with runtime.jars' `delta` and `s3` sets

The server listens on 127.0.0.1 on a free port, with one root key pair, and keeps each bucket as
a directory of `root` (object metadata such as ETags in extended attributes, or in a sidecar
directory where the filesystem has none). `start_s3_server` returns once a signed ListBuckets
answers, or raises `S3ServerFailed` with the server's output; `S3Server.stop` ends it with
SIGTERM and waits. The clients here (bucket creation, `client()`) are botocore's: the AWS SDK's
own request signing, wire format and retries.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from harness.processes import REPO, StartFailed, free_port, log_tail, stop, wait_for_start

VERSITYGW_VERSION = "v1.8.0"  # what `make s3-server` builds (the Makefile reads it here)
VERSITYGW = REPO / "build" / "bin" / "versitygw"
REGION = "us-east-1"


class S3ServerError(Exception):
    """The tests' S3 server could not be had: its binary is missing, or it did not start or stop cleanly."""


class S3ServerMissing(S3ServerError, FileNotFoundError):
    """No versitygw binary at VERSITYGW_VERSION: `make s3-server` (run by `make test`) builds it."""


class S3ServerFailed(S3ServerError, StartFailed):
    """versitygw exited, hung or outlasted its bound before it answered, or exited badly when stopped."""


@dataclass(slots=True)
class S3Server:
    proc: subprocess.Popen
    port: int
    root: Path  # the posix backend's directory: one subdirectory per bucket
    log: Path
    access_key: str
    secret_key: str
    region: str = REGION
    _client: Any = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return log_tail(self.log)

    def url(self, bucket: str, key: str = "", scheme: str = "s3") -> str:
        """`s3://bucket/key` (delta-rs), or with scheme="s3a" for Spark's Hadoop filesystem."""
        return f"{scheme}://{bucket}/{key}" if key else f"{scheme}://{bucket}"

    def client(self, **config: Any) -> Any:
        """A botocore S3 client for this server (path-style addressing); `config` goes to botocore's Config.

        The client is thread-safe, but holds at most `max_pool_connections` (10 by default)
        connections: a test that means N requests at once passes max_pool_connections=N.
        """
        import botocore.session
        from botocore.config import Config

        settings: dict[str, Any] = dict(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"},
                                        connect_timeout=5, read_timeout=30)
        settings.update(config)
        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name=self.region, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, config=Config(**settings))

    def _default_client(self) -> Any:
        if self._client is None:
            self._client = self.client()
        return self._client

    def create_bucket(self, name: str) -> str:
        self._default_client().create_bucket(Bucket=name)
        return name

    def storage_options(self) -> dict[str, str]:
        """delta-rs (`deltalake`) storage options: this endpoint over plain HTTP, its keys, and
        commits made safe by S3's conditional PUT (`If-None-Match: *`), without a lock service."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "conditional_put": "etag",
        }

    def spark_conf(self) -> dict[str, str]:
        """Spark settings for `s3a://` on this server (hadoop-aws: runtime.jars' `s3` set on the classpath)."""
        return {
            "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
            "spark.hadoop.fs.s3a.aws.credentials.provider":
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
            # A server that is down fails a test in seconds, not after S3A's minutes of retries.
            "spark.hadoop.fs.s3a.attempts.maximum": "3",
            "spark.hadoop.fs.s3a.retry.limit": "3",
            "spark.hadoop.fs.s3a.connection.establish.timeout": "15s",  # S3A's floor
        }

    def stop(self, timeout: float = 10) -> int:
        """SIGTERM, then wait; the exit code (0 when versitygw shut down cleanly)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        return stop(self.proc, timeout=timeout)


def versitygw() -> Path:
    """The versitygw binary at VERSITYGW_VERSION, or `S3ServerMissing` naming the make target that builds it."""
    if not VERSITYGW.is_file():
        raise S3ServerMissing(f"{VERSITYGW} is missing: `make s3-server` builds versitygw {VERSITYGW_VERSION}")
    # The main module's line of the build info Go writes into every binary (what `go version -m`
    # prints as "mod  github.com/versity/versitygw  v1.8.0  h1:..."), read without needing Go.
    module = f"\tgithub.com/versity/versitygw\t{VERSITYGW_VERSION}\t".encode()
    with open(VERSITYGW, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as image:
        if image.find(module) < 0:
            raise S3ServerMissing(f"{VERSITYGW} is not versitygw {VERSITYGW_VERSION}: `make s3-server` rebuilds it")
    return VERSITYGW


def _has_user_xattrs(directory: Path) -> bool:
    """Whether `directory`'s filesystem takes user extended attributes (ext4, xfs, btrfs do; tmpfs before 6.6 does not)."""
    probe = "user.logjam.probe"
    try:
        os.setxattr(directory, probe, b"1")
        os.removexattr(directory, probe)
        return True
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
            return False
        raise


def start_s3_server(base: Path, *, keep_alive: bool = True, sidecar: bool | None = None, quiet: float = 30,
                    limit: float = 120) -> S3Server:
    """versitygw over `base`/root on a free loopback port, answering signed requests; its output in `base`/versitygw.log.

    `keep_alive`: versitygw closes every connection after one response unless told otherwise;
    S3 itself keeps them open, and so do the clients here (delta-rs, S3A, botocore) in their pools.
    `sidecar`: object metadata in `base`/meta rather than in extended attributes; by default only
    where `base`'s filesystem takes no user xattrs.
    The wait for it fails once `quiet` seconds pass with its port still closed, or after `limit`.
    """
    binary = versitygw()
    root = base / "root"
    root.mkdir(parents=True, exist_ok=True)
    backend = ["posix"]
    if sidecar or (sidecar is None and not _has_user_xattrs(root)):
        # The posix backend keeps ETags, content types and user metadata in xattrs; without
        # them it keeps them as files in a sidecar directory (outside root: not a bucket).
        meta = base / "meta"
        meta.mkdir(exist_ok=True)
        backend += ["--sidecar", str(meta)]
    log = base / "versitygw.log"
    access, secret = f"logjam{secrets.token_hex(6)}", secrets.token_hex(20)
    port = free_port()
    argv = [str(binary), "--access", access, "--secret", secret, "--region", REGION,
            "--port", f"127.0.0.1:{port}", "--quiet"]  # --quiet: no line per request
    if keep_alive:
        argv.append("--keep-alive")
    with open(log, "w") as out:
        # A file, not a pipe: nothing reads it while the server runs.
        proc = subprocess.Popen([*argv, *backend, str(root)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    server = S3Server(proc, port, root, log, access, secret)
    try:
        _wait_ready(server, quiet=quiet, limit=limit)
    except BaseException:
        if proc.poll() is None:
            server.stop()
        raise
    return server


def _wait_ready(server: S3Server, *, quiet: float, limit: float) -> None:
    """Until a signed ListBuckets answers: the port open is not enough, the keys must be taken."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = server.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)
    last: list[Exception] = []

    def answers() -> bool:
        try:
            client.list_buckets()
            return True
        except (BotoCoreError, ClientError) as e:
            last[:] = [e]
            return False

    try:
        wait_for_start(server.proc, answers, server.log, what=f"versitygw on port {server.port}",
                       ports=[server.port], quiet=quiet, limit=limit, interval=0.05)
    except StartFailed as e:
        raise S3ServerFailed(f"{e}\n(its last answer: {last[0]!r})" if last else str(e)) from None
    finally:
        client.close()


@contextmanager
def running_s3_server(base: Path, **options: Any) -> Iterator[S3Server]:
    """`start_s3_server(base, **options)` until the block ends; then stopped, and a bad exit raised
    as `S3ServerFailed` (unless the block itself failed: that error is the one that matters)."""
    server = start_s3_server(base, **options)
    try:
        yield server
    except BaseException:
        server.stop()
        raise
    code = server.stop()
    if code != 0:
        raise S3ServerFailed(f"versitygw exited with {code} when stopped; its log ends:\n{server.output()}")
