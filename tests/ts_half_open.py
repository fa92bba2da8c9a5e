#!/usr/bin/python3
"""ts_half_open.py PORT PER_ADDR N_ADDRS SECONDS READY_FILE [REOPEN_S] — a peer without the network
key that tries to lock a node out: PER_ADDR TCP connections from each of the loopback addresses
127.0.0.2 .. 127.0.0.(N_ADDRS+1), plus PER_ADDR from 127.0.0.1 (the address the CLI and other
local daemons connect from; LOCAL_TOO=0 leaves it out), none of which ever sends a byte. Every
connection the node closes (a handshake timeout, an eviction) is opened again REOPEN_S seconds
later (default 0.2), for SECONDS: the connections are held, renewed as they go. Writes
READY_FILE once all are open the first time; prints how many reopenings it made."""
import os
import selectors
import socket
import sys
import time

port, per, n_addrs, secs, ready = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                   float(sys.argv[4]), sys.argv[5])
reopen_s = float(sys.argv[6]) if len(sys.argv) > 6 else 0.2
sources = (["127.0.0.1"] if os.environ.get("LOCAL_TOO", "1") == "1" else []) + ["127.0.0.%d" % (2 + i) for i in range(n_addrs)]
sel = selectors.DefaultSelector()


def open_one(src):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.bind((src, 0))
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    sel.register(s, selectors.EVENT_READ, src)


for src in sources:
    for _ in range(per):
        open_one(src)
open(ready, "w").close()
reopened = 0
pending = []  # (when, source): closed ones to open again
end = time.monotonic() + secs
while time.monotonic() < end:
    now = time.monotonic()
    while pending and pending[0][0] <= now:
        open_one(pending.pop(0)[1])
        reopened += 1
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except (ConnectionError, OSError):
            data = b""
        if data:
            continue  # the node's handshake bytes, if any: keep holding
        sel.unregister(s)
        s.close()
        pending.append((time.monotonic() + reopen_s, key.data))
print("reopened %d connections" % reopened)
