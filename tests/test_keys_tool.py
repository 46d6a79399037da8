"""`logjam-keys` through the real command: `init` makes the keys a device and its clients start
with, `add` admits one more client and `revoke` takes it out again, on a running device after
SIGHUP; the command that `--check` and a failed start name is the one that fixes it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import zmq
import zmq.auth

from logjam.curve import ClientKey
from harness.device import pings, start_device
from harness.processes import command, stop, wait_for

pytestmark = pytest.mark.timeout(120)


def keys_cmd(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([command("logjam-keys"), *argv], capture_output=True, text=True, timeout=60, env=env)


def test_init_makes_what_the_device_and_its_clients_check_for(tmp_path: Path) -> None:
    env = dict(os.environ, LOGJAM_DATA_DIR=str(tmp_path / "data"))
    checks = {"device": [command("logjam-device"), "--check"],
              "client": [command("logjam-tail"), "--sub", "tcp://127.0.0.1:1", "--check"]}
    for name, argv in checks.items():
        before = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert before.returncode == 1 and "is missing: `logjam-keys init` creates" in before.stdout, (name, before.stdout)

    made = keys_cmd("init", env=env)
    assert made.returncode == 0 and "created server, client" in made.stdout, made.stdout + made.stderr
    keys = tmp_path / "data" / "keys"
    assert keys.stat().st_mode & 0o777 == 0o700
    assert (keys / "server.key_secret").stat().st_mode & 0o777 == 0o600
    assert zmq.auth.load_certificates(keys / "allowed") == {zmq.auth.load_certificate(keys / "client.key")[0]: True}
    for name, argv in checks.items():
        after = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert after.returncode == 0, (name, after.stdout)

    secret = (keys / "server.key_secret").read_bytes()
    again = keys_cmd("init", "--keys", str(keys))
    assert again.returncode == 0 and "already holds" in again.stdout
    assert (keys / "server.key_secret").read_bytes() == secret  # a second init keeps the keys


def test_add_and_revoke_on_a_running_device(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    # Before init there is nothing to add to, and it says so.
    early = keys_cmd("add", "web-7", "--keys", str(keys))
    assert early.returncode == 1 and f"`logjam-keys init --keys {keys}`" in early.stderr, early.stderr
    assert keys_cmd("init", "--keys", str(keys)).returncode == 0
    dev = start_device(keys=keys)
    ctx = zmq.Context()
    try:
        added = keys_cmd("add", "web-7", "--keys", str(keys))
        assert added.returncode == 0, added.stderr
        assert f"--curve-secret {keys / 'web-7.key_secret'}" in added.stdout
        assert (keys / "web-7.key_secret").stat().st_mode & 0o777 == 0o600
        web = ClientKey.load(keys / "web-7.key_secret", keys / "server.key")

        def answers() -> bool:
            return pings(dev.router, web, ctx)

        dev.proc.send_signal(signal.SIGHUP)
        wait_for(answers, timeout=20, what="the added key to be admitted after SIGHUP")

        revoked = keys_cmd("revoke", "web-7", "--keys", str(keys))
        assert revoked.returncode == 0 and not (keys / "allowed" / "web-7.key").exists(), revoked.stderr
        dev.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: not answers(), timeout=20, what="the revoked key to be refused after SIGHUP")
        assert keys_cmd("revoke", "web-7", "--keys", str(keys)).returncode == 1  # not there any more

        # A public key made on the client's own host is admitted as given; its secret never came here.
        other = tmp_path / "elsewhere"
        other.mkdir()
        public, _ = zmq.auth.create_certificates(other, "agent")
        admitted = keys_cmd("add", "agent", "--public", str(public), "--keys", str(keys))
        assert admitted.returncode == 0 and (keys / "allowed" / "agent.key").is_file(), admitted.stderr
        assert not (keys / "agent.key_secret").exists()
        assert keys_cmd("add", "../x", "--keys", str(keys)).returncode == 1
    finally:
        ctx.destroy(linger=0)
        assert stop(dev.proc) == 0, dev.output()
