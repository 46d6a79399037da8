"""Benchmark: logjam-device (journal off and on) against `zmq.proxy(PULL, PUB)` under the same load.

Several producer processes PUSH 4-frame Logjam messages (~100-byte bodies) into the
device under test while a subscriber counts what comes out. The figure of merit is
messages per CPU-second of the device process (all its threads, from /proc schedstat,
so the machine's other load does not distort it), printed for both devices with the
ratio. The device runs with the journal off and with `--data-dir` under each fsync
policy (always, interval, never), reported against journal-off. A second phase offers
10x the device's receive high-water mark of messages and samples the device's RSS to
show that a backlog blocks clients instead of growing the device.

`--curve` puts CurveZMQ on every socket of both devices (zmq.proxy's PULL and PUB are CURVE
servers too, so the ratio compares encrypted with encrypted), and on every client; without
it both run plaintext (the device with --allow-plaintext).

Run: .venv/bin/python benchmarks/device.py [--messages N] [--producers K] [--curve]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # harness/ is not installed

from benchmarks.results import Run  # noqa: E402
from harness.cpu import fine_cpu_seconds  # noqa: E402

BIN = Path(sys.executable).parent

APP = b"bench-app-production"
TOPIC = b"logs.bench"
PROBE = b"logs.probe"
BODY = b'{"action":"bench#index","code":200,"duration":12.5,"pad":"' + b"x" * 40 + b'"}'
META = b"\xca\xbd\x00\x01" + bytes(4) + (1_700_000_000_000).to_bytes(8, "big") + (1).to_bytes(8, "big")

PROXY = """
import sys, zmq
ctx = zmq.Context()
pull = ctx.socket(zmq.PULL); pull.rcvhwm = int(sys.argv[3])
pub = ctx.socket(zmq.PUB); pub.sndhwm = int(sys.argv[4])
if len(sys.argv) > 5:  # CURVE server: public, secret
    for s in (pull, pub):
        s.curve_server = True; s.curve_publickey = sys.argv[5].encode(); s.curve_secretkey = sys.argv[6].encode()
pull.bind("tcp://127.0.0.1:" + sys.argv[1])
pub.bind("tcp://127.0.0.1:" + sys.argv[2])
try:
    zmq.proxy(pull, pub)
except KeyboardInterrupt:
    pass
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB from /proc/<pid>/status."""
    cur = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


# -- child processes (sockets are created inside them, after the fork) -------------

CLIENT_HWM = 5_000
# --curve: the directory of the keys (runtime.curve.ensure); None: plaintext everywhere.
KEYS: str | None = None


def secure(sock, keys: str | None) -> None:
    """The client side of CURVE with the key directory's client key (logjam.curve)."""
    if keys is not None:
        from logjam.curve import ClientKey

        ClientKey.from_dir(keys).apply(sock)


def producer(endpoint: str, count: int, go: mp.Event, blocked: mp.Value, keys: str | None = None) -> None:
    import zmq
    from zmq.backend import Socket as Raw

    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    secure(s, keys)
    s.linger = -1
    s.sndhwm = CLIENT_HWM
    s.connect(endpoint)
    send = Raw.send
    more = zmq.SNDMORE
    first = zmq.SNDMORE | zmq.NOBLOCK
    waited = 0.0
    clock = time.perf_counter
    go.wait()
    for _ in range(count):
        # Only the first frame can meet the HWM (a multipart message is queued whole);
        # time how long it blocks there, like an ordinary client would.
        try:
            send(s, APP, first)
        except zmq.Again:
            t = clock()
            send(s, APP, more)
            waited += clock() - t
        send(s, TOPIC, more)
        send(s, BODY, more)
        send(s, META)
    with blocked.get_lock():
        blocked.value += waited
    s.close()
    ctx.term()


def subscriber(endpoint: str, ready: mp.Event, counted: mp.Value, done: mp.Event, keys: str | None = None) -> None:
    import zmq
    from zmq.backend import Socket as Raw

    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    secure(s, keys)
    s.rcvhwm = 0
    s.subscribe(APP)
    s.connect(endpoint)
    recv = Raw.recv
    n = 0
    seen_probe = False
    while not done.is_set():
        if not s.poll(100):
            continue
        for _ in range(10_000):
            try:
                f = recv(s, zmq.NOBLOCK, False)
            except zmq.Again:
                break
            frames = [f]
            while f.more:
                f = recv(s, 0, False)
                frames.append(f)
            if len(frames) >= 2 and frames[1].bytes == PROBE:
                if not seen_probe:
                    seen_probe = True
                    ready.set()
            else:
                n += 1
        counted.value = n
    s.close(linger=0)
    ctx.term()


