"""st_set_meta.py IN OUT KEY=VALUE... — copies the safetensors file IN to OUT with metadata keys set
(an empty VALUE removes the key): a test's way to make an expert of another objective or latent
space from one it trained."""
import json
import struct
import sys

b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.setdefault("__metadata__", {})
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    if v:
        meta[k] = v
    else:
        meta.pop(k, None)
hb = json.dumps(h).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
