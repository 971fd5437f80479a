#!/usr/bin/python3
"""An independent safetensors reader: Python's standard library and numpy only.

Prints one line per tensor: NAME DTYPE SHAPE SUM (SUM as float64), for the
interoperability test to compare with the trainer's own tensors.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
          "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def main(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":
            raw = np.frombuffer(data[base + begin:base + end], dtype=np.uint16)
            array = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(data[base + begin:base + end], dtype=DTYPES[info["dtype"]])
        array = array.reshape(info["shape"])
        shape = "x".join(str(d) for d in info["shape"]) or "scalar"
        print(name, info["dtype"], shape, repr(float(array.astype(np.float64).sum())))


if __name__ == "__main__":
    main(sys.argv[1])
