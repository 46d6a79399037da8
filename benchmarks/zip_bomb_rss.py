"""Bridge RSS under N concurrent 1 MiB C-frame zip bombs: `python benchmarks/zip_bomb_rss.py N [zero|j] [bridge flags]`.

`zero` inflates to 1 GiB of zeros; `j` to valid J frames past the 64 MiB limit. Prints RSS before,
at peak and 8 s after (issue 17: +344 MiB for four, before chunked inflation)."""
import socket, struct, sys, time, zlib, threading
sys.path.insert(0, ".")
from tests.conftest import start_device
from tests.bridge_support import start_bridge, stop_bridge
from tests.helpers import stop

def bomb() -> bytes:
    c = zlib.compressobj(9)
    chunk = b"\0" * (1 << 20)
    parts = [c.compress(chunk) for _ in range(1024)]
    parts.append(c.flush())
    body = b"".join(parts)
    return struct.pack(">BBI", 0x32, 0x43, len(body)) + body

def jbomb() -> bytes:
    # valid J frames: inflates to well past 64 MiB
    frame = struct.pack(">BBII", 0x32, 0x4A, 1, 2) + b"{}"
    c = zlib.compressobj(9)
    blk = frame * (1 << 16)
    parts = [c.compress(blk) for _ in range(1100)]
    parts.append(c.flush())
    body = b"".join(parts)
    return struct.pack(">BBI", 0x32, 0x43, len(body)) + body

kind = sys.argv[2] if len(sys.argv) > 2 else "zero"
data = bomb() if kind == "zero" else jbomb()
print("bomb", kind, len(data))
n = int(sys.argv[1])
dev = start_device()
b = start_bridge("lumberjack", dev.router, *sys.argv[3:])
try:
    time.sleep(1)
    before = b.rss_kib()
    peak = before
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", b.port)); socks.append(s)
    ts = [threading.Thread(target=s.sendall, args=(data,)) for s in socks]
    [t.start() for t in ts]
    t0 = time.time()
    while time.time() - t0 < 8:
        peak = max(peak, b.rss_kib()); time.sleep(0.01)
    after = b.rss_kib()
    print(f"n={n} before={before/1024:.0f}MiB peak={peak/1024:.0f}MiB after={after/1024:.0f}MiB  growth peak +{(peak-before)/1024:.0f} after +{(after-before)/1024:.0f}")
    for s in socks: s.close()
finally:
    out = stop_bridge(b)
    print("\n".join(l for l in out.splitlines() if "error" in l)[:2000])
    stop(dev.proc)
