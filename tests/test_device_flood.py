"""Garbage floods and the metrics endpoint of the real logjam-device.

The expected drop reasons are computed with the wire library's own rules
(`Meta.unpack`, `logjam.validation`), not with the device's fast-path code.
"""

from __future__ import annotations

import random
import pytest

from logjam.producer import Producer
from harness.processes import free_port, wait_for
from tests.test_device_helpers import Tap, classify, dealer, meta, push, reply, scrape

pytestmark = pytest.mark.timeout(90)

REASONS = ("frame_count", "broken_meta", "bad_app_env", "bad_topic")


def dropped_by_reason(samples: dict) -> dict[str, float]:
    return {r: samples.get(("logjam_device_dropped_by_reason_total", (("reason", r),)), 0.0) for r in REASONS}


def garbage(rng: random.Random) -> list[bytes]:
    """Something between plausible-but-wrong and random bytes."""
    kind = rng.randrange(10)
    good = [b"flood-test", b"logs.flood", b"{}", meta()]
    if kind == 0:
        return [rng.randbytes(rng.randrange(0, 30)) for _ in range(rng.choice([1, 2, 5, 6, 9]))]
    if kind == 1:
        return [rng.randbytes(rng.randrange(0, 30)) for _ in range(rng.choice([3, 4]))]
    if kind == 2:
        return good[:3] + [rng.randbytes(rng.choice([0, 23, 24, 25]))]
    if kind == 3:
        return good[:3] + [meta(version=rng.choice([0, 2, 255]))]
    if kind == 4:
        return good[:3] + [meta(compression=rng.randrange(4, 256))]
    if kind == 5:
        return [rng.choice([b"nodash", b"", b"a-\x00b", b"caf\xc3\xa9-prod", b"x" * 300 + b"-y"])] + good[1:]
    if kind == 6:
        return [good[0], rng.choice([b"", b"log", b"Logs", b"metrics.x", b"frontend.other"]), *good[2:]]
    if kind == 7:
        return good + [b"extra"]
    if kind == 8:
        return good[:2]
    return [rng.randbytes(8)] + good[1:3]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["require", "off"])
def test_garbage_flood_loses_no_good_message_and_counts_every_drop(device_factory, engine):
    mport = free_port()
    dev = device_factory(native=engine, extra=["--metrics-port", str(mport)])
    tap = Tap(dev.pub, dev.pull, subscribe=b"flood-test")
    rng = random.Random(20261121)
    expected = dict.fromkeys(REASONS, 0)
    good_ids: set[bytes] = set()

    pusher = push(dev.pull)
    d = dealer(dev.router)
    requests = accepted = 0
    for i in range(3000):
        # PUSH: a good message, then (usually) some garbage.
        body = b'{"id":%d}' % i
        good_ids.add(body)
        pusher.send_multipart([b"flood-test", b"logs.flood", body, meta(seq=i + 1)])
        for _ in range(rng.randrange(3)):
            frames = garbage(rng)
            reason = classify(frames)
            if reason is None:  # random bytes can be valid by chance; then they are good too
                assert frames[0] != b"flood-test"
            else:
                expected[reason] += 1
            pusher.send_multipart(frames)
        # DEALER: every 10th round a good request and a garbage request.
        if i % 10 == 0:
            body = b'{"req":%d}' % i
            good_ids.add(body)
            d.send_multipart([b"", b"flood-test", b"logs.flood", body, meta()])
            frames = garbage(rng)
            if frames[0] == b"ping" or not frames:
                frames = [b"x"]
            # On ROUTER only 4 data frames are valid (no legacy 3-frame form).
            reason = classify(frames) if len(frames) != 3 else "frame_count"
            if reason is not None:
                expected[reason] += 1
            d.send_multipart([b""] + frames)
            requests += 2
            accepted += 1 + (reason is None)

    assert all(expected.values()), f"the flood must exercise every drop reason: {expected}"
    got: set[bytes] = set()
    while len(got) < len(good_ids):
        frames = tap.recv(10)
        assert frames is not None, f"only {len(got)} of {len(good_ids)} good messages arrived"
        if frames[0] == b"flood-test":
            got.add(frames[2])
    assert got == good_ids

    replies = [reply(d) for _ in range(requests)]
    assert sum(r[1] == b"202 Accepted" for r in replies) == accepted
    assert sum(r[1] == b"400 Bad Request" for r in replies) == requests - accepted

    def counted() -> dict[str, float] | None:
        samples = scrape(mport)
        by_reason = dropped_by_reason(samples)
        return samples if by_reason == {k: float(v) for k, v in expected.items()} else None

    try:
        samples = wait_for(counted, timeout=10, what="drop counters to match")
    except AssertionError:
        raise AssertionError(f"drops {dropped_by_reason(scrape(mport))} != expected {expected}") from None
    assert samples[("logjam_device_app_env_messages_total", (("app_env", "flood-test"),))] == len(good_ids)
    # Every dropped message is also counted per stream; bad-topic drops carry the real name.
    per_stream = sum(v for (name, _), v in samples.items() if name == "logjam_device_dropped_total")
    assert per_stream == sum(expected.values())
    bad_topic_flood = samples.get(
        ("logjam_device_dropped_total", (("app_env", "flood-test"), ("reason", "bad_topic"))), 0
    )
    assert bad_topic_flood > 0
    pusher.close()
    d.close()
    tap.close()


def test_metrics_endpoint(device_factory):
    mport = free_port()
    dev = device_factory(device_id=5, extra=["--metrics-port", str(mport)])
    tap = Tap(dev.pub, dev.pull)
    with Producer(dev.router) as p:
        for _ in range(7):
            p.submit("shop-production", "logs", b"{}")
        p.submit("shop-production", "nope", b"{}")
        result = p.flush()
        assert (result.accepted, result.rejected) == (7, 1)
    s = push(dev.pull)
    s.send_multipart([b"shop-staging", b"logs", b"{}", meta()])
    s.send_multipart([b"shop-staging", b"logs", b"{}", b"short"])
    for _ in range(8):
        tap.expect()
    samples = wait_for(
        lambda: (m := scrape(mport))
        and m.get(("logjam_device_dropped_total", (("app_env", "shop-staging"), ("reason", "broken_meta")))) == 1
        and m,
        what="metrics to show the drops",
    )
    assert samples[("logjam_device_app_env_messages_total", (("app_env", "shop-production"),))] == 7
    assert samples[("logjam_device_app_env_messages_total", (("app_env", "shop-staging"),))] == 1
    assert samples[("logjam_device_dropped_total", (("app_env", "shop-production"), ("reason", "bad_topic")))] == 1
    assert samples[("logjam_device_received_total", (("socket", "router"),))] == 8
    assert samples[("logjam_device_received_total", (("socket", "pull"),))] >= 2  # plus the tap's probes
    published = samples[("logjam_device_published_total", ())]
    assert samples[("logjam_device_sequence", ())] == published
    assert published >= 8
    s.close()
    tap.close()

