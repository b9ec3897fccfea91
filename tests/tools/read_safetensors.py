#!/usr/bin/env python3
"""A stdlib-only reader of the published safetensors format, independent of tepdist's writer.

Format: 8-byte little-endian header length N, N bytes of JSON header mapping each tensor name to
{dtype, shape, data_offsets [begin, end)} relative to the data that follows (plus an optional
"__metadata__" entry), then the data. Prints {name: {"shape": [...], "values": [...]}} as JSON.
Only F32 is accepted; anything else, or inconsistent offsets, is an error (exit 1).
"""
import json
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} has dtype {t['dtype']}, expected F32")
        begin, end = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if end - begin != 4 * count or end > len(data):
            raise SystemExit(f"{path}: {name} has inconsistent data offsets")
        out[name] = {"shape": t["shape"], "values": list(struct.unpack_from(f"<{count}f", data, begin))}
    return out


if __name__ == "__main__":
    json.dump(read(sys.argv[1]), sys.stdout)