# -- one run -------------------------------------------------------------------------

class Target:
    def __init__(self, name: str, argv: list[str], pull_port: int, pub_port: int, data_dir: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})})
        self.pull = f"tcp://127.0.0.1:{pull_port}"
        self.pub = f"tcp://127.0.0.1:{pub_port}"
        self.data_dir = data_dir

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def ours(rcv_hwm: int, snd_hwm: int, engine: str = "native", fsync: str | None = None) -> Target:
    ports = [free_port() for _ in range(5)]
    argv = [str(BIN / "logjam-device"), "--bind", "127.0.0.1", "-t", str(ports[0]), "-p", str(ports[1]),
            "-P", str(ports[2]), "-s", str(ports[3]), "-d", "7", "-R", str(rcv_hwm), "-S", str(snd_hwm)]
    name = "logjam-device" if engine == "native" else f"device/{engine}"
    data_dir = None
    if fsync:
        # The journal on the same file system as the repository (not a tmpfs /tmp), where
        # a real deployment's --data-dir would be.
        data_dir = tempfile.mkdtemp(prefix="bench-journal-", dir=REPO)
        argv += ["--data-dir", data_dir, "--journal-fsync", fsync]
        name = f"journal/{fsync}"
    argv += ["--replay-port", str(ports[4])] + (["--keys", KEYS] if KEYS else ["--allow-plaintext"])
    # engine "native" requires the C loop (a missing build fails loudly), "python" turns it off.
    return Target(name, argv, ports[1], ports[2], data_dir,
                  env={"LOGJAM_NATIVE": "require" if engine == "native" else "off"})


def journal_always(rcv_hwm: int, snd_hwm: int) -> Target:
    return ours(rcv_hwm, snd_hwm, fsync="always")


def journal_interval(rcv_hwm: int, snd_hwm: int) -> Target:
    return ours(rcv_hwm, snd_hwm, fsync="interval")


def journal_os(rcv_hwm: int, snd_hwm: int) -> Target:
    return ours(rcv_hwm, snd_hwm, fsync="never")


def ours_python(rcv_hwm: int, snd_hwm: int) -> Target:
    return ours(rcv_hwm, snd_hwm, "python")


def proxy(rcv_hwm: int, snd_hwm: int) -> Target:
    pull, pub = free_port(), free_port()
    argv = [sys.executable, "-c", PROXY, str(pull), str(pub), str(rcv_hwm), str(snd_hwm)]
    if KEYS:
        from logjam.curve import ServerKey, secret_file

        key = ServerKey.load(secret_file(KEYS, "server"))
        argv += [key.public.decode(), key.secret.decode()]
    return Target("zmq.proxy", argv, pull, pub)


