"""The bridges' one forwarding pipeline (bridges/host/pipeline.py), against a real logjam-device.

Order, budgets and refusals are the pipeline's for every protocol; these tests hold it to
them directly, with batches published through a real `DeviceLink` (and, for ordering,
protocol steps that finish in an order the test chooses).
"""

from __future__ import annotations

import asyncio

import pytest

from bridges.cli import build_parser, load_protocol
from bridges.host import Budget, EventMapper, Host, Pipeline, forward
from bridges.host.config import HostConfig
from bridges.host.link import DeviceLink
from bridges.host.metrics import BridgeMetrics

pytestmark = pytest.mark.timeout(60)


def make_host(device_router: str, *, topic: str = "logs.pipeline", inflate: int = 1 << 20) -> Host:
    args = build_parser(load_protocol("lumberjack")).parse_args(["--device", device_router, "--topic", topic])
    config = HostConfig.from_flags(args)
    metrics = BridgeMetrics("pipeline-test")
    link = DeviceLink(config.device, max_inflight=config.max_inflight)
    mapper = EventMapper(app_env="pipeline-test", topic=topic)
    return Host(config, link, mapper, metrics, Budget(inflate))


def batch(host: Host, n: int):
    out = host.mapper.batches()
    host.mapper.add_payloads(out, [b'{"i":%d}' % i for i in range(n)], {"protocol": "test"}, created_ms=1)
    return out


def counted(metric) -> float:
    return metric._value.get()


def test_batches_settle_in_the_order_they_were_launched(device) -> None:
    async def run() -> tuple[list[int], int, int]:
        host = make_host(device.router)
        host.link.start()
        settled: list[int] = []
        pipeline: Pipeline[int] = Pipeline(host, "test peer", accepted=settled.append,
                                           refused=lambda plan, e: settled.append(-plan), consequence="", depth=4)
        gates = [asyncio.get_running_loop().create_future() for _ in range(3)]

        async def step(i: int) -> None:
            await gates[i]
            await host.link.publish(batch(host, 5).batches)

        for i in range(3):
            pipeline.take(5)
            pipeline.launch(i, work=step(i), units=5, events=5)
        pipeline.launch(3)  # a plan with nothing to send keeps its place in line
        for i in (2, 1):  # the newest finish first: nothing settles before the oldest
            gates[i].set_result(None)
            await asyncio.sleep(0.2)
            assert settled == []
        gates[0].set_result(None)
        await pipeline.finish()
        await pipeline.close()
        await host.link.close()
        return settled, pipeline.pending, int(counted(host.metrics.events_acked))

    settled, pending, acked = asyncio.run(run())
    assert settled == [0, 1, 2, 3]
    assert pending == 0
    assert acked == 15


def test_a_refusal_is_counted_and_nothing_settles_after_it(device, caplog) -> None:
    async def run() -> tuple[list[int], list[tuple[int, str]], float, int]:
        host = make_host(device.router, topic="bogus.pipeline")  # outside the device's topic prefixes
        host.link.start()
        settled: list[int] = []
        refused: list[tuple[int, str]] = []
        pipeline: Pipeline[int] = Pipeline(host, "test peer", accepted=settled.append,
                                           refused=lambda plan, e: refused.append((plan, type(e).__name__)),
                                           consequence="closing", depth=4)
        for i in range(3):
            pipeline.take(2)
            pipeline.launch(i, batches=batch(host, 2), units=2, events=2)
        await pipeline.finish()
        assert pipeline.failed and not pipeline.can_launch(1)
        await pipeline.room()  # returns at once: a failed pipeline holds no reader
        await pipeline.close()
        rejected_outside = await forward(host, batch(host, 3), "recovery")
        await host.link.close()
        return settled, refused, counted(host.metrics.device_rejected), rejected_outside

    settled, refused, rejected, outside = asyncio.run(run())
    assert settled == []
    assert refused == [(0, "DeviceRejected")]
    assert rejected == 2 + 3  # the first batch's two, then forward()'s three
    assert outside == 3
    assert "test peer: device rejected 2 of 2 messages; closing" in caplog.text


def test_room_waits_for_the_pending_bound_and_inflated_bytes_return_as_units_settle(device) -> None:
    async def run() -> list[str]:
        host = make_host(device.router, inflate=100)
        host.link.start()
        seen: list[str] = []
        shared = Budget(1000)
        gate = asyncio.get_running_loop().create_future()

        async def step() -> None:
            await gate
            await host.link.publish(batch(host, 4).batches)

        pipeline: Pipeline[str] = Pipeline(host, "test peer", accepted=seen.append, refused=lambda *_: None,
                                           consequence="", depth=2, max_pending=4, shared=shared)
        pipeline.take(4)
        pipeline.charge_inflated(150)  # more than the whole budget: charged all the same
        assert not pipeline.has_room and host.inflate.spent and shared.used == 4
        waiter = asyncio.ensure_future(pipeline.room())
        pipeline.launch("first", work=step(), units=4, events=4)
        await asyncio.sleep(0.2)
        assert not waiter.done()
        gate.set_result(None)
        await asyncio.wait_for(waiter, 10)
        seen.append(f"inflate {host.inflate.used}, shared {shared.used}, pending {pipeline.pending}")
        await pipeline.close()
        await host.link.close()
        return seen

    assert asyncio.run(run()) == ["first", "inflate 0, shared 0, pending 0"]


def test_close_gives_back_what_a_connection_still_holds(device) -> None:
    async def run() -> tuple[int, int, bool]:
        host = make_host(device.router)
        host.link.start()
        shared = Budget(1000)
        pipeline: Pipeline[int] = Pipeline(host, "test peer", accepted=lambda _: None, refused=lambda *_: None,
                                           consequence="", depth=2, shared=shared)
        never = asyncio.get_running_loop().create_future()
        pipeline.take(7)
        pipeline.charge_inflated(500)
        pipeline.launch(0, work=never, units=7, events=7)
        await pipeline.close()
        await host.link.close()
        return shared.used, host.inflate.used, never.cancelled()

    assert asyncio.run(run()) == (0, 0, True)