def run(target: Target, producers: int, per_producer: int, sample_rss: bool = False) -> dict:
    import zmq

    mpc = mp.get_context("spawn")
    ready, done, go = mpc.Event(), mpc.Event(), mpc.Event()
    counted = mpc.Value("q", 0)
    blocked = mpc.Value("d", 0.0)
    sub = mpc.Process(target=subscriber, args=(target.pub, ready, counted, done, KEYS))
    sub.start()
    prods = [mpc.Process(target=producer, args=(target.pull, per_producer, go, blocked, KEYS)) for _ in range(producers)]
    for p in prods:
        p.start()

    # Probe until the subscriber sees traffic: the device is up and the SUB is joined.
    ctx = zmq.Context()
    probe = ctx.socket(zmq.PUSH)
    probe.linger = 0
    secure(probe, KEYS)
    probe.connect(target.pull)
    deadline = time.monotonic() + 20
    while not ready.wait(0.05):
        if target.proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{target.name} did not come up")
        probe.send_multipart([APP, PROBE, b"{}", META])
    probe.close()
    ctx.term()
    time.sleep(0.3)  # let in-flight probes pass before the CPU baseline

    total = producers * per_producer
    cpu0 = fine_cpu_seconds(target.proc.pid)
    t0 = time.monotonic()
    samples: list[tuple[float, float]] = []
    baseline = rss_mb(target.proc.pid)[0]
    go.set()
    last, last_change = -1, time.monotonic()
    while True:
        now = time.monotonic()
        if sample_rss:
            samples.append((now - t0, rss_mb(target.proc.pid)[0]))
        n = counted.value
        if n != last:
            last, last_change = n, now
        if n >= total or (all(not p.is_alive() for p in prods) and now - last_change > 1.0):
            break
        time.sleep(0.1 if sample_rss else 0.05)
    elapsed = time.monotonic() - t0
    cpu = fine_cpu_seconds(target.proc.pid) - cpu0
    peak = rss_mb(target.proc.pid)[1]
    done.set()
    for p in prods:
        p.join(10)
    sub.join(10)
    return {
        "sent": total, "received": counted.value, "cpu": cpu, "wall": elapsed,
        "per_cpu_s": total / cpu if cpu else float("inf"), "peak_rss": peak, "samples": samples,
        "blocked": blocked.value, "baseline_rss": baseline,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=150_000, help="messages per throughput run")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per target; best is reported")
    ap.add_argument("--no-overload", action="store_true")
    ap.add_argument("--no-journal", action="store_true", help="skip the journal-on runs")
    ap.add_argument("--curve", action="store_true", help="CurveZMQ on every socket of both devices and their clients")
    args = ap.parse_args()
    run_record = Run("device", variant="curve" if args.curve else None)
    global KEYS
    if args.curve:
        from runtime.curve import ensure

        KEYS = tempfile.mkdtemp(prefix="bench-keys-")
        ensure(KEYS)
    print(f"CURVE {'on' if KEYS else 'off'} (both devices, every client)")
    per = args.messages // args.producers
    started = time.monotonic()

    best: dict[str, dict] = {}
    rounds: list[dict[str, dict]] = []
    journals = () if args.no_journal else (journal_os, journal_interval, journal_always)
    for rnd in range(args.rounds):
        # The pure-Python loop is measured once, for comparison (it is the fallback).
        rounds.append({})
        for make in (proxy, ours, *journals) if rnd else (proxy, ours, *journals, ours_python):
            target = make(100_000, 1_000_000)
            try:
                r = run(target, args.producers, per)
            finally:
                target.stop()
            print(f"{target.name:14s} {r['sent']:>8d} msgs  {r['cpu']:6.2f} CPU-s  {r['wall']:6.2f} s wall  "
                  f"{r['per_cpu_s']:>10,.0f} msgs/CPU-s  received {r['received']}  peak RSS {r['peak_rss']:.0f} MiB")
            rounds[-1][target.name] = r
            if target.name not in best or r["per_cpu_s"] > best[target.name]["per_cpu_s"]:
                best[target.name] = r
    if best:
        report(best, rounds, run_record)
        if journals and "logjam-device" in best:
            cost = append_cost()
            if cost:
                device_ns = 1e9 / best["logjam-device"]["per_cpu_s"]
                print(f"journal step alone (in process, 1000-message batches): " + ", ".join(
                    f"{p} {ns:.0f} ns/msg" for p, ns in cost.items())
                    + f"; the journal-off device costs {device_ns:.0f} ns/msg, so journal-on/off = "
                    + ", ".join(f"{p} {device_ns / (device_ns + ns):.2f}x" for p, ns in cost.items()))
                for p, ns in cost.items():
                    run_record.figure(f"journal step alone, --journal-fsync {p}", ns, "ns/msg")
    if not args.no_overload:
        # The C engine outruns Python producers, so there the slow subscriber is the
        # bottleneck (PUB queue full); the Python engine is slower than its producers,
        # so there the clients block on the receive HWM. Both must stay flat.
        for engine in ("native", "python"):
            peak = overload(engine)
            run_record.figure(f"overload, {engine} loop: peak RSS", peak, "MiB")
    print(f"\ntotal time {time.monotonic() - started:.1f} s")
    run_record.save()


def report(best: dict[str, dict], rounds: list[dict[str, dict]], run: Run) -> None:
    ratio = best["logjam-device"]["per_cpu_s"] / best["zmq.proxy"]["per_cpu_s"]
    print(f"\nbest: logjam-device {best['logjam-device']['per_cpu_s']:,.0f} msgs/CPU-s, "
          f"zmq.proxy {best['zmq.proxy']['per_cpu_s']:,.0f} msgs/CPU-s, ratio {ratio:.2f}x "
          f"(target >= {run.target('ratio_to_proxy'):g}x)")
    for name, r in best.items():
        run.figure(f"{name}, best", r["per_cpu_s"], "msgs/CPU-s")
    run.check("ratio_to_proxy", ratio)
    if "device/python" in best:
        py = best["device/python"]["per_cpu_s"] / best["zmq.proxy"]["per_cpu_s"]
        print(f"      pure-Python fallback (LOGJAM_NATIVE=off): {best['device/python']['per_cpu_s']:,.0f} msgs/CPU-s, "
              f"ratio {py:.2f}x")
    off = best["logjam-device"]["per_cpu_s"]
    for policy in ("never", "interval", "always"):
        r = best.get(f"journal/{policy}")
        if r is None:
            continue
        target = f"  (target >= {run.target('journal_never_ratio'):g}x)" if policy == "never" else ""
        if policy == "never":
            run.check("journal_never_ratio", r["per_cpu_s"] / off)
        print(f"journal --journal-fsync {policy:8s} {r['per_cpu_s']:>10,.0f} msgs/CPU-s = {r['per_cpu_s'] / off:.2f}x "
              f"journal-off, {r['per_cpu_s'] / best['zmq.proxy']['per_cpu_s']:.2f}x zmq.proxy; "
              f"{r['sent'] / r['wall']:,.0f} msgs/s wall{target}")
    if len(rounds) > 1 and any(k.startswith("journal/") for k in rounds[0]):
        # Best-of figures mix runs from different moments of a shared machine; the ratio of
        # runs made back to back in the same round is steadier. Median over the rounds.
        print("paired (same round) journal-on / journal-off, median of rounds: " + ", ".join(
            f"{policy} {statistics.median(rd[f'journal/{policy}']['per_cpu_s'] / rd['logjam-device']['per_cpu_s'] for rd in rounds):.2f}x"
            for policy in ("never", "interval", "always")))


def append_cost(batches: int = 150, size: int = 1000) -> dict[str, float]:
    """CPU nanoseconds per message of the native engine's journal step alone, per policy.

    In process, on a real batch of the benchmark's messages drained from a PULL socket:
    `lj_encode` into the reused buffer, crc32, and the `writev` (plus the fsyncs the policy
    makes). Whole-device msgs/CPU-s figures move with batch sizes (a device that falls
    behind drains bigger batches and spends less per message), which can hide a cost
    this small; this isolates it.
    """
    import zmq

    from devices import native
    from devices.journal import Journal

    loaded = native.load()
    if loaded is None:
        return {}
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.sndhwm = pull.rcvhwm = 0
    push.bind("inproc://append-cost")
    pull.connect("inproc://append-cost")
    batch = native.NativeBatch(*loaded)
    for _ in range(size):
        push.send_multipart([APP, TOPIC, BODY, META])
    assert batch.drain(loaded[0].cast("void *", pull.underlying), size) == size
    batch.number(7, 1, 1)
    out = {}
    for policy in ("never", "interval", "always"):
        d = tempfile.mkdtemp(prefix="bench-journal-", dir=REPO)
        try:
            journal = Journal(d, fsync=policy)
            seq = 1
            cpu0 = time.process_time()
            for _ in range(batches):
                batch.journal(journal, seq)
                seq += size
            out[policy] = (time.process_time() - cpu0) / (batches * size) * 1e9
            journal.close()
        finally:
            shutil.rmtree(d, ignore_errors=True)
    batch.discard()
    for sock in (push, pull):
        sock.close(linger=0)
    ctx.term()
    return out


def overload(engine: str) -> float:
    """Offer 10x what the queues in front of the device can hold and watch its RSS.

    ZeroMQ HWMs are per connection: with K producers the device may hold K x rcv-hwm
    messages, each client K x its own send HWM. Small HWMs make the queues fill in the
    first tenth of the run, so the rest of it shows whether memory stays flat.
    """
    rcv_hwm, snd_hwm, producers = 5_000, 25_000, 4
    total = 10 * producers * (rcv_hwm + CLIENT_HWM)
    print(f"\noverload, {engine} loop: {producers} producers offer {total} messages, 10x what the queues hold "
          f"(-R {rcv_hwm} per connection, client HWM {CLIENT_HWM}, -S {snd_hwm})")
    target = ours(rcv_hwm, snd_hwm, engine)
    try:
        r = run(target, producers, total // producers, sample_rss=True)
    finally:
        target.stop()
    s = r["samples"]
    marks = [s[min(len(s) - 1, int(len(s) * q))] for q in (0.1, 0.25, 0.5, 0.75)] + [s[-1]]
    print(f"  RSS before load {r['baseline_rss']:.0f} MiB; during: " + ", ".join(f"{t:.1f}s {mb:.0f}" for t, mb in marks))
    tail = [mb for t, mb in s if t >= 0.2 * r["wall"]]
    print(f"  peak RSS {r['peak_rss']:.0f} MiB; after the first 20% of the run RSS stays within "
          f"{min(tail):.0f}..{max(tail):.0f} MiB")
    print(f"  {r['sent']} msgs in {r['wall']:.1f} s ({r['sent'] / r['wall']:,.0f}/s, {r['per_cpu_s']:,.0f} msgs/CPU-s); "
          f"producers spent {r['blocked']:.1f} s blocked on the HWM (of {producers} x {r['wall']:.1f} s); "
          f"the subscriber got {r['received']}")
    return r["peak_rss"]

if __name__ == "__main__":
    main()
